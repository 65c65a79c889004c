"""Held-out evaluation: decoding on problems the model never trained on, scored by math-verify -- or, for code
tasks, by running all of the problem's tests in the sandbox -- in grpolab.evaluation.scoring, which shares no scoring code
with the training reward, with 95% intervals.

Per problem i (one "item"), every metric is a number s_i; a model's metric is mean_i s_i with a 95% interval over
problems, and two models are compared on the same problems by the paired interval of d_i = s_i(model) - s_i(first
model): t over problems for binary scores, the studentised bootstrap for graded ones (pass@j from more than j
samples, mean@k) -- grpolab.evaluation.intervals.score_interval / paired_score_interval, coverage measured by
benchmarks/interval_coverage.py. Metrics:

- ``accuracy``: greedy completion correct (math-verify equivalence of its final answer with gold; for code: every
  test passes, i.e. greedy pass@1).
- ``strict`` / ``flexible`` (GSM8K only): greedy correct in the requested ``\\boxed{}`` format / by last number.
- with k samples at temperature T: ``pass@j`` = unbiased 1 - C(k-c, j)/C(k, j) for j in 1, 2, 4, ... and k
  (c = correct samples); ``maj@k`` = the majority answer (math-verify clusters) is correct;
  ``mean@k`` = c / k (code: no maj@k, programs have no final answer to vote on).

Slices: the task's own label (``digits=2``, ``level=3``) and, for MATH-500, ``subject=<name>`` read from the uid; an
item's slices are its ``slices`` list (in_slice), not its ``slice`` label alone.
Length is counted in completion tokens (the EOS included); truncated = hit max_new_tokens without EOS.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..agents.env import is_agent_problem
from ..agents.openai_agent import is_openai_agent_problem
from ..rollout.base import RolloutEngine, SamplingParams
from ..tasks.base import Problem
from ..tasks.code import is_code_problem
from ..tasks.prompting import prompt_ids
from .episodes import evaluate_episodes
from .intervals import paired_score_interval
from .result import Completion, EvalResult, EvalSettings, summarise
from .scoring import (
    code_passes,
    extract_final,
    gsm8k_flexible,
    gsm8k_strict,
    held_out_correct,
    held_out_job,
    maj_at_k,
    mean_at_k,
    pass_at_k,
    program_text,
)

Progress = Callable[[str, int, int], None]  # (what, problems done, problems in all): called after every batch
METRIC_NAME = "math-verify equivalence of the final answer (grpolab.evaluation.scoring)"
CODE_METRIC_NAME = "every test passes in the sandbox (grpolab.evaluation.scoring)"


def generate_all(
    engine: RolloutEngine,
    tokenizer,
    problems: list[Problem],
    params: SamplingParams,
    batch_size: int,
    progress: Progress | None = None,
) -> list[list[Completion]]:
    """params.group_size completions per problem (1 when greedy), generated batch_size sequences at a time;
    ``progress("greedy" | "k samples", done, total)`` after each batch."""
    g = 1 if params.greedy else params.group_size
    per_call = max(1, batch_size // g)
    out: list[list[Completion]] = []
    for i in range(0, len(problems), per_call):
        chunk = problems[i : i + per_call]
        r = engine.generate([prompt_ids(tokenizer, p) for p in chunk], params)
        lengths, truncated = r.completion_mask.sum(-1).tolist(), r.truncated.tolist()
        for j in range(len(chunk)):
            rows = range(j * g, (j + 1) * g)
            out.append([Completion(r.texts[k], int(lengths[k]), bool(truncated[k])) for k in rows])
        if progress:
            progress("greedy" if params.greedy else f"{g} samples", len(out), len(problems))
    return out


def slice_labels(problem: Problem) -> list[str]:
    """The slices a problem belongs to: its task label, plus ``subject=<s>`` for MATH-500 uids."""
    labels = [problem.slice]
    parts = problem.uid.split("/")
    if parts[0] == "math500" and len(parts) >= 4:  # math500/test/<subject>/<n>.json
        labels.append(f"subject={parts[2]}")
    return labels


def pass_ks(k: int) -> list[int]:
    """1, 2, 4, ... below k, and k itself.

    >>> pass_ks(8), pass_ks(5), pass_ks(1)
    ([1, 2, 4, 8], [1, 2, 4, 5], [1])
    """
    ks, j = [], 1
    while j < k:
        ks.append(j)
        j *= 2
    return ks + [k]


def score_item(problem: Problem, greedy: Completion, samples: list[Completion], task: str) -> dict[str, Any]:
    """One evaluation record: the greedy completion and its checks, the samples, and per-item ``scores``."""
    correct = held_out_correct(greedy.text, problem)
    item: dict[str, Any] = {
        "uid": problem.uid,
        "slice": problem.slice,
        "slices": slice_labels(problem),
        "gold": problem.answer,
        "completion": greedy.text,
        "answer": extract_final(greedy.text),
        "correct": correct,
        "length": greedy.length,
        "truncated": greedy.truncated,
        "scores": {"accuracy": float(correct)},
    }
    if task == "gsm8k":
        item["scores"]["strict"] = float(gsm8k_strict(greedy.text, problem.answer))
        item["scores"]["flexible"] = float(gsm8k_flexible(greedy.text, problem.answer))
    if samples:
        answers = [extract_final(s.text) for s in samples]
        ok = [held_out_correct(s.text, problem) for s in samples]
        k, c = len(samples), sum(ok)
        item["samples"] = [
            {"completion": s.text, "answer": a, "correct": o, "length": s.length, "truncated": s.truncated}
            for s, a, o in zip(samples, answers, ok)
        ]
        item["scores"].update({f"pass@{j}": pass_at_k(k, c, j) for j in pass_ks(k)})
        item["scores"][f"maj@{k}"] = float(maj_at_k(answers, problem.answer))
        item["scores"][f"mean@{k}"] = mean_at_k(ok)
    return item


def score_code_item(
    problem: Problem, greedy: Completion, samples: list[Completion], verdicts: list[tuple[bool, str | None]]
) -> dict[str, Any]:
    """One evaluation record of a code problem; ``verdicts`` (passed, reason) for the greedy completion and then
    each sample (grpolab.evaluation.scoring.code_passes)."""
    (ok, reason), rest = verdicts[0], verdicts[1:]
    item: dict[str, Any] = {
        "uid": problem.uid,
        "slice": problem.slice,
        "slices": slice_labels(problem),
        "gold": problem.answer,
        "completion": greedy.text,
        "answer": program_text(greedy.text)[:2000],
        "correct": bool(ok),
        "reason": reason,
        "length": greedy.length,
        "truncated": greedy.truncated,
        "scores": {"accuracy": float(ok)},
    }
    if samples:
        passed = [bool(v[0]) for v in rest]
        k, c = len(samples), sum(passed)
        item["samples"] = [
            {"completion": s.text, "correct": p, "reason": v[1], "length": s.length, "truncated": s.truncated}
            for s, p, v in zip(samples, passed, rest)
        ]
        item["scores"].update({f"pass@{j}": pass_at_k(k, c, j) for j in pass_ks(k)})
        item["scores"][f"mean@{k}"] = mean_at_k(passed)
    return item


def stop_rule_for(problems: list[Problem]) -> str:
    """The stop rule held-out answers are decoded with (rollout/stop.py): code_block for code problems -- their
    program is the first Python block, and nothing after it is generated, for the base model as for the trained
    one -- else none. (Training with a code reward stops the same way: rollout.stop_rule auto.)"""
    return "code_block" if problems and all(is_code_problem(p) for p in problems) else "none"


def evaluate_model(
    engine: RolloutEngine, tokenizer, problems: list[Problem], settings: EvalSettings, progress: Progress | None = None
) -> EvalResult:
    """Greedy completions (and k samples when settings.samples > 0) for every problem, scored and summarised;
    ``progress`` is told after every batch (generate_all) and around the sandbox scoring of code."""
    import torch

    if problems and all(is_agent_problem(p) or is_openai_agent_problem(p) for p in problems):
        # one greedy episode each (grpolab.evaluation.episodes)
        return evaluate_episodes(engine, tokenizer, problems, settings, progress)
    start = time.perf_counter()
    stop = stop_rule_for(problems)
    greedy = generate_all(
        engine,
        tokenizer,
        problems,
        SamplingParams(group_size=1, max_new_tokens=settings.max_new_tokens, greedy=True, stop_rule=stop),
        settings.batch_size,
        progress,
    )
    sampled: list[list[Completion]] = [[] for _ in problems]
    if settings.samples > 0:
        torch.manual_seed(settings.seed)
        params = SamplingParams(
            group_size=settings.samples,
            logprobs=False,
            temperature=settings.temperature,
            top_p=settings.top_p,
            max_new_tokens=settings.max_new_tokens,
            stop_rule=stop,
        )
        sampled = generate_all(engine, tokenizer, problems, params, settings.batch_size, progress)
    if problems and all(is_code_problem(p) for p in problems):
        jobs = [[held_out_job(c.text, p) for c in (g[0], *s)] for p, g, s in zip(problems, greedy, sampled)]
        if progress:
            progress("sandbox scoring", 0, len(problems))
        verdicts = code_passes(jobs)
        if progress:
            progress("sandbox scoring", len(problems), len(problems))
        items = [score_code_item(p, g[0], s, v) for p, g, s, v in zip(problems, greedy, sampled, verdicts)]
    else:
        items = [score_item(p, g[0], s, settings.task) for p, g, s in zip(problems, greedy, sampled)]
    result = summarise(items, time.perf_counter() - start)
    if settings.samples > 0:
        all_s = [s for it in items for s in it["samples"]]
        result.metrics["sampled_len_mean"] = {"mean": float(np.mean([s["length"] for s in all_s]))}
        result.metrics["sampled_truncated_frac"] = {"mean": float(np.mean([s["truncated"] for s in all_s]))}
    return result


def greedy_eval(
    engine: RolloutEngine,
    tokenizer,
    problems: list[Problem],
    max_new_tokens: int,
    batch_size: int = 64,
    task: str = "",
    model: str = "",
) -> EvalResult:
    """Greedy completions for every problem, batched; accuracy with its 95% interval (t over problems). model: the
    evaluated model's name (EvalSettings.model)."""
    return evaluate_model(engine, tokenizer, problems, EvalSettings(max_new_tokens, batch_size, task=task, model=model))


