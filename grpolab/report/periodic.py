"""The periodic held-out evals of a training run (``eval.every_steps``) as the held-out comparison of a report that
has no eval file: the first periodic eval against the last, on the same problems.

Paired where the run recorded each problem's right/wrong (``RUN_DIR/eval_items.jsonl``, one row per periodic eval:
``{"step", "correct": {uid: 0 or 1}}``): the difference d_i = right_i(last) - right_i(first) over the problems both
evals scored, with the report's paired interval (evaluation.intervals.paired_evidence_interval: t over problems, exact
when every difference is equal) and the counts of problems that got worse and better (the exact sign test).

Unpaired otherwise (runs from before the records): each eval's accuracy p over its n problems has the t interval's
unclipped standard error se = sqrt(p (1 - p) / (n - 1)) (the sample variance n p (1 - p) / (n - 1) over n), and

    d = p_last - p_first,   d -/+ t_{0.975, n_first + n_last - 2} sqrt(se_first^2 + se_last^2)

-- not the half-widths of the recorded intervals, which are clipped to [0, 1] and so too short near 0 and 1. Without
n the recorded intervals' half-widths are combined (the normal approximation of evidence.unpaired_diff). An eval
with a zero-width interval (every problem wrong or right) gives no unpaired difference: ``missing_interval``.
"""

from __future__ import annotations

import math
from typing import Any

from ..evaluation.intervals import paired_evidence_interval, t_quantile

ITEMS_LOG = "eval_items.jsonl"  # written by the trainer after every periodic eval


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def periodic_point(row: dict[str, Any], n: int | None) -> dict[str, Any] | None:
    """One periodic eval row as {"accuracy", "ci_low", "ci_high", "n"}; None when its interval was not recorded or
    has zero width (every problem wrong, or every one right: a degenerate t interval that claims an exact accuracy,
    which the unpaired difference would read as no uncertainty at all). An interval's low end of 0.0 is a value like
    any other, never "missing". ``n`` is the row's own ``eval/n`` (the problems it scored) when logged, else `n`."""
    lo, hi = row.get("eval/ci_low"), row.get("eval/ci_high")
    if not (_finite(lo) and _finite(hi)) or float(hi) <= float(lo):
        return None
    scored = row.get("eval/n")
    return {
        "accuracy": row["eval/accuracy"],
        "ci_low": float(lo),
        "ci_high": float(hi),
        "n": int(scored) if _finite(scored) else n,
    }


def unpaired_periodic_diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """b - a of two periodic points (module docstring): the t interval from each accuracy's unclipped standard error
    when both have n >= 2, else the recorded half-widths combined (evidence.unpaired_diff).

    >>> d = unpaired_periodic_diff({"accuracy": 0.02, "n": 50, "ci_low": 0.0, "ci_high": 0.06},
    ...                            {"accuracy": 0.10, "n": 50, "ci_low": 0.013, "ci_high": 0.187})
    >>> round(d["ci_low"], 4), round(d["ci_high"], 4), d["method"]   # 0.08 -/+ 1.9845 sqrt(0.02 * 0.98 / 49 + 0.09 / 49)
    (-0.0139, 0.1739, 'unpaired t from each accuracy and n')
    """
    from .evidence import unpaired_diff

    na, nb = a.get("n"), b.get("n")
    if not (_finite(na) and _finite(nb) and na >= 2 and nb >= 2):
        return {**unpaired_diff(a, b), "method": "unpaired, recorded half-widths (normal)"}
    pa, pb = float(a["accuracy"]), float(b["accuracy"])
    se = math.sqrt(pa * (1 - pa) / (na - 1) + pb * (1 - pb) / (nb - 1))
    half = t_quantile(0.975, na + nb - 2) * se
    d = pb - pa
    return {
        "mean": d,
        "ci_low": max(d - half, -1.0),
        "ci_high": min(d + half, 1.0),
        "paired": False,
        "method": "unpaired t from each accuracy and n",
    }


