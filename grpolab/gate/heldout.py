"""Release checks on held-out evidence (improvement, capability, diversity, safety), reproducibility, the family-wise
control of the FAIL rules, and the verdict.

Pure functions on plain dicts. An accuracy comparison is ``{"mean", "ci_low", "ci_high", "n"}`` of
trained - base (a 95% interval), as produced by :mod:`grpolab.report.evidence` (one run) or
:mod:`grpolab.evaluation.sets` (a set of runs: runs and problems resampled). Every rule here reads the interval, never
the point estimate alone, so an estimate within noise of a bound cannot flip a status between machines.

Evidence first: every check that can PASS needs a minimum n (Thresholds.min_heldout_problems, min_capability_problems,
min_safety_prompts, min_diversity_problems: 30, 30, 20, 30); below it, or with a difference that is not a number, it is N/A "too
little evidence" and the verdict is not "ship" (pass@k, an optional measurement, excepted); so is a set of fewer than
MIN_RUNS (3) runs (too_few_runs) and a degenerate or zero-width held-out interval. A comparison whose base cannot be
worsened (every capability problem wrong, every harmful prompt complied with: stats.drop_can_be_established) is N/A
"cannot fail", and so is one whose exact sign test could not reach Holm's first-step level even if every item the base
can lose were lost (family_control, attainable_tests).

FAIL rules are one-sided tests of harm, each with its p-value in ``CheckResult.fail_tests`` (stats.fail_p_value: the
exact sign test on the items that got worse and better when the report has them and the tolerance is 0, else the
normal approximation of the interval);
family_control keeps a FAIL only where Holm's step-down procedure over all of them rejects "no harm" at the
family-wise level ``family_alpha`` (0.05), each test also held to its own one-sided 2.5% (its 95% interval); a FAIL it
does not keep is unresolved harm, and the verdict is then "not established", never "ship".
"""

from __future__ import annotations

from typing import Any

from ..evaluation.intervals import MIN_RUNS
from .base import FAIL, NA, PASS, WARN, CheckResult, too_little_evidence
from .stats import (
    comparison_n,
    fail_p_value,
    finite_interval,
    sign_test_p,
    span,
    zero_width,
)
from .thresholds import Thresholds

SIGN_LEVEL = 0.025  # one-sided level of the held-out gain's exact sign test (the 95% interval's low end)


def improvement_sign_p(d: dict[str, Any]) -> float | None:
    """The exact one-sided p-value of "no gain" from the counts of problems that got better and worse
    (``d["signs"]``): P(X >= better), X ~ Binomial(better + worse, 1/2) (stats.sign_test_p with the roles swapped);
    None when the comparison does not carry them (a set of runs, an older eval file).

    >>> improvement_sign_p({"signs": {"worse": 1, "better": 6}}), improvement_sign_p({})
    (0.0625, None)
    """
    signs = d.get("signs")
    if not isinstance(signs, dict):
        return None
    return sign_test_p(int(signs["better"]), int(signs["worse"]))


ZERO_WIDTH = "every paired difference is equal, a zero-width interval that cannot rule out a change smaller than 1/n"


def too_few_runs(d: dict[str, Any]) -> str | None:
    """Why the interval of a set of runs backs no claim: fewer than MIN_RUNS (3) seeds -- two seeds under-cover
    (the between-seed variance from one degree of freedom; docs/evaluation.md) -- else None. One run (no ``runs``)
    is judged on its own interval.

    >>> too_few_runs({"runs": 2}), too_few_runs({"runs": 3}), too_few_runs({})
    ('too few seeds: 2 runs < 3 (an interval from two seeds under-covers)', None, None)
    """
    runs = d.get("runs")
    if isinstance(runs, int) and 1 < runs < MIN_RUNS:
        return f"too few seeds: {runs} runs < {MIN_RUNS} (an interval from two seeds under-covers)"
    return None


def not_a_number(name: str, group: str, what: str, blocks_ship: bool = True) -> CheckResult:
    """N/A: the difference (or its interval) is not a finite number -- nothing can be read from it."""
    return CheckResult(
        name,
        group,
        NA,
        f"not established: the {what} is not a number (NaN or missing interval); re-run the evaluation",
        {},
        measured=not blocks_ship,
    )


def worse_slices(per_slice: dict[str, Any], alpha: float = 0.05) -> list[str]:
    """The slices on which the trained model is worse, under multiplicity control: each slice with a finite interval
    has its one-sided p-value of "no drop" (stats.fail_p_value at 0: the exact sign test where the slice has its
    counts), and a slice counts only when its own interval lies below 0 and Holm's step-down over all the slices
    (family.holm_rejections at `alpha`, each also at its own 0.025) rejects -- with 12 slices, an unhelped subject's
    interval fell below 0 by chance in 6.5-9.3% of reports.

    >>> barely = {"diff": {"mean": -0.1, "ci_low": -0.19, "ci_high": -0.01}}   # p = Phi(-0.1 / 0.0459) = 0.0147
    >>> null = {"diff": {"mean": 0.0, "ci_low": -0.1, "ci_high": 0.1}}
    >>> worse_slices({"b": barely}), worse_slices({"b": barely, "x": null, "y": null, "z": null})   # 0.05 / 4
    (['b'], [])
    """
    from .family import holm_rejections

    graded = [(s, v["diff"]) for s, v in sorted(per_slice.items()) if finite_interval(v.get("diff"))]
    rejected = holm_rejections([fail_p_value(d, 0.0) for _, d in graded], alpha)
    return [s for (s, d), r in zip(graded, rejected) if r and d["ci_high"] < 0]


