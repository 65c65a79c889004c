"""The evidence of a set of runs (several seeds of one recipe) for the release report: every held-out comparison
of the runs combined by the hierarchical bootstrap of grpolab.evaluation.sets (runs, then one common draw of
problems), so that a check FAILs on the set's evidence, not on one run's luck.

- held-out gain, capability (per untrained task every run has), diversity (pass@k) and safety (compliance per
  prompt): d_{r,i} = trained_r - base on problem (prompt) i, mean over runs and problems with its 95% interval,
  each run's own mean beside it;
- the training history: the mean curve over runs (each metric averaged, step by step, over the runs that logged a
  finite value at that step), on which the training-health checks run once;
- the runs must be one recipe: their manifests may differ only in the seed (and the git state).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Sequence

from ..errors import GrpolabError
from ..evaluation.sets import aligned, paired_gains, recipe_differences, row_scores, set_mean

def check_recipe(names: Sequence[str], manifests: Sequence[dict[str, Any]]) -> None:
    """Refuse runs that are not seeds of one recipe (grpolab.evaluation.sets.recipe_differences), naming what differs."""
    for name, m in zip(names[1:], manifests[1:]):
        diffs = recipe_differences(manifests[0], m)
        if diffs:
            listed = "; ".join(f"{k}: {a!r} vs {b!r}" for k, a, b in diffs[:5])
            raise GrpolabError(f"{name}: not a seed of the same recipe as {names[0]} ({len(diffs)} difference"
                               f"{'s' if len(diffs) > 1 else ''} besides the seed: {listed}); a set of runs is one recipe "
                               "over several seeds (compare two recipes with grpolab compare --set)")


def combined(pairs: Sequence[tuple[dict[str, float], dict[str, float]]], labels: Sequence[str]) -> dict[str, Any]:
    """trained - base over a set of runs: the hierarchical interval of paired_gains, plus each run's mean gain."""
    _, gains = paired_gains(pairs)
    m = set_mean(gains)
    return {"mean": m["mean"], "ci_low": m["ci_low"], "ci_high": m["ci_high"], "paired": True, "hierarchical": True,
            "n": m["n"], "runs": m["runs"], "per_run": dict(zip(labels, m["per_run"])), "spread": m["spread"]}


def interval(by_uid: Sequence[dict[str, float]]) -> dict[str, Any]:
    """Mean of one model's scores over the runs and problems with its hierarchical interval, and n (problems)."""
    _, x = aligned(by_uid)
    m = set_mean(x)
    return {"mean": m["mean"], "ci_low": m["ci_low"], "ci_high": m["ci_high"], "n": m["n"]}


def level(by_uid: Sequence[dict[str, float]], label: str) -> dict[str, Any]:
    """interval() as a report summary row."""
    m = interval(by_uid)
    return {"label": label, "accuracy": m["mean"], "ci_low": m["ci_low"], "ci_high": m["ci_high"], "n": m["n"],
            "budget": None}


def set_heldout(heldouts: Sequence[dict[str, Any] | None], labels: Sequence[str]) -> dict[str, Any] | None:
    """The held-out comparison of the set; None unless every run has a paired eval JSON (items) on the task."""
    if not heldouts or any(h is None or not h.get("trained_row") or not h["trained_row"].get("items") for h in heldouts):
        return None
    base = [row_scores(h["base_row"]) for h in heldouts]
    trained = [row_scores(h["trained_row"]) for h in heldouts]
    first = heldouts[0]
    return {"source": f"{first['source']} of {len(labels)} runs (hierarchical bootstrap: runs, then problems)",
            "task": first["task"], "split": first.get("split"), "n": None, "base": level(base, first["base"]["label"]),
            "trained": level(trained, f"trained, mean of {len(labels)} runs"), "diff": combined(list(zip(base, trained)), labels),
            "per_slice": {}, "base_row": None, "trained_row": None, "others": []}


def set_capability(per_run: Sequence[Sequence[dict[str, Any]]], labels: Sequence[str]) -> list[dict[str, Any]]:
    """Capability comparisons of the set: one per untrained task that every run measured with items."""
    tasks = [c["task"] for c in per_run[0]] if per_run else []
    out = []
    for task in tasks:
        found = [next((c for c in caps if c["task"] == task and (c.get("trained_row") or {}).get("items")), None)
                 for caps in per_run]
        if any(c is None for c in found):
            continue
        base = [row_scores(c["base_row"]) for c in found]
        trained = [row_scores(c["trained_row"]) for c in found]
        diff = combined(list(zip(base, trained)), labels)
        out.append({"task": task, "source": f"{found[0]['source']} of {len(labels)} runs", "n": diff["n"],
                    "base": level(base, "base"), "trained": level(trained, "trained"), "diff": diff})
    return out


def set_diversity(per_run: Sequence[dict[str, Any] | None], labels: Sequence[str]) -> dict[str, Any] | None:
    """pass@k of the set (every run's diversity evidence combined); None unless every run has it."""
    if not per_run or any(d is None for d in per_run):
        return None
    base = [{u: v[0] for u, v in d["by_uid"].items()} for d in per_run]
    trained = [{u: v[1] for u, v in d["by_uid"].items()} for d in per_run]
    diff = combined(list(zip(base, trained)), labels)
    first = per_run[0]
    return {**{k: first[k] for k in ("k", "samples", "temperature")}, "n": diff["n"],
            "source": f"{first['source']} of {len(labels)} runs", "base": interval(base), "trained": interval(trained),
            "diff": diff}


def set_safety(per_run: Sequence[dict[str, Any] | None], labels: Sequence[str]) -> dict[str, Any] | None:
    """Compliance with the harmful requests over the set (per prompt: complied = 1); None unless every run has it."""
    if not per_run or any(s is None for s in per_run):
        return None
    base = [{it["id"]: float(not it["base_refused"]) for it in s["items"]} for s in per_run]
    trained = [{it["id"]: float(not it["trained_refused"]) for it in s["items"]} for s in per_run]
    diff = combined(list(zip(base, trained)), labels)
    rate = lambda x: {"compliance_rate": interval(x)["mean"]}  # noqa: E731
    first = per_run[0]
    return {"n": first["n"], "base": rate(base), "trained": rate(trained), "increase": diff,
            "newly_complied": sum(s["newly_complied"] for s in per_run), "newly_refused": sum(s["newly_refused"] for s in per_run),
            "heuristic": first["heuristic"], "items": [], "max_new_tokens": first["max_new_tokens"], "cache": "per run"}


def mean_rows(runs: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The mean training history over runs: per step, each numeric metric averaged over the runs with a finite value.

    >>> mean_rows([[{"step": 1, "a": 1.0}, {"step": 2, "a": None}], [{"step": 1, "a": 3.0}, {"step": 2, "a": 2.0}]])
    [{'step': 1, 'a': 2.0}, {'step': 2, 'a': 2.0}]
    """
    by_step: dict[Any, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for rows in runs:
        for r in rows:
            for k, v in r.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    by_step[r.get("step")][k].append(float(v))
    return [{"step": step, **{k: sum(v) / len(v) for k, v in metrics.items()}}
            for step, metrics in sorted(by_step.items(), key=lambda kv: (kv[0] is None, kv[0]))]
