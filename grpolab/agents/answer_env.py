"""Environments whose episode ends at the model's first turn without a tool call: that turn is the final answer,
scored by the single-turn correctness rule (grpolab.rewards.math.correctness_reward: the last \\boxed{}, else the
last number, against ``problem.answer``). `calc` and `lookup` are such environments; `guess` is not (it answers
every guess).

A subclass's ``reset`` sets ``self.gold`` (the problem's answer) and ``self.final = None``.
"""

from __future__ import annotations

from ..rewards.math import correctness_reward
from .env import AgentEnv


class AnswerEnv(AgentEnv):
    gold: str
    final: str | None = None

    def step(self, action: str) -> tuple[str, bool]:
        self.final = action  # a turn without a tool call is the answer
        return "", True

    def reward(self) -> float:
        return 0.0 if self.final is None else correctness_reward(self.final, self.gold)
