"""A user-defined agent environment (docs/agents.md): task {name: agent, options: {env: examples/capitals.py:Capitals}}."""

import random

from grpolab.agents.env import AgentEnv
from grpolab.agents.tools import Tool, ToolError
from grpolab.tasks.base import Problem


def lookup(key: str) -> str:  # a tool: text in, text (or a number) out
    table = {"paris": "France", "rome": "Italy"}
    if key.strip().lower() not in table:
        raise ToolError(f"unknown city {key!r}")  # the model's mistake: an error observation
    return table[key.strip().lower()]


class Capitals(AgentEnv):
    tools = [Tool("lookup", "lookup(city) gives the country of a city", lookup)]
    requires_tools = True  # the report flags rewards reached without a tool call

    def reset(self, problem: Problem, rng: random.Random) -> str:
        self.gold, self.answer = problem.answer, None
        return f"In which country is {problem.question}? Reply with just the country."

    def step(self, action: str) -> tuple[str, bool]:  # a model turn without a tool call
        self.answer = action.strip()
        return "", True

    def reward(self) -> float:
        return float(self.answer is not None and self.answer.lower() == self.gold.lower())

    @classmethod
    def problems(cls, split: str, n: int, seed: int, difficulty: int) -> list[Problem]:
        pairs = {"train": [("Paris", "France")], "test": [("Rome", "Italy")]}[split]
        return [Problem(uid=f"capitals/{split}/{c}", question=c, answer=a) for c, a in pairs][:n]
