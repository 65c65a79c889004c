"""Baselines on the same problems as a GRPO run: best-of-n reward ranking, and SFT / rejection-sampling FT.

best-of-n: sample n completions per problem (temperature T); keep the one the *training* reward
(grpolab.rewards.score_completion with the run's weights) ranks highest -- argmax of the total, an invalid
(NaN) reward never beats a valid one, ties go to the earliest sample -- and score the kept one with the held-out
metric (math-verify). ``oracle@n`` (any of the n correct under the held-out metric) is reported beside it.
The training reward sees the gold answer, so this is a verifier-reranking upper reference, not a deployable model.

SFT: fine-tune the base model on (prompt, target) pairs of the task's *train* split with the token-mean
cross-entropy of the target tokens (prompt tokens are masked; the target ends with EOS), AdamW, constant LR,
gradient clipping, for exactly ``steps`` optimizer steps of ``batch_size`` examples (examples are drawn
epoch-wise in a seeded shuffled order), i.e. the same optimizer-step budget as a GRPO run.
- mode ``gold``: the target is the gold solution (GSM8K: its worked solution with the ``<<...>>`` calculator
  notes removed and ``#### x`` turned into ``\\boxed{x}``; arithmetic: ``a + b = x``) ending in ``\\boxed{answer}``.
- mode ``rft`` (rejection-sampling FT): sample ``rft_samples`` completions per train problem from the base
  model, keep the distinct ones with training-reward component ``correct`` >= 1, fine-tune on those.
The result is an HF checkpoint directory with a ``baseline_manifest.json`` that records the training problems,
so ``grpolab eval`` refuses evaluation sets that overlap them (grpolab.evaluation.overlap).

DPO (grpolab.baselines.dpo) and PPO with a critic (grpolab.baselines.ppo) are the other baselines (`grpolab baseline dpo|ppo`).

**Budget.** Every baseline states what it spent in *sampled completions* and *optimizer steps* (``budget_of``), beside
its wall time and peak memory, so `grpolab compare` and the release report can put them in one table:

- GRPO / PPO run: train.steps x prompts_per_step x group_size completions (plus dynamic-sampling refills), train.steps
  x mu x minibatches optimizer steps (PPO: as many critic steps besides);
- DPO: the completions it sampled on training problems (default: the GRPO run's number), its optimizer steps
  (default: the GRPO run's);
- RFT: rft_samples x training problems completions; SFT on gold solutions: none; both take the run's step budget;
- best-of-n: n x evaluated problems completions (sampled at test time), no optimizer step. To spend the GRPO run's
  completions, n = round(completions / evaluated problems) (``matched_n``).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch

from ..errors import GrpolabError
from ..evaluation.heldout import Completion, EvalResult, generate_all, summarise
from ..evaluation.scoring import is_correct
from ..rewards import RewardSet, score_completion
from ..rollout.base import RolloutEngine, SamplingParams
from ..tasks.base import Problem
from ..tasks.prompting import prompt_ids

BASELINE_MANIFEST = "baseline_manifest.json"


# ---------------------------------------------------------------------------------------------- budget


def grpo_budget(cfg) -> dict[str, int]:
    """What a GRPO (or PPO) run of this config samples and steps (without dynamic-sampling refills)."""
    t = cfg.train
    return {
        "completions_sampled": t.steps * t.prompts_per_step * cfg.rollout.group_size,
        "optimizer_steps": t.steps * t.mu * t.minibatches,
    }


def budget_statement(cfg) -> str:
    """One line: the budget of a run of this config.

    >>> from grpolab.config import from_dict
    >>> budget_statement(from_dict({"train": {"steps": 30}}))
    'budget: 960 sampled completions (30 steps x 4 prompts x 8), 30 optimizer steps'
    """
    b, t = grpo_budget(cfg), cfg.train
    return (
        f"budget: {b['completions_sampled']} sampled completions ({t.steps} steps x {t.prompts_per_step} prompts x "
        f"{cfg.rollout.group_size}), {b['optimizer_steps']} optimizer steps"
    )


def matched_n(completions: int, num_problems: int) -> int:
    """best-of-n's n that spends about `completions` on `num_problems` evaluated problems (at least 1).

    >>> matched_n(960, 266)
    4
    """
    return max(1, round(completions / max(num_problems, 1)))


def run_budget(run_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """A training run's budget from its metrics.jsonl: completions (steps x P x G x (1 + refills)), optimizer steps,
    wall time (sum of time/step_s), peak memory (max memory/peak_rss_mb)."""
    import json

    cfg = manifest.get("config") or {}
    t, g = cfg.get("train") or {}, (cfg.get("rollout") or {}).get("group_size", 0)
    rows = (
        [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
        if (Path(run_dir) / "metrics.jsonl").is_file()
        else []
    )
    rows = [r for r in rows if "time/step_s" in r]  # training steps (not other records)
    completions = sum(t.get("prompts_per_step", 0) * g * (1 + r.get("dynamic/extra_rounds", 0)) for r in rows)
    return {
        "completions_sampled": int(completions),
        "optimizer_steps": len(rows) * t.get("mu", 1) * t.get("minibatches", 1),
        "wall_s": sum(r.get("time/step_s", 0.0) for r in rows),
        "peak_memory_mb": max((r.get("memory/peak_rss_mb", 0.0) for r in rows), default=float("nan")),
    }


def budget_of(
    manifest_file: Path | None,
    manifest: dict[str, Any] | None,
    method: str = "greedy",
    samples: int = 0,
    n: int = 0,
    eval_seconds: float = float("nan"),
) -> dict[str, Any]:
    """The budget row of a compared model: from its run or baseline manifest, or (best-of-n) from its evaluation."""
    nan = float("nan")
    if method == "best_of_n":
        return {"completions_sampled": samples * n, "optimizer_steps": 0, "wall_s": eval_seconds, "peak_memory_mb": nan}
    if not manifest:  # the base model
        return {"completions_sampled": 0, "optimizer_steps": 0, "wall_s": 0.0, "peak_memory_mb": nan}
    if manifest_file is not None and manifest_file.name == "manifest.json":
        return run_budget(manifest_file.parent, manifest)
    b = manifest.get("budget") or {}
    cfg = (manifest.get("config") or {}).get("train") or {}
    rft = manifest.get("method") == "sft-rft"
    return {
        "completions_sampled": b.get(
            "completions_sampled", cfg.get("rft_samples", 0) * manifest.get("num_problems", 0) if rft else 0
        ),
        "optimizer_steps": b.get("optimizer_steps", cfg.get("steps", 0)),
        "wall_s": manifest.get("seconds", nan),
        "peak_memory_mb": manifest.get("peak_rss_mb", nan),
    }


def entry_budget(entry: dict[str, Any]) -> dict[str, Any]:
    """The budget of one row of `grpolab compare` (an evaluated model): from the run or baseline manifest found
    beside the model, or, for best-of-n, from the evaluation itself (n samples per problem, its time)."""
    from ..evaluation.overlap import find_manifest

    if entry.get("method") == "best_of_n":
        rate = entry.get("problems_per_s") or float("nan")
        named = re.search(r"best-of-(\d+)", str(entry.get("model", "")))  # a report row has no decoding: its label
        samples = entry.get("samples") or (int(named.group(1)) if named else 0)
        return budget_of(None, None, "best_of_n", samples, entry.get("n") or 0, (entry.get("n") or 0) / rate)
    found = find_manifest(entry.get("model"), entry.get("path"))
    return budget_of(found[0], found[1]) if found else budget_of(None, None)


BUDGET_COLUMNS = ("wall time", "peak memory", "completions sampled", "optimizer steps")


def budget_cells(b: dict[str, Any] | None) -> list[str]:
    """wall time, peak memory, completions sampled, optimizer steps, as table cells ('-' where unknown).

    >>> budget_cells({"wall_s": 650.0, "peak_memory_mb": 4400.0, "completions_sampled": 960, "optimizer_steps": 30})
    ['10.8 min', '4.3 GiB', '960', '30']
    """
    if not b:
        return ["-"] * 4
    ok = lambda v: isinstance(v, (int, float)) and math.isfinite(v)  # noqa: E731
    return [
        f"{b['wall_s'] / 60:.1f} min" if ok(b.get("wall_s")) else "-",
        f"{b['peak_memory_mb'] / 1024:.1f} GiB" if ok(b.get("peak_memory_mb")) else "-",
        str(b.get("completions_sampled", "-")),
        str(b.get("optimizer_steps", "-")),
    ]


# ---------------------------------------------------------------------------------------------- best-of-n


def select_best(
    texts: list[str], problem: Problem | str, rewards: dict[str, float] | RewardSet
) -> tuple[int, list[float]]:
    """(index of the highest training reward, all rewards); NaN (invalid) ranks below any number; ties -> first.
    ``rewards``: the built-in rewards' weights, or a run's whole RewardSet (its own functions, judge, reward
    model: cli/score.run_reward); ``problem``: the problem, or its gold answer alone for the built-ins.

    >>> select_best(["7", "\\\\boxed{4}", "4"], "4", {"correct": 1.0, "format": 0.1})
    (1, [0.0, 1.1, 1.0])
    """
    if isinstance(problem, str):
        problem = Problem(uid="", question="", answer=problem)
    scorer = rewards if isinstance(rewards, RewardSet) else RewardSet(rewards)
    totals = [r.total for r in scorer.score_many(texts, [problem] * len(texts))]
    keyed = [(-math.inf if math.isnan(r) else r) for r in totals]
    return max(range(len(texts)), key=lambda i: (keyed[i], -i)), totals


def best_of_n_item(
    problem: Problem, samples: list[Completion], rewards: dict[str, float] | RewardSet
) -> dict[str, Any]:
    """Evaluation record of the reward-selected sample (same shape as evaluate.score_item's)."""
    best, totals = select_best([s.text for s in samples], problem, rewards)
    chosen = samples[best]
    ok = [bool(is_correct(s.text, problem.answer)) for s in samples]
    return {
        "uid": problem.uid,
        "slice": problem.slice,
        "slices": [problem.slice],
        "gold": problem.answer,
        "completion": chosen.text,
        "correct": ok[best],
        "length": chosen.length,
        "truncated": chosen.truncated,
        "chosen": best,
        "rewards": totals,
        "samples_correct": ok,
        "scores": {"accuracy": float(ok[best]), f"oracle@{len(samples)}": float(any(ok))},
    }


def best_of_n_eval(
    engine: RolloutEngine,
    tokenizer,
    problems: list[Problem],
    n: int,
    rewards: dict[str, float] | RewardSet,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    batch_size: int = 64,
    seed: int = 0,
) -> EvalResult:
    """Best-of-n by training reward (``rewards``: weights of the built-ins, or a run's RewardSet), scored by the
    held-out metric (``accuracy``), with ``oracle@n``."""
    if n < 1:
        raise GrpolabError(f"best-of-n: n must be >= 1, got {n}")
    start = time.perf_counter()
    torch.manual_seed(seed)
    params = SamplingParams(group_size=n, logprobs=False, temperature=temperature, max_new_tokens=max_new_tokens)
    samples = generate_all(engine, tokenizer, problems, params, batch_size)
    items = [best_of_n_item(p, s, rewards) for p, s in zip(problems, samples)]
    return summarise(items, time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------- SFT data


@dataclass(frozen=True)
class SFTSettings:
    mode: str = "gold"  # "gold" or "rft"
    steps: int = 20  # optimizer steps (match a GRPO run: train.steps * train.mu * train.minibatches)
    batch_size: int = 8
    lr: float = 1e-5
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    precision: str = "auto"  # "fp32", "bf16" (bfloat16 autocast over fp32 weights) or "auto" (the probe decides)
    seed: int = 0
    rft_samples: int = 4
    rft_temperature: float = 1.0
    max_new_tokens: int = 64
    gen_batch_size: int = 64


_CALC = re.compile(r"<<[^<>]*>>")


def gold_target(problem: Problem, solution: str | None = None) -> str:
    """The SFT target for one problem (rules in the module docstring).

    >>> gold_target(Problem("arithmetic/3 + 4", "What is 3 + 4?", "7"))
    '3 + 4 = 7. The answer is \\\\boxed{7}.'
    >>> gold_target(Problem("gsm8k/train/0", "q", "72"), "48/2 = <<48/2=24>>24 clips.\\n#### 72")
    '48/2 = 24 clips.\\nThe answer is \\\\boxed{72}.'
    """
    boxed = f"The answer is \\boxed{{{problem.answer}}}."
    if solution and "####" in solution:
        return _CALC.sub("", solution.rsplit("####", 1)[0]).strip() + "\n" + boxed
    if problem.uid.startswith("arithmetic/"):
        return f"{problem.uid.removeprefix('arithmetic/')} = {problem.answer}. {boxed}"
    return boxed


def gold_solutions(task: str, options: dict[str, Any], split: str) -> dict[str, str]:
    """uid -> worked solution text where the task's source has one (GSM8K), else {}."""
    if task != "gsm8k":
        return {}
    from ..tasks import make_task

    _, rows = make_task(task, **options)._rows(split)  # uid index = row index, as GSM8KTask assigns it
    return {
        f"gsm8k/{split}/{i}": row["answer"] for i, (_, row) in enumerate(rows) if isinstance(row.get("answer"), str)
    }


def rft_examples(
    engine: RolloutEngine, tokenizer, problems: list[Problem], s: SFTSettings
) -> list[tuple[Problem, str]]:
    """Distinct own samples whose training-reward ``correct`` component is >= 1 (rejection sampling)."""
    params = SamplingParams(
        group_size=s.rft_samples, logprobs=False, temperature=s.rft_temperature, max_new_tokens=s.max_new_tokens
    )
    torch.manual_seed(s.seed)
    samples = generate_all(engine, tokenizer, problems, params, s.gen_batch_size)
    out: list[tuple[Problem, str]] = []
    for p, group in zip(problems, samples):
        kept: set[str] = set()
        for c in group:
            r = score_completion(c.text, p.answer, {"correct": 1.0})
            if not c.truncated and not r.invalid and r.components["correct"] >= 1.0 and c.text not in kept:
                kept.add(c.text)
                out.append((p, c.text))
    return out


# ---------------------------------------------------------------------------------------------- SFT training


def encode(tokenizer, problem: Problem, target: str) -> tuple[list[int], list[int]]:
    """(input ids, labels): chat-template prompt + target + EOS; labels are -100 on the prompt."""
    p = prompt_ids(tokenizer, problem)
    t = tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return p + t, [-100] * len(p) + t


def collate(encoded: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a batch: input_ids, attention_mask, labels (-100 on padding)."""
    width = max(len(ids) for ids, _ in encoded)
    ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    labels = torch.full((len(encoded), width), -100, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for i, (x, y) in enumerate(encoded):
        ids[i, : len(x)], labels[i, : len(y)], mask[i, : len(x)] = torch.tensor(x), torch.tensor(y), 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def sft_loss(model, batch: dict[str, torch.Tensor], precision: str = "fp32") -> torch.Tensor:
    """Token-mean cross-entropy of the target tokens (HF shifts labels inside the model)."""
    from ..training.forward import autocast

    with autocast(precision, batch["input_ids"].device):
        return model(**batch).loss.float()


@torch.no_grad()
def mean_loss(model, tokenizer, encoded: list[tuple[list[int], list[int]]], batch_size: int = 16) -> float:
    """Target-token-weighted mean loss over all examples (model in eval mode, fp32)."""
    was = model.training
    model.eval()
    total, tokens = 0.0, 0
    for i in range(0, len(encoded), batch_size):
        batch = collate(encoded[i : i + batch_size], tokenizer.pad_token_id)
        n = int((batch["labels"][:, 1:] != -100).sum())
        total += sft_loss(model, batch).item() * n
        tokens += n
    model.train(was)
    return total / max(tokens, 1)


def train_sft(model, tokenizer, examples: list[tuple[Problem, str]], s: SFTSettings) -> list[float]:
    """Exactly s.steps AdamW steps over seeded epoch-wise shuffles of the examples; returns each step's loss."""
    if not examples:
        raise GrpolabError(
            "sft: no training examples (rft kept no correct sample; try more --rft-samples or mode gold)"
        )
    return train_on_encoded(model, [encode(tokenizer, p, t) for p, t in examples], tokenizer.pad_token_id, s)


def train_on_encoded(
    model,
    encoded: list[tuple[list[int], list[int]]],
    pad_id: int,
    s,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Exactly s.steps AdamW steps over seeded epoch-wise shuffles of `encoded` ((ids, loss mask) pairs, sft_loss's
    cross-entropy on the masked tokens); each step's loss. ``s`` gives steps, batch_size, lr, weight_decay,
    grad_clip, precision and seed (SFTSettings, or the agent warm start's AgentSFTSettings); ``on_step(step, loss)``
    is called after each step (progress)."""
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay)
    g = torch.Generator().manual_seed(s.seed)
    order: list[int] = []
    losses: list[float] = []
    model.train()
    for _ in range(s.steps):
        idx = []
        while len(idx) < min(s.batch_size, len(encoded)):
            if not order:
                order = torch.randperm(len(encoded), generator=g).tolist()
            idx.append(order.pop())
        loss = sft_loss(model, collate([encoded[i] for i in idx], pad_id), s.precision)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip or float("inf"))
        opt.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(len(losses), losses[-1])
    model.eval()
    return losses


def run_sft(
    model_name: str,
    task: str,
    options: dict[str, Any],
    s: SFTSettings,
    out_dir: Path,
    limit: int = 0,
    split: str = "train",
) -> dict[str, Any]:
    """Build the SFT/RFT data, fine-tune, write an HF checkpoint + baseline_manifest.json to out_dir."""
    from ..evaluation.heldout import load_eval_problems
    from ..manifest import data_hash, problem_hashes, versions, write_json_atomic
    from ..models.load import load_causal_lm, load_tokenizer, resolve_model_path
    from ..rollout.grpolab_engine import GrpolabEngine
    from ..training.metrics import peak_rss_mb
    from ..training.precision import resolve_update

    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise GrpolabError(f"{out_dir}: exists and is not empty; choose another --out")
    if s.mode not in ("gold", "rft"):
        raise GrpolabError(f"sft mode: expected 'gold' or 'rft', got {s.mode!r}")
    problems = load_eval_problems(task, options, split, limit)
    path = resolve_model_path(model_name)
    tokenizer, model = load_tokenizer(path), load_causal_lm(path, "float32")
    start = time.perf_counter()
    if s.mode == "gold":
        sol = gold_solutions(task, options, split)
        examples = [(p, gold_target(p, sol.get(p.uid))) for p in problems]
    else:
        examples = rft_examples(GrpolabEngine(model, tokenizer, torch.float32), tokenizer, problems, s)
    encoded = [encode(tokenizer, p, t) for p, t in examples]
    resolution = resolve_update(s.precision, model, s.batch_size, s.max_new_tokens)
    s = replace(s, precision=resolution["update"])
    before = mean_loss(model, tokenizer, encoded) if encoded else float("nan")
    losses = train_sft(model, tokenizer, examples, s)
    after = mean_loss(model, tokenizer, encoded)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    manifest = {
        "grpolab_baseline": 1,
        "method": f"sft-{s.mode}",
        "base_model": model_name,
        "base_path": path,
        # the same shape as a run's config where it matters, so manifest.diff_manifests can group seeds
        "config": {
            "model": {"name": model_name},
            "task": {"name": task, "options": options, "split": split, "limit": limit},
            "train": asdict(s),
        },
        "num_problems": len(problems),
        "num_examples": len(examples),
        "problems_with_examples": len({p.uid for p, _ in examples}),
        "train_problem_hashes": problem_hashes(problems),
        "train_data_hash": data_hash(problems),
        "loss_before": before,
        "loss_after": after,
        "losses": losses,
        "precision": resolution,
        "budget": {
            "completions_sampled": s.rft_samples * len(problems) if s.mode == "rft" else 0,
            "optimizer_steps": s.steps,
        },
        "seconds": time.perf_counter() - start,
        "peak_rss_mb": peak_rss_mb(),
        "versions": versions(),
    }
    write_json_atomic(out_dir / BASELINE_MANIFEST, manifest)
    return manifest
