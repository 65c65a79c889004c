"""A run whose reward raises on every call stops after MAX_FAILED_REWARD_STEPS steps, naming the reward and its
last error, with the checkpoints already written intact; a log-only reward that times out does not stop it and
invalidates nothing (grpolab.rewards.health, wired into the trainer's end of step; docs/robustness.md)."""

from __future__ import annotations

import json

import pytest

from grpolab.config import from_dict
from grpolab.errors import GrpolabError
from grpolab.models import checkpoint as ckpt
from grpolab.rewards.health import MAX_FAILED_REWARD_STEPS
from grpolab.runs import start_run

pytestmark = pytest.mark.usefixtures("one_thread")


def always_raises(completion, problem):
    raise RuntimeError("the grader's database is gone")


def sleeps(completion, problem):
    import time

    time.sleep(0.3)
    return 1.0


def tiny(model_dir, out, name: str, weights: dict, steps: int) -> dict:
    return {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 20, "num_test": 4}},
        "reward": {"weights": weights, "time_limit_s": 0.05},
        "rollout": {"group_size": 2, "max_new_tokens": 3, "dtype": "float32", "top_k": 2},
        "algorithm": {"preset": "grpo", "beta": 0.0},
        "train": {
            "steps": steps,
            "prompts_per_step": 2,
            "micro_batch_size": 4,
            "seed": 0,
            "save_every": 1,
            "keep_last": 10,
        },
        "eval": {"every_steps": 0},
        "run": {"output_dir": str(out), "name": name},
    }


def steps_logged(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_reward_that_always_raises_stops_the_run_naming_it(tiny_model_dir, tmp_path):
    cfg = from_dict(
        tiny(tiny_model_dir, tmp_path, "broken", {"correct": 1.0, "mine": 1.0}, steps=MAX_FAILED_REWARD_STEPS + 3)
    )
    trainer, _ = start_run(cfg, rewards={"mine": always_raises})
    with pytest.raises(GrpolabError) as stopped:
        trainer.fit()
    n = MAX_FAILED_REWARD_STEPS
    message = str(stopped.value)
    assert message.startswith(
        f"step {n}: reward 'mine' (rewards['mine']) failed on every sample for {n} consecutive "
        f"steps (steps 1-{n}); last error: RuntimeError: the grader's database is gone."
    )
    run = tmp_path / "broken"
    rows = steps_logged(run)
    assert [r["step"] for r in rows] == list(range(1, n + 1)) and all(r["reward/invalid_frac"] == 1.0 for r in rows)
    # the stop comes before the last step's checkpoint: what is on disk is what was written before, intact
    assert [p.name for p in ckpt.checkpoints(run)] == [f"step-{k}" for k in range(1, n)]
    assert message.endswith(f" The last checkpoint is {run / 'checkpoints' / f'step-{n - 1}'}.")
    assert all(ckpt.verify_checkpoint(p) is None for p in ckpt.checkpoints(run))


def test_a_log_only_reward_that_times_out_invalidates_nothing(tiny_model_dir, tmp_path):
    cfg = from_dict(
        tiny(tiny_model_dir, tmp_path, "logged", {"correct": 1.0, "slow": 0.0}, steps=MAX_FAILED_REWARD_STEPS + 1)
    )
    trainer, _ = start_run(cfg, rewards={"slow": sleeps})
    trainer.fit()
    rows = steps_logged(tmp_path / "logged")
    assert [r["step"] for r in rows] == list(range(1, MAX_FAILED_REWARD_STEPS + 2))
    assert all(r["reward/invalid_frac"] == 0.0 and r["reward/slow/failed_frac"] == 1.0 for r in rows)
