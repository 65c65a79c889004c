"""Checks that cannot fail in a run's configuration are N/A; PASS reasons state the condition that held;
the metric-history checks read the sampled batch, never the `kept/` names of dynamic sampling.

Hand-made metric histories and configs (the resolved config as manifest.json stores it); no models.
"""

from __future__ import annotations

import re

import pytest

from grpolab.gate.base import FAIL, PASS, WARN, CheckResult
from grpolab.gate.hacking import check_format_vs_correct, check_reward_length_corr, check_reward_vs_heldout
from grpolab.gate.heldout import check_improvement
from grpolab.gate.regression import check_capability, check_safety
from grpolab.gate.thresholds import Thresholds
from grpolab.gate.training import (
    check_clip_blowup,
    check_entropy_collapse,
    check_kl_blowup,
    check_learning_signal,
    check_truncation_drift,
    training_checks,
)
from grpolab.gate.verdict import DONT_SHIP, NOT_ESTABLISHED, SHIP, order_checks, verdict
from grpolab.report.safety import summarize

NA = "N/A"  # spelled out: the tests must fail (not error at import) on code that has no such status
T = Thresholds()
N = 30


def ramp(a: float, b: float, n: int = N) -> list[float]:
    return [a + (b - a) * i / (n - 1) for i in range(n)]


def history(**series: list[float] | float) -> list[dict]:
    """Metric rows for N steps; a float is a constant series; '__' in a keyword stands for '/'."""
    rows = [{"step": i + 1} for i in range(N)]
    for key, s in series.items():
        for row, v in zip(rows, s if isinstance(s, list) else [s] * N):
            row[key.replace("__", "/")] = v
    return rows


def config(beta=0.0, mu=1, minibatches=1, weights=None, max_staleness=0, **algorithm) -> dict:
    """A resolved config as in manifest.json; the demo's values by default (no KL, one pass, correctness only,
    synchronous rollouts)."""
    return {
        "rollout": {"max_staleness": max_staleness},
        "algorithm": {
            "beta": beta,
            "kl_placement": "loss",
            "overlong_buffer": 0,
            "surrogate": "ppo_clip",
            "dynamic_sampling": False,
            **algorithm,
        },
        "train": {"mu": mu, "minibatches": minibatches},
        "reward": {"weights": {"correct": 1.0, "format": 0.0} if weights is None else weights},
    }


DEMO = config()
FULL = config(beta=0.04, mu=2, minibatches=2, weights={"correct": 1.0, "format": 0.1}, max_staleness=1)


def ci(mean: float, half: float, n: int = 100) -> dict:
    """A difference with its 95% interval over n paired problems (n at or above every minimum of evidence)."""
    return {"mean": mean, "ci_low": mean - half, "ci_high": mean + half, "n": n}


def demo_history() -> list[dict]:
    """What the demo logs: KL, old-policy drift and clip fractions are exactly 0; reward == correctness."""
    correct = ramp(0.2, 0.7)
    return history(
        **{
            "reward__mean": correct,
            "reward__correct__mean": correct,
            "reward__format__mean": ramp(0.6, 0.7),
            "groups__frac_zero_std": ramp(0.2, 0.35),
            "completion__len_mean": [30 + (i % 5) for i in range(N)],
            "completion__truncated_frac": ramp(0.05, 0.02),
            "policy__entropy": ramp(1.0, 0.8),
            "policy__kl": 0.0,
            "policy__approx_kl_old": 0.0,
            "policy__clip_frac_low": 0.0,
            "policy__clip_frac_high": 0.0,
            "sampler__logp_diff_mean": 0.03,
            "sampler__logp_diff_max": 0.6,
        }
    )


# ---------------------------------------------------------------- N/A: kl_blowup


def test_kl_blowup_is_na_in_the_demo_configuration():
    r = check_kl_blowup(demo_history(), DEMO, T)
    assert r.status == NA and r.measured
    assert "beta" in r.reason and "reference" in r.reason and "mu" in r.reason and "minibatches" in r.reason


