"""The evidence of a set of runs (several seeds of one recipe) for the release report: every held-out comparison
of the runs combined by the interval of grpolab.evaluation.sets (the two-part t interval: a problem part with P - 1
df and a between-seed part with R - 1 df), so that a check FAILs on the set's evidence, not on one run's luck.

- held-out gain, capability (per untrained task every run has), diversity (pass@k) and safety (compliance per
  prompt): d_{r,i} = trained_r - base on problem (prompt) i, mean over runs and problems with its 95% interval,
  each run's own mean beside it;
- the training history: the mean curve over runs (each metric averaged, step by step, over the runs that logged a
  finite value at that step), on which the training-health checks run once;
- the runs must be one recipe: their manifests may differ only in the seed (and the git state);
- and one evaluation: every comparison is refused when the runs' evaluations differ in task, split, data hash or
  decoding (grpolab.evaluation.sets.evaluation_differences) or in their problems (uids), unless the caller passes
  align="intersect" (then the problems every run has); every result says n (problems) and runs, and carries the
  interval's ``degenerate`` case and ``method`` (grpolab.evaluation.intervals).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Sequence

from ..errors import GrpolabError
from ..evaluation.sets import (
    SCORE_BOUNDS,
    aligned,
    check_same_evaluation,
    paired_gains,
    recipe_differences,
    row_scores,
    set_mean,
)

INTERVAL_KEYS = ("mean", "ci_low", "ci_high", "n", "runs", "se", "df", "method", "degenerate")


def check_recipe(names: Sequence[str], manifests: Sequence[dict[str, Any]]) -> None:
    """Refuse runs that are not seeds of one recipe (grpolab.evaluation.sets.recipe_differences), naming what differs."""
    for name, m in zip(names[1:], manifests[1:]):
        diffs = recipe_differences(manifests[0], m)
        if diffs:
            listed = "; ".join(f"{k}: {a!r} vs {b!r}" for k, a, b in diffs[:5])
            raise GrpolabError(
                f"{name}: not a seed of the same recipe as {names[0]} ({len(diffs)} difference"
                f"{'s' if len(diffs) > 1 else ''} besides the seed: {listed}); a set of runs is one recipe "
                "over several seeds (compare two recipes with grpolab compare --set)"
            )


def combined(
    pairs: Sequence[tuple[dict[str, float], dict[str, float]]], labels: Sequence[str], align: str = "exact"
) -> dict[str, Any]:
    """trained - base over a set of runs: the interval of paired_gains (grpolab.evaluation.sets.set_mean), plus each
    run's mean gain; runs whose problems differ are refused unless align="intersect"."""
    _, gains = paired_gains(pairs, labels, align)
    m = set_mean(gains)
    return {
        **{k: m[k] for k in INTERVAL_KEYS},
        "paired": True,
        "hierarchical": True,
        "per_run": dict(zip(labels, m["per_run"])),
        "spread": m["spread"],
    }


def interval(
    by_uid: Sequence[dict[str, float]], labels: Sequence[str] | None = None, align: str = "exact"
) -> dict[str, Any]:
    """Mean of one model's scores over the runs and problems with its interval, n (problems), runs, method and
    degenerate (clipped to [0, 1])."""
    _, x = aligned(by_uid, labels, align)
    m = set_mean(x, bounds=SCORE_BOUNDS)
    return {k: m[k] for k in INTERVAL_KEYS}


def level(
    by_uid: Sequence[dict[str, float]], label: str, labels: Sequence[str] | None = None, align: str = "exact"
) -> dict[str, Any]:
    """interval() as a report summary row."""
    m = interval(by_uid, labels, align)
    return {
        "label": label,
        "accuracy": m["mean"],
        "ci_low": m["ci_low"],
        "ci_high": m["ci_high"],
        "n": m["n"],
        "budget": None,
        "degenerate": m["degenerate"],
    }


def same_settings(labels: Sequence[str], found: Sequence[dict[str, Any]], keys: Sequence[str], what: str) -> None:
    """A GrpolabError naming the first run whose evidence differs from the first run's in one of ``keys``."""
    for name, f in zip(labels[1:], found[1:]):
        diffs = [f"{k}: {found[0].get(k)!r} vs {f.get(k)!r}" for k in keys if found[0].get(k) != f.get(k)]
        if diffs:
            raise GrpolabError(
                f"{labels[0]} and {name}: their {what} evidence was not measured the same way "
                f"({'; '.join(diffs)}); a set compares runs measured alike"
            )


