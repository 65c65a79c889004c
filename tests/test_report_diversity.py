"""FAIL means the model must not ship (issue 26): the pass@k diversity check on constructed evidence, its eval and
cache (no model), and the verdict of demo-like evidence -- an entropy collapse WARNs, a measured pass@k drop FAILs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpolab.errors import GrpolabError
from grpolab.gate.base import FAIL, NA, PASS, WARN
from grpolab.gate.regression import check_diversity
from grpolab.gate.thresholds import Thresholds
from grpolab.gate.verdict import DONT_SHIP, NOT_ESTABLISHED, SHIP, all_checks, verdict
from grpolab.models.checkpoint import latest_checkpoint
from grpolab.report.diversity import (
    CACHE_NAME,
    DiversitySettings,
    diversity_comparison,
    problem_pass_at_k,
    run_diversity,
)
from grpolab.report.safety import summarize

T = Thresholds()


def evidence(mean: float, lo: float, hi: float) -> dict:
    return {
        "k": 8,
        "samples": 8,
        "temperature": 0.8,
        "n": 64,
        "source": "eval/diversity.json",
        "base": {"mean": 0.8, "ci_low": 0.7, "ci_high": 0.9},
        "trained": {"mean": 0.8 + mean, "ci_low": 0, "ci_high": 1},
        "diff": {"mean": mean, "ci_low": lo, "ci_high": hi},
        "pass1": {"mean": 0.2, "ci_low": 0.1, "ci_high": 0.3},
    }


def test_diversity_check_fail_warn_pass_na():
    fail = check_diversity(evidence(-0.12, -0.2, -0.05), "", T)
    assert fail.status == FAIL and "pass@8 dropped" in fail.reason and fail.numbers["ci_high"] == -0.05
    assert check_diversity(evidence(-0.03, -0.1, 0.04), "", T).status == WARN  # a drop not ruled out
    # issue 60: PASS is non-inferiority at diversity_margin 0.05 (it was a low end >= 0): a low end of -0.01 PASSes,
    # one of -0.06 does not (WARN, with the problems that would establish it)
    assert check_diversity(evidence(0.03, -0.01, 0.07), "", T).status == PASS
    unshown = check_diversity(evidence(0.0, -0.06, 0.06), "", T)
    assert unshown.status == WARN and unshown.noninferiority["pass@8"]["established"] is False
    assert check_diversity(evidence(0.02, 0.0, 0.05), "", T).status == PASS  # low end at 0: no drop
    # the interval, not the estimate: an estimate of -0.1 whose interval reaches 0 does not FAIL
    assert check_diversity(evidence(-0.1, -0.25, 0.0), "", T).status == WARN
    tolerant = T.replace({"diversity_tolerance": 0.05})
    assert check_diversity(evidence(-0.02, -0.04, -0.01), "", tolerant).status == PASS
    assert check_diversity(evidence(-0.02, -0.04, -0.01), "", T).status == FAIL
    na = check_diversity(None, "skipped with --skip-diversity", T)
    assert na.status == NA and na.reason == "not measured: skipped with --skip-diversity"


def sampled(models: list[tuple[str, str, list[list[bool]]]], temperature: float = 0.8) -> dict:
    rows = [
        {
            "model": name,
            "path": path,
            "items": [{"uid": f"p{i}", "samples": [{"correct": c} for c in s]} for i, s in enumerate(per)],
        }
        for name, path, per in models
    ]
    return {
        "task": "arithmetic",
        "decoding": {"samples": len(models[0][2][0]), "temperature": temperature},
        "models": rows,
    }


def test_diversity_comparison_hand_computed():
    """4 samples, k = 2: c = 1 -> 1 - C(3,2)/C(4,2) = 1/2; c = 2 -> 1 - 1/6 = 5/6; c = 0 -> 0; c = 4 -> 1."""
    base = [[True, False, False, False], [True, True, False, False]]
    trained = [[False] * 4, [True] * 4]
    d = diversity_comparison(sampled([("base", "b", base), ("run", "r", trained)]), 1, 2, "x")
    assert d["base"]["mean"] == pytest.approx((1 / 2 + 5 / 6) / 2) and d["trained"]["mean"] == pytest.approx(0.5)
    assert d["diff"]["mean"] == pytest.approx(((0 - 1 / 2) + (1 - 5 / 6)) / 2)
    assert d["by_uid"]["p0"] == pytest.approx((0.5, 0.0)) and d["pass1"]["mean"] == pytest.approx((-0.25 + 0.5) / 2)
    assert (d["k"], d["samples"], d["temperature"], d["n"]) == (2, 4, 0.8, 2)
    with pytest.raises(GrpolabError, match="pass@8 needs at least 8"):
        problem_pass_at_k({"uid": "p", "samples": [{"correct": True}] * 4}, 8)
    with pytest.raises(GrpolabError, match="at least k = 8"):
        DiversitySettings(samples=4)


CONFIG = {
    "model": {"name": "bundled:smollm2-135m-instruct"},
    "task": {"name": "arithmetic", "options": {"max_operand": 20}},
    "rollout": {"temperature": 0.8, "top_p": 1.0, "max_new_tokens": 48},
    "eval": {"split": "test"},
}


def checkpointed(tmp_path: Path, step: int) -> Path:
    ckpt = tmp_path / "run" / "checkpoints" / f"step-{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.pt").write_bytes(b"")
    return tmp_path / "run"


def test_run_diversity_samples_at_the_training_temperature_and_caches(tmp_path, monkeypatch):
    calls = []

    def fake_run_eval(
        models,
        task,
        options,
        split,
        limit,
        max_new_tokens,
        batch_size,
        dtype,
        samples,
        temperature,
        top_p,
        seed,
        progress=None,
    ):
        calls.append((models, task, options, split, limit, max_new_tokens, samples, temperature, top_p))
        n = 30  # at the minimum of evidence (min_diversity_problems)
        return sampled(
            [(models[0], models[0], [[True] + [False] * 7] * n), (models[1], models[1], [[False] * 8] * n)], temperature
        )

    monkeypatch.setattr("grpolab.evaluation.heldout.run_eval", fake_run_eval)
    run = checkpointed(tmp_path, 10)
    d, note = run_diversity(run, latest_checkpoint(run), CONFIG, "base", DiversitySettings(), "float32", lambda s: None)
    assert note == "" and calls == [
        (["base", str(run / "checkpoints" / "step-10")], "arithmetic", {"max_operand": 20}, "test", 64, 48, 8, 0.8, 1.0)
    ]
    assert d["diff"]["mean"] == -1.0 and check_diversity(d, note, T).status == FAIL
    assert json.loads((run / "eval" / CACHE_NAME).read_text())["diversity"]["checkpoint"] == "step-10"
    run_diversity(run, latest_checkpoint(run), CONFIG, "base", DiversitySettings(), "float32", lambda s: None)
    assert len(calls) == 1  # cached
    checkpointed(tmp_path, 20)  # a newer checkpoint: the cache no longer describes the trained model
    run_diversity(run, latest_checkpoint(run), CONFIG, "base", DiversitySettings(), "float32", lambda s: None)
    run_diversity(
        run, latest_checkpoint(run), CONFIG, "base", DiversitySettings(n_problems=32), "float32", lambda s: None
    )
    assert len(calls) == 3 and calls[-1][4] == 32


def test_run_diversity_not_measured_reasons(tmp_path):
    (tmp_path / "empty").mkdir()
    assert run_diversity(tmp_path / "empty", None, CONFIG, "b", DiversitySettings(), "float32", print) == (
        None,
        "the run directory has no complete checkpoint to sample",
    )
    agent = {**CONFIG, "task": {"name": "agent"}}
    d, note = run_diversity(tmp_path / "empty", None, agent, "b", DiversitySettings(), "float32", print)
    assert d is None and "one greedy episode" in note
    with pytest.raises(GrpolabError, match="config.rollout.temperature"):
        run_diversity(
            checkpointed(tmp_path, 1),
            tmp_path / "run" / "checkpoints" / "step-1",
            {"task": {"name": "arithmetic"}},
            "b",
            DiversitySettings(),
            "float32",
            print,
        )


# ---------------------------------------------------------------- the verdict of demo-like evidence

DEMO = {
    "reward": {"weights": {"correct": 1.0, "format": 0.0}},
    "algorithm": {"preset": "grpo", "beta": 0.0, "kl_placement": "loss", "overlong_buffer": 0},
    "train": {"mu": 1, "minibatches": 1},
}
MANIFEST = {
    "command": "grpolab train configs/quickstart.yaml",
    "git": {"commit": "abc", "dirty": False},
    "hashes": {"model_weights": "h"},
}


def demo_rows(entropy_late: float = 0.19) -> list[dict]:
    """30 steps of the demo: correctness rises 0.3 -> 0.6, entropy falls 1.0 -> entropy_late (x0.19: issue 26)."""
    rows = []
    for i in range(30):
        c = 0.3 + 0.3 * i / 29
        rows.append(
            {
                "step": i + 1,
                "reward/mean": c,
                "reward/correct/mean": c,
                "groups/frac_zero_std": 0.3,
                "completion/len_mean": 20.0 + i % 3,
                "completion/truncated_frac": 0.05 - 0.001 * i,
                "policy/entropy": 1.0 if i < 6 else (entropy_late if i >= 24 else 0.6),
                "sampler/logp_diff_mean": 0.0,
                "sampler/logp_diff_max": 0.0,
            }
        )
    return rows


def demo_evidence(diversity: dict | None) -> dict:
    prompts = [{"id": str(i), "category": "x", "prompt": "p"} for i in range(30)]
    return {
        "heldout": {
            "diff": {"mean": 0.259, "ci_low": 0.199, "ci_high": 0.320, "n": 266},
            "source": "eval/base_vs_trained.json",
        },
        "capability": [
            {
                "task": "arithmetic",
                "n": 100,
                "base": {"accuracy": 0.2},
                "trained": {"accuracy": 0.456},
                "diff": {"mean": 0.256, "ci_low": 0.077, "ci_high": 0.436},
            }
        ],
        "safety": summarize(prompts, ["I cannot."] * 30, ["I cannot."] * 30),
        "diversity": diversity,
        "diversity_note": "skipped with --skip-diversity",
    }


def test_demo_with_collapsed_entropy_and_a_clear_gain_ships_with_a_warning():
    # 30 unchanged safety prompts cannot show non-inferiority at 0.05 (exact interval +-0.116): without the waiver
    # the verdict is not established (issue 60); with it, it ships and names the waiver
    evidence_ = demo_evidence(evidence(0.05, -0.02, 0.12))
    assert verdict(all_checks(demo_rows(), [], DEMO, [MANIFEST], evidence_, T))[0] == NOT_ESTABLISHED
    checks = all_checks(demo_rows(), [], DEMO, [MANIFEST], evidence_, T, waived=["safety"])
    by_name = {c.name: c for c in checks}
    assert by_name["entropy_collapse"].status == WARN and by_name["entropy_collapse"].numbers["ratio"] == 0.19
    assert by_name["pass_at_k_diversity"].status == PASS  # [-0.02, +0.12]: non-inferior at 0.05 (was a WARN)
    label, why = verdict(checks)
    assert label == SHIP and "entropy_collapse" in why and why.endswith("waived by the user: safety_regression"), why
    assert [c.name for c in checks if c.status == FAIL] == []
    # without the diversity measurement the check is N/A and the verdict rests on the rest
    unmeasured = all_checks(demo_rows(), [], DEMO, [MANIFEST], demo_evidence(None), T, waived=["safety"])
    assert verdict(unmeasured)[0] == SHIP


def test_demo_whose_pass_at_8_dropped_beyond_its_interval_is_not_shipped():
    checks = all_checks(demo_rows(), [], DEMO, [MANIFEST], demo_evidence(evidence(-0.09, -0.16, -0.02)), T)
    label, why = verdict(checks)
    assert label == DONT_SHIP and why == "failing checks: pass_at_k_diversity"
    assert checks[0].name == "pass_at_k_diversity" and checks[0].status == FAIL  # failing checks first


def test_entropy_ratio_either_side_of_the_old_fail_line_gives_the_same_verdict():
    """x0.19 and x0.21 (the old FAIL line was x0.2): the same WARN and the same verdict on every machine."""
    div = demo_evidence(evidence(0.0, -0.03, 0.03))  # non-inferior pass@8 (a zero-width one no longer is)
    verdicts = {
        verdict(all_checks(demo_rows(late), [], DEMO, [MANIFEST], div, T, waived=["safety"]))[0]
        for late in (0.19, 0.21, 0.01)
    }
    assert verdicts == {SHIP}
