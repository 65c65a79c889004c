"""The no-grad passes (old logprobs pi_old, the reference) run the model in eval mode -- no dropout -- and give
every module back the mode it had."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grpolab.config import from_dict
from grpolab.rollout.base import Rollout
from grpolab.training.forward import completion_logprobs
from grpolab.training.update import PolicyUpdater


def dropout_llama() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        attention_dropout=0.5,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).double()


def rollout_of(n: int = 4, lp: int = 5, lc: int = 6) -> Rollout:
    g = torch.Generator().manual_seed(1)
    mask = (torch.arange(lc).unsqueeze(0) < torch.tensor([6, 3, 5, 2]).unsqueeze(1)).long()
    ids = torch.randint(1, 50, (n, lc), generator=g) * mask
    prompt = torch.randint(1, 50, (2, lp), generator=g).repeat_interleave(2, 0)
    return Rollout(
        prompt,
        torch.ones_like(prompt),
        ids,
        mask,
        torch.zeros(n, lc),
        torch.zeros(n, dtype=torch.bool),
        torch.arange(2).repeat_interleave(2),
        [""] * n,
    )


def test_old_logprobs_run_in_eval_mode_and_restore_the_mode(one_thread):
    policy = dropout_llama().train()
    policy.model.layers[1].eval()  # a mixed state: each module gets its own mode back
    modes = [m.training for m in policy.modules()]
    cfg = from_dict(
        {
            "rollout": {"group_size": 2, "max_new_tokens": 6, "dtype": "float32"},
            "algorithm": {"beta": 0.0},
            "train": {"micro_batch_size": 2, "mu": 2},
        }
    )
    opt = torch.optim.SGD(policy.parameters(), lr=0.0)
    updater = PolicyUpdater(cfg, policy, None, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0))
    rollout = rollout_of()
    torch.manual_seed(0)
    a = updater.logprobs_no_grad(policy, rollout, "fp32")
    b = updater.logprobs_no_grad(policy, rollout, "fp32")
    assert [m.training for m in policy.modules()] == modes
    policy.eval()
    with torch.no_grad():
        ref = completion_logprobs(policy, rollout, torch.arange(4), cfg.rollout.temperature, "fp32").logp.float()
    assert torch.equal(a, b)
    assert torch.allclose(a * rollout.completion_mask, ref * rollout.completion_mask, atol=1e-6, rtol=0)
    policy.train()
    with torch.no_grad():  # dropout is live in train mode: the comparison above can fail
        noisy = completion_logprobs(policy, rollout, torch.arange(4), cfg.rollout.temperature, "fp32").logp.float()
    assert not torch.allclose(noisy * rollout.completion_mask, ref * rollout.completion_mask, atol=1e-3)
