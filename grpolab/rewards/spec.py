"""A registered reward's record (RewardSpec) and the error a batched reward's wrong output raises; the leaves of
grpolab.rewards (code, model) import this, never the registry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..tasks.base import Problem


class RewardShapeError(TypeError):
    """A batched reward returned something other than one value per completion."""


@dataclass(frozen=True)
class RewardSpec:
    """A registered reward: the function, what it measures, its time limit in seconds (None = none, e.g. a reward
    that enforces its own, as the sandbox does), whether it takes the whole problem instead of the gold string,
    and an optional batched form ``batch(completions, problems) -> list[value | Scored | Exception]``."""

    fn: Callable[[str, Any], Any]
    description: str
    time_limit_s: float | None = 5.0
    takes_problem: bool = False
    batch: Callable[[Sequence[str], Sequence[Problem]], list[Any]] | None = None


def env_reward(completion: str, problem: Problem) -> float:
    """The registry entry of the ``env`` reward (grpolab.rewards): an agent environment's reward() at the end of an
    episode (grpolab.training.agent_batch), so it cannot score a text on its own."""
    raise TypeError(
        "the env reward is an agent environment's reward() at the end of an episode; weight it only "
        "with task.name: agent"
    )