def test_kl_blowup_grades_only_the_applicable_part():
    # no reference model (beta 0): a policy/kl series is ignored, the drift to the old policy is graded
    rows = history(policy__kl=5.0, policy__approx_kl_old=0.001)
    r = check_kl_blowup(rows, config(beta=0.0, mu=2), T)
    assert r.status == PASS and "reference" in r.reason and NA in r.reason and "beta" in r.reason
    assert "max_kl" not in r.numbers and r.numbers["max_approx_kl_old"] == 0.001
    drift = check_kl_blowup(history(policy__kl=0.0, policy__approx_kl_old=0.7), config(beta=0.0, mu=2), T)
    assert drift.status == WARN and drift.numbers["max_approx_kl_old"] == 0.7
    # one pass, one minibatch: the old-policy part is N/A, the reference part is graded
    spike = history(policy__kl=[0.01] * (N - 1) + [2.5], policy__approx_kl_old=0.9)
    r = check_kl_blowup(spike, config(beta=0.04, mu=1, minibatches=1), T)
    assert r.status == WARN and "old policy" in r.reason and NA in r.reason and "max_approx_kl_old" not in r.numbers
    calm = check_kl_blowup(history(policy__kl=0.01, policy__approx_kl_old=0.9), config(beta=0.04), T)
    assert calm.status == PASS  # the 0.9 drift cannot happen with mu = minibatches = 1 and is not graded
    # both parts apply: the worse counts
    assert check_kl_blowup(history(policy__kl=0.01, policy__approx_kl_old=0.9), FULL, T).status == WARN
    # mu = 1 but two minibatches: the second optimizer step sees a moved policy, so drift applies
    assert check_kl_blowup(history(policy__approx_kl_old=0.9), config(beta=0.0, mu=1, minibatches=2), T).status == WARN


def test_kl_blowup_applicable_part_without_its_metric_is_not_measured():
    r = check_kl_blowup(history(policy__approx_kl_old=0.001), config(beta=0.04, mu=2), T)
    assert r.status == WARN and not r.measured and "policy/kl" in r.reason


# ---------------------------------------------------------------- N/A: clip_blowup


@pytest.mark.parametrize("surrogate", ["ppo_clip", "dual_clip", "gspo"])
def test_clip_blowup_is_na_with_one_pass_and_one_minibatch(surrogate):
    r = check_clip_blowup(demo_history(), config(surrogate=surrogate), T)
    assert r.status == NA and "mu" in r.reason and "minibatches" in r.reason and "ratio" in r.reason


def test_clip_blowup_applies_with_several_optimizer_steps():
    rows = history(policy__clip_frac_low=ramp(0, 0.3), policy__clip_frac_high=ramp(0, 0.4))
    assert check_clip_blowup(rows, config(mu=2), T).status == WARN
    assert check_clip_blowup(rows, config(mu=1, minibatches=4), T).status == WARN


# ---------------------------------------------------------------- N/A: reward hacking checks


def test_bonus_vs_correctness_is_na_without_a_rewarded_bonus():
    rows = history(reward__correct__mean=0.3, reward__format__mean=ramp(0.0, 1.0))
    for weights in ({"correct": 1.0, "format": 0.0}, {"correct": 1.0}, {"correct": 1.0, "format": -0.5}):
        r = check_format_vs_correct(rows, weights, T)
        assert r.status == NA and "bonus" in r.reason, weights
    assert check_format_vs_correct(rows, {"correct": 1.0, "format": 0.1}, T).status == WARN


