"""Precision by measurement (grpolab/training/precision.py): the rule on given numbers, the per-machine cache, what a run
records (manifest and objective card: setting, resolution, probe numbers) and that a resume keeps its recorded
choice. No test asserts a timing: the measurement itself is replaced by fakes wherever a result is checked."""

from __future__ import annotations

import json
from typing import Callable

import earnable
import pytest
import torch

from grpolab.card import objective_card
from grpolab.config import from_dict
from grpolab.errors import ConfigError, GrpolabError
from grpolab.runs import resume_run, start_run
from grpolab.training import precision

SHAPES = {"update": [56, 32, 64], "sampling": [4, 32, 100]}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def probe_not_forced(monkeypatch):
    """These tests are about the probe: the suite's forced precision (conftest) is removed here."""
    monkeypatch.delenv(precision.FORCE_ENV, raising=False)


def probed(speedup: float, shapes: dict = SHAPES) -> dict:
    """What precision.probe returns when bf16 runs `speedup` times as fast as fp32 (100 GFLOP/s) for both uses."""
    products = {
        use: {"shape": s, "fp32_gflops": 100.0, "bf16_gflops": 100.0 * speedup, "speedup": speedup}
        for use, s in shapes.items()
    }
    return {"key": "fake", "cached": False, "products": products}


class FakeProbe:
    """A stand-in for precision.probe: fixed numbers, and a count of its calls."""

    def __init__(self, speedup: float):
        self.speedup, self.calls = speedup, 0

    def __call__(self, shapes: dict) -> dict:
        self.calls += 1
        return probed(self.speedup, shapes)


# ----------------------------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    "speedup, update, sampling",
    [
        (1.3, "bf16", "bfloat16"),
        (1.05, "fp32", "float32"),
        (precision.BF16_MARGIN, "bf16", "bfloat16"),
        (0.02, "fp32", "float32"),
    ],
)
def test_auto_picks_bf16_only_when_clearly_faster(speedup, update, sampling):
    r = precision.resolve("auto", "auto", "cpu", SHAPES, run_probe=lambda s: probed(speedup))
    assert (r["update"], r["sampling"]) == (update, sampling)
    assert r["setting"] == {"update": "auto", "sampling": "auto"} and r["source"].startswith("auto: probe")
    assert r["probe"]["products"]["update"]["bf16_gflops"] == pytest.approx(100 * speedup)
    assert r["probe"]["margin"] == precision.BF16_MARGIN


def test_an_explicit_setting_wins_and_is_recorded_as_explicit():
    fake = FakeProbe(1.3)
    r = precision.resolve("fp32", "float32", "cpu", SHAPES, run_probe=fake)
    assert (r["update"], r["sampling"], r["source"]) == ("fp32", "float32", "explicit") and fake.calls == 0
    assert "probe" not in r
    mixed = precision.resolve("fp32", "auto", "cpu", SHAPES, run_probe=fake)  # only the auto one follows the probe
    assert (mixed["update"], mixed["sampling"]) == ("fp32", "bfloat16") and fake.calls == 1
    assert mixed["source"].startswith("update explicit; sampling auto: probe")


def test_cuda_decides_by_device_support_without_probing(monkeypatch):
    def no_probe(shapes):
        raise AssertionError("probed on CUDA")

    for supported, update in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: supported)
        r = precision.resolve("auto", "auto", "cuda", SHAPES, run_probe=no_probe)
        assert r["update"] == update and "CUDA" in r["source"] and "probe" not in r


def test_a_baselines_update_precision_is_measured_unless_given(monkeypatch):
    """SFT and DPO resolve their update precision as the trainer does: before, SFT hard-coded bf16, 0.02-0.19x fp32's
    rate on a CPU without bf16 units."""
    model = torch.nn.Linear(8, 8)
    model.get_input_embeddings = lambda: torch.nn.Embedding(100, 32)
    model.config = type("C", (), {"intermediate_size": 64})()
    for speedup, want in ((0.1, "fp32"), (1.5, "bf16")):
        monkeypatch.setattr(precision, "probe", lambda shapes, s=speedup: probed(s, shapes))
        r = precision.resolve_update("auto", model, 4, 16)
        assert r["update"] == want and r["source"].startswith("update auto: probe")
        assert r["probe"]["products"]["update"]["shape"][1:] == [32, 64]  # hidden x intermediate of this model
    monkeypatch.setattr(precision, "probe", FakeProbe(1.5))
    assert precision.resolve_update("fp32", model, 4, 16)["update"] == "fp32" and precision.probe.calls == 0
    with pytest.raises(GrpolabError, match="expected fp32, bf16 or auto, got 'fp16'"):
        precision.resolve_update("fp16", model, 4, 16)


