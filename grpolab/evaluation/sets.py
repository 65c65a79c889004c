"""Evidence over a set of runs: a gain is a claim about a recipe (several seeds), not about one lucky run.

Data. Set s (one set, or the two sets A and B of a contrast) has runs r = 1..R_s that answered the same held-out
problems i = 1..P (the same uids: a paired design), each with a per-problem number x_{s,r,i}: a score (accuracy,
pass@k) or a paired gain d_{r,i} = s_i(trained_r) - s_i(base). With signs sigma_s (+1 for one set; -1 for A and +1
for B in B - A) the estimate is

    theta = sum_s sigma_s (1/R_s) sum_r (1/P) sum_i x_{s,r,i}

Variance. Per set, m_{s,r} = (1/P) sum_i x_{s,r,i} (run means), c_{s,i} = (1/R_s) sum_r x_{s,r,i} (problem means over
runs); per problem d_i = sum_s sigma_s c_{s,i}. theta's error has a part common to every run (which problems were
drawn, the shared base) plus each run's own deviation: its seed effect (variance tau_s^2) and its within-run noise
(which problems this run happens to get right: variance w_s of a run mean, known from its P problems). Estimates:

    w_s = MS_E,s / P,   MS_E,s = sum_{r,i} (x_{s,r,i} - m_{s,r} - c_{s,i} + x̄_s)^2 / ((R_s - 1)(P - 1))
    tau_s^2 = max(S_{m,s}^2 - w_s, 0)      (S_{m,s}^2: variance, ddof 1, of the run means: E = tau_s^2 + w_s)

so the run-mean variance is floored at the within-run component, and V = S_d^2 / P + sum_s tau_s^2 / R_s (S_d^2: the
variance, ddof 1, of d_1..d_P, which holds the common part and the within-run noise over R_s) is the one-way ANOVA
estimate of Var(theta), truncated at a between-seed variance of 0. The interval (two_part_half_width) gives each part
its own t quantile, P - 1 df for the problem part and R_s - 1 df for the between-seed part:

    half^2 = t_{1-alpha/2, P-1}^2 S_d^2 / P + sum_s t_{1-alpha/2, R_s-1}^2 tau_s^2 / R_s,   theta -/+ half

clipped to `bounds` ([-1, 1] for differences of proportions, [0, 1] for a score). Summing the squared half-widths of
independent parts is Banerjee's (1960) conservative interval for a sum of variance components. Satterthwaite's df for
the unbiased combination, the interval used before, falls below nominal when the between-seed part dominates (three
seeds cannot pin down their own spread), and counting the within-run noise twice (S_d^2 / P + S_m^2 / R) made it
wider than the ANOVA interval when the seeds agree. ``se`` is sqrt(V) and ``df`` the nu with t_{1-alpha/2, nu} =
half / se, so gate.stats.harm_p_value reads the interval's own ends. Coverage (3 and 5 seeds, between-seed SD 0 to
0.12, a failing-seed mixture; 266 problems) is measured by benchmarks/seed_set_coverage.py (docs/evaluation.md).

Limits: one run per set (or identical runs) gives the t interval over problems of one run
(grpolab.evaluation.intervals.mean_interval); one problem gives the t over run means, each set's S_{m,s}^2 / R_s with
R_s - 1 df, marked degenerate "one problem"; every value equal (V = 0) gives, for right/wrong numbers, the exact
interval of intervals.equal_changes_interval over the P problems (within-run sampling still bounds it: 0 of P changes
is not a zero-width claim), else a point marked "all equal".

The between-run spread is reported beside the interval: each run's mean, their standard deviation (ddof 1; None for
one run), min and max. Sets must answer the same problems: aligned and paired_gains refuse runs whose problems
differ unless told align="intersect", and every result says n (problems) and runs.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import GrpolabError
from .intervals import equal_changes_interval, t_quantile

Scores = Mapping[str, float]  # per-problem numbers of one run, by uid
ALIGN_MODES = ("exact", "intersect")
DIFFERENCE_BOUNDS = (-1.0, 1.0)  # a difference of proportions (a gain, B - A)
SCORE_BOUNDS = (0.0, 1.0)  # one model's score
METHOD = "two-part t: problems (P - 1 df) + between-seed excess over the within-run component (R - 1 df)"


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Mean, sample standard deviation (ddof 1; None for one value), min and max of per-run numbers.

    >>> spread([0.2, 0.4, 0.6])
    {'mean': 0.4, 'std': 0.2, 'min': 0.2, 'max': 0.6}
    """
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        raise ValueError("spread of no runs")
    return {
        "mean": round(float(v.mean()), 12),
        "std": round(float(v.std(ddof=1)), 12) if v.size > 1 else None,
        "min": float(v.min()),
        "max": float(v.max()),
    }


