"""The fp16 option (train.precision: fp16, rollout.dtype: float16): the loss scale's rule by hand, a step with an
inf gradient skipped with the weights unchanged, a real fp16 overflow, the fp16 update against fp32 (and bf16), the
fp16 sampler, the configs refused, the warning on a CPU without fp16 units, and that auto never picks fp16.

Every test forces its precision (no test reads the machine's). The models are tiny: fp16 products on a CPU without
fp16 units are conversions, many times slower than fp32."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grpolab.config import from_dict
from grpolab.errors import ConfigError, GrpolabError
from grpolab.rollout.base import Rollout
from grpolab.training import precision
from grpolab.training.loss_scale import MIN_SCALE, LossScaler, next_scale
from grpolab.training.update import PolicyUpdater

VOCAB, G, GROUPS, LP, LC = 64, 4, 3, 5, 6
FP16_EPS, BF16_EPS = 2.0**-10, 2.0**-7  # spacing of the floats just above 1: 10 and 7 mantissa bits


def tiny_policy() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
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
    groups = torch.arange(GROUPS).repeat_interleave(G)
    truncated = torch.zeros(n, dtype=torch.bool)
    return Rollout(
        prompt_ids, torch.ones_like(prompt_ids), cids, cmask, torch.zeros(n, LC), truncated, groups, [""] * n
    )


def updater(policy, precision: str = "fp16", **train) -> PolicyUpdater:
    cfg = from_dict(
        {
            "rollout": {"group_size": G, "max_new_tokens": LC, "temperature": 0.9, "dtype": "float32"},
            "algorithm": {"beta": 0.0},
            "train": {"prompts_per_step": GROUPS, "micro_batch_size": 4, "precision": precision, "seed": 0, **train},
        }
    )
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
    return PolicyUpdater(cfg, policy, None, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0))


def update(u: PolicyUpdater) -> dict[str, float]:
    advantages = torch.linspace(-1.0, 1.0, G * GROUPS)
    return u.update(rollout(), advantages, torch.ones(G * GROUPS, dtype=torch.bool))


def weights(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


# ------------------------------------------------------------------------------------------ the scale's rule


def test_the_scale_halves_on_overflow_and_doubles_after_n_good_steps():
    """growth_interval 3 from 2^16, by hand: overflow -> 2^15; two good steps -> 2^15 (count 2); the third -> 2^16
    (count 0); an overflow resets the count: good, overflow, good, good -> 2^15 with count 2."""
    assert next_scale(65536.0, 2, True, 3) == (32768.0, 0)
    assert next_scale(32768.0, 0, False, 3) == (32768.0, 1)
    assert next_scale(32768.0, 2, False, 3) == (65536.0, 0)
    s = LossScaler(65536.0, growth_interval=3)
    seen = []
    for event in ("overflow", "good", "good", "good", "good", "overflow", "good", "good"):
        s.stepped() if event == "good" else s.overflowed()
        seen.append((s.scale, s.good_steps))
    assert seen == [
        (32768.0, 0),
        (32768.0, 1),
        (32768.0, 2),
        (65536.0, 0),
        (65536.0, 1),
        (32768.0, 0),
        (32768.0, 1),
        (32768.0, 2),
    ]
    assert s.overflow_steps == 2 and s.metrics() == {"optim/loss_scale": 32768.0, "optim/overflow_skipped_steps": 2.0}
    restored = LossScaler(1.0, 3)
    restored.load_state_dict(copy.deepcopy(s.state_dict()))
    assert restored.state_dict() == s.state_dict() == {"scale": 32768.0, "good_steps": 2, "overflow_steps": 2}


def test_the_loss_is_scaled_and_the_gradient_unscaled_exactly():
    s = LossScaler(1024.0, 2000)
    w = torch.nn.Parameter(torch.tensor([0.5, -0.25]))
    s.scaled((w * torch.tensor([3.0, 5.0])).sum()).backward()
    assert w.grad.tolist() == [3072.0, 5120.0]  # 1024 * d/dw
    s.unscale_([w, torch.nn.Parameter(torch.ones(1))])  # a parameter without a gradient is left alone
    assert w.grad.tolist() == [3.0, 5.0]


# ------------------------------------------------------------------------------------------ skipped steps


def test_an_inf_gradient_skips_the_step_with_the_weights_unchanged_and_halves_the_scale():
    policy = tiny_policy()
    u = updater(policy, grad_clip=0.0)
    before = weights(policy)
    for p in policy.parameters():
        p.grad = torch.full_like(p, 0.01 * 65536.0)
    next(policy.parameters()).grad[0, 0] = float("inf")
    assert u.optimizer_step() == float("inf")
    assert all(torch.equal(p, q) for p, q in zip(policy.parameters(), before))
    assert all(p.grad is None for p in policy.parameters()) and u.optimizer.state_dict()["state"] == {}
    assert (u.scaler.scale, u.scaler.overflow_steps, u.skipped_steps) == (32768.0, 1, 0)  # an overflow, not a fault
    for p in policy.parameters():  # the same step without the inf: taken, at the unscaled gradient 0.01
        p.grad = torch.full_like(p, 0.01 * 32768.0)
    u.optimizer_step()
    assert all(torch.allclose(p, q - 0.1 * 0.01, rtol=0, atol=1e-7) for p, q in zip(policy.parameters(), before))
    assert (u.scaler.scale, u.scaler.good_steps) == (32768.0, 1)


def test_at_the_minimum_scale_an_overflow_is_a_non_finite_step():
    policy = tiny_policy()
    u = updater(policy, loss_scale_init=MIN_SCALE)
    for p in policy.parameters():
        p.grad = torch.full_like(p, float("nan"))
    u.optimizer_step()
    assert (u.scaler.scale, u.scaler.overflow_steps, u.skipped_steps) == (MIN_SCALE, 0, 1)  # counts towards the stop


def test_a_real_fp16_overflow_is_skipped_then_the_scale_grows_after_good_steps():
    """At S = 2^40 the scaled gradient of the fp16 backward overflows 65504: the step is skipped (weights unchanged)
    and S halves; at S = 2^16 with growth_interval 2, two good updates double it."""
    policy = tiny_policy()
    before = weights(policy)
    m = update(updater(policy, loss_scale_init=2.0**40))
    assert m["optim/loss_scale"] == 2.0**39 and m["optim/overflow_skipped_steps"] == 1.0
    assert m["optim/skipped_steps"] == 0.0
    assert all(torch.equal(p, q) for p, q in zip(policy.parameters(), before))
    u = updater(policy, loss_scale_growth_interval=2)
    assert update(u)["optim/loss_scale"] == 2.0**16
    assert not all(torch.equal(p, q) for p, q in zip(policy.parameters(), before))  # taken
    m = update(u)
    assert m["optim/loss_scale"] == 2.0**17 and m["optim/overflow_skipped_steps"] == 0.0


# ------------------------------------------------------------------------------------------ fp16 against fp32


def test_the_fp16_update_matches_fp32_within_fp16_rounding():
    """One SGD update of the same model on the same batch in fp32, fp16 and bf16. The weight change of the fp16 run
    is the fp32 one up to the rounding of the products' fp16 inputs: each rounds by at most u = eps/2 = 2^-11
    relative, and a gradient passes through some 10 of them (2 layers, forward and backward), whose independent
    errors add in quadrature: ~sqrt(10) u = 1.6 eps. The bound is 4 eps of the largest change (measured: 0.5 eps);
    bf16, whose eps is 8x fp16's, exceeds it (measured: 4.9 eps), so the test tells the two apart."""
    runs = {}
    for p in ("fp32", "fp16", "bf16"):
        policy = tiny_policy()
        before = weights(policy)
        metrics = update(updater(policy, p, grad_clip=0.0))
        runs[p] = (torch.cat([(a - b).flatten() for a, b in zip(policy.parameters(), before)]).double(), metrics)
    d32, d16, d16bf = runs["fp32"][0], runs["fp16"][0], runs["bf16"][0]
    scale = d32.abs().max()
    err16, err_bf16 = (d16 - d32).abs().max() / scale, (d16bf - d32).abs().max() / scale
    assert scale > 1e-3  # the update moved the weights
    assert 0 < err16 <= 4 * FP16_EPS < err_bf16, (err16, err_bf16)
    h32, h16 = runs["fp32"][1]["policy/entropy"], runs["fp16"][1]["policy/entropy"]  # from the fp16 logits
    assert 0 < abs(h16 - h32) <= 4 * FP16_EPS * h32, (h16, h32)


