"""The Problem record and the Task interface every task source implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

PROMPT_INSTRUCTION = "Reason briefly, then put the final answer in \\boxed{}."


@dataclass(frozen=True)
class Problem:
    """One verifiable problem.

    uid:         stable identifier (e.g. "gsm8k/test/17" or "arithmetic/3+4").
    question:    the problem text shown to the model (without the answer-format instruction).
    answer:      the gold final answer as a plain string ("18", "-7", "\\frac{1}{2}"); for a code task a
                 reference solution (what a baseline may imitate), never what the reward compares against.
    slice:       a label for per-slice metrics (difficulty, subject, level).
    data:        task data a reward needs beyond the gold string, e.g. a code task's tests
                 (grpolab.tasks.code: ``{"kind": "code", "tests": [...], ...}``). Empty for answer tasks. It is not
                 part of the hash of a Problem (a mapping is not hashable) but is part of the data hash of a run.
    instruction: the answer-format instruction appended to the question in the prompt.
    """

    uid: str
    question: str
    answer: str
    slice: str = "all"
    data: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=True, repr=False)
    instruction: str = PROMPT_INSTRUCTION


class Task(Protocol):
    """A source of problems. `split` is "train" or "test"."""

    name: str

    def problems(self, split: str) -> list[Problem]: ...


def normalise_problem_text(text: str) -> str:
    """Lower case, runs of whitespace as one space: the form problem identities are hashed from (grpolab.manifest)."""
    return " ".join(text.lower().split())
