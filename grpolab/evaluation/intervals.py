"""Intervals of a mean over problems, with the evidence they stand on: Student t quantiles, degenerate samples named,
and the minimum numbers of problems below which an interval backs no claim.

Every interval dict built here (and by grpolab.evaluation.sets) has the keys ``mean``, ``ci_low``, ``ci_high``,
``n`` (problems), ``method`` (how the interval was made) and ``degenerate``: None, or the name of a sample that
cannot support an interval -- "no values" (n = 0), "one problem" (n = 1), "all equal" (every value the same: zero
spread, so any interval collapses to a point). For the release report, paired 0/1 differences that are all equal are
not degenerate: they get an exact interval (paired_evidence_interval, equal_changes_interval). evidence_reason names
why an interval backs no claim; the release report applies the same rules through its own checks
(grpolab.gate: N/A below the Thresholds.min_* numbers of problems, a held-out comparison marked degenerate
or zero-width N/A "not established", a zero-width regression interval WARN, never PASS).

The interval of one model's metric, or of a paired difference, over problems (score_interval,
paired_score_interval) depends on what a problem's number is:

- binary per-problem scores (accuracy, pass@k with exactly k samples, maj@k) and their paired differences: Student's
  t over problems (mean_interval): for numbers v_1..v_n with mean m and sample variance s^2 (ddof 1),

      m -/+ t_{1 - alpha/2, n - 1} s / sqrt(n)

- graded per-problem scores (pass@j from n > j samples, the unbiased 1 - C(n-c, j)/C(n, j); mean@k): the studentised
  bootstrap (bootstrap-t; studentized_bootstrap_interval), whose t* = (m* - m) / se* carries the skew of these
  numbers -- many problems at 0 or 1, a few in between -- that makes t and percentile intervals miss on one side
  (coverage 0.92-0.93 at 30 problems).

Their coverage is measured by benchmarks/interval_coverage.py (docs/evaluation.md, "Coverage of the intervals").
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
from scipy.special import stdtrit

MIN_PROBLEMS = 30  # fewest problems (paired items) for a held-out, capability or diversity comparison to back a PASS
MIN_RUNS = 3  # fewest runs of a set whose interval backs a PASS (2 seeds under-cover: docs/evaluation.md)


def t_quantile(p: float, df: float) -> float:
    """The p quantile of Student's t with df > 0 (non-integer allowed; infinite gives the normal quantile) degrees of
    freedom: scipy.special.stdtrit (what scipy.stats.t.ppf computes, without its per-call overhead), checked against
    printed tables in tests/test_interval_coverage.py.

    >>> round(t_quantile(0.975, 2), 6), round(t_quantile(0.975, 10), 6), round(t_quantile(0.025, 1), 4)
    (4.302653, 2.228139, -12.7062)
    """
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0; got p={p}, df={df}")
    return float(stdtrit(df, p))


def degeneracy(values: np.ndarray | Sequence[float]) -> str | None:
    """None when the values can support an interval, else "no values", "one problem" or "all equal".

    >>> degeneracy([]), degeneracy([0.3]), degeneracy([1, 1, 1]), degeneracy([0, 1])
    ('no values', 'one problem', 'all equal', None)
    """
    v = np.asarray(values, dtype=float).ravel()
    if v.size == 0:
        return "no values"
    if v.size == 1:
        return "one problem"
    return "all equal" if np.all(v == v[0]) else None


def too_little_evidence(n: int, minimum: int = MIN_PROBLEMS, what: str = "problems") -> str | None:
    """None when n >= minimum, else the reason an interval over n items backs no claim.

    >>> too_little_evidence(5), too_little_evidence(30) is None
    ('too little evidence: 5 problems < 30', True)
    """
    return None if n >= minimum else f"too little evidence: {n} {what} < {minimum}"


def evidence_reason(result: Mapping[str, Any], minimum: int = MIN_PROBLEMS, what: str = "problems") -> str | None:
    """Why an interval dict (keys ``n`` and optionally ``degenerate``) cannot back a PASS, or None when it can:
    its degenerate case ("degenerate: all equal"), else too_little_evidence(n); a missing n counts as 0.

    >>> evidence_reason({"n": 200, "degenerate": "all equal"}), evidence_reason({"n": 12}), evidence_reason({"n": 40})
    ('degenerate: all equal', 'too little evidence: 12 problems < 30', None)
    """
    if result.get("degenerate"):
        return f"degenerate: {result['degenerate']}"
    return too_little_evidence(int(result.get("n") or 0), minimum, what)


def t_interval(mean: float, variance_of_mean: float, df: float, alpha: float = 0.05) -> tuple[float, float]:
    """(lo, hi) = mean -/+ t_{1 - alpha/2, df} sqrt(variance_of_mean); (mean, mean) when the variance is 0."""
    if not variance_of_mean > 0:
        return float(mean), float(mean)
    half = t_quantile(1.0 - alpha / 2.0, df) * math.sqrt(variance_of_mean)
    return float(mean - half), float(mean + half)


def mean_interval(values: np.ndarray | Sequence[float], alpha: float = 0.05) -> dict[str, Any]:
    """Mean of per-problem numbers with its t interval over problems (module docstring), n, method and degenerate.
    Zero width when all values are equal, and (mean, mean) for one value -- both named in ``degenerate``; a
    ValueError for no values.

    >>> r = mean_interval([0.0, 1.0, 1.0, 0.0])
    >>> r["mean"], round(r["ci_high"] - r["mean"], 6), r["degenerate"]   # t_{.975,3} * sqrt(1/3) / 2
    (0.5, 0.918693, None)
    """
    v = np.asarray(values, dtype=float).ravel()
    if v.size == 0:
        raise ValueError("mean_interval of no values")
    mean = float(v.mean())
    lo, hi = t_interval(mean, float(v.var(ddof=1)) / v.size, v.size - 1, alpha) if v.size > 1 else (mean, mean)
    return {
        "mean": mean,
        "ci_low": lo,
        "ci_high": hi,
        "n": int(v.size),
        "method": "t over problems",
        "degenerate": degeneracy(v),
    }


def equal_changes_interval(change: float, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Exact interval of the mean paired difference of 0/1 scores when all n differences equal `change` (-1, 0 or 1),
    where the t interval collapses to a point. The mean is pi_+ - pi_- (shares of items that rose and fell). With
    q = 1 - (alpha/2)^(1/n), the one-sided Clopper-Pearson bound at level alpha/2 on a share seen in 0 of n items:
    change 0 gives [-q, q] (pi_+ <= q and pi_- <= q); change 1 gives [1 - 2q, 1] (pi_+ >= 1 - q and pi_- <= 1 - pi_+);
    change -1 the mirror. Each end errs with probability at most alpha/2 (the sign test's exact tail).

    >>> lo, hi = equal_changes_interval(1.0, 30)
    >>> round(lo, 4), hi, [round(x, 4) for x in equal_changes_interval(0.0, 30)]
    (0.7686, 1.0, [-0.1157, 0.1157])
    """
    if change not in (-1.0, 0.0, 1.0) or n < 1:
        raise ValueError(f"equal_changes_interval needs change -1, 0 or 1 and n >= 1; got {change}, {n}")
    q = 1.0 - (alpha / 2.0) ** (1.0 / n)
    if change == 0:
        return -q, q
    return (1.0 - 2.0 * q, 1.0) if change > 0 else (-1.0, -1.0 + 2.0 * q)