def test_the_fp16_sampler_samples_with_float16_weights_close_to_the_fp32_trainer(tiny_model_dir):
    """rollout.dtype float16: the engine's own copy is float16, and its log-probabilities of the tokens it sampled
    differ from the fp32 trainer's by fp16's rounding of the activations (u = eps/2 relative per product, a few
    products deep): bound 2 eps of the largest logit's magnitude (at least 1)."""
    from grpolab.algo.logprobs import token_logprobs
    from grpolab.models.load import load_causal_lm, load_tokenizer
    from grpolab.rollout.base import SamplingParams
    from grpolab.rollout.engines import SAMPLER_DTYPES
    from grpolab.rollout.grpolab_engine import GrpolabEngine

    policy, tok = load_causal_lm(tiny_model_dir, "float32").eval(), load_tokenizer(tiny_model_dir)
    engine = GrpolabEngine(policy, tok, SAMPLER_DTYPES["float16"])
    assert engine.own_copy and next(engine.model.parameters()).dtype == torch.float16
    prompts = [[5, 9, 13, 2], [7, 3]]
    out = engine.generate(prompts, SamplingParams(group_size=2, max_new_tokens=5, temperature=1.0), seeds=[1, 2])
    worst = 0.0
    for i in range(len(out)):
        n = int(out.completion_mask[i].sum())
        comp = out.completion_ids[i, :n]
        with torch.no_grad():
            logits = policy(torch.tensor([prompts[i // 2] + comp.tolist()])).logits[0, len(prompts[i // 2]) - 1 : -1]
        worst = max(worst, (token_logprobs(logits, comp, 1.0) - out.sampler_logprobs[i, :n]).abs().max().item())
    assert 0 < worst < 2 * FP16_EPS * max(1.0, logits.abs().max().item()), worst  # measured: 0.16 eps


# ------------------------------------------------------------------------------------------ config and resolution


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"model": {"dtype": "bfloat16"}}, "model.dtype: expected float32 with train.precision fp16"),
        ({"train": {"strategy": "fsdp2"}}, "train.strategy: expected ddp with train.precision fp16"),
        ({"algorithm": {"estimator": "gae"}}, "algorithm.estimator: expected anything but gae with train.precision"),
    ],
)
def test_an_unsupported_fp16_combination_is_refused_naming_the_field(extra, field):
    raw = {**extra, "train": {"precision": "fp16", **extra.get("train", {})}}
    with pytest.raises(ConfigError, match=field):
        from_dict(raw)
    from_dict({**raw, "train": {**raw["train"], "precision": "bf16"}})  # the same fields are fine in bf16