def _check_shapes(sets: Sequence[np.ndarray]) -> int:
    p = sets[0].shape[1] if sets and sets[0].ndim == 2 else -1
    if not sets or any(x.ndim != 2 or x.shape[1] != p or x.shape[0] == 0 or p == 0 for x in sets):
        raise ValueError(
            f"every set must be a (runs >= 1, problems >= 1) array over the same problems; got "
            f"{[x.shape for x in sets]}"
        )
    return p


def run_components(x: np.ndarray) -> tuple[float, float]:
    """(w, tau^2) of one (R, P) set (module docstring): the within-run component w = MS_E / P of a run mean's
    variance and the between-seed variance tau^2 = max(S_m^2 - w, 0), the run means' variance floored at w. One
    problem (no within-run estimate): (0, S_m^2); one run: (0, 0).

    >>> [round(v, 6) for v in run_components(np.array([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]))]   # S_m^2 = 1/18 = w
    [0.055556, 0.0]
    >>> run_components(np.array([[1.0, 1.0], [0.0, 0.0]]))   # MS_E = 0: all of S_m^2 = 1/2 is between seeds
    (0.0, 0.5)
    """
    r, p = x.shape
    if r < 2:
        return 0.0, 0.0
    run_means = x.mean(axis=1)
    s_m2 = float(run_means.var(ddof=1))
    if p < 2:
        return 0.0, s_m2
    resid = x - run_means[:, None] - x.mean(axis=0)[None, :] + x.mean()
    w = float((resid**2).sum()) / ((r - 1) * (p - 1)) / p
    return w, (s_m2 - w if s_m2 - w > 1e-12 * s_m2 else 0.0)  # rounding aside


def variance_terms(sets: Sequence[np.ndarray], signs: Sequence[float]) -> tuple[float, list[tuple[float, float]]]:
    """(theta, [(variance part, df)]) of sum_s sign_s theta(set s) (module docstring): the problem part
    max(S_d^2 / P, sum_s w_s / R_s) with P - 1 df when P >= 2 (floored at the within-run component: S_d^2 / P holds
    it, and a chance low S_d^2 must not hide it), then (tau_s^2 / R_s, R_s - 1) for every set of >= 2 runs. Each set
    is an (R_s, P) array, every set over the same P problems in the same order.

    >>> theta, parts = variance_terms([np.array([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]])], [1.0])
    >>> round(theta, 6), [(round(v, 6), df) for v, df in parts]   # S_d^2 / P = 1/36 = w / R; tau^2 = 0
    (0.833333, [(0.027778, 2), (0.0, 1)])
    """
    p = _check_shapes(sets)
    theta, d = 0.0, np.zeros(p)
    for x, sign in zip(sets, signs):
        theta += sign * float(x.mean())
        d += sign * x.mean(axis=0)
    comps = [(run_components(x), x.shape[0]) for x in sets]
    parts: list[tuple[float, float]] = []
    if p >= 2:
        parts.append((max(float(d.var(ddof=1)) / p, sum(w / r for (w, _), r in comps)), p - 1))
    parts += [(tau2 / r, r - 1) for (_, tau2), r in comps if r >= 2]
    return theta, parts


