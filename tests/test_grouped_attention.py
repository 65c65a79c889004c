"""Grouped-head attention in deterministic CPU training passes (grpolab/training/attention.py `grouped_attention`):
the float64 formula with repeated heads, SDPA's math backend to float32 rounding (fully masked rows included),
the same model logits and gradients as SDPA, used only inside `grouped_passes`, and the same bytes on a rerun."""

from __future__ import annotations

import contextlib
import math
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import LlamaConfig, LlamaForCausalLM

from grpolab.training import attention
from grpolab.training.attention import GROUPED, grouped_attention, grouped_passes, use_training_attention
from grpolab.training.reproducibility import training_attention


def inputs(b=3, h=6, kv=2, length=5, s=9, d=8, dv=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, length, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, kv, s, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, kv, s, dv or d, generator=g, dtype=torch.float64)
    mask = torch.ones(length, s, dtype=torch.bool).tril(diagonal=s - length).expand(b, 1, length, s).clone()
    mask[0, :, :, :3] = False  # row 0: three padding keys on the left ...
    mask[1, :, 0, :] = False  # ... and row 1's first query attends to nothing
    return q, k, v, mask


def float64_reference(q, k, v, mask, scale):
    """softmax(Q K^T scale + M) V with each key/value head repeated for its query heads (head h reads h // G);
    a row that attends to nothing is 0."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~mask, -math.inf)
    out = torch.nan_to_num(scores.softmax(-1)) @ v
    return out.masked_fill(~mask.any(-1, keepdim=True), 0.0)


@pytest.mark.parametrize("case", ["mask", "no mask", "mask shared by the batch", "value head size 12"])
def test_it_is_the_formula_with_repeated_heads_in_float64(case):
    q, k, v, mask = inputs(dv=12 if case == "value head size 12" else None)
    given = {"no mask": None, "mask shared by the batch": mask[2:3]}.get(case, mask)
    meant = torch.ones_like(mask) if given is None else given.expand_as(mask)
    got = grouped_attention(q, k, v, given, 0.3)
    assert got.shape == (3, 6, 5, v.shape[-1])
    assert torch.allclose(got, float64_reference(q, k, v, meant, 0.3), atol=1e-12, rtol=0)


def test_rows_that_attend_to_nothing_are_zero_and_their_gradients_finite():
    q, k, v, mask = (x.requires_grad_() if x.dtype != torch.bool else x for x in inputs())
    out = grouped_attention(q, k, v, mask, 0.3)
    assert torch.equal(out[1, :, 0], torch.zeros_like(out[1, :, 0]))  # every head of the empty row
    out.square().sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


def test_gradients_match_autograd_through_the_float64_formula():
    q, k, v, mask = inputs(seed=1)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    refs = [x.clone().requires_grad_() for x in (q, k, v)]
    w = torch.randn(3, 6, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    (grouped_attention(*leaves, mask, 0.3) * w).sum().backward()
    (float64_reference(*refs, mask, 0.3) * w).sum().backward()
    for got, want in zip(leaves, refs):
        assert torch.allclose(got.grad, want.grad, atol=1e-12, rtol=0)


def test_float32_matches_sdpa_math_backend_with_repeated_heads():
    q, k, v, mask = (
        x.float() if x.is_floating_point() else x for x in inputs(b=4, h=9, kv=3, length=6, s=11, d=16, seed=3)
    )
    with sdpa_kernel(SDPBackend.MATH):
        want = F.scaled_dot_product_attention(
            q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), attn_mask=mask, scale=0.25
        )
    got = grouped_attention(q, k, v, mask, 0.25)
    assert torch.equal(got[1, :, 0], want[1, :, 0])  # the empty row: 0 in both
    assert torch.allclose(got, want, atol=2e-6, rtol=1e-5)


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=48,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(cfg).double()


def logits_and_grads(model, ids, mask):
    model.zero_grad()
    logits = model(input_ids=ids, attention_mask=mask).logits
    (logits.masked_fill(~mask.bool()[..., None], 0.0) * torch.linspace(-1, 1, 64, dtype=logits.dtype)).sum().backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters()]


def test_the_model_inside_training_passes_gives_sdpas_logits_and_gradients():
    model = tiny_llama()
    ids = torch.randint(0, 64, (3, 10), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[0, :4] = 0  # left padding: those queries attend to nothing
    want = logits_and_grads(model, ids, mask)  # plain SDPA (float64)
    assert use_training_attention(model, fp32_inside_bf16=False) == GROUPED
    calls = []
    real = attention.grouped_attention
    with mock.patch.object(attention, "grouped_attention", lambda *a: calls.append(1) or real(*a)):
        outside = logits_and_grads(model, ids, mask)
        assert not calls  # outside the training passes: SDPA
        with training_attention(True, torch.device("cpu")):
            inside = logits_and_grads(model, ids, mask)
    assert len(calls) == 2  # one per layer
    for got in (outside, inside):
        keep = mask.bool()
        assert torch.allclose(got[0][keep], want[0][keep], atol=1e-10, rtol=0)
        assert all(torch.allclose(a, b, atol=1e-10, rtol=0) for a, b in zip(got[1], want[1]))


def test_training_passes_rerun_to_the_same_bytes_and_the_switch_is_restored():
    model = tiny_llama().float()
    use_training_attention(model, fp32_inside_bf16=False)
    ids = torch.randint(0, 64, (3, 10), generator=torch.Generator().manual_seed(6))
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, :2] = 0
    with training_attention(True, torch.device("cpu")):
        first, second = logits_and_grads(model, ids, mask), logits_and_grads(model, ids, mask)
    assert torch.equal(first[0], second[0]) and all(torch.equal(a, b) for a, b in zip(first[1], second[1]))
    with pytest.raises(RuntimeError), grouped_passes():
        raise RuntimeError("a failed pass")
    assert attention._grouped["on"] is False


@pytest.mark.parametrize(
    "case",
    [
        "no mask",
        "a mask per head",
        "an additive float mask",
        "a mask of another batch",
        "bfloat16 inputs",
        "dropout",
        "outside the training passes",
    ],
)
def test_what_it_does_not_take_goes_to_sdpa(case):
    q, k, v, mask = (x.float() if x.is_floating_point() else x for x in inputs())
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal, module.training = 3, True, True
    m = {
        "no mask": None,
        "a mask per head": mask.expand(3, 6, 5, 9),
        "a mask of another batch": mask[:2],
        "an additive float mask": torch.zeros(3, 1, 5, 9),
    }.get(case, mask)
    if case == "a mask of another batch":
        q, k, v = q[:1], k[:1], v[:1]
    if case == "bfloat16 inputs":
        q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    passes = contextlib.nullcontext() if case == "outside the training passes" else grouped_passes()
    with (
        passes,
        mock.patch.object(attention, "grouped_attention", side_effect=AssertionError),
        mock.patch.object(attention, "sdpa_attention_forward", return_value=(torch.zeros(1), None)) as sdpa,
    ):
        attention.sdpa_grouped_forward(module, q, k, v, m, scaling=0.3, dropout=0.5 if case == "dropout" else 0.0)
    assert sdpa.call_count == 1


def test_the_switch_reports_only_what_took():
    model = tiny_llama()
    with mock.patch.object(type(model), "set_attn_implementation", lambda self, name: None):  # refused silently
        assert use_training_attention(model, fp32_inside_bf16=False) is None
