"""bf16 casts of the weights made once per optimizer step (grpolab/training/forward.py weight_casts_kept): an update
over several micro-batches gives the same bytes as casting every weight again in each micro-batch's forward, with
fewer casts; the fp32 path is untouched."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from transformers import LlamaConfig, LlamaForCausalLM

import grpolab.training.forward as forward_module
import grpolab.training.update as update_module
from grpolab.config import from_dict
from grpolab.rollout.base import Rollout
from grpolab.training.update import PolicyUpdater

VOCAB, HIDDEN, G, GROUPS, LP, LC = 64, 32, 4, 3, 5, 6


def tiny_policy() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def rollout() -> Rollout:
    g = torch.Generator().manual_seed(3)
    n = G * GROUPS
    prompt_ids = torch.randint(1, VOCAB, (GROUPS, LP), generator=g).repeat_interleave(G, 0)
    lengths = torch.randint(1, LC + 1, (n,), generator=g)
    cmask = (torch.arange(LC)[None] < lengths[:, None]).long()
    cids = torch.randint(1, VOCAB, (n, LC), generator=g) * cmask
    return Rollout(
        prompt_ids,
        torch.ones_like(prompt_ids),
        cids,
        cmask,
        torch.zeros(n, LC),
        torch.zeros(n, dtype=torch.bool),
        torch.arange(GROUPS).repeat_interleave(G),
        [""] * n,
    )


def update(precision: str, keep: bool) -> tuple[LlamaForCausalLM, int]:
    """(policy after one update with micro-batches of 4 of 12 rows, forward casts of the tied embedding counted)."""
    cfg = from_dict(
        {
            "rollout": {"group_size": G, "max_new_tokens": LC, "temperature": 0.9, "dtype": "float32"},
            "algorithm": {"beta": 0.0},
            "train": {"prompts_per_step": GROUPS, "micro_batch_size": 4, "precision": precision, "lr": 1e-2, "seed": 0},
        }
    )
    policy = tiny_policy()
    optimizer = torch.optim.SGD(policy.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    advantages = torch.linspace(-1.0, 1.0, G * GROUPS, dtype=torch.float64)
    with contextlib.ExitStack() as stack:
        if not keep:
            stack.enter_context(pytest.MonkeyPatch.context()).setattr(
                update_module, "weight_casts_kept", lambda *a, **k: contextlib.nullcontext()
            )
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            PolicyUpdater(cfg, policy, None, optimizer, scheduler).update(
                rollout(), advantages, torch.ones(G * GROUPS, dtype=torch.bool)
            )
    casts = sum(
        e.count
        for e in prof.key_averages(group_by_input_shape=True)
        if e.key == "aten::_to_copy" and e.input_shapes and list(e.input_shapes[0]) == [VOCAB, HIDDEN]
    )
    return policy, casts


def test_bf16_update_is_the_same_bytes_with_fewer_casts():
    kept, casts_kept = update("bf16", keep=True)
    again, casts_again = update("bf16", keep=False)
    before = tiny_policy()
    moved = max(float((p - q).detach().abs().max()) for p, q in zip(kept.parameters(), before.parameters()))
    assert moved > 1e-4  # the update did something
    for (name, p), q in zip(kept.named_parameters(), again.parameters()):
        assert torch.equal(p, q), name
    # 3 micro-batches: the embedding's forward cast once instead of 3 times (its gradient's casts in the backward
    # are one per micro-batch either way)
    assert casts_again - casts_kept == 2, (casts_kept, casts_again)


def test_fp32_update_opens_no_autocast_region(monkeypatch):
    opened = []
    real = torch.autocast

    def spy(*args, **kwargs):
        opened.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(forward_module.torch, "autocast", spy)
    update("fp32", keep=True)
    assert opened == []


def test_casts_are_not_kept_past_the_region():
    """Outside the region autocast's cache is empty again: a weight changed after it is cast afresh."""
    w = torch.nn.Parameter(torch.ones(4, 4))
    x = torch.ones(1, 4)
    with forward_module.weight_casts_kept("bf16"):
        with forward_module.autocast("bf16"):
            y1 = torch.nn.functional.linear(x, w)
    with torch.no_grad():
        w.mul_(2)
    with forward_module.autocast("bf16"):
        y2 = torch.nn.functional.linear(x, w)
    assert y1.dtype == torch.bfloat16 and torch.equal(y2, 2 * y1)