def two_part_half_width(parts: Sequence[tuple[float, float]], alpha: float = 0.05) -> tuple[float, float, float]:
    """(half, se, nu): half = sqrt(sum_j t_{1-alpha/2, df_j}^2 v_j), se = sqrt(sum_j v_j), and the effective df nu
    with t_{1-alpha/2, nu} = half / se (inf when half / se is the normal quantile; nan when se = 0).

    >>> h, se, nu = two_part_half_width([(0.0004, 265), (0.0004, 2)])
    >>> round(h, 5), round(se, 5), round(nu, 2)   # sqrt(1.969^2 + 4.303^2) * 0.02 = 3.346 * se
    (0.09464, 0.02828, 2.76)
    """
    live = [(v, df) for v, df in parts if v > 0]
    se = math.sqrt(sum(v for v, _ in live))
    if not live:
        return 0.0, 0.0, math.nan
    half = math.sqrt(sum(t_quantile(1.0 - alpha / 2.0, df) ** 2 * v for v, df in live))
    return half, se, effective_df(half / se, alpha)


def effective_df(q: float, alpha: float = 0.05) -> float:
    """nu with t_{1-alpha/2, nu} = q (Brent's root of the quantile in log nu; inf at or below the normal quantile).

    >>> round(effective_df(4.302652729749464), 6), effective_df(1.9)
    (2.0, inf)
    """
    from scipy.optimize import brentq

    p = 1.0 - alpha / 2.0
    if q <= t_quantile(p, math.inf) * (1 + 1e-12):
        return math.inf
    if q >= t_quantile(p, 1e-3):
        return 1e-3
    return math.exp(brentq(lambda x: t_quantile(p, math.exp(x)) - q, math.log(1e-3), math.log(1e9), xtol=1e-12))


def all_equal_interval(value: float, p: int, bounds: tuple[float, float], alpha: float) -> tuple[float, float] | None:
    """The exact interval when every run's number on every one of p problems is `value`: right/wrong differences
    (value -1, 0 or 1 with bounds below 0) get intervals.equal_changes_interval(value, p); right/wrong scores (0 or 1
    with bounds (0, 1)) the one-sided Clopper-Pearson bound q = 1 - (alpha/2)^(1/p): [0, q] or [1 - q, 1]. None
    otherwise (graded numbers: a point, marked "all equal").

    >>> [round(v, 4) for v in all_equal_interval(0.0, 50, (-1.0, 1.0), 0.05)], all_equal_interval(0.5, 50, (-1.0, 1.0), 0.05)
    ([-0.0711, 0.0711], None)
    """
    if p < 2:
        return None
    if bounds[0] < 0 and value in (-1.0, 0.0, 1.0):
        return equal_changes_interval(value, p, alpha)
    if bounds == SCORE_BOUNDS and value in (0.0, 1.0):
        q = 1.0 - (alpha / 2.0) ** (1.0 / p)
        return (0.0, q) if value == 0 else (1.0 - q, 1.0)
    return None


def set_interval(
    sets: Sequence[np.ndarray],
    signs: Sequence[float],
    alpha: float = 0.05,
    bounds: tuple[float, float] = DIFFERENCE_BOUNDS,
) -> dict[str, Any]:
    """theta with its two-part t interval (module docstring), clipped to `bounds`: mean, ci_low, ci_high, se, df (the
    effective nu), n (P), method and degenerate ("one problem", "all equal" or None)."""
    sets = [np.asarray(x, dtype=float) for x in sets]
    theta, parts = variance_terms(sets, signs)
    half, se, nu = two_part_half_width(parts, alpha)
    p = sets[0].shape[1]
    lo, hi, method = theta - half, theta + half, METHOD
    degenerate = "one problem" if p == 1 else None
    if se == 0 and p > 1:  # every d_i = theta and no run differs from another: right/wrong numbers get the exact one
        binary = all(bool(np.isin(x, (-1.0, 0.0, 1.0)).all()) for x in sets)
        exact = all_equal_interval(theta, p, bounds, alpha) if binary else None
        if exact is None:
            degenerate = "all equal"
        else:
            (lo, hi), method = exact, f"exact: every run's {p} numbers equal (Clopper-Pearson)"
    return {
        "mean": theta,
        "ci_low": max(lo, bounds[0]),
        "ci_high": min(hi, bounds[1]),
        "se": se,
        "df": nu,
        "n": p,
        "method": method,
        "degenerate": degenerate,
    }