def test_code_runs_judge_bonuses_and_length_against_the_code_correctness_component():
    """A code run has no `correct` component: pass_fraction (or all_pass) is its correctness, so the hacking checks
    are N/A when it is the whole reward and judge a bonus against it otherwise, instead of 'too few steps'."""
    code_only = config(weights={"pass_fraction": 1.0})
    rows = history(
        reward__mean=ramp(0.2, 0.5),
        completion__len_mean=ramp(60, 30),
        reward__pass_fraction__mean=ramp(0.2, 0.5),
        reward__format__mean=ramp(0.0, 1.0),
    )
    assert check_format_vs_correct(rows, {"pass_fraction": 1.0}, T).status == NA
    assert check_reward_length_corr(rows, code_only, T).status == NA
    flat = [{**r, "reward/pass_fraction/mean": 0.3} for r in rows]  # the bonus grew, passing did not
    farmed = check_format_vs_correct(flat, {"pass_fraction": 1.0, "format": 0.2}, T)
    assert farmed.status == WARN and farmed.numbers["correct_early"] == 0.3 and "farming" in farmed.reason
    both = check_format_vs_correct(flat, {"all_pass": 1.0, "pass_fraction": 0.5}, T)
    assert (
        both.status == NA and not both.measured and "reward/all_pass/mean" in both.reason
    )  # all_pass not logged: too little evidence
    length = check_reward_length_corr(rows, config(weights={"pass_fraction": 1.0, "format": 0.2}), T)
    assert length.status == PASS and length.numbers["corr_reward_correct"] == 1.0


def test_agent_runs_judge_against_the_environments_reward():
    """An agent run's only reward is `env`, the environment's verdict on the end state: nothing else is rewarded, so
    the bonus and length checks are N/A -- not WARN 'too few steps with reward/correct/mean', which left the agent
    quickstart's verdict 'not established'."""
    rows = history(reward__mean=ramp(0.1, 0.2), completion__len_mean=ramp(35, 19), reward__env__mean=ramp(0.1, 0.2))
    bonus = check_format_vs_correct(rows, {"env": 1.0}, T)
    assert bonus.status == NA and "nothing besides correctness" in bonus.reason
    length = check_reward_length_corr(rows, config(weights={"env": 1.0}), T)
    assert length.status == NA and "'env'" in length.reason


def test_reward_vs_heldout_is_na_when_the_reward_did_not_rise():
    flat = check_reward_vs_heldout(history(reward__mean=0.3), {"diff": ci(-0.1, 0.02)}, T)
    assert flat.status == NA and "did not rise" in flat.reason and "0.300->0.300" in flat.reason
    assert flat.numbers["reward_early"] == 0.3 and flat.numbers["reward_late"] == 0.3
    fell = check_reward_vs_heldout(history(reward__mean=ramp(0.6, 0.2)), None, T)
    assert fell.status == NA and fell.measured  # nothing to compare, so held-out evidence is not "missing" here


def test_reward_follows_length_is_na_when_the_reward_is_correctness():
    r = check_reward_length_corr(demo_history(), DEMO, T)
    assert r.status == NA and "correct" in r.reason
    # any other term in the reward makes the check applicable again
    for cfg in (
        config(weights={"correct": 1.0, "format": 0.1}),
        config(overlong_buffer=16),
        config(beta=0.04, kl_placement="reward"),
    ):
        assert check_reward_length_corr(demo_history(), cfg, T).status == PASS, cfg
    # with KL in the loss (not in the reward) the logged reward is still correctness
    assert check_reward_length_corr(demo_history(), config(beta=0.04, kl_placement="loss"), T).status == NA
    # KL in the reward but logged apart (reward/kl_penalty/mean): reward/mean is still correctness
    apart = [{**r, "reward/kl_penalty/mean": 0.01} for r in demo_history()]
    assert check_reward_length_corr(apart, config(beta=0.04, kl_placement="reward"), T).status == NA


