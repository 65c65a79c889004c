"""train.device resolution and validation, and the shipped recipes (configs/*.yaml) load as their comments say."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpolab.config import load_config
from grpolab.errors import ConfigError
from grpolab.training.distributed import resolve_device

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_recipe_loads_and_validates(path):
    load_config(path)


def test_the_case_study_recipe_has_its_settings():
    c = load_config(CONFIGS / "gsm8k_qwen2.5-math-7b.yaml")
    assert c.model.name == "Qwen/Qwen2.5-Math-7B" and c.task.name == "gsm8k"
    assert (c.rollout.group_size, c.rollout.temperature, c.rollout.max_new_tokens) == (8, 1.0, 2048)
    assert (c.train.lr, c.train.steps, c.algorithm.beta) == (1e-6, 1000, 0.04)
    assert c.reward.weights == {"correct": 1.0, "format": 0.1} and c.train.strategy == "fsdp2"


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "cuda:", "tpu"])
def test_bad_device_is_one_line_naming_the_field(bad):
    with pytest.raises(ConfigError, match=r"train.device: expected one of 'auto', 'cpu', 'cuda', 'cuda:N'"):
        load_config(None, [f"train.device={bad}"])


def test_device_resolution(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    if torch.cuda.is_available():
        monkeypatch.setenv("LOCAL_RANK", "0")
        assert resolve_device("auto") == torch.device("cuda:0")
    else:
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(ConfigError, match="train.device: cuda:1 asked for, but torch sees no CUDA device"):
            resolve_device("cuda:1")
        monkeypatch.setenv("LOCAL_RANK", "3")
        with pytest.raises(ConfigError, match="train.device: cuda:3 asked for"):  # torchrun's local rank
            resolve_device("cuda")
