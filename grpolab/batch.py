"""Collecting one step's training batch: prompts -> G completions each -> rewards -> advantages, with DAPO dynamic
sampling (docs/design.md section 2).

Two batches exist in a step with dynamic sampling, and both are logged:

- the **sampled** batch: every group generated in the step (all refill rounds). It is an unbiased sample of what
  the policy does, so the standard metric names (`reward/*`, `completion/*`, `groups/frac_zero_std`) describe it
  and the release checks for reward hacking, length and truncation read it;
- the **kept** batch: the groups the update trains on. Dynamic sampling keeps only groups whose *correctness*
  varies (all-right and all-wrong groups carry no signal), which biases every statistic of the kept batch;
  its metrics carry a `kept/` prefix.

Without dynamic sampling the two are the same batch and only the standard names are logged.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from .algo.advantages import Advantages, compute_advantages, zero_signal_groups
from .config import Config
from .metrics import completion_metrics, group_metrics, reward_metrics
from .prompt_sampler import PromptSampler
from .prompting import prompt_ids
from .rewards import RewardSet
from .rewards.overlong import soft_overlong_penalty
from .rollout.base import Rollout, RolloutEngine, SamplingParams, concat_rollouts
from .tasks.base import Problem


@dataclass
class Scores:
    """Per-completion reward (NaN where invalid), its named components, and the invalid flags. [N] each."""

    rewards: torch.Tensor
    components: dict[str, torch.Tensor]
    invalid: torch.Tensor
    errors: list[str | None] = field(default_factory=list)  # per row: why it is invalid, None when valid

    def select(self, rows: list[int]) -> "Scores":
        return Scores(self.rewards[rows], {k: v[rows] for k, v in self.components.items()}, self.invalid[rows],
                      [self.errors[i] for i in rows])


def cat_scores(parts: list[Scores]) -> Scores:
    return Scores(torch.cat([s.rewards for s in parts]),
                  {k: torch.cat([s.components[k] for s in parts]) for k in parts[0].components},
                  torch.cat([s.invalid for s in parts]), [e for s in parts for e in s.errors])


def score_rollout(rollout: Rollout, problems: list[Problem], rewards: RewardSet, cfg: Config) -> Scores:
    """Reward every completion against its problem; failures are invalid, never a silent 0.

    With algorithm.overlong_buffer > 0 the DAPO soft overlong penalty is added as the `overlong` component.
    """
    results = [rewards.score(text, problems[g]) for text, g in zip(rollout.texts, rollout.group.tolist())]
    components = {n: torch.tensor([r.components.get(n, math.nan) for r in results], dtype=torch.float64)
                  for n in rewards.weights}
    total = torch.tensor([r.total for r in results], dtype=torch.float64)
    a = cfg.algorithm
    if a.overlong_buffer > 0:
        lengths = rollout.completion_mask.sum(-1).tolist()
        pen = [soft_overlong_penalty(n, cfg.rollout.max_new_tokens, a.overlong_buffer, a.overlong_penalty) for n in lengths]
        components["overlong"] = torch.tensor(pen, dtype=torch.float64)
        total = total + components["overlong"]
    return Scores(total, components, torch.tensor([r.invalid for r in results]), [r.error for r in results])


@dataclass
class Round:
    """One generation round: prompts_per_step problems, G completions each, scored."""

    rollout: Rollout
    problems: list[Problem]
    scores: Scores


@dataclass
class Batch:
    """What one step trains on (the kept groups) and what it sampled (its metrics)."""

    rollout: Rollout
    problems: list[Problem]  # indexed by rollout.group
    scores: Scores
    advantages: torch.Tensor  # [N]
    metrics: dict[str, float]  # reward / completion / group metrics of the sampled batch (+ kept/ ones)


def signal_values(scores: Scores) -> torch.Tensor:
    """What dynamic sampling judges a group's signal by: the correctness component when the reward has one (as
    DAPO filters on accuracy: a format bonus or a length penalty must not keep an all-wrong group), else the
    total reward."""
    return scores.components.get("correct", scores.rewards)


class BatchCollector:
    """Draws problems from the prompt sampler, generates, scores and (with dynamic sampling) refills."""

    def __init__(self, cfg: Config, engine: RolloutEngine, tokenizer, sampler: PromptSampler, rewards: RewardSet):
        self.cfg, self.engine, self.tokenizer, self.sampler, self.rewards = cfg, engine, tokenizer, sampler, rewards
        r = cfg.rollout
        self.params = SamplingParams(group_size=r.group_size, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                                     max_new_tokens=r.max_new_tokens)
        self._prompt_cache: dict[str, list[int]] = {}
        self.timing = {"rollout": 0.0, "reward": 0.0}

    def prompt_ids(self, problem: Problem) -> list[int]:
        if problem.uid not in self._prompt_cache:
            self._prompt_cache[problem.uid] = prompt_ids(self.tokenizer, problem)
        return self._prompt_cache[problem.uid]

    def advantages(self, values: torch.Tensor, invalid: torch.Tensor) -> Advantages:
        a, g = self.cfg.algorithm, self.cfg.rollout.group_size
        return compute_advantages(values.view(-1, g), ~invalid.view(-1, g), baseline=a.baseline, scaling=a.scaling,
                                  eps=a.adv_eps, std_kind=a.std_kind)

    def generate_round(self) -> Round:
        t0 = time.perf_counter()
        problems = self.sampler.take(self.cfg.train.prompts_per_step)
        rollout = self.engine.generate([self.prompt_ids(p) for p in problems], self.params)
        t1 = time.perf_counter()
        scores = score_rollout(rollout, problems, self.rewards, self.cfg)
        self.timing["rollout"] += t1 - t0
        self.timing["reward"] += time.perf_counter() - t1
        return Round(rollout, problems, scores)

    def has_signal(self, rnd: Round) -> list[bool]:
        g = self.cfg.rollout.group_size
        values, invalid = signal_values(rnd.scores).view(-1, g), rnd.scores.invalid.view(-1, g)
        valid = ~invalid & torch.isfinite(values)
        return (~zero_signal_groups(torch.where(valid, values, 0.0), valid)).tolist()

    def collect(self) -> Batch:
        """Generate and score prompts_per_step groups. With dynamic sampling, keep the groups with signal and refill
        with new prompts for up to max_extra_rounds extra rounds; train on at most prompts_per_step kept groups.
        When the budget is spent with nothing kept, the first round is trained on as it is (no signal, logged)."""
        self.timing = {"rollout": 0.0, "reward": 0.0}
        a, want = self.cfg.algorithm, self.cfg.train.prompts_per_step
        rounds = [self.generate_round()]
        kept = [(0, gi) for gi, ok in enumerate(self.has_signal(rounds[0])) if ok] if a.dynamic_sampling else []
        while a.dynamic_sampling and len(kept) < want and len(rounds) <= a.max_extra_rounds:
            rounds.append(self.generate_round())
            kept += [(len(rounds) - 1, gi) for gi, ok in enumerate(self.has_signal(rounds[-1])) if ok]
        sampled = self.join(rounds, [(r, gi) for r in range(len(rounds)) for gi in range(len(rounds[r].problems))])
        sampled.metrics = self.batch_metrics(sampled)
        if not a.dynamic_sampling:
            return sampled
        train = self.join(rounds, kept[:want]) if kept else self.join(rounds[:1], [(0, gi) for gi in range(want)])
        train.metrics = {**sampled.metrics, **{f"kept/{k}": v for k, v in self.batch_metrics(train).items()},
                         "dynamic/extra_rounds": float(len(rounds) - 1), "dynamic/kept_groups": float(min(len(kept), want))}
        return train

    def join(self, rounds: list[Round], groups: list[tuple[int, int]]) -> Batch:
        """The (round, group) pairs of several rounds as one batch, groups renumbered 0..len(groups)-1."""
        g = self.cfg.rollout.group_size
        offsets = [0]
        for rnd in rounds:
            offsets.append(offsets[-1] + len(rnd.rollout))
        rows = [offsets[r] + gi * g + k for r, gi in groups for k in range(g)]
        rollout = concat_rollouts([r.rollout for r in rounds], self.tokenizer.pad_token_id).select(rows)
        rollout.group = torch.arange(len(groups)).repeat_interleave(g)
        scores = cat_scores([r.scores for r in rounds]).select(rows)
        problems = [rounds[r].problems[gi] for r, gi in groups]
        adv = self.advantages(scores.rewards, scores.invalid).advantages.view(-1)
        return Batch(rollout, problems, scores, adv, {})

    def batch_metrics(self, batch: Batch) -> dict[str, float]:
        """reward/*, completion/* and groups/frac_zero_std (+ per slice) of a batch."""
        s = batch.scores
        zero = self.advantages(s.rewards, s.invalid).zero_std
        return {**reward_metrics(s.rewards, s.components, s.invalid), **completion_metrics(batch.rollout),
                **group_metrics(zero, [p.slice for p in batch.problems])}