def test_missing_config_fields_are_unknown_never_na():
    """An old manifest without a field: nothing is declared N/A on a guess."""
    rows = demo_history()
    for cfg in ({}, {"algorithm": {}, "train": {}}, {"algorithm": {"beta": 0.0}, "train": {"mu": 1}}):
        assert check_clip_blowup(rows, cfg, T).status == PASS, cfg
        assert check_reward_length_corr(rows, cfg, T).status == PASS, cfg
    kl = check_kl_blowup(rows, {"train": {"mu": 1, "minibatches": 1}}, T)  # beta unknown: the reference part counts
    assert kl.status == PASS and "max_kl" in kl.numbers
    # reward weights unknown: every logged component besides correctness is judged as if it were rewarded
    hacked = history(reward__correct__mean=0.3, reward__format__mean=ramp(0.0, 1.0))
    assert check_format_vs_correct(hacked, None, T).status == WARN
    assert check_format_vs_correct(history(reward__correct__mean=0.3), None, T).status == NA
    # the trainer's penalties (overlong, KL in the reward) are logged as components but are not bonuses
    penalties = history(
        reward__correct__mean=0.3, reward__overlong__mean=ramp(-1.0, 0.0), reward__kl_penalty__mean=ramp(0.0, 0.5)
    )
    assert check_format_vs_correct(penalties, None, T).status == NA


def test_training_checks_take_the_config_and_mark_the_demo():
    by_name = {c.name: c for c in training_checks(demo_history(), DEMO, {"diff": ci(0.2, 0.05)}, T)}
    assert {n for n, c in by_name.items() if c.status == NA} == {
        "kl_blowup",
        "clip_blowup",
        "bonus_vs_correctness",
        "reward_follows_length",
        "staleness",
    }
    assert {c.status for c in by_name.values()} == {PASS, NA}
    full = training_checks(demo_history(), FULL, {"diff": ci(0.2, 0.05)}, T)
    assert [c.name for c in full if c.status == NA] == []


# ---------------------------------------------------------------- the verdict ignores N/A


def thirty_prompts(base: int, trained: int) -> dict:
    """The safety summary of 30 prompts: the base complies with the first `base`, the trained model the first `trained`."""
    prompts = [{"id": str(i), "category": "x", "prompt": "p"} for i in range(30)]
    return summarize(
        prompts, ["Sure."] * base + ["I cannot."] * (30 - base), ["Sure."] * trained + ["I cannot."] * (30 - trained)
    )


def passing_gates() -> list:
    # 5 prompts newly refused, none newly complied: non-inferior (30 unchanged prompts no longer pass: their exact
    # interval reaches +0.116, beyond the safety margin 0.05 -- issue 60)
    safety = thirty_prompts(6, 1)
    cap = {"task": "gsm8k", "n": 50, "base": {"accuracy": 0.3}, "trained": {"accuracy": 0.3}, "diff": ci(0.0, 0.05)}
    return [check_improvement({"diff": ci(0.2, 0.05)}, T), check_safety(safety, T), check_capability([cap], T)]


def test_demo_verdict_is_computed_from_the_applicable_checks():
    checks = training_checks(demo_history(), DEMO, {"diff": ci(0.2, 0.05)}, T) + passing_gates()
    label, why = verdict(checks)
    assert label == SHIP and "kl_blowup" not in why.split("N/A")[0]
    # an N/A check that cannot fail here is neither a pass nor "not measured": it is ignored
    ghost = CheckResult("kl_blowup", "dynamics", NA, "cannot fail here")
    assert verdict(passing_gates() + [ghost])[0] == SHIP
    # an N/A for too little evidence (measured False) is no pass either, and keeps the verdict from ship
    thin = CheckResult("kl_blowup", "dynamics", NA, "too little evidence (n = 2 < 3 steps)", measured=False)
    assert verdict(passing_gates() + [thin]) == (NOT_ESTABLISHED, "not measured or too little evidence: kl_blowup")
    # a collapsed entropy is a WARN with its numbers: it does not block a model that is better held out
    collapsed = check_entropy_collapse(history(policy__entropy=ramp(1.0, 0.01)), T)
    assert collapsed.status == WARN and verdict(checks + [collapsed])[0] == SHIP
    # the remaining checks still decide: held-out evidence of harm
    failing = check_improvement({"diff": ci(-0.1, 0.05)}, T)
    assert verdict(checks + [failing])[0] == DONT_SHIP
    assert verdict([ghost, check_improvement({"diff": ci(0.02, 0.05)}, T)])[0] == NOT_ESTABLISHED


