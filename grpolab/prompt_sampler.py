"""Prompt order for training: a seeded permutation per epoch and a cursor, both checkpointable."""

from __future__ import annotations

from typing import Any

import torch

from .tasks.base import Problem


class PromptSampler:
    """Yields training problems in epoch-wise shuffled order; state = (epoch, position)."""

    def __init__(self, problems: list[Problem], seed: int):
        self.problems = problems
        self.seed = seed
        self.epoch = 0
        self.position = 0

    def _order(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(len(self.problems), generator=g).tolist()

    def take(self, n: int) -> list[Problem]:
        out: list[Problem] = []
        order = self._order()
        while len(out) < n:
            if self.position >= len(order):
                self.epoch, self.position = self.epoch + 1, 0
                order = self._order()
            out.append(self.problems[order[self.position]])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "size": len(self.problems)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
