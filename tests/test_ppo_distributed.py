"""PPO's metrics under data parallelism: 2 gloo ranks under torchrun run the same PPO experiment as 1 process (the
same samples, the same critic), so every value/* and ppo/* metric must be the same number -- a statistic of the
whole batch, not of rank 0's half of it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import earnable
import pytest
from test_distributed import ENV, TORCHRUN

WORKER = Path(__file__).resolve().parent / "distributed" / "ppo_worker.py"
METRICS = (
    "value/loss",
    "value/clip_frac",
    "value/explained_var",
    "value/mean",
    "value/grad_norm",
    "ppo/adv_raw_mean",
    "ppo/return_mean",
    "reward/kl_penalty/mean",
    "reward/mean",
)


def run(cmd: list[str], config: dict, out: Path) -> list[dict]:
    """The metrics.jsonl rows of a PPO run launched with `cmd` (one process, or torchrun)."""
    spec = out.with_suffix(".json")
    spec.write_text(json.dumps({"config": config, "out": str(out)}))
    done = subprocess.run([*cmd, str(WORKER), str(spec)], capture_output=True, text=True, env=ENV, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_ppo_metrics_of_two_ranks_are_those_of_the_whole_batch(tiny_model_dir, tmp_path):
    config = {
        "model": {"name": tiny_model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 40, "num_test": 4}},
        "reward": earnable.reward_config(),
        "rollout": earnable.rollout_config(group_size=4),
        "algorithm": {
            "estimator": "gae",
            "beta": 0.05,
            "kl_placement": "reward",
            "gamma": 1.0,
            "lam": 0.95,
            "whiten": True,
        },
        "critic": {"lr": 1e-2, "value_clip": 0.05},
        "train": {
            "steps": 2,
            "prompts_per_step": 4,
            "micro_batch_size": 4,
            "minibatches": 2,
            "lr": 5e-3,
            "seed": 3,
            "samples_per_step": 2,
            "save_every_minutes": 0,
            "precision": "fp32",
        },
        "eval": {"every_steps": 0},
    }
    one = run([sys.executable], config, tmp_path / "one")
    two = run(TORCHRUN, config, tmp_path / "two")
    assert len(one) == len(two) == 2
    for a, b in zip(one, two):
        assert a["reward/mean"] == b["reward/mean"]  # the same samples
        for name in METRICS:
            assert b[name] == pytest.approx(a[name], rel=1e-5, abs=1e-7), (a["step"], name, a[name], b[name])
    assert one[1]["value/mean"] != 0 and one[1]["value/clip_frac"] > 0  # the values moved: a real check
