"""Config validation refuses what would train on NaN weights or fail at step 1: non-finite numbers in any float
field (--set x=inf, YAML .nan), reward weights that are not numbers, and a config file that is not UTF-8 text --
each one ConfigError naming the field or the file."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from grpolab.config import Config, from_dict, load_config
from grpolab.errors import ConfigError


def float_fields(cls: type = Config, prefix: str = "") -> list[str]:
    """Every float field of the config tree, as dotted paths."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out += float_fields(tp, f"{prefix}{f.name}.")
        elif tp is float:
            out.append(f"{prefix}{f.name}")
    return out


@pytest.mark.parametrize("text", ["inf", "-inf", ".inf", "nan", ".nan"])
@pytest.mark.parametrize("path", ["train.lr", "rollout.temperature", "algorithm.beta"])
def test_named_non_finite_settings_are_refused(path, text):
    with pytest.raises(ConfigError, match=rf"^{path}: expected a finite number, got -?(inf|nan)$"):
        load_config(None, [f"{path}={text}"])


def test_every_float_field_refuses_inf_and_nan():
    paths = float_fields()
    assert len(paths) > 30 and "train.lr" in paths and "reward.judge.max_score" in paths
    for path in paths:
        for value in (float("inf"), float("nan")):
            with pytest.raises(ConfigError, match=rf"^{path}: expected a finite number"):
                load_config(None, [f"{path}={value}"])


def test_finite_numbers_still_load_the_same():
    cfg = load_config(None, ["train.lr=1e-5", "rollout.temperature=0.7", "algorithm.beta=0"])
    assert (cfg.train.lr, cfg.rollout.temperature, cfg.algorithm.beta) == (1e-5, 0.7, 0.0)


@pytest.mark.parametrize(
    "weights, expected",
    [
        ({"correct": "high"}, "reward.weights.correct: expected a finite number, got 'high'"),
        ({"correct": True}, "reward.weights.correct: expected a finite number, got True"),
        ({"correct": float("inf")}, "reward.weights.correct: expected a finite number, got inf"),
        ({"correct": None}, "reward.weights.correct: expected a finite number, got None"),
        ({"correct": [1]}, "reward.weights.correct: expected a finite number, got [1]"),
    ],
)
def test_reward_weights_must_be_numbers(weights, expected):
    with pytest.raises(ConfigError) as e:
        from_dict({"reward": {"weights": weights}})
    assert str(e.value) == expected


def test_reward_weights_read_yaml_string_numbers_as_numbers(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("reward:\n  weights: {correct: 1e-1, format: 0}\n")  # YAML 1.1 reads 1e-1 as a string
    assert load_config(path).reward.weights == {"correct": 0.1, "format": 0}
    assert load_config(None, ["reward.weights.correct=2"]).reward.weights == {"correct": 2}


def test_a_config_that_is_not_utf8_names_the_file(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("run: {name: caf\u00e9}\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1\.yaml: not a UTF-8 text file \(byte 15: invalid continuation"):
        load_config(path)


def test_the_python_api_refuses_the_same(tmp_path):
    import grpolab

    with pytest.raises(ConfigError, match=r"^train\.lr: expected a finite number, got inf$"):
        grpolab.load_config(None, {"train.lr": float("inf")})
    path = tmp_path / "bad.yaml"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not a UTF-8 text file"):
        grpolab.load_config(path)


def test_an_unquoted_off_in_yaml_is_the_choice_off_not_a_boolean(tmp_path):
    """YAML 1.1 reads `memory_fit: off` as False; a field whose choices include "off" takes it as "off", and a
    boolean where no choice is on/off is still refused, naming the field."""
    path = tmp_path / "c.yaml"
    path.write_text("train: {memory_fit: off}\n")
    assert load_config(path).train.memory_fit == "off"
    assert load_config(None, ["train.memory_fit=off"]).train.memory_fit == "off"
    with pytest.raises(ConfigError, match="train.memory_fit: expected one of 'check', 'off', got True"):
        from_dict({"train": {"memory_fit": True}})
