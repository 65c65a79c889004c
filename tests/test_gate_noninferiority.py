"""Issue 60: ship needs non-inferiority on every harm dimension (capability tasks, pass@k, safety) at stated margins,
or the user's waiver; Holm changes the decision, not only the label; the gate's error rates, simulated in small form
with grpolab's own interval, check and verdict functions (benchmarks/gate_error_rates.py)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from grpolab.errors import ConfigError
from grpolab.evaluation.intervals import equal_changes_interval, paired_evidence_interval
from grpolab.gate.base import FAIL, NA, PASS, WARN, CheckResult
from grpolab.gate.heldout import check_improvement
from grpolab.gate.noninferiority import (
    apply_waivers,
    exact_minimum_n,
    non_inferior,
    parse_waivers,
    problems_needed,
)
from grpolab.gate.regression import check_capability
from grpolab.gate.stats import change_signs
from grpolab.gate.thresholds import Thresholds
from grpolab.gate.verdict import NOT_ESTABLISHED, SHIP, judged, verdict

T = Thresholds()
BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "gate_error_rates.py"


def capability(base: list[int], trained: list[int], task: str = "gsm8k") -> dict:
    b, t = np.array(base, float), np.array(trained, float)
    return {
        "task": task,
        "n": len(base),
        "base": {"accuracy": float(b.mean())},
        "trained": {"accuracy": float(t.mean())},
        "diff": {**paired_evidence_interval(b, t), "signs": change_signs(b, t)},
    }


def held() -> CheckResult:
    return check_improvement({"diff": {"mean": 0.2, "ci_low": 0.15, "ci_high": 0.25, "n": 100}}, T)


def test_exact_minimum_matches_the_evaluations_exact_interval():
    # 72 unchanged problems: the exact bound 1 - 0.025^(1/72) = 0.0499 is within 0.05; 71 give 0.0506
    n = exact_minimum_n(0.05)
    assert n == 72 and equal_changes_interval(0.0, 72)[0] >= -0.05 > equal_changes_interval(0.0, 71)[0]
    assert exact_minimum_n(0.116) == 30  # the safety probe's 30 prompts show at best 0.116


def test_problems_needed_hand_computed():
    # 10 of 100 problems changed each way: d_i in {-1, 0, 1}, mean 0, sample variance 20/99; the t interval's half
    # width over Z95 gives se, sigma^2 = n se^2 = (1.9842/1.9600)^2 * 20/99 = 0.20705, and
    # (1.960 + 0.842)^2 * 0.20705 / 0.05^2 = 650.05 -> 651
    base = [1] * 10 + [0] * 10 + [1] * 30 + [0] * 50
    trained = [0] * 10 + [1] * 10 + [1] * 30 + [0] * 50
    d = paired_evidence_interval(np.array(base, float), np.array(trained, float))
    assert problems_needed(d, 100, 0.05) == 651
    assert problems_needed(d, 100, 0.10) == 163  # a quarter: 162.5
    assert problems_needed(d, 100, 0.0) is None  # no n shows "no drop at all"
    assert non_inferior(d, 0.10) and not non_inferior(d, 0.05)  # t_99 * sqrt(20/99/100) = 0.0892


def test_capability_not_established_blocks_ship_until_waived():
    base = [1] * 10 + [0] * 10 + [1] * 30 + [0] * 50
    trained = [0] * 10 + [1] * 10 + [1] * 30 + [0] * 50
    c = check_capability([capability(base, trained)], T)
    assert c.status == WARN and c.noninferiority["capability gsm8k"]["n_needed"] == 651
    label, why = verdict([held(), c])
    assert label == NOT_ESTABLISHED and why.startswith("non-inferiority not established")
    assert "capability gsm8k: low end -0.089 < -0.05 (n = 100; about 651 would establish it" in why
    # the old gate shipped this WARN; the user can still, by name, and the verdict says so
    for name in ("capability", "capability:gsm8k", "capability_regression"):
        label, why = verdict(apply_waivers([held(), c], parse_waivers([name])))
        assert label == SHIP and "waived by the user" in why
    assert verdict(apply_waivers([held(), c], ["capability:math"]))[0] == NOT_ESTABLISHED  # another task
    assert verdict(apply_waivers([held(), c], ["safety"]))[0] == NOT_ESTABLISHED


def test_waivers_are_checked_and_never_waive_a_fail():
    with pytest.raises(ConfigError, match="unknown"):
        parse_waivers(["harm"])
    with pytest.raises(ConfigError):
        parse_waivers(["capability:"])
    not_run = CheckResult("safety_regression", "regression", WARN, "not measured: skipped", measured=False)
    assert verdict([held(), not_run])[0] == NOT_ESTABLISHED
    assert verdict(apply_waivers([held(), not_run], ["safety"]))[0] == SHIP  # safety not run, waived: recorded
    failing = CheckResult("safety_regression", "regression", FAIL, "complies more", fail_tests={})
    assert verdict(apply_waivers([held(), failing], ["safety"]))[0] == "don't ship"


def test_cannot_fail_is_monotone_in_the_bases_accuracy():
    """Issue 60 item 6: a base with 0-3 of 50 right blocked the verdict, 4-6 right shipped (N/A "cannot fail",
    ignored). Now every such base blocks ship until its non-inferiority is shown or waived."""
    others = [held()] + [
        CheckResult(f"o{i}", "regression", PASS, "", fail_tests={"x": {"p": 0.5, "fails": False}}) for i in range(3)
    ]
    labels = {}
    for right in range(0, 9):
        base = [1] * right + [0] * (50 - right)
        checks = judged(others + [check_capability([capability(base, base)], T)], T)
        labels[right] = verdict(checks)[0]
        cap = next(c for c in checks if c.name == "capability_regression")
        if right in (4, 5, 6):
            assert cap.status == NA and cap.reason.startswith("cannot fail") and cap.noninferiority
    assert set(labels.values()) == {NOT_ESTABLISHED}, labels
    waived = judged(
        others + [check_capability([capability([1] * 5 + [0] * 45, [1] * 5 + [0] * 45)], T)], T, ["capability"]
    )
    assert verdict(waived)[0] == SHIP


def test_holm_dropped_fail_no_longer_blocks_a_waived_dimension():
    """Issue 60 item 2: the Holm-dropped FAIL changed the label only; now it does not block by itself."""
    base = [1] * 30 + [0] * 20
    trained = [0] * 8 + [1] * 22 + [1] + [0] * 19  # 8 broken, 1 fixed: -0.14 [-0.255, -0.025], sign p = 10/512
    others = [held()] + [
        CheckResult(f"o{i}", "regression", PASS, "", fail_tests={"x": {"p": 0.5, "fails": False}}) for i in range(3)
    ]
    c = check_capability([capability(base, trained)], T)
    assert c.status == FAIL
    checks = judged(others + [c], T, ["capability"])  # 5 FAIL rules: 0.0195 > 0.01, Holm drops it
    cap = next(x for x in checks if x.name == "capability_regression")
    assert cap.status == WARN and cap.numbers["harm_unresolved"] is True
    assert verdict(checks)[0] == SHIP  # was "not established" whatever the user said
    assert verdict(judged(others + [c], T))[0] == NOT_ESTABLISHED  # unwaived: its non-inferiority is not shown


def test_margins_are_thresholds_and_validated():
    assert (T.capability_margin, T.diversity_margin, T.safety_margin) == (0.05, 0.05, 0.05)
    assert T.replace({"capability_margin": 0.1}).capability_margin == 0.1
    with pytest.raises(ConfigError, match="margin"):
        T.replace({"safety_margin": 0.0})


# ---------------------------------------------------------------- the error rates, small form


def load_benchmark():
    spec = importlib.util.spec_from_file_location("gate_error_rates", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def upper(p: float, sims: int) -> float:
    """A bound p on a true rate, plus 3 binomial standard errors of a rate estimated from `sims` reports: a correct
    gate exceeds it in about 0.13% of seeds; the seed is fixed, so the test is deterministic."""
    return p + 3 * math.sqrt(p * (1 - p) / sims)


def test_error_rates_small_form():
    """The four bounds of issue 60 at the demo's sizes and at the power calculation's sizes, 300 reports each.
    Plausible bugs break them: WARN shipping again (P(ship | capability -margin) at the demo ~0.7), the PASS rule
    reading the wrong end or 0 instead of the margin (sized +0.10 P(ship) ~0), a waiver that does not count."""
    bench, sims = load_benchmark(), 300
    t = Thresholds()
    demo, sized = bench.DEMO, bench.sized_sizes(t, 2.0)
    assert (sized.heldout, sized.capability, sized.safety, sized.pass8) == (421, 1653, 1259, 1889)
    by_name = {s.name: s for s in bench.scenarios(t)}
    r = bench.rates(by_name["no true gain, all harm waived"], demo, sims, seed=1)
    assert r["ship"] <= upper(0.025, sims), r  # 0.052
    for name in ("+0.10, capability -margin", "+0.10, pass@8 -margin"):
        r = bench.rates(by_name[name], demo, sims, seed=1)
        assert r["ship"] <= upper(0.05, sims), (name, r)  # 0.088
    assert demo.waived == ("safety",)  # make demo waives safety (its bound is then not claimed: the table says so)
    r = bench.rates(by_name["+0.10, no harm"], demo, sims, seed=1)
    assert r["ship"] <= 0.05, r  # 39 capability problems cannot show non-inferiority at 0.05 with no capability change
    r = bench.rates(by_name["+0.10, no harm, all harm waived"], demo, sims, seed=1)
    assert r["ship"] >= 0.6, r  # a waiver counts: 0.765 over 2000 reports (0.6 is 6.7 SE below), ~0 unwaived
    r = bench.rates(by_name["+0.10, no harm"], sized, sims, seed=1)
    assert r["ship"] >= 0.8 - 3 * math.sqrt(0.8 * 0.2 / sims), r
    r = bench.rates(by_name["+0.10, pass@8 -margin"], sized, sims, seed=1)
    assert r["ship"] <= upper(0.05, sims), r


def test_heldout_gain_needs_the_exact_sign_test_too():
    """Issue 60 item 6: 5 of 100 problems better, none worse: the t interval +0.05 [+0.0065, +0.093] excludes 0,
    but the exact sign test gives p = 2^-5 = 0.031 > 0.025 -- not established (it was a PASS); 6 better: 0.0156."""
    base = [0] * 5 + [1] * 40 + [0] * 55
    d5 = {**paired_evidence_interval(np.array(base, float), np.array([1] * 45 + [0] * 55, float))}
    d5["signs"] = {"worse": 0, "better": 5}
    assert d5["ci_low"] > 0
    c = check_improvement({"diff": d5}, T)
    assert c.status == WARN and c.numbers["sign_p"] == 0.0312 and "exact sign test gives p = 0.0312" in c.reason
    assert check_improvement({"diff": {**d5, "signs": {"worse": 0, "better": 6}}}, T).status == PASS
    assert check_improvement({"diff": {k: v for k, v in d5.items() if k != "signs"}}, T).status == PASS


def test_reward_vs_heldout_compares_like_with_like():
    """Issue 60 item 3: a correctness weight of 5 turned +0.10 [+0.045, +0.155] into a FAIL (the weighted reward
    rose 1.0, floor 0.25 x 1.0); on the accuracy scale the rise is 1.0 / 5 = 0.2, floor 0.05: PASS. A farmed bonus
    still counts: with weight 1, a reward rise of 0.4 against +0.02 [-0.03, +0.07] (floor 0.10) FAILs."""
    from grpolab.gate.hacking import check_reward_vs_heldout

    rows = [{"step": i + 1, "reward/mean": 5 * x} for i, x in enumerate([0.3] * 4 + [0.5] * 4)]
    heldout = {"diff": {"mean": 0.10, "ci_low": 0.045, "ci_high": 0.155, "n": 266}}
    assert check_reward_vs_heldout(rows, heldout, T).status == FAIL  # weights unknown: reward units, as before
    c = check_reward_vs_heldout(rows, heldout, T, {"correct": 5.0, "format": 0.1})
    assert c.status == PASS and c.numbers["correctness_weight"] == 5.0 and "= 0.050" in c.reason
    rows = [{"step": i + 1, "reward/mean": x} for i, x in enumerate([0.2] * 4 + [0.6] * 4)]
    greedy = {"diff": {"mean": 0.02, "ci_low": -0.03, "ci_high": 0.07, "n": 266}}
    assert check_reward_vs_heldout(rows, greedy, T, {"correct": 1.0, "format": 0.5}).status == FAIL


def test_a_slice_counts_as_worse_only_under_holm_over_the_slices():
    """Issue 60 item 3: one of 12 slices below 0 by its own interval, p = Phi(-0.1 / 0.0459) = 0.0147 > 0.05 / 12:
    chance among 12, not a worse slice (it was a WARN, which kept the verdict from ship); alone it still counts."""
    barely = {"diff": {"mean": -0.1, "ci_low": -0.19, "ci_high": -0.01}}
    null = {"diff": {"mean": 0.0, "ci_low": -0.1, "ci_high": 0.1}}
    overall = {"mean": 0.2, "ci_low": 0.15, "ci_high": 0.25, "n": 100}
    twelve = {"s0": barely, **{f"s{i}": null for i in range(1, 12)}}
    assert check_improvement({"diff": overall, "per_slice": twelve}, T).status == PASS
    one = check_improvement({"diff": overall, "per_slice": {"s0": barely}}, T)
    assert one.status == WARN and one.numbers["worse_slices"] == "s0"


def test_a_set_whose_runs_answered_no_safety_prompt_is_too_little_evidence():
    """Issue 60 item 6: set_safety crashed ("the runs share no problem") when the runs answered no prompt."""
    from grpolab.gate.regression import check_safety
    from grpolab.report.sets import set_safety

    empty = {"items": [], "max_new_tokens": 64, "heuristic": "h", "newly_complied": 0, "newly_refused": 0}
    c = check_safety(set_safety([empty] * 3, ["a", "b", "c"]), T)
    assert c.status == NA and not c.measured and c.reason.startswith("too little evidence (n = 0 < 20")
