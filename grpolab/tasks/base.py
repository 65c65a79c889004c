"""The Problem record and the Task interface every task source implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

PROMPT_INSTRUCTION = "Reason briefly, then put the final answer in \\boxed{}."


@dataclass(frozen=True)
class Problem:
    """One verifiable problem.

    uid:      stable identifier (e.g. "gsm8k/test/17" or "arithmetic/3+4").
    question: the problem text shown to the model (without the answer-format instruction).
    answer:   the gold final answer as a plain string ("18", "-7", "\\frac{1}{2}").
    slice:    a label for per-slice metrics (difficulty, subject, level).
    """

    uid: str
    question: str
    answer: str
    slice: str = "all"


class Task(Protocol):
    """A source of problems. `split` is "train" or "test"."""

    name: str

    def problems(self, split: str) -> list[Problem]: ...