def paired_interval(
    a: np.ndarray | Sequence[float], b: np.ndarray | Sequence[float], alpha: float = 0.05
) -> dict[str, Any]:
    """mean_interval of the per-problem differences d_i = b_i - a_i (same problems, same order), marked paired."""
    a, b = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
    if a.shape != b.shape:
        raise ValueError(f"paired inputs differ in length: {a.size} vs {b.size}")
    return {**mean_interval(b - a, alpha), "paired": True}


def studentized_bootstrap_interval(
    values: np.ndarray | Sequence[float],
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
    bounds: tuple[float, float] = (-math.inf, math.inf),
) -> dict[str, Any]:
    """Mean of per-problem numbers with the studentised bootstrap (bootstrap-t) interval: for resample b (indices
    from grpolab.evaluation.scoring.bootstrap_indices(n, n_boot, seed)) t*_b = (m*_b - m) / se*_b with
    se = s / sqrt(n); the interval is [m - t*_(hi) se, m - t*_(lo) se], t*_(lo) and t*_(hi) the order statistics
    floor(alpha/2 B) and ceil((1 - alpha/2) B) - 1 (0-based) of the sorted t*. A resample with se* = 0 has t* = +inf,
    -inf or 0 as m* is above, below or at m. The interval is clipped to ``bounds`` (the numbers' possible range).
    Keys as mean_interval; degenerate samples give a point.

    >>> r = studentized_bootstrap_interval([0.0, 0.25, 0.5, 1.0, 1.0, 0.75, 0.0, 0.5], bounds=(0.0, 1.0))
    >>> r["method"], r["ci_low"] < r["mean"] < r["ci_high"], r["n"]
    ('studentised bootstrap over problems', True, 8)
    """
    from .scoring import bootstrap_indices

    v = np.asarray(values, dtype=float).ravel()
    if v.size == 0:
        raise ValueError("studentized_bootstrap_interval of no values")
    mean, degenerate = float(v.mean()), degeneracy(v)
    out = {
        "mean": mean,
        "ci_low": mean,
        "ci_high": mean,
        "n": int(v.size),
        "method": "studentised bootstrap over problems",
        "degenerate": degenerate,
    }
    if degenerate:
        return out
    se = float(v.std(ddof=1)) / math.sqrt(v.size)
    t_star = []
    for idx in bootstrap_indices(v.size, n_boot, seed):
        x = v[idx]
        m_star, se_star = x.mean(axis=1), x.std(axis=1, ddof=1) / math.sqrt(v.size)
        with np.errstate(divide="ignore", invalid="ignore"):
            t_star.append(
                np.where(
                    se_star > 0, (m_star - mean) / np.where(se_star > 0, se_star, 1.0), np.sign(m_star - mean) * np.inf
                )
            )
    t_sorted = np.sort(np.concatenate(t_star))
    t_lo = t_sorted[int(math.floor(alpha / 2 * n_boot))]
    t_hi = t_sorted[int(math.ceil((1 - alpha / 2) * n_boot)) - 1]
    out["ci_low"] = float(max(bounds[0], mean - t_hi * se))
    out["ci_high"] = float(min(bounds[1], mean - t_lo * se))
    return out


