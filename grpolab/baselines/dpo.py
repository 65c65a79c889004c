"""DPO beside GRPO: preference pairs from the base model's own samples on the training problems, then DPO (or IPO)
with the base model as the reference (grpolab.algo.dpo for the losses).

**Sampling** is the GRPO run's own collection code (grpolab.training.batch.BatchCollector with the run's config): rounds of
train.prompts_per_step training problems x rollout.group_size completions from the base model, scored by the
*training* reward (the run's reward weights), drawn from the run's prompt sampler with the run's seed. The budget
is a number of sampled completions -- by default the GRPO run's train.steps x prompts_per_step x group_size -- so
DPO sees as many completions as GRPO generated (``budget_completions``).

**Pairs** (``build_pairs``): within one problem's group only (pairs never cross problems), the valid, distinct
completions are ranked by training reward (ties: earlier sample first); the best is paired with the worst, the
second best with the second worst, ..., while the better one's reward is strictly higher (a correct completion is
preferred over an incorrect one with a correctness reward). A group whose rewards are all equal gives no pair.
``held_out_guard`` refuses any sampled problem that is also in the task's held-out split.

**Training**: exactly ``steps`` AdamW steps of ``batch_size`` distinct pairs drawn epoch-wise, each epoch a seeded
permutation of the pairs (``epoch_batches``) -- the same optimizer-step budget as GRPO: train.steps x mu x
minibatches --, loss = mean over the batch of the per-pair loss;
reference log-probabilities are those of the base model, computed once before the first step (the policy starts
as the base model), so no second model is held in memory. The result is an HF checkpoint with a
``baseline_manifest.json`` (method, budget, pairs, training problems for the held-out check, wall time, peak memory).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..algo.dpo import PairLogps, PreferenceLoss, preference_loss, sequence_logps
from ..errors import GrpolabError
from ..rollout.base import Rollout, concat_rollouts
from ..tasks.base import Problem


@dataclass(frozen=True)
class DPOSettings:
    loss: str = "sigmoid"  # sigmoid (DPO) or ipo
    beta: float = 0.1
    label_smoothing: float = 0.0
    steps: int = 30  # optimizer steps (GRPO's train.steps * mu * minibatches)
    batch_size: int = 8  # pairs per step
    lr: float = 1e-5
    grad_clip: float = 1.0
    completions: int = 960  # sampled completions (GRPO's train.steps * prompts_per_step * group_size)
    pairs_per_problem: int = 0  # at most this many pairs per problem (0 = as many as the ranking gives)
    seed: int = 0


@dataclass(frozen=True)
class Pair:
    problem: int  # index into the sampled problems
    chosen: int  # row of the sampled rollout
    rejected: int
    chosen_reward: float
    rejected_reward: float


def build_pairs(
    rewards: torch.Tensor, invalid: torch.Tensor, texts: list[str], group_size: int, pairs_per_problem: int = 0
) -> list[Pair]:
    """Pairs within each group of `group_size` consecutive rows (module docstring). rewards / invalid: [P * G].

    >>> [(p.problem, p.chosen, p.rejected) for p in build_pairs(torch.tensor([1., 0, 1, 0, 0, 0]), torch.zeros(6, dtype=torch.bool),
    ...                                                        ["a", "b", "c", "d", "e", "f"], 3)]
    [(0, 0, 1)]
    """
    pairs: list[Pair] = []
    for g in range(len(rewards) // group_size):
        seen, rows = set(), []
        for i in range(g * group_size, (g + 1) * group_size):
            if not invalid[i] and math.isfinite(rewards[i].item()) and texts[i] not in seen:
                seen.add(texts[i])
                rows.append(i)
        ranked = sorted(rows, key=lambda i: (-rewards[i].item(), i))
        made = 0
        for k in range(len(ranked) // 2):
            best, worst = ranked[k], ranked[len(ranked) - 1 - k]
            if rewards[best].item() <= rewards[worst].item() or (pairs_per_problem and made >= pairs_per_problem):
                break
            pairs.append(Pair(g, best, worst, rewards[best].item(), rewards[worst].item()))
            made += 1
    return pairs


def held_out_guard(sampled: list[Problem], held_out: list[Problem]) -> None:
    """GrpolabError when a sampled (training) problem is also a held-out one."""
    from ..evaluation.overlap import overlapping
    from ..manifest import problem_hashes

    bad = overlapping(sampled, problem_hashes(held_out))
    if bad:
        raise GrpolabError(
            f"dpo: {len(bad)} sampled problem(s) are in the held-out split, e.g. {bad[0].uid!r}; "
            f"pairs are built on training problems only"
        )


def pair_rollout(rollout: Rollout, pairs: list[Pair], pad_id: int) -> Rollout:
    """Rows [chosen_0, rejected_0, chosen_1, ...] with group = pair index (the two rows share their prompt)."""
    rows = [r for p in pairs for r in (p.chosen, p.rejected)]
    out = concat_rollouts([rollout], pad_id).select(rows)
    out.group = torch.arange(len(pairs)).repeat_interleave(2)
    return out


def pair_token_logps(model, rollout: Rollout, pair_ids: list[int], precision: str, grad: bool) -> torch.Tensor:
    """[2 b, Lc] token logprobs (T = 1) of the chosen/rejected rows of pairs `pair_ids`, prompts run once per pair."""
    from ..training.forward import completion_logprobs

    rows = torch.tensor([2 * i + k for i in pair_ids for k in (0, 1)], dtype=torch.long)
    with torch.set_grad_enabled(grad):
        fo = completion_logprobs(model, rollout, rows, 1.0, precision, share_prompt=True)
    out = torch.zeros((len(rows), rollout.completion_ids.shape[1]), dtype=fo.logp.dtype)
    out = out.to(fo.logp.device)
    out[:, fo.cols] = fo.logp
    return out


def dpo_loss(
    model, rollout: Rollout, pair_ids: list[int], ref: torch.Tensor, s: DPOSettings, precision: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean loss over the pairs, [b] margins h) of pairs `pair_ids`; ref: [num_pairs, 2] reference sequence logps."""
    kind = PreferenceLoss(s.loss)
    logp = pair_token_logps(model, rollout, pair_ids, precision, grad=True)
    rows = torch.tensor([2 * i + k for i in pair_ids for k in (0, 1)], dtype=torch.long)
    seq = sequence_logps(logp, rollout.completion_mask[rows].to(logp.device), kind).view(-1, 2)
    r = ref[pair_ids].to(seq.device)
    p = PairLogps(seq[:, 0], seq[:, 1], r[:, 0], r[:, 1])
    return preference_loss(kind, p, s.beta, s.label_smoothing).mean(), p.margin().detach()


