"""The training-batch collector of agent tasks: each group is G episodes from one initial state (grpolab.agents.episode)
instead of G single completions, and the reward is the environment's, as the reward component ``env``.

Everything after the rewards is the single-turn collector's (grpolab.training.batch): advantages, dynamic sampling and the
pass_rate prompt schedule (which judge a group by its ``env`` component, the correctness component of an agent
task, while its weight is > 0, else by the total reward: grpolab.training.batch.signal_values), the gathering over ranks
and the metrics -- with completion lengths counted in model tokens (the loss mask) and an episode ended by a bound
counted as truncated. The episode metrics (``agent/*``, grpolab.training.metrics.agent_metrics) are added for the sampled
batch and, with dynamic sampling, the kept one.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from ..agents.env import is_agent_problem
from ..agents.episode import EpisodeResult, EpisodeRunner
from ..agents.openai_agent import OpenAIAgentRunner, is_openai_agent_problem
from ..errors import ConfigError
from ..rewards import RewardResult
from ..rollout.base import Rollout
from ..tasks.base import Problem
from .batch import Batch, BatchCollector, Round, Scores
from .metrics import agent_metrics

ENV_REWARD = "env"


@dataclass(frozen=True)
class EpisodeScore(RewardResult):
    """A RewardResult that keeps its episode (how it ended, turns, tool calls) for the agent/* metrics."""

    episode: EpisodeResult | None = None


def episode_scores(results: list[EpisodeResult], weights: dict[str, float]) -> Scores:
    """Scores of episodes: component ``env`` = the environment's reward, total = weights['env'] * env; an invalid
    episode has NaN and its reason."""
    w = weights[ENV_REWARD]
    rows = [
        EpisodeScore(math.nan, {ENV_REWARD: math.nan}, True, f"env: {r.error}", episode=r)
        if r.invalid
        else EpisodeScore(w * r.reward, {ENV_REWARD: r.reward}, episode=r)
        for r in results
    ]
    return Scores(
        torch.tensor([r.total for r in rows], dtype=torch.float64),
        {ENV_REWARD: torch.tensor([r.components[ENV_REWARD] for r in rows], dtype=torch.float64)},
        torch.tensor([r.invalid for r in rows]),
        rows,
    )


def check_agent_config(cfg) -> None:
    """ConfigError for settings an agent task cannot honour."""
    unknown = sorted(set(cfg.reward.weights) - {ENV_REWARD})
    if unknown or ENV_REWARD not in cfg.reward.weights:
        raise ConfigError(
            f"reward.weights: an agent task is rewarded by its environment; expected {{env: 1.0}}, got "
            f"{dict(cfg.reward.weights)}"
        )
    if cfg.algorithm.overlong_buffer:
        raise ConfigError(
            "algorithm.overlong_buffer: not supported for agent tasks (episodes are bounded by the "
            "task's max_turn_tokens / max_total_tokens)"
        )


class AgentCollector(BatchCollector):
    def __init__(self, cfg, *args, **kwargs):
        check_agent_config(cfg)
        super().__init__(cfg, *args, **kwargs)
        self.runner = self.make_runner()

    def make_runner(self):
        """What plays the episodes: grpolab's own runner on the engine's sampler copy."""
        return EpisodeRunner.from_engine(self.engine)

    def sample_and_score(self, problems: list[Problem], seeds: list[int], t0: float) -> tuple[Rollout, Scores]:
        """G episodes of each of this rank's problems, scored by their environments (all timed as rollout)."""
        episodes = self.runner.run(problems, self.cfg.rollout.group_size, self.params, seeds)
        self.timing["rollout"] += time.perf_counter() - t0
        return episodes.rollout, episode_scores(episodes.results, self.rewards.weights)

    def join(self, rounds: list[Round], groups: list[tuple[int, int]]) -> Batch:
        """The single-turn batch, plus the agent/* metrics of its episodes (every rank's)."""
        batch = super().join(rounds, groups)
        g, p = self.cfg.rollout.group_size, self.cfg.train.prompts_per_step
        every = [r * p * g + gi * g + k for r, gi in groups for k in range(g)]
        results = [e for rnd in rounds for e in rnd.scores.results]
        batch.metrics.update(agent_metrics([results[i].episode for i in every]))
        return batch


class OpenAIAgentCollector(AgentCollector):
    """Episodes played by an OpenAI-client agent through the run's endpoint (grpolab.agents.openai_agent)."""

    def make_runner(self):
        """The training endpoint's runner; the periodic held-out eval runs the agent against an endpoint of its own
        that serves greedily (grpolab.evaluation.episodes.episode_runner)."""
        return OpenAIAgentRunner(self.engine, self.tokenizer, self.cfg.model.name)

    def close(self) -> None:
        """Stop this run's endpoint (only its own: another run in the process keeps serving)."""
        self.runner.close()


def collector_class(problems) -> type[BatchCollector]:
    """AgentCollector for agent problems (OpenAIAgentCollector for openai_agent ones), the single-turn
    BatchCollector otherwise."""
    if problems and is_openai_agent_problem(problems[0]):
        return OpenAIAgentCollector
    return AgentCollector if problems and is_agent_problem(problems[0]) else BatchCollector