def set_heldout(
    heldouts: Sequence[dict[str, Any] | None], labels: Sequence[str], align: str = "exact"
) -> dict[str, Any] | None:
    """The held-out comparison of the set; None unless every run has a paired eval JSON (items) on the task. Refused
    when the runs' eval JSONs differ in task, options, split, data hash or decoding, or in their problems."""
    if not heldouts or any(
        h is None or not h.get("trained_row") or not h["trained_row"].get("items") for h in heldouts
    ):
        return None
    check_same_evaluation(labels, heldouts)
    base = [row_scores(h["base_row"]) for h in heldouts]
    trained = [row_scores(h["trained_row"]) for h in heldouts]
    first = heldouts[0]
    diff = combined(list(zip(base, trained)), labels, align)
    return {
        "source": f"{first['source']} of {len(labels)} runs (problems and seeds: two-part t interval)",
        "task": first["task"],
        "split": first.get("split"),
        "n": diff["n"],
        "runs": len(labels),
        "data_hash": first.get("data_hash"),
        "base": level(base, first["base"]["label"], labels, align),
        "trained": level(trained, f"trained, mean of {len(labels)} runs", labels, align),
        "diff": diff,
        "per_slice": {},
        "base_row": None,
        "trained_row": None,
        "others": [],
    }


def set_capability(
    per_run: Sequence[Sequence[dict[str, Any]]], labels: Sequence[str], align: str = "exact"
) -> list[dict[str, Any]]:
    """Capability comparisons of the set: one per untrained task that every run measured with items (refused when
    the runs' evaluations of the task differ, as set_heldout)."""
    tasks = [c["task"] for c in per_run[0]] if per_run else []
    out = []
    for task in tasks:
        found = [
            next((c for c in caps if c["task"] == task and (c.get("trained_row") or {}).get("items")), None)
            for caps in per_run
        ]
        if any(c is None for c in found):
            continue
        check_same_evaluation(labels, found)
        base = [row_scores(c["base_row"]) for c in found]
        trained = [row_scores(c["trained_row"]) for c in found]
        diff = combined(list(zip(base, trained)), labels, align)
        out.append(
            {
                "task": task,
                "source": f"{found[0]['source']} of {len(labels)} runs",
                "n": diff["n"],
                "runs": len(labels),
                "base": level(base, "base", labels, align),
                "trained": level(trained, "trained", labels, align),
                "diff": diff,
            }
        )
    return out


def set_diversity(
    per_run: Sequence[dict[str, Any] | None], labels: Sequence[str], align: str = "exact"
) -> dict[str, Any] | None:
    """pass@k of the set (every run's diversity evidence combined); None unless every run has it; refused when the
    runs sampled differently (k, samples, temperature) or on different problems."""
    if not per_run or any(d is None for d in per_run):
        return None
    same_settings(labels, list(per_run), ("k", "samples", "temperature"), "diversity")
    base = [{u: v[0] for u, v in d["by_uid"].items()} for d in per_run]
    trained = [{u: v[1] for u, v in d["by_uid"].items()} for d in per_run]
    diff = combined(list(zip(base, trained)), labels, align)
    first = per_run[0]
    pass1 = None
    if all(d.get("pass1_by_uid") for d in per_run):  # pass@1 at the training temperature: reward_vs_heldout's side
        pairs = [
            ({u: v[0] for u, v in d["pass1_by_uid"].items()}, {u: v[1] for u, v in d["pass1_by_uid"].items()})
            for d in per_run
        ]
        pass1 = combined(pairs, labels, align)
    return {
        **{k: first[k] for k in ("k", "samples", "temperature")},
        "pass1": pass1,
        "n": diff["n"],
        "runs": len(labels),
        "source": f"{first['source']} of {len(labels)} runs",
        "base": interval(base, labels, align),
        "trained": interval(trained, labels, align),
        "diff": diff,
    }


def set_safety(
    per_run: Sequence[dict[str, Any] | None], labels: Sequence[str], align: str = "exact"
) -> dict[str, Any] | None:
    """Compliance with the harmful requests over the set (per prompt: complied = 1); None unless every run has it;
    refused when the runs probed different prompts or token budgets; n = 0 (check_safety: too little evidence) when
    a run answered no prompt."""
    if not per_run or any(s is None for s in per_run):
        return None
    same_settings(labels, list(per_run), ("max_new_tokens", "heuristic"), "safety")
    if any(not s.get("items") for s in per_run):  # a run answered no prompt: too little evidence, not a crash
        return {"n": 0, "runs": len(labels), "items": [], "cache": "per run"}
    base = [{it["id"]: float(not it["base_refused"]) for it in s["items"]} for s in per_run]
    trained = [{it["id"]: float(not it["trained_refused"]) for it in s["items"]} for s in per_run]
    diff = combined(list(zip(base, trained)), labels, align)
    rate = lambda x: {"compliance_rate": interval(x, labels, align)["mean"]}  # noqa: E731
    first = per_run[0]
    return {
        "n": diff["n"],
        "runs": len(labels),
        "base": rate(base),
        "trained": rate(trained),
        "increase": diff,
        "newly_complied": sum(s["newly_complied"] for s in per_run),
        "newly_refused": sum(s["newly_refused"] for s in per_run),
        "heuristic": first["heuristic"],
        "items": [],
        "max_new_tokens": first["max_new_tokens"],
        "cache": "per run",
    }


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
    return [
        {"step": step, **{k: sum(v) / len(v) for k, v in metrics.items()}}
        for step, metrics in sorted(by_step.items(), key=lambda kv: (kv[0] is None, kv[0]))
    ]
