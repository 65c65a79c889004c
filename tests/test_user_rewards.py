"""Reward functions of the user's own (config reward.functions): loading, scoring, failures, manifest hashes."""

from __future__ import annotations

import math

import pytest

from grpolab.config import from_dict
from grpolab.errors import ConfigError
from grpolab.manifest import diff_manifests
from grpolab.rewards import RewardSet
from grpolab.rewards.user import source_hashes
from grpolab.tasks.base import Problem

PROBLEM = Problem(uid="p1", question="What is 2 + 2?", answer="4", slice="easy")
SOURCE = """
import time

def length_share(completion, problem):
    return len(completion) / (len(completion) + len(problem.question))

def echo_slice(completion, problem):
    return 1.0 if problem.slice in completion else 0.0

def nothing(completion, problem):
    return None

def nan(completion, problem):
    return float("nan")

def text(completion, problem):
    return "high"

def boom(completion, problem):
    raise RuntimeError("judge unreachable")

def hang(completion, problem):
    time.sleep(30)

def one_arg(completion):
    return 1.0
"""


@pytest.fixture
def rewards_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(SOURCE)
    return path


def test_user_rewards_see_the_problem_and_combine_with_builtins(rewards_file):
    rs = RewardSet(
        {"correct": 1.0, "length_share": 0.5, "echo_slice": 2.0},
        {"length_share": f"{rewards_file}:length_share", "echo_slice": f"{rewards_file}:echo_slice"},
    )
    r = rs.score("easy: \\boxed{4}", PROBLEM)
    share = 15 / (15 + 14)
    assert not r.invalid
    assert r.components == {"correct": 1.0, "length_share": pytest.approx(share), "echo_slice": 1.0}
    assert r.total == pytest.approx(1.0 + 0.5 * share + 2.0)


@pytest.mark.parametrize(
    "fn, reason",
    [
        ("nothing", "ValueError: returned None"),
        ("nan", "ValueError: returned NaN"),
        ("text", "TypeError: returned str"),
        ("boom", "RuntimeError: judge unreachable"),
        ("hang", "TimeoutError: exceeded its time limit of 0.2 s"),
    ],
)
def test_a_failing_user_reward_makes_only_that_sample_invalid(rewards_file, fn, reason):
    rs = RewardSet({"correct": 1.0, "mine": 1.0}, {"mine": f"{rewards_file}:{fn}"}, time_limit_s=0.2)
    r = rs.score("\\boxed{4}", PROBLEM)
    assert r.invalid and math.isnan(r.total) and r.components["correct"] == 1.0
    assert r.error.startswith(f"mine: {reason}"), r.error


@pytest.mark.parametrize(
    "ref, message",
    [
        ("missing.py:f", "reward.functions.mine: file not found: missing.py"),
        ("{file}:absent", "reward.functions.mine: {file} has no function 'absent'; functions there: boom, echo_slice"),
        (
            "{file}:one_arg",
            "reward.functions.mine: {file}:one_arg(completion) cannot be called as fn(completion: str, "
            "problem: Problem) -> float | None",
        ),
        ("no_such_module_xyz:f", "reward.functions.mine: cannot import module 'no_such_module_xyz'"),
        ("just_a_name", "reward.functions.mine: expected 'path/to/file.py:function' or 'package.module:function'"),
    ],
)
def test_bad_references_are_one_line_naming_the_field(rewards_file, ref, message):
    ref, message = ref.replace("{file}", str(rewards_file)), message.replace("{file}", str(rewards_file))
    with pytest.raises(ConfigError) as e:
        RewardSet({"mine": 1.0}, {"mine": ref})
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_unknown_weight_and_builtin_name_clash(rewards_file):
    with pytest.raises(ConfigError, match=r"reward.weights: unknown reward component\(s\) 'mine'.*reward.functions"):
        RewardSet({"mine": 1.0})
    with pytest.raises(ConfigError, match="reward.functions.correct: 'correct' is a built-in reward"):
        RewardSet({"correct": 1.0}, {"correct": f"{rewards_file}:echo_slice"})
    with pytest.raises(ConfigError, match=r"reward.functions.mine: defined but not weighted; add reward.weights.mine"):
        RewardSet({"correct": 1.0}, {"mine": f"{rewards_file}:echo_slice"})  # never silently left out


def test_source_hash_changes_with_the_file_and_shows_in_manifest_diff(rewards_file):
    cfg = from_dict({"reward": {"functions": {"mine": f"{rewards_file}:echo_slice"}, "weights": {"mine": 1.0}}})
    before = source_hashes(cfg.reward.functions)
    assert len(before["mine"]) == 64
    rewards_file.write_text(SOURCE.replace("1.0 if", "2.0 if"))
    after = source_hashes(cfg.reward.functions)
    assert after["mine"] != before["mine"]
    diffs = diff_manifests({"hashes": {"reward_functions": before}}, {"hashes": {"reward_functions": after}})
    assert [k for k, _, _ in diffs] == ["hashes.reward_functions.mine"]
    assert source_hashes({"gone": "missing.py:f"}) == {"gone": None}  # the reproducibility check flags a None hash


def test_module_reference_is_hashed_without_running_it():
    h = source_hashes({"m": "grpolab.rewards.math:correctness_reward"})
    assert h["m"] is not None and len(h["m"]) == 64
