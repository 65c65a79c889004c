"""The GRPO loop. One step reads like DESIGN.md section 2:

    problems -> rollout (G per prompt) -> rewards -> advantages -> update (mu x minibatches x micro-batches)
             -> sync sampler weights -> metrics -> [periodic held-out eval] -> [checkpoint]
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from . import checkpoint as ckpt
from .algo.advantages import compute_advantages
from .config import Config
from .data import PromptSampler
from .errors import GrpolabError
from .evaluate import EvalResult, greedy_eval
from .metrics import JsonlSink, completion_metrics, group_metrics, peak_rss_mb, reward_metrics
from .models import DTYPES, frozen_copy, load_causal_lm, load_tokenizer, resolve_model_path
from .prompting import prompt_ids
from .rewards import score_completion
from .rollout.base import Rollout, SamplingParams
from .rollout.hf import HFEngine
from .tasks import make_task
from .tasks.base import Problem
from .update import PolicyUpdater


@dataclass
class Scores:
    """Per-completion reward (NaN where invalid), its named components, and the invalid flags. [N] each."""

    rewards: torch.Tensor
    components: dict[str, torch.Tensor]
    invalid: torch.Tensor


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


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


def score_rollout(rollout: Rollout, problems: list[Problem], weights: dict[str, float]) -> Scores:
    """Reward every completion against its prompt's gold answer; failures are invalid, never a silent 0."""
    results = [score_completion(text, problems[g].answer, weights) for text, g in zip(rollout.texts, rollout.group.tolist())]
    names = list(weights)
    return Scores(
        rewards=torch.tensor([r.total for r in results], dtype=torch.float64),
        components={n: torch.tensor([r.components.get(n, math.nan) for r in results], dtype=torch.float64) for n in names},
        invalid=torch.tensor([r.invalid for r in results]),
    )


class Trainer:
    def __init__(self, cfg: Config, run_dir: Path):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        seed_everything(cfg.train.seed)
        task = make_task(cfg.task.name, **cfg.task.options)
        self.train_problems = task.problems("train")
        self.eval_problems = task.problems(cfg.eval.split)[: cfg.eval.num_problems] if cfg.eval.every_steps else []
        self.model_path = resolve_model_path(cfg.model.name)
        self.tokenizer = load_tokenizer(self.model_path)
        self.policy = load_causal_lm(self.model_path, cfg.model.dtype)
        self.policy.train()
        compute_dtype = torch.bfloat16 if cfg.train.precision == "bf16" else DTYPES[cfg.model.dtype]
        self.reference = frozen_copy(self.policy, compute_dtype) if cfg.algorithm.beta > 0 else None
        self.engine = HFEngine(self.policy, self.tokenizer, DTYPES[cfg.rollout.dtype])
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay,
            betas=(cfg.train.adam_beta1, cfg.train.adam_beta2),
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
        self.last_eval: EvalResult | None = None

    # ------------------------------------------------------------------------------------------ one step

    def prompt_ids(self, problem: Problem) -> list[int]:
        if problem.uid not in self._prompt_cache:
            self._prompt_cache[problem.uid] = prompt_ids(self.tokenizer, problem)
        return self._prompt_cache[problem.uid]

    def train_step(self) -> tuple[dict[str, float], list[dict[str, Any]]]:
        cfg, t0 = self.cfg, time.perf_counter()
        problems = self.sampler.take(cfg.train.prompts_per_step)
        rollout = self.engine.generate([self.prompt_ids(p) for p in problems], self.sampling)
        t1 = time.perf_counter()
        scores = score_rollout(rollout, problems, cfg.reward.weights)
        t2 = time.perf_counter()
        g = cfg.rollout.group_size
        a = cfg.algorithm
        adv = compute_advantages(
            scores.rewards.view(-1, g), ~scores.invalid.view(-1, g), baseline=a.baseline, scaling=a.scaling,
            eps=a.adv_eps, std_kind=a.std_kind,
        )
        update_metrics = self.updater.update(rollout, adv.advantages.view(-1), ~scores.invalid)
        self.engine.sync_weights(self.policy)
        t3 = time.perf_counter()
        self.step += 1
        metrics = {
            **reward_metrics(scores.rewards, scores.components, scores.invalid),
            **group_metrics(adv.zero_std, [p.slice for p in problems]),
            **completion_metrics(rollout),
            **update_metrics,
            "optim/lr": self.scheduler.get_last_lr()[0],
            "time/rollout_s": t1 - t0, "time/reward_s": t2 - t1, "time/update_s": t3 - t2, "time/step_s": t3 - t0,
            "throughput/tokens_per_s": (rollout.completion_mask.sum().item() + rollout.prompt_mask.sum().item()) / (t3 - t0),
            "memory/peak_rss_mb": peak_rss_mb(),
        }
        samples = [
            {"step": self.step, "uid": problems[gi].uid, "gold": problems[gi].answer, "completion": rollout.texts[i],
             "reward": scores.rewards[i].item(), "advantage": adv.advantages.view(-1)[i].item(),
             **{f"reward/{k}": v[i].item() for k, v in scores.components.items()}}
            for i, gi in enumerate(rollout.group.tolist()[: cfg.train.samples_per_step])
        ]
        return metrics, samples

    def evaluate(self) -> EvalResult:
        max_new = self.cfg.eval.max_new_tokens or self.cfg.rollout.max_new_tokens
        self.last_eval = greedy_eval(self.engine, self.tokenizer, self.eval_problems, max_new, self.cfg.eval.batch_size)
        return self.last_eval

    # ------------------------------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step, "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(), "sampler": self.sampler.state_dict(),
        }

    def save(self) -> Path:
        return ckpt.save_checkpoint(self.run_dir, self.step, self.policy, self.tokenizer, self.state_dict(), self.cfg.train.keep_last)

    def load(self, path: Path) -> None:
        state = ckpt.load_state(path)
        self.policy.load_state_dict(load_causal_lm(str(path), self.cfg.model.dtype).state_dict())
        self.engine.sync_weights(self.policy)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        set_rng_state(state["rng"])
        self.step = state["step"]

    # ------------------------------------------------------------------------------------------ loop

    def fit(self, on_step: Callable[[int, dict[str, float]], None] | None = None) -> dict[str, float]:
        """Run to train.steps, logging every step, evaluating every eval.every_steps, checkpointing."""
        cfg = self.cfg
        metrics_sink = JsonlSink(self.run_dir / "metrics.jsonl")
        samples_sink = JsonlSink(self.run_dir / "samples.jsonl")
        metrics: dict[str, float] = {}
        try:
            while self.step < cfg.train.steps:
                metrics, samples = self.train_step()
                if cfg.eval.every_steps and (self.step % cfg.eval.every_steps == 0 or self.step == cfg.train.steps):
                    result = self.evaluate()
                    metrics.update({"eval/accuracy": result.accuracy, "eval/ci_low": result.ci_low, "eval/ci_high": result.ci_high})
                if not all(math.isfinite(v) for k, v in metrics.items() if k.startswith("loss/")):
                    raise GrpolabError(f"step {self.step}: non-finite loss {metrics}")
                metrics_sink.log(self.step, metrics)
                for s in samples:
                    samples_sink.log(self.step, s)
                if on_step:
                    on_step(self.step, metrics)
                if cfg.train.save_every and self.step % cfg.train.save_every == 0 and self.step < cfg.train.steps:
                    self.save()
            self.save()
        finally:
            metrics_sink.close()
            samples_sink.close()
        return metrics
