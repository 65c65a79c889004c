"""Evidence over a set of runs: a gain is a claim about a recipe (several seeds), not about one lucky run.

Data. Run r = 1..R of a set answered the same held-out problems i = 1..P (the same uids: a paired design) and has
a per-problem number x_{r,i}: a score (accuracy, pass@k) or a paired gain d_{r,i} = s_i(trained_r) - s_i(base).
The estimate is the grand mean over runs and problems

    theta = (1/R) sum_r (1/P) sum_i x_{r,i}

and its 95% interval comes from a two-stage (hierarchical) percentile bootstrap, paired over problems. Replicate
b = 1..B (B = 2000) draws R run indices r*_1..r*_R uniformly with replacement, and ONE set of P problem indices
i*_1..i*_P uniformly with replacement, common to every drawn run because every run answered the same problems:

    theta*_b = (1/R) sum_a (1/P) sum_j x_{r*_a, i*_j}

The interval is [q_{alpha/2}, q_{1-alpha/2}] of theta*_1..theta*_B. It widens with the spread between runs (the
run stage) and with the number of problems (the problem stage). Two limits pin it down: when every run is the same
(x_{r,i} = x_i), or R = 1, theta*_b = (1/P) sum_j x_{i*_j}, exactly grpolab.evaluation.scoring.bootstrap_ci of x -- the
ordinary paired bootstrap, same problem draws (grpolab.evaluation.scoring.bootstrap_indices); when P = 1 only runs vary.

Two sets A and B of runs on the same problems (two recipes): the difference of means theta(B) - theta(A), with
runs resampled within each set independently and one common problem draw per replicate:

    delta*_b = theta*_b(B) - theta*_b(A)

The between-run spread is reported beside the interval: each run's mean (1/P) sum_i x_{r,i}, their standard
deviation (ddof 1; None for one run), min and max. This is rliable's stratified bootstrap over runs, with the
problems of one benchmark resampled jointly as the paired design asks.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .scoring import bootstrap_indices

Scores = Mapping[str, float]  # per-problem numbers of one run, by uid


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Mean, sample standard deviation (ddof 1; None for one value), min and max of per-run numbers.

    >>> spread([0.2, 0.4, 0.6])
    {'mean': 0.4, 'std': 0.2, 'min': 0.2, 'max': 0.6}
    """
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        raise ValueError("spread of no runs")
    return {"mean": round(float(v.mean()), 12), "std": round(float(v.std(ddof=1)), 12) if v.size > 1 else None,
            "min": float(v.min()), "max": float(v.max())}


def _weights(rng: np.random.Generator, m: int, runs: int) -> np.ndarray:
    """(m, runs) run weights of m replicates: how often each run was drawn among `runs` draws with replacement."""
    counts = np.zeros((m, runs))
    np.add.at(counts, (np.arange(m)[:, None], rng.integers(0, runs, (m, runs))), 1.0)
    return counts


def replicates(sets: Sequence[np.ndarray], signs: Sequence[float], n_boot: int = 2000, seed: int = 0) -> np.ndarray:
    """theta*_b of sum_s sign_s * theta(set s) for b = 1..n_boot (module docstring): runs drawn within each set
    (generator seeded (seed, 1)), one problem draw per replicate common to all sets (bootstrap_indices(seed)).
    Each set is an (R_s, P) array; every set has the same P problems, in the same order."""
    p = sets[0].shape[1]
    if any(x.ndim != 2 or x.shape[1] != p or x.shape[0] == 0 for x in sets):
        raise ValueError(f"every set must be a (runs >= 1, {p}) array of per-problem numbers; got "
                         f"{[x.shape for x in sets]}")
    run_rng = np.random.default_rng((seed, 1))
    out = []
    for probs in bootstrap_indices(p, n_boot, seed):
        total = np.zeros(probs.shape[0])
        for x, sign in zip(sets, signs):
            mixed = _weights(run_rng, probs.shape[0], x.shape[0]) @ x / x.shape[0]  # mean of the drawn runs, per problem
            total += sign * np.take_along_axis(mixed, probs, axis=1).mean(axis=1)
        out.append(total)
    return np.concatenate(out)


def _interval(estimate: float, reps: np.ndarray, alpha: float) -> dict[str, float]:
    lo, hi = np.quantile(reps, [alpha / 2, 1 - alpha / 2])
    return {"mean": float(estimate), "ci_low": float(lo), "ci_high": float(hi)}


