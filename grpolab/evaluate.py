"""Held-out evaluation: greedy decoding on problems the model never trained on, scored by math-verify
(grpolab.scoring, which shares no code with the training reward), with bootstrap intervals."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .prompting import prompt_ids
from .rollout.base import RolloutEngine, SamplingParams
from .scoring import bootstrap_ci, is_correct
from .tasks.base import Problem


@dataclass
class EvalResult:
    accuracy: float
    ci_low: float
    ci_high: float
    n: int
    per_slice: dict[str, dict[str, float]]
    len_mean: float
    truncated_frac: float
    problems_per_s: float
    items: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "items"}


def greedy_eval(engine: RolloutEngine, tokenizer, problems: list[Problem], max_new_tokens: int, batch_size: int = 64) -> EvalResult:
    """Greedy completions for every problem, batched; accuracy with a 95% percentile-bootstrap interval."""
    start = time.perf_counter()
    items: list[dict[str, Any]] = []
    params = SamplingParams(group_size=1, max_new_tokens=max_new_tokens, greedy=True)
    for i in range(0, len(problems), batch_size):
        chunk = problems[i : i + batch_size]
        out = engine.generate([prompt_ids(tokenizer, p) for p in chunk], params)
        lengths = out.completion_mask.sum(-1).tolist()
        for p, text, n, trunc in zip(chunk, out.texts, lengths, out.truncated.tolist()):
            items.append({"uid": p.uid, "slice": p.slice, "gold": p.answer, "completion": text,
                          "correct": bool(is_correct(text, p.answer)), "length": int(n), "truncated": bool(trunc)})
    elapsed = time.perf_counter() - start
    correct = np.array([it["correct"] for it in items], dtype=float)
    mean, lo, hi = bootstrap_ci(correct)
    by_slice: dict[str, list[float]] = defaultdict(list)
    for it in items:
        by_slice[it["slice"]].append(float(it["correct"]))
    per_slice = {}
    for s, v in sorted(by_slice.items()):
        m, l, h = bootstrap_ci(np.array(v))
        per_slice[s] = {"accuracy": m, "ci_low": l, "ci_high": h, "n": len(v)}
    return EvalResult(
        accuracy=float(mean), ci_low=float(lo), ci_high=float(hi), n=len(items), per_slice=per_slice,
        len_mean=float(np.mean([it["length"] for it in items])),
        truncated_frac=float(np.mean([it["truncated"] for it in items])),
        problems_per_s=len(items) / elapsed if elapsed > 0 else float("nan"), items=items,
    )


def load_eval_problems(task: str, options: dict[str, Any], split: str, limit: int) -> list[Problem]:
    from .tasks import make_task

    problems = make_task(task, **options).problems(split)
    return problems[:limit] if limit else problems


def run_eval(models: list[str], task: str, options: dict[str, Any], split: str, limit: int,
             max_new_tokens: int, batch_size: int, dtype: str) -> dict[str, Any]:
    """Evaluate each model on the same problems; paired bootstrap differences against the first model."""
    from .manifest import data_hash
    from .models import DTYPES, load_causal_lm, load_tokenizer, resolve_model_path
    from .rollout.hf import HFEngine
    from .scoring import paired_bootstrap_diff

    problems = load_eval_problems(task, options, split, limit)
    rows, first = [], None
    for name in models:
        path = resolve_model_path(name)
        tokenizer = load_tokenizer(path)
        model = load_causal_lm(path, dtype)
        result = greedy_eval(HFEngine(model, tokenizer, DTYPES[dtype]), tokenizer, problems, max_new_tokens, batch_size)
        row = {"model": name, "path": path, **result.summary(), "items": result.items}
        correct = np.array([it["correct"] for it in result.items], dtype=float)
        if first is None:
            first = correct
        else:
            d, lo, hi = paired_bootstrap_diff(first, correct)
            row["diff_vs_first"] = {"mean": d, "ci_low": lo, "ci_high": hi}
        rows.append(row)
    return {"task": task, "task_options": options, "split": split, "n": len(problems),
            "data_hash": data_hash(problems), "decoding": "greedy", "max_new_tokens": max_new_tokens,
            "dtype": dtype, "metric": "math-verify equivalence of the final answer", "models": rows}