def set_mean(
    x: np.ndarray | Sequence[Sequence[float]], alpha: float = 0.05, bounds: tuple[float, float] = DIFFERENCE_BOUNDS
) -> dict[str, Any]:
    """theta of an (R runs, P problems) array with its interval (set_interval; `bounds` SCORE_BOUNDS for a score,
    the default DIFFERENCE_BOUNDS for gains), plus ``runs`` (R), ``n`` (P), ``per_run`` (each run's mean) and
    ``spread`` (spread of per_run).

    >>> r = set_mean([[1, 0], [1, 1]])
    >>> r["mean"], r["per_run"], r["spread"]["min"], r["runs"], r["n"]
    (0.75, [0.5, 1.0], 0.5, 2, 2)
    """
    x = np.asarray(x, dtype=float)
    per_run = [float(v) for v in x.mean(axis=1)] if x.ndim == 2 else []
    return {
        **set_interval([x], [1.0], alpha, bounds),
        "runs": int(x.shape[0]),
        "per_run": per_run,
        "spread": spread(per_run),
    }


def set_difference(
    a: np.ndarray | Sequence[Sequence[float]], b: np.ndarray | Sequence[Sequence[float]], alpha: float = 0.05
) -> dict[str, Any]:
    """theta(B) - theta(A) of two sets of runs' scores on the same P problems (arrays (R_A, P) and (R_B, P)), with its
    interval (set_interval with signs -1, +1: the problems paired across the sets, each set's runs its own between-
    seed part; clipped to [-1, 1]), and each set's own set_mean (clipped to [0, 1])."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return {
        **set_interval([a, b], [-1.0, 1.0], alpha),
        "a": set_mean(a, alpha, SCORE_BOUNDS),
        "b": set_mean(b, alpha, SCORE_BOUNDS),
    }


def _names(names: Sequence[str] | None, count: int) -> list[str]:
    return list(names) if names is not None else [f"run {j + 1}" for j in range(count)]


def _check_align(align: str) -> None:
    if align not in ALIGN_MODES:
        raise ValueError(f"align={align!r}: expected one of {ALIGN_MODES}")


def aligned(
    runs: Sequence[Scores], names: Sequence[str] | None = None, align: str = "exact"
) -> tuple[list[str], np.ndarray]:
    """(uids, (R, P) array) of the runs' per-problem numbers, in the first run's order. align="exact" (the default)
    refuses runs whose problems (uids) differ, naming the runs, their numbers of problems and an example uid;
    align="intersect" keeps the problems every run has. A GrpolabError when no problem is shared.

    >>> aligned([{"a": 1.0, "b": 0.0}, {"b": 1.0, "a": 0.5, "c": 1.0}], align="intersect")
    (['a', 'b'], array([[1. , 0. ],
           [0.5, 1. ]]))
    """
    _check_align(align)
    if not runs:
        raise ValueError("no runs")
    names = _names(names, len(runs))
    uids = [u for u in runs[0] if all(u in r for r in runs[1:])]
    if not uids:
        raise GrpolabError(
            f"{', '.join(names)}: the runs share no problem (uid); they were not evaluated on the same held-out set"
        )
    if align == "exact":
        for name, r in zip(names[1:], runs[1:]):
            if len(r) != len(runs[0]) or len(uids) != len(r):
                only = next((u for u in r if u not in runs[0]), None)
                example = (
                    f"{only!r} only in {name}"
                    if only is not None
                    else f"{next(u for u in runs[0] if u not in r)!r} only in {names[0]}"
                )
                raise GrpolabError(
                    f"{names[0]} ({len(runs[0])} problems) and {name} ({len(r)} problems) were evaluated "
                    f"on different problems ({len(uids)} shared by every run; e.g. {example}); evaluate "
                    f"them on the same held-out set, or align them explicitly (align='intersect') to "
                    f"compare on the {len(uids)} shared problems"
                )
    return uids, np.array([[float(r[u]) for u in uids] for r in runs])


def paired_gains(
    pairs: Sequence[tuple[Scores, Scores]], names: Sequence[str] | None = None, align: str = "exact"
) -> tuple[list[str], np.ndarray]:
    """(uids, (R, P) array of d_{r,i} = b_r[i] - a_r[i]) for runs given as (reference scores, scores) by uid.
    align="exact" refuses a run whose scores and reference differ in their problems, and runs that differ from each
    other (aligned); align="intersect" keeps the problems every run and its reference have.

    >>> paired_gains([({"p": 0.0, "q": 1.0}, {"p": 1.0, "q": 1.0}), ({"p": 0.0, "q": 1.0}, {"p": 0.0, "q": 0.0})])
    (['p', 'q'], array([[ 1.,  0.],
           [ 0., -1.]]))
    """
    _check_align(align)
    names = _names(names, len(pairs))
    if align == "exact":
        for name, (a, b) in zip(names, pairs):
            if set(a) != set(b):
                raise GrpolabError(
                    f"{name}: the model and its reference were evaluated on different problems "
                    f"({len(b)} vs {len(a)}, {len(set(a) & set(b))} shared); evaluate both on the same "
                    "held-out set, or align them explicitly (align='intersect')"
                )
    gains = [{u: float(b[u]) - float(a[u]) for u in a if u in b} for a, b in pairs]
    return aligned(gains, names, align)


# ---------------------------------------------------------------- eval JSON headers and rows (grpolab eval --out) as sets

IDENTITY_KEYS = ("task", "task_options", "split", "data_hash", "max_new_tokens")  # the header also has max_new_tokens
DECODING_KEYS = ("greedy", "samples", "temperature", "top_p", "max_new_tokens")  # the sampling seed may differ


def evaluation_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, a's value, b's value) for what makes two evaluations measure different things: the eval JSON header's
    task, task options, split, data hash and max_new_tokens, and the decoding settings (decoding.<key>; the sampling
    seed excepted).
    Keys missing from both are not compared; a decoding that is not a mapping (older files) is compared whole.

    >>> evaluation_differences({"data_hash": "x", "decoding": {"max_new_tokens": 64, "seed": 0}},
    ...                        {"data_hash": "x", "decoding": {"max_new_tokens": 128, "seed": 1}})
    [('decoding.max_new_tokens', 64, 128)]
    """
    out = [(k, a.get(k), b.get(k)) for k in IDENTITY_KEYS if (k in a or k in b) and a.get(k) != b.get(k)]
    da, db = a.get("decoding"), b.get("decoding")
    if not (isinstance(da, Mapping) and isinstance(db, Mapping)):  # older files: a word ("greedy"), or absent
        return out + ([("decoding", da, db)] if da != db else [])
    return out + [
        (f"decoding.{k}", da.get(k), db.get(k))
        for k in DECODING_KEYS
        if (k in da or k in db) and da.get(k) != db.get(k)
    ]


