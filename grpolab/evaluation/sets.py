"""Evidence over a set of runs: a gain is a claim about a recipe (several seeds), not about one lucky run.

Data. Set s (one set, or the two sets A and B of a contrast) has runs r = 1..R_s that answered the same held-out
problems i = 1..P (the same uids: a paired design), each with a per-problem number x_{s,r,i}: a score (accuracy,
pass@k) or a paired gain d_{r,i} = s_i(trained_r) - s_i(base). With signs sigma_s (+1 for one set; -1 for A and +1
for B in B - A) the estimate is

    theta = sum_s sigma_s (1/R_s) sum_r (1/P) sum_i x_{s,r,i}

Its interval is a t interval with a two-stage variance and Satterthwaite degrees of freedom (set_interval). Per set,
m_{s,r} = (1/P) sum_i x_{s,r,i} (run means) and c_{s,i} = (1/R_s) sum_r x_{s,r,i} (problem means over runs); per
problem, d_i = sum_s sigma_s c_{s,i}. Then

    V = S_d^2 / P + sum_{s: R_s >= 2} S_{m,s}^2 / R_s

with S_d^2 the sample variance (ddof 1) of d_1..d_P and S_{m,s}^2 that of the run means of set s. The problems are
SHARED by every run, so the problem-sampling variance is common to all runs and invisible in the spread of run
means: it is the first term. The between-seed variance is the second. The within-run noise (which problems one run
happens to get right) is in both terms, so V overstates the variance by sum_s sigma_e,s^2 / (R_s P): little when seeds
disagree, and it keeps the interval at nominal coverage when they agree. Degrees of freedom (Satterthwaite, for
the variance components as a linear combination of independent mean squares): with MS_R,s = P S_{m,s}^2 (R_s - 1
df) and MS_E,s the two-way residual mean square sum_{r,i} (x_{s,r,i} - m_{s,r} - c_{s,i} + x̄_s)^2 / ((R_s - 1)(P - 1))
((R_s - 1)(P - 1) df), the between-seed component of set s is (MS_R,s - MS_E,s) / (R_s P), kept only when positive;
the terms are u_0 = S_d^2 / P (P - 1 df) and, per kept set, +MS_R,s / (R_s P) and -MS_E,s / (R_s P):

    nu = (sum_j u_j)^2 / sum_j (u_j^2 / df_j),     interval = theta -/+ t_{1 - alpha/2, nu} sqrt(V)

These df belong to the unbiased combination, not to V's own terms (S_d^2 / P with P - 1 df, S_{m,s}^2 / R_s with
R_s - 1 df); V's own terms give more df and a narrower interval that under-covers when seeds disagree (0.928 against
0.940 at 3 seeds, between-seed SD 0.08 and 0.12, on the same 2000 simulated sets), so the conservative choice is kept.
Two seeds under-cover with either (0.88-0.91 at SD 0.08-0.12): the release gate needs MIN_RUNS = 3 runs of a set for
a PASS (grpolab.evaluation.intervals.MIN_RUNS).

Limits: one run per set (or identical runs) gives V = S_d^2 / P and nu = P - 1, the t interval over problems of one
run (grpolab.evaluation.intervals.mean_interval); one problem gives V = sum_s S_{m,s}^2 / R_s (a t interval over run
means), marked degenerate "one problem"; V = 0 gives a point, marked "all equal". Coverage with known truths (3 and 5
seeds, between-seed SD 0 to 0.08, 200 problems) is measured by benchmarks/interval_coverage.py (docs/evaluation.md).

The between-run spread is reported beside the interval: each run's mean, their standard deviation (ddof 1; None for
one run), min and max. Sets must answer the same problems: aligned and paired_gains refuse runs whose problems
differ unless told align="intersect", and every result says n (problems) and runs.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import GrpolabError
from .intervals import t_interval

Scores = Mapping[str, float]  # per-problem numbers of one run, by uid
ALIGN_MODES = ("exact", "intersect")


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


def variance_terms(sets: Sequence[np.ndarray], signs: Sequence[float]) -> tuple[float, float, float]:
    """(theta, V, nu) of sum_s sign_s theta(set s) (module docstring); nu is inf when V = 0. Each set is an (R_s, P)
    array, every set over the same P problems in the same order.

    >>> theta, v, nu = variance_terms([np.array([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]])], [1.0])
    >>> round(theta, 6), round(v, 6), round(nu, 6)   # S_d^2 = 1/12 over 3, S_m^2 = 1/18 over 2; u_0 = 1/36, u_1 = 0
    (0.833333, 0.055556, 2.0)
    """
    p = _check_shapes(sets)
    theta, d = 0.0, np.zeros(p)
    v, components = 0.0, []  # (u_j, df_j)
    for x, sign in zip(sets, signs):
        theta += sign * float(x.mean())
        d += sign * x.mean(axis=0)
        r = x.shape[0]
        if r >= 2:
            run_means = x.mean(axis=1)
            v += float(run_means.var(ddof=1)) / r
            if p >= 2:
                resid = x - run_means[:, None] - x.mean(axis=0)[None, :] + x.mean()
                ms_e = float((resid**2).sum()) / ((r - 1) * (p - 1))
                ms_r = p * float(run_means.var(ddof=1))
                if ms_r > ms_e * (1 + 1e-9):  # a positive between-seed component (rounding aside)
                    components += [(ms_r / (r * p), r - 1), (-ms_e / (r * p), (r - 1) * (p - 1))]
            else:
                components.append((float(run_means.var(ddof=1)) / r, r - 1))
    if p >= 2:
        v += float(d.var(ddof=1)) / p
        components.append((float(d.var(ddof=1)) / p, p - 1))
    total = sum(u for u, _ in components)
    if total > 0:
        nu = total * total / sum(u * u / df for u, df in components)
    elif v > 0:  # runs vary but no component is measured (every between-seed one cancelled): the fewest runs' df
        nu = float(min((x.shape[0] - 1 for x in sets if x.shape[0] >= 2), default=0)) or float("inf")
    else:
        nu = float("inf")
    return theta, v, nu


def set_interval(sets: Sequence[np.ndarray], signs: Sequence[float], alpha: float = 0.05) -> dict[str, Any]:
    """theta with its t interval (module docstring): mean, ci_low, ci_high, se (sqrt V), df (nu), n (P), method and
    degenerate ("one problem", "all equal" or None)."""
    sets = [np.asarray(x, dtype=float) for x in sets]
    theta, v, nu = variance_terms(sets, signs)
    lo, hi = t_interval(theta, v, nu, alpha)
    p = sets[0].shape[1]
    degenerate = "one problem" if p == 1 else ("all equal" if v == 0 else None)
    return {
        "mean": theta,
        "ci_low": lo,
        "ci_high": hi,
        "se": float(np.sqrt(v)),
        "df": float(nu),
        "n": p,
        "method": "t, two-stage variance (runs, problems), Satterthwaite df",
        "degenerate": degenerate,
    }


def set_mean(x: np.ndarray | Sequence[Sequence[float]], alpha: float = 0.05) -> dict[str, Any]:
    """theta of an (R runs, P problems) array with its interval (set_interval), plus ``runs`` (R), ``n`` (P),
    ``per_run`` (each run's mean) and ``spread`` (spread of per_run).

    >>> r = set_mean([[1, 0], [1, 1]])
    >>> r["mean"], r["per_run"], r["spread"]["min"], r["runs"], r["n"]
    (0.75, [0.5, 1.0], 0.5, 2, 2)
    """
    x = np.asarray(x, dtype=float)
    per_run = [float(v) for v in x.mean(axis=1)] if x.ndim == 2 else []
    return {**set_interval([x], [1.0], alpha), "runs": int(x.shape[0]), "per_run": per_run, "spread": spread(per_run)}


def set_difference(
    a: np.ndarray | Sequence[Sequence[float]], b: np.ndarray | Sequence[Sequence[float]], alpha: float = 0.05
) -> dict[str, Any]:
    """theta(B) - theta(A) of two sets of runs on the same P problems (arrays (R_A, P) and (R_B, P)), with its
    interval (set_interval with signs -1, +1: the problems paired across the sets, each set's runs its own between-
    seed term), and each set's own set_mean."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return {**set_interval([a, b], [-1.0, 1.0], alpha), "a": set_mean(a, alpha), "b": set_mean(b, alpha)}


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
        entry = {"value": set_mean(aligned([row_scores(r, m) for r in members], names, align)[1])}
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
