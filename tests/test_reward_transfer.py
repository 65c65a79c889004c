"""reward_vs_heldout compares like with like (issue 60, item 3): the training correctness, sampled at the training
temperature, against the held-out pass@1 sampled at the same temperature (the diversity eval); a greedy held-out
gain is a different scale, so the check then only WARNs and says what it compared."""

from __future__ import annotations

from grpolab.gate.base import FAIL, NA, PASS, WARN
from grpolab.gate.hacking import check_reward_vs_heldout, transfer_comparison
from grpolab.gate.thresholds import Thresholds

T = Thresholds()
CONFIG = {"rollout": {"temperature": 0.8}, "reward": {"weights": {"correct": 1.0, "format": 0.1}}}
WEIGHTS = CONFIG["reward"]["weights"]


def ci(mean: float, half: float, n: int) -> dict:
    return {"mean": mean, "ci_low": mean - half, "ci_high": mean + half, "n": n}


def rows(correct_from: float, correct_to: float, reward_from: float, reward_to: float, steps: int = 10) -> list:
    f = lambda a, b, i: a + (b - a) * i / (steps - 1)  # noqa: E731
    return [
        {
            "step": i + 1,
            "reward/mean": f(reward_from, reward_to, i),
            "reward/correct/mean": f(correct_from, correct_to, i),
        }
        for i in range(steps)
    ]


def test_the_sampled_pass1_at_the_training_temperature_is_the_comparison():
    greedy = {"diff": ci(0.12, 0.05, 266), "n": 266}
    diversity = {"temperature": 0.8, "n": 64, "pass1": ci(0.01, 0.03, 64), "source": "eval/diversity.json"}
    c = transfer_comparison(greedy, diversity, CONFIG)
    assert c["same_scale"] and c["n"] == 64 and c["diff"]["mean"] == 0.01 and "both sampled at T=0.8" in c["compares"]
    hotter = transfer_comparison(greedy, {**diversity, "temperature": 1.0}, CONFIG)
    assert not hotter["same_scale"] and "sampled at T=1, not the training T=0.8" in hotter["compares"]
    assert hotter["diff"]["n"] == 266  # the greedy comparison, marked
    assert transfer_comparison(None, None, CONFIG) is None


def test_correctness_rose_but_sampled_held_out_did_not_fails_and_greedy_only_warns():
    """Correctness 0.3 -> 0.6 (rise 0.3, floor 0.075): sampled pass@1 +0.01 [-0.02, +0.04] FAILs with its test;
    the greedy gain +0.12 [+0.07, +0.17] that held (a different decoding) used to PASS this run."""
    history = rows(0.3, 0.6, 0.36, 0.67)
    sampled = transfer_comparison(None, {"temperature": 0.8, "n": 64, "pass1": ci(0.01, 0.03, 64)}, CONFIG)
    c = check_reward_vs_heldout(history, sampled, T, WEIGHTS)
    assert (
        c.status == FAIL
        and c.fail_tests["reward transfer"]["fails"]
        and c.numbers["reward_key"] == "reward/correct/mean"
    )
    greedy = transfer_comparison({"diff": ci(-0.02, 0.03, 266), "n": 266}, None, CONFIG)
    w = check_reward_vs_heldout(history, greedy, T, WEIGHTS)
    assert w.status == WARN and not w.fail_tests and "two scales, so WARN only" in w.reason
    assert "greedy held-out accuracy" in w.reason
    ok = check_reward_vs_heldout(history, transfer_comparison({"diff": ci(0.12, 0.05, 266)}, None, CONFIG), T, WEIGHTS)
    assert ok.status == PASS and not ok.fail_tests


def test_a_farmed_bonus_is_not_a_correctness_gain():
    """reward/mean rose 0.2 -> 0.6 from the format bonus while correctness stayed at 0.2: nothing to transfer (N/A);
    bonus_vs_correctness is the check that WARNs about the bonus."""
    c = check_reward_vs_heldout(rows(0.2, 0.2, 0.2, 0.6), {"diff": ci(0.0, 0.03, 266)}, T, WEIGHTS)
    assert c.status == NA and "reward/correct/mean did not rise" in c.reason
