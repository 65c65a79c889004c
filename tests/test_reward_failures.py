"""A log-only reward (weight 0) never invalidates a sample; a reward that fails on every sample step after step stops
the run with its name and last error (grpolab.rewards.health; docs/robustness.md, "Rewards that fail")."""

from __future__ import annotations

import logging
import math
import time

import pytest

from grpolab.rewards import RewardResult, RewardSet, result_metrics
from grpolab.rewards.health import ALL_INVALID, RewardFailureStreak, failing_everywhere
from grpolab.tasks.base import Problem

PROBLEM = Problem(uid="p1", question="2+2?", answer="4")


def slow(completion, problem):
    time.sleep(0.5)
    return 1.0


def broken(completion, problem):
    raise ValueError("the judge is down")


def length(completion, problem):
    return float(len(completion))


def test_a_log_only_reward_that_times_out_leaves_the_sample_valid():
    rewards = RewardSet({"correct": 1.0, "format": 0.5, "slow": 0.0}, callables={"slow": slow}, time_limit_s=0.05)
    right, wrong = rewards.score_many(["\\boxed{4}", "5"], [PROBLEM, PROBLEM])
    assert not right.invalid and right.total == 1.5 and right.error is None
    assert not wrong.invalid and wrong.total == 0.0
    assert math.isnan(right.components["slow"]) and right.components["correct"] == 1.0
    assert right.failures == {"slow": "TimeoutError: exceeded its time limit of 0.05 s"} and right.log_only == ("slow",)
    assert result_metrics([right, wrong]) == {"reward/slow/failed_frac": 1.0}


def test_a_weighted_reward_that_fails_still_invalidates_and_a_log_only_one_is_counted():
    rewards = RewardSet({"correct": 1.0, "mine": 2.0, "size": 0.0}, callables={"mine": broken, "size": length})
    (r,) = rewards.score_many(["\\boxed{4}"], [PROBLEM])
    assert r.invalid and math.isnan(r.total) and r.error == "mine: ValueError: the judge is down"
    assert r.components["size"] == 9.0 and r.failures == {"mine": "ValueError: the judge is down"}
    assert result_metrics([r]) == {"reward/size/failed_frac": 0.0}
    rewards = RewardSet({"correct": 1.0, "size": 0.0, "mine": 0.0}, callables={"mine": broken, "size": length})
    ok = rewards.score_many(["\\boxed{4}", "x"], [PROBLEM, PROBLEM])
    assert [r.total for r in ok] == [1.0, 0.0] and not any(r.invalid for r in ok)
    assert result_metrics(ok) == {"reward/mine/failed_frac": 1.0, "reward/size/failed_frac": 0.0}


def failed(name: str, message: str = "ValueError: boom", log_only: tuple[str, ...] = ()) -> RewardResult:
    weighted = name not in log_only
    return RewardResult(
        math.nan if weighted else 1.0,
        {name: math.nan},
        weighted,
        f"{name}: {message}" if weighted else None,
        failures={name: message},
        log_only=log_only,
    )


def test_failing_everywhere_names_only_rewards_that_failed_on_every_sample():
    a, b = failed("mine", "ValueError: one"), failed("mine", "ValueError: two")
    assert failing_everywhere([a, b]) == {"mine": "ValueError: two"}  # the last error
    assert failing_everywhere([a, RewardResult(1.0)]) == {}
    assert failing_everywhere([]) == {}


def test_a_reward_failing_on_every_sample_stops_after_the_limit_in_a_row():
    watch = RewardFailureStreak(limit=3, fields={"mine": "reward.functions.mine"})
    bad, good = [failed("mine"), failed("mine", "ValueError: last")], [RewardResult(1.0), RewardResult(0.0)]
    assert [watch.record(s, r) for s, r in [(1, bad), (2, bad), (3, good), (4, bad), (5, bad)]] == [None] * 5
    assert watch.record(6, bad) == (
        "step 6: reward 'mine' (reward.functions.mine) failed on every sample for 3 consecutive steps (steps 4-6); "
        "last error: ValueError: last. Nothing was learned from these steps: fix the reward (or what it depends on) "
        "and resume the run (with --allow-changes if you edited the reward's source)"
    )
    half = [failed("mine"), RewardResult(1.0)]  # fails on some samples only: the run learns from the others
    watch = RewardFailureStreak(limit=1)
    assert watch.record(1, half) is None


def test_every_sample_invalid_for_mixed_reasons_also_stops():
    watch = RewardFailureStreak(limit=2)
    mixed = [failed("a", "TimeoutError: slow"), failed("b", "ValueError: nope")]  # no single reward fails everywhere
    assert watch.record(1, mixed) is None
    message = watch.record(2, mixed)
    assert message.startswith(
        "step 2: every sample was invalid for 2 consecutive steps (steps 1-2); last error: b: ValueError: nope."
    )
    assert ALL_INVALID in watch.streaks


def test_a_log_only_reward_failing_everywhere_never_stops_and_warns_once(caplog):
    watch = RewardFailureStreak(limit=2)
    logged = [failed("extra", "TimeoutError: slow", log_only=("extra",))] * 2
    with caplog.at_level(logging.WARNING, logger="grpolab"):
        assert [watch.record(s, logged) for s in range(1, 6)] == [None] * 5
    warnings = [r.getMessage() for r in caplog.records if "log-only" in r.getMessage()]
    assert warnings == [
        "step 2: the log-only reward 'extra' failed on every sample for 2 steps in a row (last: "
        "TimeoutError: slow); training goes on (weight 0)"
    ]


def test_the_limit_must_be_at_least_one():
    with pytest.raises(ValueError, match="limit: expected an integer >= 1, got 0"):
        RewardFailureStreak(limit=0)


def test_a_log_only_component_that_failed_on_some_samples_is_averaged_over_the_rest():
    import torch

    from grpolab.training.metrics import reward_metrics

    nan = float("nan")
    m = reward_metrics(
        torch.tensor([1.0, 0.0, 1.0, 0.5]),
        {
            "correct": torch.tensor([1.0, 0.0, 1.0, 0.5]),
            "log_only": torch.tensor([0.2, nan, 0.4, 9.0], dtype=torch.float64),
        },
        invalid=torch.tensor([False, False, False, True]),
    )
    assert m["reward/log_only/mean"] == pytest.approx(0.3, abs=1e-15)  # (0.2 + 0.4) / 2: NaN and the invalid row out
    assert m["reward/correct/mean"] == pytest.approx(2 / 3, abs=1e-15) and m["reward/invalid_frac"] == 0.25