def in_slice(item: dict[str, Any], label: str) -> bool:
    """Whether an eval item belongs to a slice: the label is among its ``slices`` (its ``slice`` when it has none).
    MATH-500 items carry ``subject=<s>`` only in ``slices``; their ``slice`` is the level.

    >>> it = {"slice": "level=2", "slices": ["level=2", "subject=algebra"]}
    >>> in_slice(it, "subject=algebra"), in_slice(it, "level=2"), in_slice({"slice": "easy"}, "easy")
    (True, True, True)
    """
    return label in (item.get("slices") or [item.get("slice")])


def paired_diffs(
    first: list[dict[str, Any]], other: list[dict[str, Any]], slice_: str | None = None
) -> dict[str, dict[str, Any]]:
    """Paired interval of other - first (intervals.paired_score_interval) for every metric both have, on the problems
    (uids) both have -- only those of one slice when ``slice_`` is given (in_slice); each with n, method and
    degenerate. {} when they share no problem."""
    a = {it["uid"]: it["scores"] for it in first if slice_ is None or in_slice(it, slice_)}
    b = {it["uid"]: it["scores"] for it in other if slice_ is None or in_slice(it, slice_)}
    uids = [u for u in a if u in b]
    if not uids:
        return {}
    out = {}
    for m in (m for m in a[uids[0]] if m in b[uids[0]]):
        r = paired_score_interval([a[u][m] for u in uids], [b[u][m] for u in uids])
        out[m] = {k: r[k] for k in ("mean", "ci_low", "ci_high", "n", "method", "degenerate")}
    return out


