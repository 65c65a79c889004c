"""A run is never silent and never unsaved by default: one progress line per step when stdout is not a terminal,
and a checkpoint on a time cadence (train.save_every_minutes) without any step setting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpolab.cli.train import step_line
from grpolab.config import TrainConfig, from_dict
from grpolab.models import checkpoint as ckpt
from grpolab.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def tiny(model_dir: str, out: Path, **train) -> dict:
    return {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 20, "num_test": 4}},
        "rollout": {"group_size": 2, "max_new_tokens": 3, "dtype": "float32"},
        "algorithm": {"preset": "grpo", "beta": 0.0},
        "train": {"steps": 3, "prompts_per_step": 1, "micro_batch_size": 4, "lr": 1e-3, "samples_per_step": 1, **train},
        "eval": {"every_steps": 0},
        "run": {"output_dir": str(out), "name": "r"},
    }


def test_one_progress_line_per_step_when_stdout_is_not_a_terminal(tiny_model_dir, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny(tiny_model_dir, tmp_path)))
    out = subprocess.run(
        [sys.executable, "-m", "grpolab", "train", str(config)], capture_output=True, text=True, env=ENV, timeout=300
    )
    assert out.returncode == 0, out.stderr
    steps = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("step ")]
    assert steps == ["1/3", "2/3", "3/3"], out.stdout


def test_step_line_reports_reward_held_out_and_time():
    m = {"reward/mean": 0.25, "time/step_s": 3.0}
    assert step_line(2, 10, m, None) == "step 2/10  reward 0.250  3.0s/step"
    assert step_line(2, 10, m, 0.5) == "step 2/10  reward 0.250  held-out 0.500  3.0s/step"


def test_checkpoints_on_a_time_cadence_by_default(tiny_model_dir, tmp_path):
    assert TrainConfig().save_every == 0 and TrainConfig().save_every_minutes > 0  # on by default, by time
    trainer = Trainer(from_dict(tiny(tiny_model_dir, tmp_path, save_every_minutes=1e-9, keep_last=5)), tmp_path)
    trainer.fit()
    assert [p.name for p in ckpt.checkpoints(tmp_path)] == ["step-1", "step-2", "step-3"]


def test_no_periodic_checkpoint_when_both_cadences_are_off(tiny_model_dir, tmp_path):
    trainer = Trainer(from_dict(tiny(tiny_model_dir, tmp_path, save_every_minutes=0, keep_last=5)), tmp_path)
    trainer.fit()
    assert [p.name for p in ckpt.checkpoints(tmp_path)] == ["step-3"]  # the final one only