def test_fp16_is_explicit_only_and_auto_never_picks_it(monkeypatch):
    shapes = {"update": [8, 16, 16], "sampling": [4, 16, 32]}
    r = precision.resolve("fp16", "float16", "cpu", shapes, run_probe=lambda s: pytest.fail("no probe"))
    assert (r["update"], r["sampling"], r["source"]) == ("fp16", "float16", "explicit")
    monkeypatch.delenv(precision.FORCE_ENV, raising=False)
    fast = {"key": "k", "cached": False, "products": {u: {"speedup": 50.0} for u in shapes}}
    r = precision.resolve("auto", "auto", "cpu", shapes, run_probe=lambda s: fast)
    assert (r["update"], r["sampling"]) == ("bf16", "bfloat16")
    monkeypatch.setenv(precision.FORCE_ENV, "fp16")
    with pytest.raises(GrpolabError, match="GRPOLAB_PRECISION: expected fp32 or bf16"):
        precision.resolve("auto", "auto", "cpu", shapes)
    with pytest.raises(GrpolabError, match="fp16 is the GRPO update's only"):
        precision.resolve_update("fp16", tiny_policy(), 4, 16)


def test_a_cpu_without_fp16_units_gets_a_warning_naming_the_field(tmp_path, monkeypatch):
    note = precision.fp16_note("fp16", "float16", "cpu", has_units=False)
    assert note.startswith("train.precision fp16 and rollout.dtype float16 on a CPU without fp16 units")
    assert "slower than fp32" in note
    assert precision.fp16_note("fp32", "float16", "cpu", has_units=False).startswith("rollout.dtype float16 on")
    assert precision.fp16_note("fp16", "float32", "cpu", has_units=True) is None
    assert precision.fp16_note("fp16", "float16", "cuda", has_units=False) is None
    assert precision.fp16_note("bf16", "bfloat16", "cpu", has_units=False) is None
    monkeypatch.setattr(torch.cpu, "_is_amx_fp16_supported", lambda: False, raising=False)
    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: X\nflags\t\t: fpu avx2 f16c avx512_bf16\n")
    assert precision.cpu_has_fp16_units(str(info)) is False  # f16c converts, it does not multiply
    info.write_text("model name\t: X\nflags\t\t: fpu avx2 avx512f avx512_fp16\n")
    assert precision.cpu_has_fp16_units(str(info)) is True
