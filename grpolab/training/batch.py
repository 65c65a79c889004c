"""Collecting one step's training batch: prompts -> G completions each -> rewards -> advantages, with DAPO dynamic
sampling (docs/design.md section 2).

Two batches exist in a step with dynamic sampling, and both are logged:

- the **sampled** batch: every group generated in the step (all refill rounds). It is an unbiased sample of what
  the policy does, so the standard metric names (`reward/*`, `completion/*`, `groups/frac_zero_std`) describe it
  and the release checks for reward hacking, length and truncation read it;
- the **kept** batch: the groups the update trains on. Dynamic sampling keeps only groups whose *correctness*
  varies (all-right and all-wrong groups carry no signal; ``signal_values`` says what counts as correctness),
  which biases every statistic of the kept batch; its metrics carry a `kept/` prefix.

Without dynamic sampling the two are the same batch and only the standard names are logged. Over several ranks
(grpolab.training.distributed) each rank samples and trains its own groups, and every statistic here is over all of them.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..algo.advantages import Advantages
from ..config import Config
from ..rewards import CORRECTNESS_REWARDS, RewardResult, RewardSet, result_metrics, stop_rule
from ..rewards.overlong import soft_overlong_penalty
from ..rollout.base import Rollout, RolloutEngine, SamplingParams, concat_rollouts
from ..tasks.base import Problem
from ..tasks.prompting import prompt_ids
from .distributed import World, gather_objects, gather_rows, group_seed, owned_groups
from .group_rules import GroupRule
from .metrics import completion_metrics, group_metrics, reward_metrics
from .prompt_sampler import PromptSampler


@dataclass
class Scores:
    """Per-completion reward (NaN where invalid), its named components, and the invalid flags. [N] each. ``results``
    keeps each row's RewardResult for what is not a number: why it is invalid, why a code program failed (its
    reason) and its per-sample extras (grpolab.rewards.result_metrics)."""

    rewards: torch.Tensor
    components: dict[str, torch.Tensor]
    invalid: torch.Tensor
    results: list[RewardResult] = field(default_factory=list)

    @property
    def errors(self) -> list[str | None]:
        """Per row: why it is invalid, None when valid."""
        return [r.error for r in self.results]

    def select(self, rows: list[int]) -> "Scores":
        return Scores(
            self.rewards[rows],
            {k: v[rows] for k, v in self.components.items()},
            self.invalid[rows],
            [self.results[i] for i in rows],
        )


def cat_scores(parts: list[Scores]) -> Scores:
    return Scores(
        torch.cat([s.rewards for s in parts]),
        {k: torch.cat([s.components[k] for s in parts]) for k in parts[0].components},
        torch.cat([s.invalid for s in parts]),
        [r for s in parts for r in s.results],
    )


def score_rollout(rollout: Rollout, problems: list[Problem], rewards: RewardSet, cfg: Config) -> Scores:
    """Reward every completion against its problem; failures are invalid, never a silent 0.

    With algorithm.overlong_buffer > 0 the DAPO soft overlong penalty is added as the `overlong` component.
    """
    results = rewards.score_many(rollout.texts, [problems[g] for g in rollout.group.tolist()])
    components = {
        n: torch.tensor([r.components.get(n, math.nan) for r in results], dtype=torch.float64) for n in rewards.weights
    }
    total = torch.tensor([r.total for r in results], dtype=torch.float64)
    a = cfg.algorithm
    if a.overlong_buffer > 0:
        lengths = rollout.completion_mask.sum(-1).tolist()
        pen = [
            soft_overlong_penalty(n, cfg.rollout.max_new_tokens, a.overlong_buffer, a.overlong_penalty) for n in lengths
        ]
        components["overlong"] = torch.tensor(pen, dtype=torch.float64)
        total = total + components["overlong"]
    return Scores(total, components, torch.tensor([r.invalid for r in results]), results)


@dataclass
class Round:
    """One generation round: prompts_per_step problems (the same on every rank), G completions for each group this
    rank owns, and the scores, lengths and truncation flags of *every* group (gathered from all ranks)."""

    problems: list[Problem]  # all P problems of the round, in global group order
    owned: list[int]  # the global groups this rank sampled
    rollout: Rollout  # this rank's rows: its owned groups, group-major
    scores: Scores  # all P * G rows, group-major
    lengths: torch.Tensor  # [P * G] completion lengths, all rows
    truncated: torch.Tensor  # [P * G] bool, all rows
    signal: list[bool] = field(default_factory=list)  # [P] whether each group's correctness varies (has_signal)


@dataclass
class Batch:
    """What one step trains on (this rank's share of the kept groups) and what the step sampled (its metrics)."""

    rollout: Rollout  # this rank's rows
    problems: list[Problem]  # indexed by rollout.group
    scores: Scores  # this rank's rows
    advantages: torch.Tensor  # [N] this rank's rows (computed over the whole batch of every rank)
    metrics: dict[str, float]  # reward / completion / group metrics of the sampled batch (+ kept/ ones), global
    positions: list[int] = field(default_factory=list)  # each local group's index among the batch's global groups
    num_groups: int = 0  # groups in the batch over all ranks
    # the sampled batch's completion lengths and truncation flags, every rank's rows (grpolab.training.truncation)
    sampled_lengths: torch.Tensor | None = None
    sampled_truncated: torch.Tensor | None = None


def signal_values(scores: Scores, weights: dict[str, float]) -> torch.Tensor:
    """What dynamic sampling and the pass_rate prompt schedule judge a group by: the first correctness component
    the run trains on -- ``correct``, else a code task's ``all_pass``, else its ``pass_fraction``, else an agent's
    ``env``, each only when its weight is > 0 (as DAPO filters on accuracy: a format bonus or a length penalty must
    not keep an all-wrong group) -- and otherwise the total reward (a component at weight 0 is only logged: with
    {model: 1, correct: 0} the reward model's score decides, not the verifier's)."""
    for name in CORRECTNESS_REWARDS:
        if weights.get(name, 0.0) > 0 and name in scores.components:
            return scores.components[name]
    return scores.rewards


class BatchCollector:
    """Draws problems from the prompt sampler, generates this rank's groups, scores them, gathers what every rank
    scored, and (with dynamic sampling) refills -- every decision taken on gathered data, identically on all ranks.
    ``group``: the run's advantage estimator's rule for sequence-level advantages and group signal
    (grpolab.training.group_rules)."""

    def __init__(
        self,
        cfg: Config,
        engine: RolloutEngine,
        tokenizer,
        sampler: PromptSampler,
        rewards: RewardSet,
        group: GroupRule,
        world: World = World(),
    ):
        self.cfg, self.engine, self.tokenizer, self.sampler, self.rewards = cfg, engine, tokenizer, sampler, rewards
        self.group, self.world = group, world
        r = cfg.rollout
        self.params = SamplingParams(
            group_size=r.group_size,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            max_new_tokens=r.max_new_tokens,
            stop_rule=stop_rule(cfg),
        )
        self._prompt_cache: dict[str, list[int]] = {}
        self.timing = {"rollout": 0.0, "reward": 0.0}

    def close(self) -> None:
        """Stop what this collector started (the trainer's close); nothing for single-turn batches."""

    def prompt_ids(self, problem: Problem) -> list[int]:
        if problem.uid not in self._prompt_cache:
            self._prompt_cache[problem.uid] = prompt_ids(self.tokenizer, problem)
        return self._prompt_cache[problem.uid]

    def advantages(
        self, values: torch.Tensor, invalid: torch.Tensor, components: dict[str, torch.Tensor] | None = None
    ) -> Advantages:
        """The batch's advantages, [P, G], from its rewards and invalid flags [P * G] (the estimator's group rule) and
        its reward components, each with its weight in the total (the overlong penalty: 1, as it is added)."""
        g = self.cfg.rollout.group_size
        parts = None
        if components:
            parts = [(float(self.rewards.weights.get(k, 1.0)), v.view(-1, g)) for k, v in components.items()]
        return self.group.advantages(values.view(-1, g), invalid.view(-1, g), parts)

    def gather(self, local: torch.Tensor, owned: list[int], num_groups: int) -> torch.Tensor:
        return gather_rows(local, owned, num_groups, self.cfg.rollout.group_size, self.world)

    def sample_and_score(self, problems: list[Problem], seeds: list[int], t0: float) -> tuple[Rollout, Scores]:
        """G completions of each of this rank's problems and their scores (timed from t0). The collector of agent
        tasks runs G episodes per problem here instead (grpolab.training.agent_batch)."""
        rollout = self.engine.generate([self.prompt_ids(q) for q in problems], self.params, seeds)
        t1 = time.perf_counter()
        local = score_rollout(rollout, problems, self.rewards, self.cfg)
        self.timing["rollout"] += t1 - t0
        self.timing["reward"] += time.perf_counter() - t1
        return rollout, local

    def generate_round(self, step: int, index: int) -> Round:
        """Round `index` of training step `step`: group j's sampling stream is seeded by (seed, step, index * P + j)."""
        t0, p = time.perf_counter(), self.cfg.train.prompts_per_step
        problems = self.sampler.take(p)
        owned = owned_groups(p, self.world)
        seeds = [group_seed(self.cfg.train.seed, step, index * p + j) for j in owned]
        rollout, local = self.sample_and_score([problems[j] for j in owned], seeds, t0)
        return self.gathered_round(problems, owned, rollout, local)

    def draw_round(self, step: int) -> tuple[list[Problem], list[int], list[list[int]], list[int]]:
        """Round 0 of step `step` drawn for an engine that samples it ahead (rollout.max_staleness:
        grpolab.training.pipeline submits it): its problems, the groups this rank owns, and their prompts and seeds
        (the same as generate_round's)."""
        p = self.cfg.train.prompts_per_step
        problems = self.sampler.take(p)
        owned = owned_groups(p, self.world)
        seeds = [group_seed(self.cfg.train.seed, step, j) for j in owned]
        return problems, owned, [self.prompt_ids(problems[j]) for j in owned], seeds

    def collect_rollout(self, problems: list[Problem], owned: list[int], rollout: Rollout) -> Batch:
        """The batch of a step whose rollout was generated ahead (grpolab.training.pipeline): scored, gathered and
        made a batch as collect does, without refill rounds (dynamic sampling keeps the first round's groups with
        signal: max_extra_rounds is 0 there)."""
        self.timing = {"rollout": 0.0, "reward": 0.0}
        t1 = time.perf_counter()
        local = score_rollout(rollout, [problems[j] for j in owned], self.rewards, self.cfg)
        self.timing["reward"] += time.perf_counter() - t1
        return self.batch_of(self.gathered_round(problems, owned, rollout, local), None)

    def gathered_round(self, problems: list[Problem], owned: list[int], rollout: Rollout, local: Scores) -> Round:
        """A round from this rank's rollout and scores: every rank's scores, lengths and truncation flags gathered;
        the prompt schedule told how each group did."""
        p, g = len(problems), self.cfg.rollout.group_size
        by_group = {
            j: res[i * g : (i + 1) * g]
            for groups, res in gather_objects((owned, local.results), self.world)
            for i, j in enumerate(groups)
        }
        scores = Scores(
            self.gather(local.rewards, owned, p),
            {k: self.gather(v, owned, p) for k, v in local.components.items()},
            self.gather(local.invalid, owned, p),
            [e for j in range(p) for e in by_group[j]],
        )
        lengths = self.gather(rollout.trained_mask().sum(-1).cpu(), owned, p)  # agent episodes: model tokens only
        rnd = Round(problems, owned, rollout, scores, lengths, self.gather(rollout.truncated.cpu(), owned, p))
        rnd.signal, pass_rates = self.group_signal(scores)
        self.sampler.observe(problems, [not s for s in rnd.signal], pass_rates)  # the prompt schedule's memory
        return rnd

    def group_signal(self, scores: Scores) -> tuple[list[bool], list[float]]:
        """Per group: whether it carries signal (the estimator's group rule: its correctness, signal_values, varies
        among the valid rows, or its pass@k advantages are not all zero) and its mean correctness."""
        g = self.cfg.rollout.group_size
        values, invalid = signal_values(scores, self.rewards.weights).view(-1, g), scores.invalid.view(-1, g)
        valid = ~invalid & torch.isfinite(values)
        means = (torch.where(valid, values, 0.0).sum(-1) / valid.sum(-1).clamp(min=1)).tolist()
        return self.group.signal(scores.rewards.view(-1, g), values, invalid).tolist(), means

    def collect(self, step: int = 0) -> Batch:
        """Generate and score prompts_per_step groups. With dynamic sampling, keep the groups with signal and refill
        with new prompts for up to max_extra_rounds extra rounds; train on at most prompts_per_step kept groups.
        When the budget is spent with nothing kept, the first round is trained on as it is (no signal, logged)."""
        self.timing = {"rollout": 0.0, "reward": 0.0}
        return self.batch_of(self.generate_round(step, 0), lambda index: self.generate_round(step, index))

    def batch_of(self, first: Round, refill: Callable[[int], Round] | None) -> Batch:
        """The step's batch from its first round and, with dynamic sampling, the refill rounds `refill(index)`
        (None: no refill, the kept groups of the first round only)."""
        a, want = self.cfg.algorithm, self.cfg.train.prompts_per_step
        rounds = [first]
        kept = [(0, gi) for gi, ok in enumerate(first.signal) if ok] if a.dynamic_sampling else []
        while refill and a.dynamic_sampling and len(kept) < want and len(rounds) <= a.max_extra_rounds:
            rounds.append(refill(len(rounds)))
            kept += [(len(rounds) - 1, gi) for gi, ok in enumerate(rounds[-1].signal) if ok]
        everything = [(r, gi) for r in range(len(rounds)) for gi in range(want)]
        sampled = self.join(rounds, everything)
        sampled.metrics.update(self.sampler.stats())
        if not a.dynamic_sampling:
            return sampled
        train = self.join(rounds, kept[:want] if kept else everything[:want])
        train.sampled_lengths, train.sampled_truncated = sampled.sampled_lengths, sampled.sampled_truncated
        train.metrics = {
            **sampled.metrics,
            **{f"kept/{k}": v for k, v in train.metrics.items()},
            "dynamic/extra_rounds": float(len(rounds) - 1),
            "dynamic/kept_groups": float(min(len(kept), want)),
        }
        return train

    def join(self, rounds: list[Round], groups: list[tuple[int, int]]) -> Batch:
        """The (round, global group) pairs as one batch: this rank's rows of the groups it owns, advantages and
        metrics over all of them."""
        g = self.cfg.rollout.group_size
        p = self.cfg.train.prompts_per_step
        every = [r * p * g + gi * g + k for r, gi in groups for k in range(g)]  # rows of the rounds' global tensors
        scores = cat_scores([r.scores for r in rounds]).select(every)
        adv = self.advantages(scores.rewards, scores.invalid, scores.components)
        problems = [rounds[r].problems[gi] for r, gi in groups]
        lengths, truncated = (
            torch.cat([r.lengths for r in rounds])[every],
            torch.cat([r.truncated for r in rounds])[every],
        )
        metrics = {
            **reward_metrics(scores.rewards, scores.components, scores.invalid),
            **result_metrics(scores.results),
            **completion_metrics(lengths, truncated),
            **group_metrics(adv.zero_std, [q.slice for q in problems]),
        }
        positions = [i for i, (r, gi) in enumerate(groups) if gi in rounds[r].owned]
        offsets = [0]
        for rnd in rounds:
            offsets.append(offsets[-1] + len(rnd.rollout))
        local_rows = [
            offsets[r] + rounds[r].owned.index(gi) * g + k for r, gi in (groups[i] for i in positions) for k in range(g)
        ]
        rollout = concat_rollouts([r.rollout for r in rounds], self.tokenizer.pad_token_id).select(local_rows)
        rollout.group = torch.arange(len(positions)).repeat_interleave(g)
        mine = [i * g + k for i in positions for k in range(g)]
        return Batch(
            rollout,
            [problems[i] for i in positions],
            scores.select(mine),
            adv.advantages.view(-1)[mine],
            metrics,
            positions,
            len(groups),
            lengths,
            truncated,
        )

    def global_advantages(self, batch: Batch) -> torch.Tensor:
        """This rank's advantages recomputed after its rewards changed (KL in the reward), over the whole batch."""
        rewards = gather_rows(
            batch.scores.rewards, batch.positions, batch.num_groups, self.cfg.rollout.group_size, self.world
        )
        invalid = gather_rows(
            batch.scores.invalid, batch.positions, batch.num_groups, self.cfg.rollout.group_size, self.world
        )
        g = self.cfg.rollout.group_size
        mine = [i * g + k for i in batch.positions for k in range(g)]
        return self.advantages(rewards, invalid).advantages.view(-1)[mine]