def test_the_rate_formula_and_the_shapes_fit_the_budget():
    assert precision.gflops(2, 3, 4, 1e-9) == pytest.approx(2 * 2 * 3 * 4)  # 2 m n k / s / 1e9
    shapes = precision.probe_shapes(576, 1536, 49152, micro_batch_size=16, max_new_tokens=48, group_size=8)
    m, k, n = shapes["update"]
    assert [k, n] == [576, 1536] and 2 * m * k * n <= precision.MAX_PROBE_FLOP  # hidden sizes kept, tokens cut
    assert shapes["sampling"] == [8, 576, 49152]  # decoding: the whole head (113 MB in fp32), read from memory
    qwen_7b = precision.probe_shapes(3584, 18944, 152064, micro_batch_size=4, max_new_tokens=256, group_size=8)
    m, k, n = qwen_7b["sampling"]
    assert [m, k] == [8, 3584] and 4 * k * n <= precision.MAX_SAMPLING_WEIGHT_BYTES < 4 * k * (n + 1)


def test_auto_is_accepted_and_a_wrong_value_names_the_field():
    cfg = from_dict({})
    assert (cfg.train.precision, cfg.rollout.dtype) == ("auto", "auto")
    with pytest.raises(ConfigError, match="train.precision: expected one of 'auto', 'fp32', 'bf16'"):
        from_dict({"train": {"precision": "float32"}})
    with pytest.raises(ConfigError, match="rollout.dtype: expected one of 'auto', 'float32', 'bfloat16'"):
        from_dict({"rollout": {"dtype": "bf16"}})
    card = objective_card(cfg)["choices"]["precision"]  # no trainer yet: the settings, left open
    assert card["update"] == "auto" and "when the trainer is built" in card["source"]


# ----------------------------------------------------------------------------------------------- the cache


class FakeTimer:
    """A stand-in for precision.sample_seconds: seconds per product from `seconds(dtype, call_index)`, and a log."""

    def __init__(self, seconds: Callable[[torch.dtype, int], float]):
        self.seconds, self.calls = seconds, []

    def __call__(self, m, k, n, dtype) -> float:
        self.calls.append((m, k, n, dtype))
        return self.seconds(dtype, len(self.calls) - 1)


def speed(speedup: float) -> FakeTimer:
    """fp32 1 ms per product, bf16 1 ms / speedup."""
    return FakeTimer(lambda dtype, i: 1e-3 if dtype == torch.float32 else 1e-3 / speedup)


SAMPLES_PER_PROBE = 2 * 2 * (precision.WARMUP_REPS + precision.REPEATS)  # 2 uses x 2 dtypes