@torch.no_grad()
def reference_logps(
    model, rollout: Rollout, kind: PreferenceLoss, precision: str, batch_pairs: int = 8
) -> torch.Tensor:
    """[num_pairs, 2] sequence logps of chosen/rejected under `model` (eval mode): the reference, computed once."""
    from ..models.load import eval_mode

    n = len(rollout) // 2
    out = []
    with eval_mode(model):
        for start in range(0, n, batch_pairs):
            ids = list(range(start, min(n, start + batch_pairs)))
            rows = torch.tensor([2 * i + k for i in ids for k in (0, 1)], dtype=torch.long)
            logp = pair_token_logps(model, rollout, ids, precision, grad=False)
            out.append(sequence_logps(logp, rollout.completion_mask[rows].to(logp.device), kind).view(-1, 2).cpu())
    return torch.cat(out).double()


def epoch_batches(n: int, batch_size: int, steps: int, seed: int) -> list[list[int]]:
    """`steps` sorted batches of min(batch_size, n) distinct pair ids out of range(n). The ids are drawn from a
    stream of seeded permutations, one per epoch; a batch that straddles two epochs takes the next epoch's ids in
    its order, skipping those it already holds, which stay first in line for the next batch -- so every epoch
    still uses each pair once, and no batch holds a pair twice."""
    g, size, queue, out = torch.Generator().manual_seed(seed), min(batch_size, n), [], []
    for _ in range(steps):
        batch: list[int] = []
        while len(batch) < size:
            fresh = [i for i in queue if i not in batch]
            if not fresh:
                queue += torch.randperm(n, generator=g).tolist()
                continue
            batch.append(fresh[0])
            queue.remove(fresh[0])
        out.append(sorted(batch))
    return out


def train_dpo(model, rollout: Rollout, s: DPOSettings, precision: str, betas=(0.9, 0.99)) -> list[dict[str, float]]:
    """Exactly s.steps AdamW steps on seeded epoch-wise batches of pairs; per step: loss, margin, accuracy."""
    n = len(rollout) // 2
    if n == 0:
        raise GrpolabError("dpo: no preference pairs (every sampled group had equal rewards); sample more completions")
    ref = reference_logps(model, rollout, PreferenceLoss(s.loss), precision)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=s.lr, weight_decay=0.0, betas=betas)
    log = []
    model.train()
    for ids in epoch_batches(n, s.batch_size, s.steps, s.seed):
        loss, margin = dpo_loss(model, rollout, ids, ref, s, precision)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip or float("inf")).item()
        if math.isfinite(norm):
            opt.step()
        log.append(
            {
                "loss": loss.item(),
                "margin": margin.mean().item(),
                "accuracy": (margin > 0).double().mean().item(),
                "grad_norm": norm,
            }
        )
    model.eval()
    return log