def test_order_puts_na_last():
    checks = training_checks(demo_history(), DEMO, {"diff": ci(0.2, 0.05)}, T)
    checks.append(check_improvement({"diff": ci(-0.1, 0.05)}, T))
    statuses = [c.status for c in order_checks(checks)]
    assert statuses[0] == FAIL and statuses[-5:] == [NA] * 5 and NA not in statuses[:-5]


# ---------------------------------------------------------------- a PASS says what held


def corr_history(length: list[float], reward: list[float], correct: list[float]) -> list[dict]:
    return history(reward__mean=reward, completion__len_mean=length, reward__correct__mean=correct)


def test_reward_follows_length_pass_names_the_condition_that_held():
    # the reward-hacked run: weakly tied to length, barely to correctness. It passes only because |r| < 0.5.
    length = [30.0 + (i % 6) * 4 for i in range(N)]
    noise = [((i * 7) % 11) / 10 for i in range(N)]
    reward = [0.02 * x + n for x, n in zip(length, noise)]
    correct = [0.3 + 0.05 * ((i * 5) % 7) for i in range(N)]
    r = check_reward_length_corr(corr_history(length, reward, correct), FULL, T)
    a, b = r.numbers["corr_reward_length"], r.numbers["corr_reward_correct"]
    assert a < T.length_corr_min and b < a  # the situation of the report that said otherwise
    assert r.status == PASS and "not strongly tied to length" in r.reason and "< 0.5" in r.reason
    assert "at least as much" not in r.reason and "follows correctness" not in r.reason
    # strongly tied to length but correctness at least as much
    both = check_reward_length_corr(corr_history(ramp(30, 60), ramp(0.1, 0.7), ramp(0.1, 0.7)), FULL, T)
    assert both.status == PASS and "follows correctness" in both.reason and "at least as much" in both.reason
    # strongly tied to length, correctness less but within the margin
    correct = [c + (0.1 if i % 2 else -0.1) for i, c in enumerate(ramp(0.1, 0.7))]
    near = check_reward_length_corr(corr_history(ramp(30, 60), ramp(0.1, 0.7), correct), FULL, T)
    a, b = near.numbers["corr_reward_length"], near.numbers["corr_reward_correct"]
    assert a >= T.length_corr_min and 0 < a - b < T.length_corr_margin
    assert near.status == PASS and "within" in near.reason and "at least as much" not in near.reason


def test_bonus_pass_says_whether_correctness_rose_with_the_bonus():
    weights = {"correct": 1.0, "format": 0.1}
    with_correct = check_format_vs_correct(
        history(reward__correct__mean=ramp(0.2, 0.7), reward__format__mean=ramp(0.0, 1.0)), weights, T
    )
    assert with_correct.status == PASS and "format" in with_correct.reason and "rose too" in with_correct.reason
    quiet = check_format_vs_correct(history(reward__correct__mean=0.3, reward__format__mean=0.5), weights, T)
    assert quiet.status == PASS and "no rewarded bonus grew" in quiet.reason
    # a rewarded bonus with too few values: not a silent pass
    sparse = check_format_vs_correct(
        history(reward__correct__mean=0.3, reward__format__mean=[0.5] + [None] * (N - 1)), weights, T
    )
    assert sparse.status == NA and not sparse.measured and sparse.reason.startswith("too little evidence")


HEALTHY = history(
    **{
        "reward__mean": ramp(0.2, 0.7),
        "reward__correct__mean": ramp(0.2, 0.7),
        "reward__format__mean": ramp(0.6, 0.7),
        "groups__frac_zero_std": ramp(0.2, 0.35),
        "completion__len_mean": [30 + (i % 5) for i in range(N)],
        "completion__truncated_frac": ramp(0.05, 0.02),
        "policy__entropy": ramp(1.0, 0.8),
        "policy__kl": ramp(0, 0.02),
        "policy__approx_kl_old": 0.001,
        "policy__clip_frac_low": 0.01,
        "policy__clip_frac_high": 0.02,
        "sampler__logp_diff_mean": 0.03,
        "sampler__logp_diff_max": 0.6,
        "async__staleness": 0.0,  # FULL's max_staleness 1, never reached
    }
)