def paired_periodic_diff(first: dict[str, int], last: dict[str, int]) -> dict[str, Any] | None:
    """last - first over the uids both periodic evals recorded (module docstring): paired_evidence_interval with n,
    method, degenerate and signs; None when they share no problem.

    >>> d = paired_periodic_diff({"a": 0, "b": 1, "c": 0}, {"a": 1, "b": 1, "c": 1, "x": 0})
    >>> d["mean"], d["n"], d["signs"]
    (0.6666666666666666, 3, {'worse': 0, 'better': 2})
    """
    from ..gate.stats import change_signs

    shared = [u for u in first if u in last]
    if not shared:
        return None
    a, b = [float(first[u]) for u in shared], [float(last[u]) for u in shared]
    r = paired_evidence_interval(a, b)
    keep = ("mean", "ci_low", "ci_high", "method", "degenerate")
    return {**{k: r.get(k) for k in keep}, "paired": True, "n": len(shared), "signs": change_signs(a, b)}


def items_by_step(rows: list[dict[str, Any]]) -> dict[int, dict[str, int]]:
    """{step: {uid: right}} of the eval_items.jsonl rows (the last row of a step wins)."""
    return {int(r["step"]): r["correct"] for r in rows if isinstance(r.get("correct"), dict) and "step" in r}


def periodic_heldout(
    metrics: list[dict[str, Any]], n: int | None = None, items: list[dict[str, Any]] | None = None
) -> dict[str, Any] | None:
    """First vs last periodic held-out eval of the training run: paired on the problems (`items`, the rows of
    eval_items.jsonl) when both evals recorded them, else unpaired (unpaired_periodic_diff; n = the problems each eval
    scored: the rows' eval/n when logged, else `n`, the config's eval.num_problems). Unpaired, a row without a
    recorded interval, or with a zero-width one (periodic_point), gives no difference: the result carries
    ``missing_interval`` (the reason) instead. None with fewer than two periodic evals."""
    rows = [r for r in metrics if _finite(r.get("eval/accuracy"))]
    if len(rows) < 2:
        return None
    first, last = rows[0], rows[-1]
    by_step = items_by_step(items or [])
    pair = by_step.get(first["step"]), by_step.get(last["step"])
    diff = paired_periodic_diff(*pair) if all(pair) else None
    label = "paired on the problems" if diff else "unpaired"
    out = {
        "source": f"periodic eval, step {first['step']} vs step {last['step']} ({label})",
        "task": "",
        "n": diff["n"] if diff else n,
        "per_slice": {},
        "base_row": None,
        "trained_row": None,
        "from_step": first["step"],
        "trained_step": last["step"],
    }
    a, b = periodic_point(first, n), periodic_point(last, n)
    point = lambda r, p: {**(p or {"ci_low": math.nan, "ci_high": math.nan, "n": n}), "accuracy": r["eval/accuracy"]}  # noqa: E731
    ends = {
        "base": {**point(first, a), "label": f"step {first['step']}"},
        "trained": {**point(last, b), "label": f"step {last['step']}"},
    }
    if diff:
        return {**out, **ends, "diff": diff}
    if a is None or b is None:
        row = first if a is None else last
        why = (
            "has a zero-width 95% interval (every problem wrong or every one right: degenerate)"
            if _finite(row.get("eval/ci_low")) and _finite(row.get("eval/ci_high"))
            else "has no recorded 95% interval (eval/ci_low, eval/ci_high)"
        )
        return {
            **out,
            **ends,
            "diff": None,
            "missing_interval": f"the periodic held-out eval at step {row['step']} {why}, so the change cannot "
            "be judged from the periodic evals (run `grpolab eval` for a paired comparison)",
        }
    scored = min(x for x in (a["n"], b["n"]) if x is not None) if a["n"] is not None or b["n"] is not None else None
    return {**out, **ends, "n": scored, "diff": {**unpaired_periodic_diff(a, b), "n": scored}}
