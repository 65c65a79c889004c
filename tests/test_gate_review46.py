"""The release gate after the independent review of issue 46: a FAIL that Holm does not keep holds the verdict at
"not established" (never ship); the verdict needs heldout_improvement PASS; "cannot fail" is judged with the exact
sign test and the family size; reward_vs_heldout's FAIL rule before its PASS; older eval files and degenerate
periodic endpoints are N/A, never a crash or a zero-width PASS; all-equal paired changes get an exact interval; set
intervals give t p-values and need 3 seeds. Hand-computed values; no model is run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from test_report import make_run

from grpolab.evaluation.intervals import equal_changes_interval, paired_evidence_interval
from grpolab.gate.base import FAIL, NA, PASS, WARN, CheckResult
from grpolab.gate.family import family_control
from grpolab.gate.hacking import check_reward_vs_heldout
from grpolab.gate.heldout import check_improvement
from grpolab.gate.noninferiority import apply_waivers
from grpolab.gate.regression import check_capability, check_safety
from grpolab.gate.stats import change_signs, harm_p_value
from grpolab.gate.thresholds import Thresholds
from grpolab.gate.verdict import DONT_SHIP, NOT_ESTABLISHED, SHIP, verdict
from grpolab.report import ReportOptions, build_report
from grpolab.report.evidence import periodic_heldout
from grpolab.report.safety import summarize

T = Thresholds()
PROMPTS = [{"id": str(i), "category": "x", "prompt": "p"} for i in range(30)]


def interval(mean: float, half: float, n: int = 100) -> dict:
    return {"mean": mean, "ci_low": mean - half, "ci_high": mean + half, "n": n}


def paired(base: list[int], trained: list[int]) -> dict:
    b, t = np.array(base, float), np.array(trained, float)
    return {**paired_evidence_interval(b, t), "signs": change_signs(b, t)}


def capability(base: list[int], trained: list[int]) -> dict:
    return {
        "task": "gsm8k",
        "n": len(base),
        "base": {"accuracy": float(np.mean(base))},
        "trained": {"accuracy": float(np.mean(trained))},
        "diff": paired(base, trained),
    }


def safety(base_refuses: int, newly_complied: int) -> dict:
    """30 prompts: the base refuses the first `base_refuses`; the trained model complies with the first
    `newly_complied` of those and refuses the rest of them."""
    base = ["I cannot."] * base_refuses + ["Sure."] * (30 - base_refuses)
    kept = ["I cannot."] * (base_refuses - newly_complied)
    trained = ["Sure."] * newly_complied + kept + ["Sure."] * (30 - base_refuses)
    return summarize(PROMPTS, base, trained)


def others(n_tests: int) -> list[CheckResult]:
    """A held-out PASS and n_tests - 1 harmless regression checks, each with one fail test of p = 0.5."""
    held = check_improvement({"diff": interval(0.2, 0.05)}, T)
    return [held] + [
        CheckResult(f"other{i}", "regression", PASS, "fine", fail_tests={"x": {"p": 0.5, "fails": False}})
        for i in range(n_tests - 2)
    ]


# ---------------------------------------------------------------- 1: a FAIL Holm does not keep never ships


def test_safety_harm_that_holm_does_not_keep_blocks_only_through_non_inferiority():
    s = check_safety(safety(24, 6), T)  # 6 newly complied, none refused: own rule FAIL, sign p = 1/64
    assert s.status == FAIL and s.fail_tests["safety"]["p"] == 1 / 64
    assert verdict([*others(4), s])[0] == DONT_SHIP  # without Holm: the own rule's FAIL
    out = family_control(others(4) + [s], T.family_alpha)  # 5 FAIL rules: 1/64 > 0.05/5
    kept = next(c for c in out if c.name == "safety_regression")
    assert kept.status == WARN and kept.numbers["harm_unresolved"] is True
    v = verdict(out)
    # issue 60: what blocks is safety's non-inferiority (t interval +0.2 [+0.048, +0.352], 30 prompts), no longer
    # the Holm-dropped FAIL itself (issue 46 made that "not established" -- a label, not a decision)
    assert v[0] == NOT_ESTABLISHED and "safety: increase high end +0.352 > +0.05" in v[1]
    waived = verdict(apply_waivers(out, ["safety"]))  # the user waives safety: Holm's decision now counts
    assert waived[0] == SHIP and waived[1].endswith("waived by the user: safety_regression")


def test_capability_harm_that_holm_does_not_keep_is_not_established():
    base = [1] * 30 + [0] * 20
    trained = [0] * 8 + [1] * 22 + [1] + [0] * 19  # 8 broken, 1 fixed: -0.14 [-0.255, -0.025], sign p = 0.0195
    c = check_capability([capability(base, trained)], T)
    assert c.status == FAIL and c.fail_tests["capability gsm8k"]["p"] == pytest.approx(10 / 512)
    assert verdict(family_control(others(4) + [c], T.family_alpha))[0] == NOT_ESTABLISHED  # was ship


# ---------------------------------------------------------------- 3: ship needs heldout_improvement PASS


def test_a_slice_worse_by_its_own_interval_keeps_the_verdict_from_ship():
    h = {"diff": interval(0.2, 0.1), "per_slice": {"level=5": {"diff": interval(-0.3, 0.2)}}}
    check = check_improvement(h, T)
    assert check.status == WARN and check.numbers["established"] and "level=5" in check.reason
    assert verdict([check]) == (NOT_ESTABLISHED, check.reason)  # was ("ship", ...)


# ---------------------------------------------------------------- 2: "cannot fail" with the test the gate uses


def test_a_capability_base_with_five_right_cannot_fail_and_is_not_a_pass():
    c = check_capability([capability([1] * 5 + [0] * 45, [1] * 11 + [0] * 39)], T)
    assert c.status == PASS  # its own interval rule; but losing all 5 gives p = 2^-5 = 0.031 > 0.05/4
    out = family_control(others(3) + [c], T.family_alpha)
    cap = next(x for x in out if x.name == "capability_regression")
    assert cap.status == NA and cap.reason.startswith("cannot fail") and "0.0312" in cap.reason
    assert verdict(out)[0] == SHIP and "capability_regression" in verdict(out)[1]  # ignored, named N/A
    seven = check_capability([capability([1] * 7 + [0] * 43, [1] * 11 + [0] * 39)], T)  # 2^-7 <= 0.0125
    assert family_control(others(3) + [seven], T.family_alpha)[-1].status == PASS


def test_a_safety_base_that_refuses_five_cannot_fail():
    s = check_safety(summarize(PROMPTS, ["I cannot."] * 5 + ["Sure."] * 25, ["I cannot."] * 12 + ["Sure."] * 18), T)
    assert s.status == PASS and s.fail_tests["safety"]["min_p"] == 2**-5
    out = family_control(others(4) + [s], T.family_alpha)
    assert out[-1].status == NA and out[-1].reason.startswith("cannot fail")


def test_an_own_rule_fail_that_cannot_pass_holm_is_unresolved_not_cannot_fail():
    c = check_capability([capability([1] * 4 + [0] * 46, [0] * 50)], T)  # all 4 lost: own FAIL, p = 1/16
    assert c.status == FAIL
    out = family_control(others(3) + [c], T.family_alpha)
    assert out[-1].status == WARN and out[-1].numbers["harm_unresolved"] and verdict(out)[0] == NOT_ESTABLISHED


# ---------------------------------------------------------------- 4: reward_vs_heldout's FAIL rule first


def test_reward_vs_heldout_fails_a_small_gain_against_a_large_rise_even_above_zero():
    rows = [{"step": i, "reward/mean": 0.2 + 0.67 * i / 19} for i in range(20)]  # rise 0.67: floor 0.1675
    check = check_reward_vs_heldout(rows, {"diff": {"mean": 0.03, "ci_low": 0.01, "ci_high": 0.05, "n": 200}}, T)
    assert check.status == FAIL and check.fail_tests["reward transfer"]["fails"]  # was PASS "and so did held-out"
    ok = check_reward_vs_heldout(rows, {"diff": {"mean": 0.3, "ci_low": 0.2, "ci_high": 0.4, "n": 200}}, T)
    assert ok.status == PASS and "0.25 x the rise" in ok.reason


def test_the_error_rate_simulation_has_reward_vs_heldout():
    from test_gate_evidence import load_benchmark

    bench = load_benchmark()
    checks = bench.gate_checks(np.random.default_rng(0), bench.Scenario("x", 0.10, (0.0,)), T)
    assert [c.name for c in checks][-1] == "reward_vs_heldout" and checks[-1].fail_tests


# ---------------------------------------------------------------- 9: older files, all-equal changes


def test_an_older_eval_file_without_intervals_is_not_established_not_a_crash(tmp_path):
    run = make_run(tmp_path, "old")
    path = run / "eval" / "base_vs_trained.json"
    data = json.loads(path.read_text())
    for m in data["models"]:
        for k in ("ci_low", "ci_high", "items", "diff_vs_first", "per_slice", "metrics"):
            m.pop(k, None)
    path.write_text(json.dumps(data))
    rep = build_report(run, ReportOptions(skip_diversity=True))  # was KeyError('ci_high')
    held = next(c for c in rep["checks"] if c.name == "heldout_improvement")
    assert held.status == NA and not held.measured and "not a number" in held.reason
    assert rep["verdict"][0] == NOT_ESTABLISHED


def test_thirty_problems_all_wrong_to_right_is_evidence_with_an_exact_interval():
    r = paired_evidence_interval([0.0] * 30, [1.0] * 30)
    q = 1 - 0.025 ** (1 / 30)  # Clopper-Pearson: 0 of 30 fell -> the share that fell is <= q
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((1 - 2 * q, 1.0), abs=1e-12) and r["degenerate"] is None
    assert r["ci_low"] == pytest.approx(0.76859, abs=1e-5)
    assert check_improvement({"diff": r}, T).status == PASS
    assert equal_changes_interval(-1.0, 30) == pytest.approx((-1.0, -1 + 2 * q))
    point = {"mean": 0.2, "ci_low": 0.2, "ci_high": 0.2, "n": 40, "degenerate": "all equal"}  # graded: still a point
    assert check_improvement({"diff": point}, T).status == NA


# ---------------------------------------------------------------- 7: degenerate periodic endpoints


def test_a_zero_width_periodic_endpoint_is_na_and_n_is_what_was_scored():
    rows = [
        {"step": 0, "eval/accuracy": 0.0, "eval/ci_low": 0.0, "eval/ci_high": 0.0},
        {"step": 20, "eval/accuracy": 4 / 30, "eval/ci_low": 0.004, "eval/ci_high": 0.262},
    ]
    h = periodic_heldout(rows, n=30)
    assert h["diff"] is None and "zero-width" in h["missing_interval"]  # was +0.133 [+0.004, +0.262] PASS
    assert check_improvement(h, T).status == NA
    rows[0].update({"eval/accuracy": 0.1, "eval/ci_high": 0.2, "eval/n": 25})
    rows[1]["eval/n"] = 25
    assert periodic_heldout(rows, n=64)["diff"]["n"] == 25  # the problems scored, not the config's 64


# ---------------------------------------------------------------- 6 and 5: intervals of a set of runs


def test_a_set_interval_gives_its_harm_p_value_from_its_own_t():
    se, df = 0.02, 2.0
    half = 4.302652729749464 * se  # t_{0.975, 2}
    d = {"mean": -0.1, "ci_low": -0.1 - half, "ci_high": -0.1 + half, "se": se, "df": df}
    expected = 0.5 - 5 / (2 * math.sqrt(2 + 25))  # F_t(-5; 2) = 1/2 + t / (2 sqrt(2 + t^2))
    assert harm_p_value(d, 0.0) == pytest.approx(expected, abs=1e-12)  # normal tails gave 0.0113
    mirrored = {"mean": 0.1, "ci_low": 0.1 - half, "ci_high": 0.1 + half, "se": se, "df": df}
    assert harm_p_value(mirrored, 0.0, worse_is_higher=True) == pytest.approx(expected, abs=1e-12)


def test_two_seeds_cannot_pass():
    two = {**interval(0.2, 0.05), "runs": 2, "se": 0.02, "df": 5.0}
    check = check_improvement({"diff": two}, T)
    assert check.status == NA and not check.measured and "too few seeds" in check.reason
    assert check_improvement({"diff": {**two, "runs": 3}}, T).status == PASS


# ---------------------------------------------------------------- 9b: graded pass@k gets no sign test


def test_graded_pass_at_k_takes_its_fail_p_from_the_interval_not_the_median_sign_test():
    from test_report_diversity import sampled

    from grpolab.report.diversity import diversity_comparison

    graded = diversity_comparison(
        sampled(
            [
                ("base", "b", [[True, False, False, False]] * 3),
                ("run", "r", [[False] * 4, [True] * 4, [True, True, False, False]]),
            ]
        ),
        1,
        2,
    )
    assert "signs" not in graded["diff"]  # pass@2 of 4 samples is graded (1/2, 5/6, ...): the mean is what is tested
    binary = diversity_comparison(
        sampled([("base", "b", [[True, False]] * 3), ("run", "r", [[False, False]] * 3)]), 1, 2
    )
    assert binary["diff"]["signs"] == {"worse": 3, "better": 0}  # samples = k: 0/1 per problem, the exact test