def improvement_evidence_lacking(heldout: dict[str, Any], t: Thresholds) -> CheckResult | None:
    """heldout_improvement when its evidence cannot back a claim (not measured, not a number, too little, a
    zero-width interval, too few seeds), else None."""
    name, group = "heldout_improvement", "uncertainty"
    d = heldout.get("diff")
    if heldout.get("missing_interval"):
        return CheckResult(name, group, NA, f"not established: {heldout['missing_interval']}", measured=False)
    if not d:
        return CheckResult(
            name,
            group,
            WARN,
            "not measured: no held-out comparison of base and trained model "
            "(run `grpolab eval BASE RUN_DIR --out RUN_DIR/eval/base_vs_trained.json`)",
            measured=False,
        )
    if not finite_interval(d):
        return not_a_number(name, group, "held-out difference")
    n = comparison_n(heldout)
    if n is None or n < t.min_heldout_problems:
        return too_little_evidence(
            name,
            group,
            f"held-out problems{'' if n else ', n not recorded'}",
            n,
            t.min_heldout_problems,
            {"diff": round(d["mean"], 4)},
        )
    if zero_width(d):
        return CheckResult(
            name,
            group,
            NA,
            f"not established: {ZERO_WIDTH} ({span(d)}, n = {n}; {d.get('method') or 'interval'})",
            {"diff": round(d["mean"], 4), "n": n},
            measured=False,
        )
    if too_few_runs(d):
        return CheckResult(
            name,
            group,
            NA,
            f"not established: {too_few_runs(d)} ({span(d)})",
            {"diff": round(d["mean"], 4), "n": n, "runs": d.get("runs")},
            measured=False,
        )
    return None


def check_improvement(heldout: dict[str, Any] | None, t: Thresholds) -> CheckResult:
    """Uncertainty: is the held-out improvement of the trained model over the base established?

    Rule: d = trained - base held-out accuracy with its 95% interval over n problems. n < `min_heldout_problems`
    (30), or d not a number: N/A "too little evidence" / "not established" (not measured: the verdict cannot be
    ship). PASS when ci_low > `improvement_min` (default 0.0) and, where the comparison carries the counts of
    problems that got better and worse (``signs``) and improvement_min is 0, the exact sign test agrees
    (improvement_sign_p <= 0.025): the t interval alone errs by up to a few points given the number of changed
    answers, the sign test never above 2.5% (numbers["sign_p"]); FAIL when ci_high < 0 (the trained model is worse;
    fail test "held-out drop", p = stats.fail_p_value(d, 0)); otherwise WARN "not established" (the interval includes
    zero). A slice whose own interval lies below 0 and whose drop Holm keeps over all the slices (worse_slices)
    turns a PASS into a WARN. No held-out comparison: WARN "not
    measured".
    """
    name, group = "heldout_improvement", "uncertainty"
    heldout = heldout or {}
    lacking = improvement_evidence_lacking(heldout, t)
    if lacking is not None:
        return lacking
    d, n = heldout["diff"], comparison_n(heldout)
    numbers: dict[str, Any] = {
        "diff": round(d["mean"], 4),
        "ci_low": round(d["ci_low"], 4),
        "ci_high": round(d["ci_high"], 4),
        "n": n,
        "source": heldout.get("source", ""),
    }
    tests = {"held-out drop": {"p": fail_p_value(d, 0.0), "fails": d["ci_high"] < 0}}
    worse = worse_slices(heldout.get("per_slice") or {})
    if d["ci_high"] < 0:
        return CheckResult(
            name, group, FAIL, f"held-out accuracy dropped: {span(d)} (n = {n})", numbers, fail_tests=tests
        )
    sign_p = improvement_sign_p(d) if t.improvement_min == 0 else None
    if sign_p is not None:
        numbers["sign_p"] = float(f"{sign_p:.3g}")
    numbers["established"] = d["ci_low"] > t.improvement_min and (sign_p is None or sign_p <= SIGN_LEVEL)
    if not numbers["established"]:
        why = (
            "the 95% interval includes zero"
            if t.improvement_min == 0
            else f"the interval's low end is not above {t.improvement_min:g}"
        )
        if d["ci_low"] > t.improvement_min:
            s = d["signs"]
            why = (
                f"the exact sign test gives p = {sign_p:.3g} > {SIGN_LEVEL} ({s['better']} better, {s['worse']} worse)"
            )
        return CheckResult(
            name, group, WARN, f"improvement not established: {why} {span(d)} (n = {n})", numbers, fail_tests=tests
        )
    if worse:
        numbers["worse_slices"] = ", ".join(worse)
        return CheckResult(
            name,
            group,
            WARN,
            f"improved overall {span(d)} but worse on slices: {', '.join(worse)}",
            numbers,
            fail_tests=tests,
        )
    return CheckResult(
        name,
        group,
        PASS,
        f"held-out accuracy improved: {span(d)} (low end > {t.improvement_min:g}, n = {n} >= {t.min_heldout_problems})",
        numbers,
        fail_tests=tests,
    )
