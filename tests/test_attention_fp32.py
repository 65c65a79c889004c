"""Attention in float32 inside bf16 autocast (grpolab/training/attention.py): it is float32 SDPA on the bf16-rounded inputs,
the trainer switches only its training policy (to it in bf16, to sdpa_grouped in fp32), and packing still applies."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grpolab.config import from_dict
from grpolab.training.attention import GROUPED, NAME, grouped_passes, sdpa_fp32_forward, use_training_attention
from grpolab.training.forward import packing_supported
from grpolab.training.trainer import Trainer


def reference_attention(q, k, v, mask, scale):
    """softmax(Q K^T * scale + mask) V in float64, grouped-query heads repeated, mask True = attend."""
    q, k, v = (x.double() for x in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = q @ k.transpose(-1, -2) * scale
    scores = scores.masked_fill(~mask, -math.inf)
    return (scores.softmax(-1) @ v).transpose(1, 2)  # [B, T, H, D] like transformers' attention output


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(cfg)


@pytest.mark.parametrize("grouped", [False, True], ids=["sdpa", "grouped passes"])
def test_it_is_float32_attention_of_the_bf16_inputs(grouped):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 7, 16, generator=g).bfloat16()
    k, v = (torch.randn(2, 2, 7, 16, generator=g).bfloat16() for _ in range(2))
    mask = torch.ones(7, 7, dtype=torch.bool).tril().expand(2, 1, 7, 7).clone()
    mask[0, :, :, :2] = False  # row 0: two padding positions on the left ...
    mask[0, :, :2, 0] = True  # ... whose own rows still see one key (no all-masked row)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal, module.training = 2, False, False
    with torch.autocast("cpu", dtype=torch.bfloat16), grouped_passes() if grouped else contextlib.nullcontext():
        out, _ = sdpa_fp32_forward(module, q, k, v, mask, scaling=0.25, dropout=0.0)
    assert out.dtype == torch.bfloat16
    ref = reference_attention(q, k, v, mask, 0.25)
    # float32 attention then one rounding to bf16: within half a bf16 ulp of the float64 value (2^-9 relative)
    assert torch.all((out.double() - ref).abs() <= ref.abs() * 2.0**-8 + 1e-6)


def test_model_logits_and_gradients_under_autocast_match_float32_attention():
    model = tiny_llama()
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(2))
    assert use_training_attention(model, fp32_inside_bf16=True) == NAME and model.config._attn_implementation == NAME
    assert packing_supported(model)  # it takes the packed block-causal mask like SDPA
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(input_ids=ids).logits.float()
    logits.logsumexp(-1).sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    fp32 = model(input_ids=ids).logits  # no autocast: the upcast is a no-op, plain float32 SDPA
    assert torch.allclose(logits, fp32, atol=0.05)  # only the bf16 projections differ


def test_a_non_sdpa_model_is_left_alone():
    model = tiny_llama()
    model.set_attn_implementation("eager")
    assert use_training_attention(model, fp32_inside_bf16=True) is None and model.config._attn_implementation == "eager"


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize(
    "precision, sampling, attention",
    [("bf16", "bfloat16", NAME), ("bf16", "float32", NAME), ("fp32", "float32", GROUPED)],
)
def test_the_trainer_switches_only_the_training_policy(tiny_model_dir, tmp_path, precision, sampling, attention):
    cfg = from_dict(
        {
            "model": {"name": tiny_model_dir},
            "task": {"options": {"num_train": 4, "num_test": 2}},
            "rollout": {"group_size": 2, "max_new_tokens": 4, "dtype": sampling},
            "train": {"steps": 1, "prompts_per_step": 1, "precision": precision, "device": "cpu"},
            "run": {"output_dir": str(tmp_path)},
        }
    )
    trainer = Trainer(cfg, tmp_path / "run")
    assert trainer.policy.config._attn_implementation == attention
    # a sampler copy (bf16 sampling) keeps SDPA; a float32 sampler shares the policy, where the upcast is a no-op
    assert trainer.engine.own_copy == (sampling == "bfloat16")
    assert trainer.engine.model.config._attn_implementation == ("sdpa" if trainer.engine.own_copy else attention)
    assert ("attention" in trainer.precision) == (precision == "bf16")