def sample_pairs(cfg, collector, s: DPOSettings) -> tuple[Rollout, list[Problem], list[Pair], dict[str, Any]]:
    """Rounds of the run's collection until s.completions are sampled; (all rows, their problems, pairs, stats)."""
    per_round = cfg.train.prompts_per_step * cfg.rollout.group_size
    rounds = [collector.generate_round(0, i) for i in range(max(1, math.ceil(s.completions / per_round)))]
    rollout = concat_rollouts([r.rollout for r in rounds], collector.tokenizer.pad_token_id)
    problems = [p for r in rounds for p in r.problems]
    rewards = torch.cat([r.scores.rewards for r in rounds])
    invalid = torch.cat([r.scores.invalid for r in rounds])
    pairs = build_pairs(rewards, invalid, rollout.texts, cfg.rollout.group_size, s.pairs_per_problem)
    stats = {
        "completions_sampled": len(rollout),
        "problems_sampled": len(problems),
        "pairs": len(pairs),
        "problems_with_pairs": len({p.problem for p in pairs}),
        "sampled_reward_mean": float(torch.nan_to_num(rewards, nan=0.0).mean()),
        "invalid": int(invalid.sum()),
    }
    return rollout, problems, pairs, stats


def run_dpo(cfg, s: DPOSettings, out_dir: Path) -> dict[str, Any]:
    """Sample, pair, train, write an HF checkpoint + baseline_manifest.json to out_dir (module docstring)."""
    from ..config import to_dict
    from ..manifest import data_hash, problem_hashes, versions, write_json_atomic
    from ..models.load import DTYPES, load_causal_lm, load_tokenizer, resolve_model_path
    from ..rewards import RewardSet
    from ..rollout.grpolab_engine import GrpolabEngine
    from ..tasks import make_task
    from ..training.batch import BatchCollector
    from ..training.builders import load_problems
    from ..training.estimators import estimator_spec
    from ..training.metrics import peak_rss_mb
    from ..training.precision import resolve_update
    from ..training.prompt_sampler import PromptSampler
    from .sft_bon import BASELINE_MANIFEST

    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise GrpolabError(f"{out_dir}: exists and is not empty; choose another --out")
    start = time.perf_counter()
    torch.manual_seed(cfg.train.seed)
    train, _, _ = load_problems(dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, every_steps=0)))
    held_out = make_task(cfg.task.name, **cfg.task.options).problems(cfg.eval.split)
    path = resolve_model_path(cfg.model.name)
    tokenizer, model = load_tokenizer(path), load_causal_lm(path, "float32")
    resolution = resolve_update(cfg.train.precision, model, cfg.train.micro_batch_size, cfg.rollout.max_new_tokens)
    precision = resolution["update"]
    rewards = RewardSet(cfg.reward.weights, cfg.reward.functions, cfg.reward.time_limit_s, cfg.reward.sandbox)
    engine = GrpolabEngine(
        model, tokenizer, DTYPES["float32"] if cfg.rollout.dtype == "auto" else DTYPES[cfg.rollout.dtype]
    )
    group = estimator_spec(cfg).group(cfg.algorithm)  # the pairs' sampling only reads the rewards
    collector = BatchCollector(cfg, engine, tokenizer, PromptSampler(train, cfg.train.seed), rewards, group)
    rollout, problems, pairs, stats = sample_pairs(cfg, collector, s)
    held_out_guard(problems, held_out)
    sampled_s = time.perf_counter() - start
    log = train_dpo(
        model,
        pair_rollout(rollout, pairs, tokenizer.pad_token_id),
        s,
        precision,
        (cfg.train.adam_beta1, cfg.train.adam_beta2),
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    unique = list({p.uid: p for p in problems}.values())
    manifest = {
        "grpolab_baseline": 1,
        "method": f"dpo-{s.loss}",
        "base_model": cfg.model.name,
        "base_path": path,
        "config": {**to_dict(cfg), "dpo": dataclasses.asdict(s)},
        "budget": {
            "completions_sampled": stats["completions_sampled"],
            "optimizer_steps": s.steps,
            "pairs_per_step": s.batch_size,
        },
        "pairs": stats,
        "num_problems": len(unique),
        "precision": resolution,
        "train_problem_hashes": problem_hashes(unique),
        "train_data_hash": data_hash(unique),
        "steps": log,
        "seconds": time.perf_counter() - start,
        "sampling_seconds": sampled_s,
        "peak_rss_mb": peak_rss_mb(),
        "versions": versions(),
    }
    write_json_atomic(out_dir / BASELINE_MANIFEST, manifest)
    return manifest
