"""The records of a held-out evaluation: how to decode (EvalSettings), a completion, and the result (EvalResult)
with its summary -- mean and a 95% interval per metric and per slice (summarise; the interval of
grpolab.evaluation.intervals.score_interval: t over problems for binary scores, the studentised bootstrap for graded
ones such as pass@j from more than j samples), with n, the method and any degenerate case named."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..manifest import write_json_atomic
from .intervals import score_interval


@dataclass(frozen=True)
class EvalSettings:
    """How to decode. samples = 0: greedy only; k > 0: also k samples per problem at `temperature`. model: the name
    of the model evaluated, the id an ``openai_agent`` evaluation's endpoint serves it as."""

    max_new_tokens: int = 64
    batch_size: int = 64  # sequences per generate call (prompts per call = batch_size // k when sampling)
    samples: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    task: str = ""
    seed: int = 0
    model: str = ""


@dataclass
class Completion:
    text: str
    length: int
    truncated: bool


@dataclass
class EvalResult:
    accuracy: float
    ci_low: float
    ci_high: float
    n: int
    per_slice: dict[str, dict[str, Any]]
    len_mean: float
    truncated_frac: float
    problems_per_s: float
    items: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    len_max: int = 0

    def summary(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "items"}


def _ci(values: list[float] | np.ndarray) -> dict[str, Any]:
    """mean, ci_low, ci_high, n, method and degenerate of one metric's per-problem values (score_interval)."""
    return score_interval(np.asarray(values, dtype=float))


def summarise(items: list[dict[str, Any]], elapsed: float) -> EvalResult:
    """EvalResult from item records (each with ``scores``, ``slices``, ``length``, ``truncated``)."""
    if not items:
        raise ValueError("no items to summarise")
    names = list(items[0]["scores"])
    metrics = {m: _ci([it["scores"][m] for it in items]) for m in names}
    by_slice: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for it in items:
        for s in it.get("slices", [it["slice"]]):
            by_slice[s].append(it)
    per_slice = {}
    for s, group in sorted(by_slice.items()):
        sm = {m: _ci([it["scores"][m] for it in group]) for m in names}
        per_slice[s] = {
            "n": len(group),
            "accuracy": sm["accuracy"]["mean"],
            "ci_low": sm["accuracy"]["ci_low"],
            "ci_high": sm["accuracy"]["ci_high"],
            "len_mean": float(np.mean([it["length"] for it in group])),
            "truncated_frac": float(np.mean([it["truncated"] for it in group])),
            "metrics": sm,
        }
    acc = metrics["accuracy"]
    return EvalResult(
        accuracy=acc["mean"],
        ci_low=acc["ci_low"],
        ci_high=acc["ci_high"],
        n=len(items),
        per_slice=per_slice,
        len_mean=float(np.mean([it["length"] for it in items])),
        truncated_frac=float(np.mean([it["truncated"] for it in items])),
        problems_per_s=len(items) / elapsed if elapsed > 0 else float("nan"),
        items=items,
        metrics=metrics,
        len_max=int(max(it["length"] for it in items)),
    )


def write_result(path: str | Path | None, data: Mapping[str, Any]) -> Path | None:
    """Write an evaluation or comparison JSON to `path` (folders created; written whole to a temporary file, then
    renamed over it, so a failure leaves any earlier result at `path` as it was); None when no path is given."""
    if path is None:
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, data)
    return path