def check_same_evaluation(names: Sequence[str], headers: Sequence[Mapping[str, Any]]) -> None:
    """A GrpolabError naming the first run whose evaluation differs from the first run's (evaluation_differences) and
    every difference; nothing when they agree."""
    for name, h in zip(names[1:], headers[1:]):
        diffs = evaluation_differences(headers[0], h)
        if diffs:
            listed = "; ".join(f"{k}: {x!r} vs {y!r}" for k, x, y in diffs)
            raise GrpolabError(
                f"{names[0]} and {name} were not evaluated the same way ({listed}); a set compares runs "
                "on one held-out set with one decoding"
            )


def row_scores(row: Mapping[str, Any], metric: str = "accuracy") -> dict[str, float]:
    """{uid: s_i} of one model row of an eval JSON: its items' ``scores[metric]`` (accuracy: else ``correct``)."""
    out = {}
    for it in row.get("items") or []:
        v = (it.get("scores") or {}).get(metric)
        if v is None and metric == "accuracy":
            v = float(bool(it.get("correct")))
        if v is not None:
            out[it["uid"]] = float(v)
    return out


def shared_metrics(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The per-problem metrics every row's items have (first row's order); [] when a row has no items."""
    if not rows or any(not r.get("items") for r in rows):
        return []
    names = list((rows[0]["items"][0].get("scores") or {"accuracy": None}))
    return [m for m in names if all(row_scores(r, m) for r in rows)]


def _label(row: Mapping[str, Any], j: int) -> str:
    return str(row.get("label") or row.get("model") or f"run {j + 1}")


def set_evidence(
    members: Sequence[Mapping[str, Any]], references: Sequence[Mapping[str, Any] | None] = (), align: str = "exact"
) -> dict[str, Any]:
    """Per metric of a set of runs' rows on one evaluation set: ``value`` (set_mean of their scores) and, when every
    member has a reference row with items (its base, from the same eval JSON), ``gain`` (set_mean of
    member - reference, paired within each run). {} when a member has no per-problem records. Rows whose problems
    differ are refused unless align="intersect" (aligned, paired_gains)."""
    refs = list(references) if references else [None] * len(members)
    names = [_label(r, j) for j, r in enumerate(members)]
    out: dict[str, Any] = {}
    for m in shared_metrics(list(members)):
        scores = aligned([row_scores(r, m) for r in members], names, align)[1]
        entry = {"value": set_mean(scores, bounds=SCORE_BOUNDS)}
        if all(ref is not None and row_scores(ref, m) for ref in refs):
            pairs = [(row_scores(ref, m), row_scores(r, m)) for ref, r in zip(refs, members)]
            entry["gain"] = set_mean(paired_gains(pairs, names, align)[1])
        out[m] = entry
    return out


def set_contrast(
    a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], align: str = "exact"
) -> dict[str, Any]:
    """Per metric both sets' rows have: set_difference (B - A) on the problems of every run of both sets (refused
    when they differ, unless align="intersect")."""
    names = [_label(r, j) for j, r in enumerate((*a, *b))]
    out = {}
    for m in shared_metrics([*a, *b]):
        _, x = aligned([row_scores(r, m) for r in (*a, *b)], names, align)
        out[m] = set_difference(x[: len(a)], x[len(a) :])
    return out


# ---------------------------------------------------------------- which runs are one recipe

SEED_KEYS = ("config.train.seed",)


def recipe_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """What makes two runs different recipes: grpolab.manifest.diff_manifests without the seed and the git state."""
    from ..manifest import diff_manifests

    return [
        (k, x, y) for k, x, y in diff_manifests(dict(a), dict(b)) if k not in SEED_KEYS and not k.startswith("git.")
    ]


def recipe_groups(manifests: Sequence[Mapping[str, Any] | None]) -> list[list[int]]:
    """Indices of the runs that are seeds of one recipe (recipe_differences empty), in order; groups of >= 2 only;
    a row without a manifest (a hub model, a baseline JSON) is never grouped."""
    groups: list[list[int]] = []
    for i, m in enumerate(manifests):
        if not m:
            continue
        home = next((g for g in groups if not recipe_differences(manifests[g[0]], m)), None)
        if home is None:
            groups.append([i])
        else:
            home.append(i)
    return [g for g in groups if len(g) >= 2]
