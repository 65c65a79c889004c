"""Prompt order for training: a seeded permutation per epoch and a cursor, plus an optional pass-rate memory that
visits saturated prompts less often. Everything is checkpointable, so a resume draws exactly the same prompts.

Schedules (config ``train.prompt_schedule``):

- ``shuffle``: every prompt once per epoch, in a seeded random order.
- ``pass_rate``: the same walk, but a prompt whose last group had no reward signal -- solved G/G or 0/G, the
  groups whose advantages are all zero and whose generation time teaches nothing -- is skipped when the walk
  reaches it, except with probability ``floor`` (exploration: its pass rate may have changed). A prompt skipped
  ``ceil(1 / floor)`` times in a row is taken whatever the draw, so no prompt is starved: each saturated prompt
  is revisited at least once every ceil(1 / floor) epochs. A prompt seen with signal, or never seen, is always
  taken. The draw is a pure function of (seed, epoch, position), so the state is (epoch, position, memory).

The memory is what the last group of each prompt showed (``observe``): saturated or not, and its mean correctness.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..tasks.base import Problem

SCHEDULES = ("shuffle", "pass_rate")


def revisit_draw(seed: int, epoch: int, position: int) -> float:
    """A uniform number in [0, 1) fixed by (seed, epoch, position): the walk's exploration coin, no RNG state."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + epoch) * 1_000_033 + position)
    return torch.rand((), generator=g, dtype=torch.float64).item()


class PromptSampler:
    """Yields training problems in epoch-wise shuffled order; with ``schedule="pass_rate"`` it skips prompts whose
    last group was saturated (module docstring). State = (epoch, position, memory)."""

    def __init__(self, problems: list[Problem], seed: int, schedule: str = "shuffle", floor: float = 0.25):
        if schedule not in SCHEDULES:
            raise ValueError(f"train.prompt_schedule: expected one of {', '.join(SCHEDULES)}, got {schedule!r}")
        if not 0.0 < floor <= 1.0:
            raise ValueError(f"train.prompt_floor: expected a number in (0, 1], got {floor!r}")
        self.problems = problems
        self.seed, self.schedule, self.floor = seed, schedule, floor
        self.max_skips = math.ceil(1.0 / floor)
        self.epoch = 0
        self.position = 0
        self.memory: dict[str, dict[str, Any]] = {}  # uid -> {"saturated": bool, "pass_rate": float, "skips": int}
        self.skipped = 0  # prompts skipped over the whole run

    def _order(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(len(self.problems), generator=g).tolist()

    def _skip(self, problem: Problem) -> bool:
        """Whether the walk passes over this prompt now (and counts the skip)."""
        seen = self.memory.get(problem.uid)
        if self.schedule == "shuffle" or seen is None or not seen["saturated"] or seen["skips"] >= self.max_skips:
            return False
        if revisit_draw(self.seed, self.epoch, self.position) < self.floor:
            return False
        seen["skips"] += 1
        self.skipped += 1
        return True

    def take(self, n: int) -> list[Problem]:
        out: list[Problem] = []
        order = self._order()
        while len(out) < n:
            if self.position >= len(order):
                self.epoch, self.position = self.epoch + 1, 0
                order = self._order()
            problem = self.problems[order[self.position]]
            if not self._skip(problem):
                out.append(problem)
            self.position += 1
        return out

    def observe(self, problems: list[Problem], saturated: list[bool], pass_rates: list[float]) -> None:
        """Remember what each prompt's group showed: saturated (no signal) or not, and its mean correctness."""
        for problem, sat, rate in zip(problems, saturated, pass_rates, strict=True):
            self.memory[problem.uid] = {"saturated": bool(sat), "pass_rate": float(rate), "skips": 0}

    def stats(self) -> dict[str, float]:
        """Metrics of the schedule: how many prompts are remembered as saturated, and how many were skipped."""
        if self.schedule == "shuffle":
            return {}
        saturated = sum(m["saturated"] for m in self.memory.values())
        return {
            "schedule/saturated_prompts": float(saturated),
            "schedule/seen_prompts": float(len(self.memory)),
            "schedule/skipped_total": float(self.skipped),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "size": len(self.problems),
            "schedule": self.schedule,
            "floor": self.floor,
            "skipped": self.skipped,
            "memory": {uid: dict(m) for uid, m in self.memory.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self.skipped = state.get("skipped", 0)
        self.memory = {uid: dict(m) for uid, m in state.get("memory", {}).items()}  # older checkpoints: no memory
