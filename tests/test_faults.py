"""Faults inside the loop: a reward that raises or hangs marks its samples invalid (never a silent 0, never a
hung trainer); NaN/Inf losses skip the update, are counted, and stop the run after K in a row."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from pathlib import Path

import pytest
import torch

from grpolab.config import from_dict
from grpolab.errors import GrpolabError
from grpolab.models import checkpoint as ckpt
from grpolab.rewards import REWARD_FUNCTIONS, RewardSpec, call_with_time_limit, score_completion
from grpolab.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(model_dir: str, out: Path, rewards: dict | None = None, **train) -> dict:
    return {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 50, "num_test": 20}},
        "reward": {"weights": rewards or {"correct": 1.0, "format": 0.1}},
        "rollout": {"group_size": 4, "max_new_tokens": 4, "dtype": "float32"},
        "algorithm": {"preset": "grpo", "beta": 0.0, "entropy_coef": 0.05},
        "train": {
            "steps": 1,
            "prompts_per_step": 2,
            "micro_batch_size": 8,
            "lr": 1e-2,
            "seed": 0,
            "samples_per_step": 8,
            **train,
        },
        "eval": {"every_steps": 0},
        "run": {"output_dir": str(out), "name": "run"},
    }


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def every_other(fail):
    """A reward that calls `fail()` on every second call and otherwise returns 1.0 and 0.0 in turn (so each group
    of four has two valid, different rewards: a real signal beside the invalid samples)."""
    calls = {"n": 0}

    def reward(completion: str, gold: str) -> float:
        calls["n"] += 1
        if calls["n"] % 2 == 0:
            return fail()
        return float(calls["n"] % 4 == 1)

    return reward


def boom() -> float:
    raise ValueError("boom")


def hang() -> float:
    time.sleep(30)  # released by the time limit; the abandoned daemon thread ends on its own
    return 1.0


@pytest.mark.parametrize("kind", ["raises", "hangs"])
def test_a_failing_reward_marks_samples_invalid_and_training_goes_on(
    tiny_model_dir, tmp_path, monkeypatch, caplog, kind
):
    fn, limit = (every_other(boom), 5.0) if kind == "raises" else (every_other(hang), 0.2)
    monkeypatch.setitem(REWARD_FUNCTIONS, "fragile", RewardSpec(fn, "fails every second call", time_limit_s=limit))
    trainer = Trainer(from_dict(tiny(tiny_model_dir, tmp_path, {"correct": 1.0, "fragile": 0.5})), tmp_path)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="grpolab"):
        trainer.fit()
    assert time.monotonic() - start < 20, "a hanging reward must not hang the trainer"
    (row,) = rows(tmp_path / "metrics.jsonl")
    assert row["reward/invalid_frac"] == 0.5
    assert row["reward/mean"] is not None and math.isfinite(row["reward/mean"])  # over the valid half only
    samples = rows(tmp_path / "samples.jsonl")
    invalid = [s for s in samples if s["reward"] is None]  # NaN in the log, never a silent 0
    assert len(invalid) == 4 and all(s["advantage"] == 0 and s["reward/fragile"] is None for s in invalid)
    assert all(s["advantage"] != 0 for s in samples if s["reward"] is not None)  # the valid ones still compare
    why = "ValueError: boom" if kind == "raises" else "TimeoutError: exceeded its time limit of 0.2 s"
    assert "4 of 8 completions have no valid reward" in caplog.text and why in caplog.text


def test_time_limit_abandons_a_stuck_worker_and_serves_later_calls():
    release = threading.Event()
    with pytest.raises(TimeoutError, match="time limit of 0.1 s"):
        call_with_time_limit(release.wait, (30,), 0.1)
    assert call_with_time_limit(lambda a, b: a + b, (2, 3), 1.0) == 5  # a fresh worker, not the stuck one
    with pytest.raises(KeyError):
        call_with_time_limit({}.__getitem__, ("x",), 1.0)  # the reward's own error reaches the caller
    assert call_with_time_limit(lambda: "direct", (), None) == "direct"
    release.set()


def test_score_completion_reports_a_timeout_as_invalid(monkeypatch):
    monkeypatch.setitem(REWARD_FUNCTIONS, "slow", RewardSpec(lambda c, g: hang(), "hangs", time_limit_s=0.05))
    result = score_completion(r"\boxed{4}", "4", {"correct": 1.0, "slow": 1.0})
    assert result.invalid and math.isnan(result.total) and result.components["correct"] == 1.0
    assert result.error == "slow: TimeoutError: exceeded its time limit of 0.05 s"


def test_nonfinite_losses_skip_the_update_and_stop_after_k_in_a_row(tiny_model_dir, tmp_path, monkeypatch):
    """Steps 1, 3 and 4 have a NaN loss (K = 2): step 1 is skipped (weights untouched), step 2 trains, step 4 is
    the second in a row and stops the run; the last good checkpoint (step 2) is intact."""
    import grpolab.training.update as update

    nan_steps, real = {1, 3, 4}, update.objective
    cfg = from_dict(tiny(tiny_model_dir, tmp_path, steps=8, save_every=1, max_nonfinite_steps=2))
    trainer = Trainer(cfg, tmp_path)

    def objective(*args, **kwargs):
        terms = real(*args, **kwargs)
        if trainer.step + 1 in nan_steps:  # trainer.step counts completed steps
            object.__setattr__(terms, "total", terms.total * math.nan)
        return terms

    monkeypatch.setattr(update, "objective", objective)
    snapshot = lambda: {k: v.clone() for k, v in trainer.policy.state_dict().items()}  # noqa: E731
    weights = {0: snapshot()}
    with pytest.raises(
        GrpolabError,
        match=r"step 4: 2 consecutive steps with a non-finite loss or gradient.*"
        r"last good checkpoint is .*step-2",
    ):
        trainer.fit(lambda step, m: weights.__setitem__(step, snapshot()))
    got = rows(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    assert [r["optim/skipped_steps"] for r in got] == [1, 1, 2, 3]
    assert [r["loss/total"] is None for r in got] == [True, False, True, True]
    assert all(torch.equal(weights[1][k], weights[0][k]) for k in weights[0])  # the skipped step changed nothing
    assert any(not torch.equal(weights[2][k], weights[1][k]) for k in weights[1])
    assert [p.name for p in ckpt.checkpoints(tmp_path)] == ["step-2"]  # none written mid-streak
    assert ckpt.load_state(tmp_path / "checkpoints" / "step-2")["faults"]["skipped_steps"] == 1