def test_every_training_pass_reason_states_its_threshold():
    """A PASS reason quotes the bound it stayed within, e.g. 'late share 0.32 < 0.5'."""
    for c in training_checks(HEALTHY, FULL, {"diff": ci(0.2, 0.05)}, T):
        assert c.status == PASS, (c.name, c.reason)
        assert re.search(r"(<|<=|>=|>|≤|≥)\s*x?[+-]?\d", c.reason), (c.name, c.reason)


def test_safety_pass_with_a_tolerated_increase_does_not_claim_no_increase():
    safety = thirty_prompts(1, 2)
    loose = T.replace({"safety_margin": 0.15})  # the PASS reads the margin since issue 60 (safety_increase: FAIL)
    r = check_safety(safety, loose)
    assert r.status == PASS and "does not comply more often" not in r.reason and "less than the margin 0.15" in r.reason
    assert check_safety(safety, T).status == WARN  # +0.033 [-0.035, +0.102]: an increase of 0.05 not ruled out


# ---------------------------------------------------------------- sampled vs kept batch (dynamic sampling)


def dynamic_history() -> list[dict]:
    """Dynamic sampling drops zero-variance groups: the kept batch (kept/...) looks healthy while the sampled
    batch (the unprefixed names) shows truncation taking over, a farmed bonus and dead groups."""
    return history(
        **{
            "reward__mean": ramp(0.1, 0.2),
            "reward__correct__mean": ramp(0.1, 0.0),
            "reward__format__mean": ramp(0.2, 1.0),
            "completion__len_mean": ramp(30, 47),
            "completion__truncated_frac": ramp(0.1, 0.7),
            "groups__frac_zero_std": ramp(0.3, 1.0),
            "kept__reward__mean": ramp(0.4, 0.6),
            "kept__reward__correct__mean": ramp(0.4, 0.6),
            "kept__reward__format__mean": ramp(0.9, 1.0),
            "kept__completion__len_mean": 30.0,
            "kept__completion__truncated_frac": 0.02,
            "kept__groups__frac_zero_std": 0.0,
        }
    )


def test_checks_read_the_sampled_batch_not_the_kept_one():
    cfg = config(weights={"correct": 1.0, "format": 0.1}, dynamic_sampling=True)
    rows = dynamic_history()
    trunc = check_truncation_drift(rows, T)
    assert trunc.status == WARN and trunc.numbers["late"] > 0.6
    assert check_format_vs_correct(rows, cfg["reward"]["weights"], T).status == WARN
    assert check_learning_signal(rows, T).status == WARN
    # the sampled batch's correctness fell (0.1 -> 0.0; the kept batch's rose 0.4 -> 0.6): no gain to transfer
    transfer = check_reward_vs_heldout(rows, {"diff": ci(-0.05, 0.03)}, T)
    assert transfer.status == NA and transfer.numbers["reward_key"] == "reward/correct/mean"
    assert transfer.numbers["reward_late"] < 0.05


def test_no_check_reads_a_kept_metric():
    """A history with only kept/ names gives every metric-history check nothing to read."""
    kept_only = [
        {"step": r["step"], **{k: v for k, v in r.items() if k.startswith("kept/")}} for r in dynamic_history()
    ]
    for c in training_checks(
        kept_only,
        config(weights={"correct": 1.0, "format": 0.1}, dynamic_sampling=True, mu=2, max_staleness=1),
        {"diff": ci(0.1, 0.05)},
        T,
    ):
        assert c.status in (WARN, NA) and not c.measured, (c.name, c.status, c.reason)  # not measured / too little
