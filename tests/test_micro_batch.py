"""The update's micro-batches (grpolab/training/update.py): typed records, the same gradient whatever their size,
and a non-finite loss that stops the backward from that micro-batch on while later forwards still add their metrics."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grpolab.config import from_dict
from grpolab.rollout.base import Rollout
from grpolab.training.update import MicroBatch, PolicyUpdater, UpdateBatch

LENGTHS = [6, 3, 5, 2]  # completion tokens of the 4 rows (2 groups of 2)


def tiny_llama() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).double()


def rollout_of(lp: int = 5, lc: int = 6) -> Rollout:
    n, g = len(LENGTHS), torch.Generator().manual_seed(1)
    mask = (torch.arange(lc).unsqueeze(0) < torch.tensor(LENGTHS).unsqueeze(1)).long()
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


def minibatch(policy, advantages: list[float], micro_batch_size: int) -> tuple[bool, dict[str, float], int]:
    """(finite, metric sums, backward passes) of one minibatch of all 4 rows."""
    cfg = from_dict(
        {
            "rollout": {"group_size": 2, "max_new_tokens": 6, "dtype": "float32"},
            "algorithm": {"beta": 0.0},
            "train": {"micro_batch_size": micro_batch_size, "precision": "fp32"},
        }
    )
    opt = torch.optim.SGD(policy.parameters(), lr=0.0)
    updater = PolicyUpdater(cfg, policy, None, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0))
    rollout = rollout_of()
    batch = UpdateBatch(
        rollout,
        torch.tensor(advantages, dtype=torch.float64),
        updater.loss_mask(rollout, torch.ones(len(rollout), dtype=torch.bool)),
        None,
        None,
    )
    backwards = []
    handle = policy.lm_head.weight.register_hook(lambda grad: backwards.append(1))  # once per backward pass
    sums: dict[str, float] = defaultdict(float)
    try:
        finite = updater.minibatch(batch, torch.arange(len(rollout)), sums, None)
    finally:
        handle.remove()
    return finite, sums, len(backwards)


def test_the_records_are_frozen():
    micro = MicroBatch(rows=torch.arange(2), weights=torch.ones(2, 3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        micro.rows = torch.arange(3)  # type: ignore[misc]
    fields = [f.name for f in dataclasses.fields(UpdateBatch)]
    assert fields == ["rollout", "advantages", "mask", "ref_logp", "old_logp"]


def test_the_gradient_does_not_depend_on_the_micro_batch_size(one_thread):
    grads = []
    for size in (1, 2, 3, 4):
        policy = tiny_llama()
        finite, sums, backwards = minibatch(policy, [1.0, -1.0, 0.5, -0.5], size)
        assert finite and backwards == math.ceil(len(LENGTHS) / size) and sums["tokens"] == sum(LENGTHS)
        grads.append(torch.cat([p.grad.flatten() for p in policy.parameters()]))
    assert grads[0].abs().max() > 1e-6  # a gradient to compare
    for other in grads[1:]:  # the same up to float32 rounding (logprobs are float32; trimming differs per size)
        torch.testing.assert_close(other, grads[0], atol=1e-8, rtol=1e-5)


@pytest.mark.parametrize("nan_row, backwards_run", [(None, 2), (0, 0), (2, 1)])
def test_a_non_finite_loss_stops_the_backward_from_its_micro_batch_on(one_thread, nan_row, backwards_run):
    advantages = [1.0, -1.0, 0.5, -0.5]
    if nan_row is not None:
        advantages[nan_row] = math.nan
    finite, sums, backwards = minibatch(tiny_llama(), advantages, micro_batch_size=2)
    assert finite == (nan_row is None)
    assert backwards == backwards_run  # micro-batches of rows [0, 1] and [2, 3]
    assert sums["tokens"] == sum(LENGTHS)  # every forward still adds its metrics