def test_the_probe_is_measured_once_per_machine_and_shapes(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPOLAB_CACHE", str(tmp_path))
    timer = speed(0.25)
    first = precision.probe(SHAPES, timer)
    assert len(timer.calls) == SAMPLES_PER_PROBE and first["cached"] is False
    assert first["products"]["update"] == {
        "shape": [56, 32, 64],
        "fp32_gflops": round(2 * 56 * 32 * 64 / 1e-3 / 1e9, 2),
        "bf16_gflops": round(2 * 56 * 32 * 64 / 4e-3 / 1e9, 2),
        "speedup": 0.25,
    }
    assert first["decision"] == {"update": "fp32", "sampling": "fp32"} and "measured" in first
    again = precision.probe(SHAPES, timer)
    assert len(timer.calls) == SAMPLES_PER_PROBE and again["cached"] is True and again["products"] == first["products"]
    assert json.loads((tmp_path / precision.CACHE_FILE).read_text())[first["key"]]["decision"] == first["decision"]

    other = {**SHAPES, "update": [28, 32, 64]}
    assert precision.probe(other, timer)["cached"] is False and len(timer.calls) == 2 * SAMPLES_PER_PROBE
    monkeypatch.setattr(torch, "get_num_threads", lambda: 7)
    assert precision.probe(SHAPES, timer)["cached"] is False and len(timer.calls) == 3 * SAMPLES_PER_PROBE
    assert precision.probe(SHAPES, timer)["cached"] is True and len(timer.calls) == 3 * SAMPLES_PER_PROBE


def test_an_unreadable_cache_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPOLAB_CACHE", str(tmp_path))
    (tmp_path / precision.CACHE_FILE).write_text("{not json")
    timer = speed(1.0)
    assert precision.probe(SHAPES, timer)["cached"] is False and len(timer.calls) == SAMPLES_PER_PROBE
    assert precision.probe(SHAPES, timer)["cached"] is True  # and the file is whole again


def test_the_median_of_alternating_samples_ignores_a_stall():
    """One sample in five stalled 20x (another process took the core): the median is still the true rate, where
    the mean (or a single 3 ms sample) would have flipped the decision."""

    def seconds(dtype, i):
        base = 1e-3 if dtype == torch.float32 else 1e-3 / 1.4
        return base * (20 if i == 2 * precision.WARMUP_REPS + 3 else 1)  # the 2nd timed bf16 sample stalls

    timer = FakeTimer(seconds)
    products = precision.measure({"update": [8, 16, 16]}, timer)
    assert products["update"]["speedup"] == pytest.approx(1.4, rel=1e-2)
    timed = [d for *_, d in timer.calls[2 * precision.WARMUP_REPS :]]
    assert timed[:4] == [torch.float32, torch.bfloat16, torch.float32, torch.bfloat16]  # alternating


def test_a_slow_dtype_stops_at_its_budget_with_at_least_one_sample():
    timer = FakeTimer(lambda dtype, i: 1e-3 if dtype == torch.float32 else 0.6)  # bf16 600x slower
    precision.measure({"update": [8, 16, 16]}, timer)
    bf16_timed = [c for c in timer.calls[2 * precision.WARMUP_REPS :] if c[3] == torch.bfloat16]
    assert len(bf16_timed) == 2  # 0.6 s, then 1.2 s >= DTYPE_BUDGET_S: stop
    assert len([c for c in timer.calls if c[3] == torch.float32]) == precision.WARMUP_REPS + precision.REPEATS


@pytest.mark.parametrize(
    "recorded, measured, decision",
    [
        ("bf16", 1.10, "bf16"),
        ("bf16", 1.06, "bf16"),
        ("bf16", 1.04, "fp32"),  # inside the band the record stands
        ("fp32", 1.20, "fp32"),
        ("fp32", 1.24, "fp32"),
        ("fp32", 1.26, "bf16"),
    ],
)
def test_a_re_probe_keeps_the_recorded_decision_inside_the_band(tmp_path, monkeypatch, recorded, measured, decision):
    """An entry of the older probe (numbers only, decided at BF16_MARGIN) is measured again; the new numbers change
    its decision only outside the hysteresis band."""
    monkeypatch.setenv("GRPOLAB_CACHE", str(tmp_path))
    key = precision.cache_key(SHAPES)
    old_speedup = 1.3 if recorded == "bf16" else 1.0
    old = {
        use: {"shape": s, "fp32_gflops": 100.0, "bf16_gflops": 100.0 * old_speedup, "speedup": old_speedup}
        for use, s in SHAPES.items()
    }
    (tmp_path / precision.CACHE_FILE).write_text(json.dumps({key: {"products": old}}))
    p = precision.probe(SHAPES, speed(measured))
    assert p["cached"] is False and p["previous_decision"]["update"] == recorded
    assert p["decision"] == {"update": decision, "sampling": decision}


def test_probes_of_a_speedup_at_the_margin_agree(tmp_path, monkeypatch):
    """The flip the issue saw (one shape measured 1.10x then 0.87x a minute apart, one 3 ms product each): with
    noisy samples around 1.15x (+-8% each, deterministic pseudo-noise) the first probe decides and every re-probe of the
    same shapes, whatever its noise, keeps that decision."""
    monkeypatch.setenv("GRPOLAB_CACHE", str(tmp_path))
    import random

    decisions, speedups = [], []
    for trial in range(12):
        rng = random.Random(trial)
        timer = FakeTimer(lambda dtype, i: (1e-3 if dtype == torch.float32 else 1e-3 / 1.15) * rng.uniform(0.92, 1.08))
        p = precision.probe(SHAPES, timer, refresh=bool(trial))  # measured again every time
        decisions.append(p["decision"]["update"])
        speedups.append(p["products"]["update"]["speedup"])
    assert min(speedups) < precision.BF16_MARGIN < max(speedups)  # the numbers alone would have flipped
    assert len(set(decisions)) == 1, (decisions, speedups)


def test_a_sample_repeats_the_product_until_its_minimum_time(monkeypatch):
    clock = iter(i * 0.003 for i in range(1000))  # every product 3 ms
    monkeypatch.setattr(precision.time, "perf_counter", lambda: next(clock))
    assert precision.sample_seconds(4, 4, 4, torch.float32, min_s=0.02) == pytest.approx(0.003)


def test_the_forcing_variable_decides_auto_without_a_probe(monkeypatch):
    def no_probe(shapes):
        raise AssertionError("probed while forced")

    for value, update, sampling in (
        ("bf16", "bf16", "bfloat16"),
        ("fp32", "fp32", "float32"),
        ("bfloat16", "bf16", "bfloat16"),
    ):
        monkeypatch.setenv(precision.FORCE_ENV, value)
        r = precision.resolve("auto", "auto", "cpu", SHAPES, run_probe=no_probe)
        assert (r["update"], r["sampling"]) == (update, sampling) and "forced by GRPOLAB_PRECISION" in r["source"]
        assert precision.resolve("fp32", "float32", "cpu", SHAPES, run_probe=no_probe)["source"] == "explicit"
    monkeypatch.setenv(precision.FORCE_ENV, "fp16")
    with pytest.raises(GrpolabError, match="GRPOLAB_PRECISION: expected fp32 or bf16 .*got 'fp16'"):
        precision.resolve("auto", "auto", "cpu", SHAPES, run_probe=no_probe)


def test_the_real_probe_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    precision.measure({"update": [8, 16, 16]})
    assert torch.equal(state, torch.random.get_rng_state())


# ----------------------------------------------------------------------------------------------- runs


def tiny(model_dir: str, out, name: str, **train) -> dict:
    return {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 20, "num_test": 10}},
        "reward": earnable.reward_config(),
        "rollout": earnable.rollout_config(group_size=4, dtype="auto"),
        "algorithm": {"preset": "grpo", "beta": 0.0, "entropy_coef": 0.0},
        "train": {
            "steps": 1,
            "prompts_per_step": 2,
            "micro_batch_size": 4,
            "lr": 1e-3,
            "seed": 0,
            "samples_per_step": 0,
            "precision": "auto",
            **train,
        },
        "eval": {"every_steps": 0},
        "run": {"output_dir": str(out), "name": name},
    }