def set_mean(x: np.ndarray | Sequence[Sequence[float]], n_boot: int = 2000, alpha: float = 0.05, seed: int = 0) -> dict[str, Any]:
    """theta of an (R runs, P problems) array with its hierarchical 95% interval (module docstring), plus
    ``runs`` (R), ``n`` (P), ``per_run`` (each run's mean) and ``spread`` (spread of per_run).

    >>> r = set_mean([[1, 0], [1, 1]])
    >>> r["mean"], r["per_run"], r["spread"]["min"]
    (0.75, [0.5, 1.0], 0.5)
    """
    x = np.asarray(x, dtype=float)
    reps = replicates([x], [1.0], n_boot, seed)
    per_run = [float(v) for v in x.mean(axis=1)]
    return {**_interval(x.mean(), reps, alpha), "runs": x.shape[0], "n": x.shape[1], "per_run": per_run,
            "spread": spread(per_run)}


def set_difference(a: np.ndarray | Sequence[Sequence[float]], b: np.ndarray | Sequence[Sequence[float]],
                   n_boot: int = 2000, alpha: float = 0.05, seed: int = 0) -> dict[str, Any]:
    """theta(B) - theta(A) of two sets of runs on the same P problems (arrays (R_A, P) and (R_B, P)), with the
    hierarchical 95% interval (runs resampled within each set, problems jointly), and each set's own set_mean."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    reps = replicates([a, b], [-1.0, 1.0], n_boot, seed)
    return {**_interval(b.mean() - a.mean(), reps, alpha), "n": a.shape[1], "a": set_mean(a, n_boot, alpha, seed),
            "b": set_mean(b, n_boot, alpha, seed)}


def aligned(runs: Sequence[Scores]) -> tuple[list[str], np.ndarray]:
    """(uids, (R, P) array) of the problems every run has, in the first run's order.

    >>> aligned([{"a": 1.0, "b": 0.0}, {"b": 1.0, "a": 0.5, "c": 1.0}])
    (['a', 'b'], array([[1. , 0. ],
           [0.5, 1. ]]))
    """
    if not runs:
        raise ValueError("no runs")
    uids = [u for u in runs[0] if all(u in r for r in runs[1:])]
    if not uids:
        raise ValueError("the runs share no problem (uid): they were not evaluated on the same held-out set")
    return uids, np.array([[float(r[u]) for u in uids] for r in runs])


def paired_gains(pairs: Sequence[tuple[Scores, Scores]]) -> tuple[list[str], np.ndarray]:
    """(uids, (R, P) array of d_{r,i} = b_r[i] - a_r[i]) for runs given as (reference scores, scores) by uid, on the
    problems every run and its reference have.

    >>> paired_gains([({"p": 0.0, "q": 1.0}, {"p": 1.0, "q": 1.0}), ({"p": 0.0, "q": 1.0}, {"p": 0.0, "q": 0.0})])
    (['p', 'q'], array([[ 1.,  0.],
           [ 0., -1.]]))
    """
    gains = [{u: float(b[u]) - float(a[u]) for u in a if u in b} for a, b in pairs]
    return aligned(gains)


# ---------------------------------------------------------------- eval JSON rows (grpolab eval --out) as sets


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


def set_evidence(members: Sequence[Mapping[str, Any]], references: Sequence[Mapping[str, Any] | None] = ()) -> dict[str, Any]:
    """Per metric of a set of runs' rows on one evaluation set: ``value`` (set_mean of their scores) and, when every
    member has a reference row with items (its base, from the same eval JSON), ``gain`` (set_mean of
    member - reference, paired within each run). {} when a member has no per-problem records."""
    refs = list(references) if references else [None] * len(members)
    out: dict[str, Any] = {}
    for m in shared_metrics(list(members)):
        entry = {"value": set_mean(aligned([row_scores(r, m) for r in members])[1])}
        if all(ref is not None and row_scores(ref, m) for ref in refs):
            entry["gain"] = set_mean(paired_gains([(row_scores(ref, m), row_scores(r, m)) for ref, r in zip(refs, members)])[1])
        out[m] = entry
    return out


def set_contrast(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per metric both sets' rows have: set_difference (B - A) on the problems every run of both sets answered."""
    out = {}
    for m in shared_metrics([*a, *b]):
        _, x = aligned([row_scores(r, m) for r in (*a, *b)])
        out[m] = set_difference(x[: len(a)], x[len(a):])
    return out


# ---------------------------------------------------------------- which runs are one recipe

SEED_KEYS = ("config.train.seed",)


def recipe_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """What makes two runs different recipes: grpolab.manifest.diff_manifests without the seed and the git state."""
    from ..manifest import diff_manifests

    return [(k, x, y) for k, x, y in diff_manifests(dict(a), dict(b)) if k not in SEED_KEYS and not k.startswith("git.")]


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
