"""The GRPO loop. One step reads like DESIGN.md section 2:

    problems -> rollout (G per prompt) -> rewards -> advantages -> update (mu x minibatches x micro-batches)
             -> sync sampler weights -> metrics -> [periodic held-out eval] -> [checkpoint]
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from . import checkpoint as ckpt
from .algo.advantages import compute_advantages
from .algo.kl import KLPlacement, token_kl
from .checkpoint import rng_state, seed_everything, set_rng_state
from .config import Config
from .errors import DataError, GrpolabError
from .evaluate import EvalResult, greedy_eval
from .faults import InterruptGuard, NonFiniteTracker, TrainingInterrupted
from .metrics import JsonlSink, completion_metrics, group_metrics, peak_rss_mb, reward_metrics, truncate_log
from .models import DTYPES, frozen_copy, load_causal_lm, load_tokenizer, resolve_model_path
from .prompt_sampler import PromptSampler
from .prompting import prompt_ids
from .rewards import score_completion
from .rewards.overlong import soft_overlong_penalty
from .rollout.base import Rollout, SamplingParams, concat_rollouts
from .rollout.hf import HFEngine
from .tasks import make_task
from .tasks.base import Problem
from .update import PolicyUpdater

log = logging.getLogger("grpolab")
LOGS = ("metrics.jsonl", "samples.jsonl")  # truncated to their checkpointed length on resume


@dataclass
class Scores:
    """Per-completion reward (NaN where invalid), its named components, and the invalid flags. [N] each."""

    rewards: torch.Tensor
    components: dict[str, torch.Tensor]
    invalid: torch.Tensor
    errors: list[str] = field(default_factory=list)  # why each invalid sample is invalid, in row order


def lr_lambda(cfg: Config) -> Callable[[int], float]:
    """Linear warmup over warmup_steps optimizer steps, then constant or cosine down to min_lr_ratio."""
    t = cfg.train
    total = t.steps * t.mu * t.minibatches

    def f(i: int) -> float:
        if i < t.warmup_steps:
            return (i + 1) / t.warmup_steps
        if t.schedule == "constant":
            return 1.0
        progress = min(1.0, (i - t.warmup_steps) / max(1, total - t.warmup_steps))
        return t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def score_rollout(rollout: Rollout, problems: list[Problem], cfg: Config) -> Scores:
    """Reward every completion against its prompt's gold answer; failures are invalid, never a silent 0.

    With algorithm.overlong_buffer > 0 the DAPO soft overlong penalty is added as the `overlong` component.
    """
    weights = cfg.reward.weights
    results = [score_completion(text, problems[g].answer, weights) for text, g in zip(rollout.texts, rollout.group.tolist())]
    components = {n: torch.tensor([r.components.get(n, math.nan) for r in results], dtype=torch.float64) for n in weights}
    rewards = torch.tensor([r.total for r in results], dtype=torch.float64)
    a = cfg.algorithm
    if a.overlong_buffer > 0:
        lengths = rollout.completion_mask.sum(-1).tolist()
        pen = [soft_overlong_penalty(n, cfg.rollout.max_new_tokens, a.overlong_buffer, a.overlong_penalty) for n in lengths]
        components["overlong"] = torch.tensor(pen, dtype=torch.float64)
        rewards = rewards + components["overlong"]
    invalid = torch.tensor([r.invalid for r in results])
    return Scores(rewards=rewards, components=components, invalid=invalid, errors=[r.error for r in results if r.invalid])


def load_problems(cfg: Config) -> tuple[list[Problem], list[Problem], dict[str, int]]:
    """(train problems, held-out problems, data summary); an unreadable source is a DataError naming it.

    Rows a task skips for lacking a usable gold answer (its `last_skipped`) are counted in the summary; the
    task itself fails when more than its allowed share are bad (e.g. task.max_bad_fraction of gsm8k).
    """
    task = make_task(cfg.task.name, **cfg.task.options)
    source = cfg.task.options.get("path", cfg.task.name)
    try:
        train = task.problems("train")
        summary = {"train_problems": len(train), "train_skipped": getattr(task, "last_skipped", 0)}
        held_out: list[Problem] = []
        if cfg.eval.every_steps:
            held_out = task.problems(cfg.eval.split)[: cfg.eval.num_problems]
            summary.update(held_out_problems=len(held_out), held_out_skipped=getattr(task, "last_skipped", 0))
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{source}: cannot read the task data ({type(e).__name__}: {e})") from None
    if not train:
        raise DataError(f"{source}: no training problems")
    return train, held_out, summary


@dataclass
class Batch:
    """What one step trains on: the kept rollout, its prompts (indexed by rollout.group), scores, advantages."""

    rollout: Rollout
    problems: list[Problem]
    scores: Scores
    advantages: torch.Tensor  # [N]
    zero_std: torch.Tensor  # [groups] of the *first* generation round (what the sampler saw)
    zero_std_slices: list[str]
    stats: dict[str, float]


class Trainer:
    def __init__(self, cfg: Config, run_dir: Path):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        seed_everything(cfg.train.seed)
        self.train_problems, self.eval_problems, self.data_summary = load_problems(cfg)
        self.model_path = resolve_model_path(cfg.model.name)
        self.tokenizer = load_tokenizer(self.model_path)
        self.policy = load_causal_lm(self.model_path, cfg.model.dtype)
        self.policy.train()
        compute_dtype = torch.bfloat16 if cfg.train.precision == "bf16" else DTYPES[cfg.model.dtype]
        self.reference = frozen_copy(self.policy, compute_dtype) if cfg.algorithm.beta > 0 else None
        self.engine = HFEngine(self.policy, self.tokenizer, DTYPES[cfg.rollout.dtype], cfg.rollout.decoder)
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay,
            betas=(cfg.train.adam_beta1, cfg.train.adam_beta2),
            **({"fused": True} if cfg.train.fused_adamw else {"foreach": True}),
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self.updater = PolicyUpdater(cfg, self.policy, self.reference, self.optimizer, self.scheduler)
        self.sampler = PromptSampler(self.train_problems, cfg.train.seed)
        self.sampling = SamplingParams(
            group_size=cfg.rollout.group_size, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
            top_k=cfg.rollout.top_k, max_new_tokens=cfg.rollout.max_new_tokens,
        )
        self._prompt_cache: dict[str, list[int]] = {}
        self.step = 0
        self.saved_step: int | None = None  # step of the newest checkpoint this trainer wrote or loaded
        self.nonfinite = NonFiniteTracker(cfg.train.max_nonfinite_steps)
        self.skipped_in_step = 0
        self.timing = {"rollout": 0.0, "reward": 0.0}
        self.last_eval: EvalResult | None = None

    # ------------------------------------------------------------------------------------------ one step

    def prompt_ids(self, problem: Problem) -> list[int]:
        if problem.uid not in self._prompt_cache:
            self._prompt_cache[problem.uid] = prompt_ids(self.tokenizer, problem)
        return self._prompt_cache[problem.uid]

    def generate_round(self, n_prompts: int) -> tuple[Rollout, list[Problem], Scores]:
        """Sample n_prompts new problems, generate G completions each, score them (timed into self.timing)."""
        t0 = time.perf_counter()
        problems = self.sampler.take(n_prompts)
        rollout = self.engine.generate([self.prompt_ids(p) for p in problems], self.sampling)
        t1 = time.perf_counter()
        scores = score_rollout(rollout, problems, self.cfg)
        self.timing["rollout"] += t1 - t0
        self.timing["reward"] += time.perf_counter() - t1
        return rollout, problems, scores

    def advantages(self, scores: Scores):
        a, g = self.cfg.algorithm, self.cfg.rollout.group_size
        return compute_advantages(
            scores.rewards.view(-1, g), ~scores.invalid.view(-1, g), baseline=a.baseline, scaling=a.scaling,
            eps=a.adv_eps, std_kind=a.std_kind,
        )

    def collect(self) -> Batch:
        """Generate and score prompts_per_step groups; with dynamic sampling, drop zero-variance groups and
        refill with new prompts for up to max_extra_rounds extra rounds, then train on what was kept."""
        cfg, p = self.cfg, self.cfg.train.prompts_per_step
        rollout, problems, scores = self.generate_round(p)
        first_zero = self.advantages(scores).zero_std
        first_slices = [q.slice for q in problems]
        rounds, kept = 0, []
        if cfg.algorithm.dynamic_sampling:
            parts = [(rollout, problems, scores)]
            kept = [(0, gi) for gi in (~first_zero).nonzero().flatten().tolist()]
            while len(kept) < p and rounds < cfg.algorithm.max_extra_rounds:
                rounds += 1
                parts.append(self.generate_round(p))
                zero = self.advantages(parts[-1][2]).zero_std
                kept += [(rounds, gi) for gi in (~zero).nonzero().flatten().tolist()]
            if kept:  # budget spent with nothing kept: train on the first round as it is (no signal, logged)
                rollout, problems, scores = self.keep_groups(parts, kept[:p])
        kept_groups = min(len(kept), p) if cfg.algorithm.dynamic_sampling else p
        stats = {"dynamic/extra_rounds": float(rounds), "dynamic/kept_groups": float(kept_groups)}
        adv = self.advantages(scores).advantages.view(-1)
        return Batch(rollout, problems, scores, adv, first_zero, first_slices, stats)

    def keep_groups(self, parts, kept: list[tuple[int, int]]) -> tuple[Rollout, list[Problem], Scores]:
        """The kept (round, group) pairs of several generation rounds, as one batch."""
        g = self.cfg.rollout.group_size
        rows, problems, offsets = [], [], [0]
        for r, _, _ in parts:
            offsets.append(offsets[-1] + len(r))
        for rnd, gi in kept:
            rows += list(range(offsets[rnd] + gi * g, offsets[rnd] + (gi + 1) * g))
            problems.append(parts[rnd][1][gi])
        rollout = concat_rollouts([r for r, _, _ in parts], self.tokenizer.pad_token_id).select(rows)
        rollout.group = torch.arange(len(kept)).repeat_interleave(g)
        cat = lambda xs: torch.cat(xs)[rows]  # noqa: E731
        errors = [e for _, _, s in parts for e in _row_errors(s)]
        scores = Scores(
            rewards=cat([s.rewards for _, _, s in parts]),
            components={k: cat([s.components[k] for _, _, s in parts]) for k in parts[0][2].components},
            invalid=cat([s.invalid for _, _, s in parts]),
            errors=[errors[i] for i in rows if errors[i] is not None],
        )
        return rollout, problems, scores

    def kl_in_reward(self, batch: Batch) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """With KL placed in the reward: R_i <- R_i - beta * sum_t kl(pi_old || pi_ref); returns (ref, old) logprobs."""
        a = self.cfg.algorithm
        if not (a.beta > 0 and a.kl_placement == KLPlacement.REWARD):
            return None, None
        ref = self.updater.logprobs_no_grad(self.reference, batch.rollout, "fp32")
        old = self.updater.logprobs_no_grad(self.policy, batch.rollout, self.cfg.train.precision)
        kl_seq = (token_kl(old, ref, a.kl_estimator) * batch.rollout.completion_mask).sum(-1).double()
        batch.scores.rewards = batch.scores.rewards - a.beta * kl_seq
        batch.advantages = self.advantages(batch.scores).advantages.view(-1)
        return ref, old

    def train_step(self) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """One whole step (collect + update) without logging or checkpointing."""
        t0, self.timing = time.perf_counter(), {"rollout": 0.0, "reward": 0.0}
        return self.update_step(self.collect(), t0)

    def update_step(self, batch: Batch, t0: float) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """Update the policy on a collected batch and return (metrics, samples) of the completed step."""
        t1 = time.perf_counter()
        ref, old = self.kl_in_reward(batch)
        rollout, scores = batch.rollout, batch.scores
        skipped = self.updater.skipped_steps
        update_metrics = self.updater.update(rollout, batch.advantages, ~scores.invalid, ref_logp=ref, old_logp=old)
        self.skipped_in_step = self.updater.skipped_steps - skipped
        self.engine.sync_weights(self.policy)
        t2 = time.perf_counter()
        self.step += 1
        if scores.invalid.any():
            first = f"; first: {scores.errors[0]}" if scores.errors else ""
            log.warning("step %d: %d of %d completions have no valid reward (excluded from the update)%s",
                        self.step, int(scores.invalid.sum()), len(rollout), first)
        metrics = {
            **reward_metrics(scores.rewards, scores.components, scores.invalid),
            **group_metrics(batch.zero_std, batch.zero_std_slices),
            **completion_metrics(rollout),
            **update_metrics,
            **(batch.stats if self.cfg.algorithm.dynamic_sampling else {}),
            "optim/lr": self.scheduler.get_last_lr()[0],
            "time/rollout_s": self.timing["rollout"], "time/reward_s": self.timing["reward"], "time/update_s": t2 - t1,
            "time/step_s": t2 - t0,
            "throughput/tokens_per_s": (rollout.completion_mask.sum().item() + rollout.prompt_mask.sum().item()) / (t2 - t0),
            "memory/peak_rss_mb": peak_rss_mb(),
        }
        return metrics, self.samples(batch)

    def samples(self, batch: Batch) -> list[dict[str, Any]]:
        r, n = batch.rollout, self.cfg.train.samples_per_step
        return [
            {"step": self.step, "uid": batch.problems[gi].uid, "gold": batch.problems[gi].answer, "completion": r.texts[i],
             "reward": batch.scores.rewards[i].item(), "advantage": batch.advantages[i].item(),
             **{f"reward/{k}": v[i].item() for k, v in batch.scores.components.items()}}
            for i, gi in enumerate(r.group.tolist()[:n])
        ]

    def evaluate(self) -> EvalResult:
        max_new = self.cfg.eval.max_new_tokens or self.cfg.rollout.max_new_tokens
        self.last_eval = greedy_eval(self.engine, self.tokenizer, self.eval_problems, max_new, self.cfg.eval.batch_size)
        return self.last_eval

    def eval_metrics(self) -> dict[str, float]:
        r = self.evaluate()
        return {"eval/accuracy": r.accuracy, "eval/ci_low": r.ci_low, "eval/ci_high": r.ci_high,
                "eval/len_mean": r.len_mean, "eval/truncated_frac": r.truncated_frac}

    # ------------------------------------------------------------------------------------------ state

    def cursor_state(self) -> dict[str, Any]:
        """What a step changes before its update: the RNG states and the prompt cursor (cheap to copy)."""
        return {"rng": rng_state(), "sampler": self.sampler.state_dict()}

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs besides the weights (DESIGN.md section 6). Dynamic sampling keeps no
        state across steps (each step refills from the prompt cursor), so the cursor covers it."""
        return {
            **self.cursor_state(), "step": self.step, "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "faults": {"skipped_steps": self.updater.skipped_steps},
            "logs": {name: _size(self.run_dir / name) for name in LOGS}, "torch_threads": torch.get_num_threads(),
        }

    def save(self) -> Path:
        """Write checkpoints/step-N atomically; a failed write (full disk...) stops the run with the previous
        checkpoint intact."""
        try:
            path = ckpt.save_checkpoint(self.run_dir, self.step, self.policy, self.tokenizer, self.state_dict(),
                                        self.cfg.train.keep_last)
        except (OSError, RuntimeError) as e:
            prev = ckpt.latest_checkpoint(self.run_dir)
            kept = f"the previous checkpoint {prev} is intact" if prev else "there is no earlier checkpoint"
            raise GrpolabError(f"could not write the checkpoint of step {self.step} ({type(e).__name__}: {e}); {kept}; "
                               f"fix the cause (disk space?) and continue with: grpolab train --resume {self.run_dir}") from None
        self.saved_step = self.step
        return path

    def load(self, path: Path) -> None:
        """Restore a checkpoint. The RNG states are restored last, after everything that could draw from them."""
        state = ckpt.load_state(path)
        self.policy.load_state_dict(load_causal_lm(str(path), self.cfg.model.dtype).state_dict())
        self.engine.sync_weights(self.policy)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        self.updater.skipped_steps = state.get("faults", {}).get("skipped_steps", 0)
        for name, offset in state.get("logs", {}).items():
            truncate_log(self.run_dir / name, offset)
        self.step = self.saved_step = state["step"]
        if state.get("torch_threads", torch.get_num_threads()) != torch.get_num_threads():
            log.warning("%s was written with %d torch threads, this process uses %d: CPU results may differ in the "
                        "last bits (set OMP_NUM_THREADS=%d for an exact resume)", path, state["torch_threads"],
                        torch.get_num_threads(), state["torch_threads"])
        set_rng_state(state["rng"])

    def resume(self) -> Path | None:
        """Continue from the newest complete checkpoint, or from step 0 (logs emptied) when there is none."""
        ckpt.remove_partial(self.run_dir)
        path = ckpt.latest_checkpoint(self.run_dir)
        if path is None:
            for name in LOGS:
                truncate_log(self.run_dir / name, 0)
            return None
        self.load(path)
        return path

    # ------------------------------------------------------------------------------------------ loop

    def fit(self, on_step: Callable[[int, dict[str, float]], None] | None = None) -> dict[str, float]:
        """Run to train.steps, logging every step, evaluating every eval.every_steps, checkpointing.

        Ctrl-C: see grpolab.faults (raises TrainingInterrupted after writing a checkpoint). Non-finite steps are
        skipped and stop the run after train.max_nonfinite_steps in a row (GrpolabError)."""
        metrics: dict[str, float] = {}
        sinks = {name: JsonlSink(self.run_dir / name) for name in LOGS}
        try:
            with InterruptGuard() as guard:
                while self.step < self.cfg.train.steps:
                    before, t0 = self.cursor_state(), time.perf_counter()
                    self.timing = {"rollout": 0.0, "reward": 0.0}
                    try:
                        batch = self.collect()
                    except KeyboardInterrupt:  # nothing trained yet: roll the step back and keep the last one
                        self.sampler.load_state_dict(before["sampler"])
                        set_rng_state(before["rng"])
                        raise self.interrupted() from None
                    with guard.critical_section():
                        metrics = self.end_step(*self.update_step(batch, t0), sinks, on_step)
                    if guard.requested:
                        raise self.interrupted()
                with guard.critical_section():
                    if self.saved_step != self.step:
                        self.save()
        except KeyboardInterrupt:  # a second Ctrl-C inside the critical section
            raise TrainingInterrupted(self.run_dir, ckpt.latest_checkpoint(self.run_dir), written=False) from None
        finally:
            for sink in sinks.values():
                sink.close()
        return metrics

    def end_step(self, metrics: dict[str, float], samples: list[dict[str, Any]], sinks: dict[str, JsonlSink],
                 on_step: Callable[[int, dict[str, float]], None] | None) -> dict[str, float]:
        """Periodic eval, logging, non-finite bookkeeping and the periodic checkpoint of the step just taken."""
        cfg, step = self.cfg, self.step
        if cfg.eval.every_steps and (step % cfg.eval.every_steps == 0 or step == cfg.train.steps):
            metrics.update(self.eval_metrics())
        bad = self.skipped_in_step > 0 or not all(math.isfinite(v) for k, v in metrics.items() if k.startswith("loss/"))
        sinks["metrics.jsonl"].log(step, metrics)
        for s in samples:
            sinks["samples.jsonl"].log(step, s)
        if on_step:
            on_step(step, metrics)
        if self.nonfinite.record(step, bad, self.updater.skipped_steps):
            last = ckpt.latest_checkpoint(self.run_dir)
            raise GrpolabError(
                f"step {step}: {self.nonfinite.streak} consecutive steps with a non-finite loss or gradient "
                f"(train.max_nonfinite_steps = {self.nonfinite.limit}); stopped. "
                + (f"The last good checkpoint is {last}" if last else "No checkpoint was written"))
        if cfg.train.save_every and step % cfg.train.save_every == 0 and step < cfg.train.steps and not self.nonfinite.streak:
            self.save()
        return metrics

    def interrupted(self) -> TrainingInterrupted:
        """Checkpoint the last completed step (unless it already is, or nothing was trained) for a Ctrl-C."""
        written = self.step > 0 and self.saved_step != self.step and not self.nonfinite.streak
        if written:
            self.save()
        return TrainingInterrupted(self.run_dir, ckpt.latest_checkpoint(self.run_dir), written)


def _row_errors(scores: Scores) -> list[str | None]:
    """scores.errors spread over the rows: the message of each invalid row, None for a valid one."""
    messages = iter(scores.errors)
    return [next(messages, None) if bad else None for bad in scores.invalid.tolist()]


def _size(path: Path) -> int:
    return os.path.getsize(path) if path.is_file() else 0