def sampler_dtype(trainer) -> torch.dtype:
    return next(trainer.engine.model.parameters()).dtype


def test_a_run_records_setting_resolution_and_probe_numbers(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(precision, "probe", fake := FakeProbe(0.5))
    trainer, manifest = start_run(from_dict(tiny(tiny_model_dir, tmp_path, "auto")))
    assert fake.calls == 1
    p = manifest["precision"]
    assert p["setting"] == {"update": "auto", "sampling": "auto"} and (p["update"], p["sampling"]) == (
        "fp32",
        "float32",
    )
    assert p["probe"]["cached"] is False and p["probe"]["margin"] == precision.BF16_MARGIN
    hidden, inter, vocab = precision.model_dims(trainer.policy)
    assert (hidden, inter) == (32, 64)  # conftest's tiny Llama
    assert p["probe"]["products"]["update"]["shape"][1:] == [32, 64]
    assert p["probe"]["products"]["sampling"]["shape"] == [4, 32, vocab]
    assert p["probe"]["products"]["sampling"]["fp32_gflops"] == 100.0
    card = manifest["objective"]["choices"]["precision"]
    assert (
        card
        == {
            "update": "fp32",
            "sampling": "float32",
            "source": p["source"],
            "rank_invariant_samples": precision.RANK_INVARIANCE["float32"],
        }
        and "0.5x" in card["source"]
    )
    assert manifest["config"]["train"]["precision"] == "auto" and manifest["config"]["rollout"]["dtype"] == "auto"
    assert json.loads((tmp_path / "auto" / "manifest.json").read_text())["precision"] == p
    assert trainer.update_precision == "fp32" and sampler_dtype(trainer) == torch.float32
    assert trainer.cfg is trainer.config_given and trainer.cfg.train.precision == "auto"  # the config as given

    monkeypatch.setattr(precision, "probe", FakeProbe(1.3))  # bf16 clearly faster: the run uses it
    trainer, manifest = start_run(from_dict(tiny(tiny_model_dir, tmp_path, "fast-bf16")))
    assert trainer.update_precision == "bf16" and trainer.updater.precision == "bf16"
    assert trainer.sampling_dtype == "bfloat16" and trainer.cfg.rollout.dtype == "auto"
    assert sampler_dtype(trainer) == torch.bfloat16 and manifest["precision"]["sampling"] == "bfloat16"
    assert manifest["objective"]["choices"]["precision"]["rank_invariant_samples"].startswith("no: bf16 rounding")


def test_ppo_runs_its_critic_in_the_resolved_precision(tiny_model_dir, tmp_path, monkeypatch):
    from grpolab.baselines import critic

    monkeypatch.setattr(precision, "probe", FakeProbe(1.3))  # auto resolves to bf16
    seen, real = [], critic.completion_values

    def spy(model, rollout, rows, precision_used):
        seen.append(precision_used)
        return real(model, rollout, rows, precision_used)

    monkeypatch.setattr(critic, "completion_values", spy)
    raw = tiny(tiny_model_dir, tmp_path, "ppo")
    raw["algorithm"] = {"estimator": "gae", "beta": 0.0, "gamma": 1.0, "lam": 0.95}
    trainer, _ = start_run(from_dict(raw))
    trainer.fit()
    assert trainer.cfg.train.precision == "auto" and trainer.update_precision == "bf16"
    assert seen and set(seen) == {"bf16"}  # the critic's value passes, as the policy's


def test_an_explicit_run_is_recorded_as_explicit(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(precision, "probe", fake := FakeProbe(1.3))
    raw = tiny(tiny_model_dir, tmp_path, "explicit", precision="fp32")
    raw["rollout"]["dtype"] = "float32"
    trainer, manifest = start_run(from_dict(raw))
    assert fake.calls == 0 and manifest["precision"]["source"] == "explicit" and "probe" not in manifest["precision"]
    assert manifest["objective"]["choices"]["precision"] == {
        "update": "fp32",
        "sampling": "float32",
        "source": "explicit",
        "rank_invariant_samples": precision.RANK_INVARIANCE["float32"],
    }
    assert sampler_dtype(trainer) == torch.float32


def test_a_resumed_auto_run_keeps_its_recorded_choice(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(precision, "probe", FakeProbe(0.5))
    trainer, manifest = start_run(from_dict(tiny(tiny_model_dir, tmp_path, "r")))
    trainer.fit()
    run = tmp_path / "r"
    monkeypatch.setattr(precision, "probe", now := FakeProbe(1.3))  # this machine would now choose bf16
    assert precision.resolve("auto", "auto", "cpu", SHAPES)["update"] == "bf16" and now.calls == 1

    resumed, path = resume_run(run, [], allow_changes=False)  # no difference: the recorded choice is reused
    assert now.calls == 1 and path is not None and path.name == "step-1"
    assert resumed.update_precision == "fp32" and sampler_dtype(resumed) == torch.float32
    after = json.loads((run / "manifest.json").read_text())
    assert after["precision"] == manifest["precision"] and after["resumes"][0]["differences"] == []

    with pytest.raises(GrpolabError, match="config.train.precision"):  # an override is a change like any other
        resume_run(run, ["train.precision=bf16"], allow_changes=False)
    resumed, _ = resume_run(run, ["train.precision=bf16"], allow_changes=True)  # ... and wins when allowed
    assert resumed.update_precision == "bf16" and resumed.sampling_dtype == "float32" and now.calls == 1
    assert resumed.cfg.train.precision == "bf16" and resumed.cfg.rollout.dtype == "auto"  # the override, as given
    after = json.loads((run / "manifest.json").read_text())
    assert after["precision"]["update"] == "bf16" and after["precision"]["sampling"] == "float32"
    assert after["precision"]["source"] == "update explicit; sampling auto: recorded by the run"
    assert after["precision"]["probe"] == manifest["precision"]["probe"]  # the numbers the kept choice was made on
    assert after["objective"]["choices"]["precision"]["update"] == "bf16"