def is_binary(values: np.ndarray | Sequence[float]) -> bool:
    """Every value is 0 or 1."""
    v = np.asarray(values, dtype=float)
    return bool(np.all((v == 0) | (v == 1)))


def _clipped(result: dict[str, Any], low: float, high: float) -> dict[str, Any]:
    """The interval dict with its ends clipped to [low, high]."""
    return {**result, "ci_low": max(result["ci_low"], low), "ci_high": min(result["ci_high"], high)}


def score_interval(
    values: np.ndarray | Sequence[float], alpha: float = 0.05, n_boot: int = 2000, seed: int = 0
) -> dict[str, Any]:
    """One model's metric over problems (module docstring): t for binary per-problem scores, the studentised
    bootstrap for graded ones; both clipped to [0, 1], where the metric lives (a t interval over 3 problems reaches
    past it; clipping to the parameter space never lowers coverage)."""
    if is_binary(values):
        return _clipped(mean_interval(values, alpha), 0.0, 1.0)
    return studentized_bootstrap_interval(values, n_boot, alpha, seed, bounds=(0.0, 1.0))


def paired_score_interval(
    a: np.ndarray | Sequence[float],
    b: np.ndarray | Sequence[float],
    alpha: float = 0.05,
    n_boot: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """b - a over the same problems (same order), paired: t when both models' scores are binary, else the studentised
    bootstrap of the differences (clipped to [-1, 1]); marked ``paired``."""
    a, b = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
    if a.shape != b.shape:
        raise ValueError(f"paired inputs differ in length: {a.size} vs {b.size}")
    if is_binary(a) and is_binary(b):
        return _clipped(paired_interval(a, b, alpha), -1.0, 1.0)
    return {**studentized_bootstrap_interval(b - a, n_boot, alpha, seed, bounds=(-1.0, 1.0)), "paired": True}


def paired_evidence_interval(
    a: np.ndarray | Sequence[float],
    b: np.ndarray | Sequence[float],
    alpha: float = 0.05,
    n_boot: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """paired_score_interval, except that 0/1 scores whose n >= 2 differences are all equal get the exact
    equal_changes_interval instead of a zero-width t (method "exact: all n differences equal", not degenerate): 30
    problems all gone wrong -> right is strong evidence, and 50 unchanged problems still leave changes up to 0.07
    possible. The release report's paired comparisons use it (a degenerate interval backs no claim there).

    >>> r = paired_evidence_interval([0.0] * 30, [1.0] * 30)
    >>> round(r["ci_low"], 4), r["ci_high"], r["degenerate"], paired_score_interval([0.0] * 30, [1.0] * 30)["ci_low"]
    (0.7686, 1.0, None, 1.0)
    """
    out = paired_score_interval(a, b, alpha, n_boot, seed)
    a, b = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
    if a.size >= 2 and out["degenerate"] == "all equal" and is_binary(a) and is_binary(b):
        lo, hi = equal_changes_interval(out["mean"], a.size, alpha)
        out.update(
            ci_low=lo, ci_high=hi, method=f"exact: all {a.size} differences equal (Clopper-Pearson)", degenerate=None
        )
    return out
