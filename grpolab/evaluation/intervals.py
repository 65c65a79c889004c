"""Intervals of a mean over problems, with the evidence they stand on: Student t quantiles, degenerate samples named,
and the minimum numbers of problems below which an interval backs no claim.

Every interval dict built here (and by grpolab.evaluation.sets) has the keys ``mean``, ``ci_low``, ``ci_high``,
``n`` (problems), ``method`` (how the interval was made) and ``degenerate``: None, or the name of a sample that
cannot support an interval -- "no values" (n = 0), "one problem" (n = 1), "all equal" (every value the same: zero
spread, so any interval collapses to a point). The release report turns a degenerate interval, or one over fewer
than MIN_PROBLEMS problems (too_little_evidence), into N/A rather than PASS (evidence_reason).

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
from scipy.stats import t as student_t

MIN_PROBLEMS = 30  # fewest problems (paired items) for a held-out, capability or diversity comparison to back a PASS
MIN_RUNS = 2  # fewest runs of a set that measure a between-seed spread


def t_quantile(p: float, df: float) -> float:
    """The p quantile of Student's t with df > 0 (non-integer allowed; infinite gives the normal quantile) degrees of
    freedom: scipy.stats.t.ppf, checked against printed tables in tests/test_interval_coverage.py.

    >>> round(t_quantile(0.975, 2), 6), round(t_quantile(0.975, 10), 6), round(t_quantile(0.025, 1), 4)
    (4.302653, 2.228139, -12.7062)
    """
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0; got p={p}, df={df}")
    return float(student_t.ppf(p, df))


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
    return {"mean": mean, "ci_low": lo, "ci_high": hi, "n": int(v.size), "method": "t over problems",
            "degenerate": degeneracy(v)}


def paired_interval(a: np.ndarray | Sequence[float], b: np.ndarray | Sequence[float], alpha: float = 0.05) -> dict[str, Any]:
    """mean_interval of the per-problem differences d_i = b_i - a_i (same problems, same order), marked paired."""
    a, b = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
    if a.shape != b.shape:
        raise ValueError(f"paired inputs differ in length: {a.size} vs {b.size}")
    return {**mean_interval(b - a, alpha), "paired": True}


def studentized_bootstrap_interval(values: np.ndarray | Sequence[float], n_boot: int = 2000, alpha: float = 0.05,
                                   seed: int = 0, bounds: tuple[float, float] = (-math.inf, math.inf)) -> dict[str, Any]:
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
    out = {"mean": mean, "ci_low": mean, "ci_high": mean, "n": int(v.size),
           "method": "studentised bootstrap over problems", "degenerate": degenerate}
    if degenerate:
        return out
    se = float(v.std(ddof=1)) / math.sqrt(v.size)
    t_star = []
    for idx in bootstrap_indices(v.size, n_boot, seed):
        x = v[idx]
        m_star, se_star = x.mean(axis=1), x.std(axis=1, ddof=1) / math.sqrt(v.size)
        with np.errstate(divide="ignore", invalid="ignore"):
            t_star.append(np.where(se_star > 0, (m_star - mean) / np.where(se_star > 0, se_star, 1.0),
                                   np.sign(m_star - mean) * np.inf))
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


def score_interval(values: np.ndarray | Sequence[float], alpha: float = 0.05, n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """One model's metric over problems (module docstring): t for binary per-problem scores, the studentised
    bootstrap (clipped to [0, 1]) for graded ones."""
    if is_binary(values):
        return mean_interval(values, alpha)
    return studentized_bootstrap_interval(values, n_boot, alpha, seed, bounds=(0.0, 1.0))


def paired_score_interval(a: np.ndarray | Sequence[float], b: np.ndarray | Sequence[float], alpha: float = 0.05,
                          n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """b - a over the same problems (same order), paired: t when both models' scores are binary, else the studentised
    bootstrap of the differences (clipped to [-1, 1]); marked ``paired``."""
    a, b = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
    if a.shape != b.shape:
        raise ValueError(f"paired inputs differ in length: {a.size} vs {b.size}")
    if is_binary(a) and is_binary(b):
        return paired_interval(a, b, alpha)
    return {**studentized_bootstrap_interval(b - a, n_boot, alpha, seed, bounds=(-1.0, 1.0)), "paired": True}