def load_eval_problems(task: str, options: dict[str, Any], split: str, limit: int) -> list[Problem]:
    from ..tasks import make_task

    problems = make_task(task, **options).problems(split)
    return problems[:limit] if limit else problems


def model_row(name: str, path: str, result: EvalResult, held_out: dict[str, Any], method: str) -> dict[str, Any]:
    """One entry of an evaluation JSON's ``models`` list."""
    return {
        "model": name,
        "path": path,
        "method": method,
        "held_out": held_out,
        **result.summary(),
        "items": result.items,
    }


def add_paired(rows: list[dict[str, Any]]) -> None:
    """``paired_vs_first`` (every metric) and ``diff_vs_first`` (accuracy) on every row after the first."""
    for row in rows[1:]:
        row["paired_vs_first"] = paired_diffs(rows[0]["items"], row["items"])
        if "accuracy" in row["paired_vs_first"]:
            row["diff_vs_first"] = {k: v for k, v in row["paired_vs_first"]["accuracy"].items() if k != "n"}


def eval_header(
    task: str, options: dict[str, Any], split: str, problems: list[Problem], dtype: str, decoding: dict[str, Any]
) -> dict[str, Any]:
    """The part of an evaluation JSON that identifies the evaluation set and the decoding."""
    from ..manifest import data_hash, versions

    code = bool(problems) and all(is_code_problem(p) for p in problems)
    return {
        "grpolab_eval": 1,
        "task": task,
        "task_options": options,
        "split": split,
        "n": len(problems),
        "data_hash": data_hash(problems),
        "decoding": decoding,
        "max_new_tokens": decoding["max_new_tokens"],
        "dtype": dtype,
        "metric": CODE_METRIC_NAME if code else METRIC_NAME,
        "versions": versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def add_sets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sets among the rows after the first: runs whose manifests (found by the held-out check) differ only in
    the seed (grpolab.evaluation.sets.recipe_groups), each with every metric's mean over runs and problems and its
    gain over the first row, two-part (problems, seeds) intervals (grpolab.evaluation.sets.set_evidence)."""
    from .sets import recipe_groups, set_evidence

    def manifest(row: dict[str, Any]) -> dict[str, Any] | None:
        path = (row.get("held_out") or {}).get("manifest")
        data = json.loads(Path(path).read_text(encoding="utf-8")) if path else None
        return data if isinstance(data, dict) and data.get("grpolab_manifest") else None

    manifests = [None] + [manifest(r) for r in rows[1:]]
    return [
        {
            "runs": [rows[i]["model"] for i in g],
            "seeds": [manifests[i].get("seed") for i in g],
            "reference": rows[0]["model"],
            "metrics": set_evidence([rows[i] for i in g], [rows[0]] * len(g)),
        }
        for g in recipe_groups(manifests)
    ]


def run_eval(
    models: list[str],
    task: str,
    options: dict[str, Any],
    split: str,
    limit: int,
    max_new_tokens: int,
    batch_size: int,
    dtype: str,
    samples: int = 0,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Evaluate each model on the same problems; paired differences (with intervals) against the first model, and the
    evidence of every set of runs (seeds of one recipe) among the others (add_sets).

    Every model's held-out integrity is checked (grpolab.evaluation.overlap) before any model is loaded. ``progress(what,
    done, total)`` is told after every batch, ``what`` naming the model.
    """
    from ..models.load import DTYPES, load_causal_lm, load_tokenizer, resolve_model_path
    from ..rollout.grpolab_engine import GrpolabEngine
    from .overlap import check_held_out

    problems = load_eval_problems(task, options, split, limit)
    if not problems:
        from ..errors import GrpolabError

        raise GrpolabError(f"task {task!r} has no problems in split {split!r}")
    paths = [resolve_model_path(name) for name in models]
    checks = [check_held_out(name, path, problems) for name, path in zip(models, paths)]
    settings = EvalSettings(max_new_tokens, batch_size, samples, temperature, top_p, task, seed)
    rows = []
    for name, path, held_out in zip(models, paths, checks):
        tokenizer = load_tokenizer(path)
        model = load_causal_lm(path, dtype)
        told = (lambda what, done, total, name=name: progress(f"{name} {what}", done, total)) if progress else None
        engine = GrpolabEngine(model, tokenizer, DTYPES[dtype])
        result = evaluate_model(engine, tokenizer, problems, replace(settings, model=name), told)
        rows.append(model_row(name, path, result, held_out, "sampled" if samples else "greedy"))
        del model
    add_paired(rows)
    decoding = {
        "greedy": True,
        "samples": samples,
        "temperature": temperature if samples else None,
        "top_p": top_p if samples else None,
        "seed": seed,
        "max_new_tokens": max_new_tokens,
    }
    sets = add_sets(rows)
    return {
        **eval_header(task, options, split, problems, dtype, decoding),
        "models": rows,
        **({"sets": sets} if sets else {}),
    }
