"""Rewards from executed tests (docs/code.md): ``pass_fraction`` (the share of the problem's tests that pass) and
``all_pass`` (1.0 only when every test passes).

The code is extracted from the completion (``extract_code``, rule ``EXTRACTION_RULE``, recorded on the objective
card), put after the problem's ``prefix`` where it has one (HumanEval), and run in the sandbox
(grpolab.sandbox) against the problem's trusted tests -- the ``tests`` and, for the visible-vs-hidden gap, the
``shown`` ones -- all completions of a batch in parallel on the pool. A program that does not parse, raises,
exits early or exceeds a limit fails its tests and gets 0 with a reason (syntax, error, wrong_answer, timeout,
limit, exit); only a failure of the sandbox itself makes a sample invalid.
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..rollout.stop import PYTHON_FENCES, fenced_blocks
from ..sandbox import ExecResult, Job, SandboxLimits, shared_pool
from ..tasks.base import Problem
from ..tasks.code import entry_points, is_code_problem

EXTRACTION_RULE = (
    "the first fenced code block tagged python, py, python3 or untagged (other languages' blocks are "
    "skipped), up to its closing fence or the end of the completion; without such a block, the whole "
    "completion"
)


@dataclass(frozen=True)
class Scored:
    """What a reward returns when it can say why: ``value`` (None: invalid, ``error`` says why), the ``reason``
    it is not full marks, and per-sample numbers for metrics (``extras``, e.g. ``code/shown_pass``)."""

    value: float | None
    reason: str | None = None
    extras: Mapping[str, float] = field(default_factory=dict)
    error: str | None = None


def extract_code(completion: str) -> str:
    """The program in a completion (rule: EXTRACTION_RULE).

    >>> extract_code("Here:\\n```python\\ndef f(x):\\n    return x\\n```\\nDone.")
    'def f(x):\\n    return x'
    >>> extract_code("```bash\\nls\\n```\\n```\\nx = 1\\n```")
    'x = 1'
    >>> extract_code("```python\\ndef f(): pass")
    'def f(): pass'
    >>> extract_code("def g(): return 2")
    'def g(): return 2'
    """
    lines = completion.split("\n")
    for info, start, end in fenced_blocks(completion):
        if info in PYTHON_FENCES:
            return "\n".join(lines[start + 1 : end])
    return completion


def build_program(code: str, data: Mapping[str, Any]) -> str:
    """The program to run: the problem's prefix (HumanEval's prompt) and then the code -- after a blank line when
    the code defines the entry point itself, else as the continuation of the prefix's function.

    >>> build_program("def f(): return 1", {"prefix": "import os\\ndef f():\\n", "entry_point": "f"})
    'import os\\ndef f():\\n\\n\\ndef f(): return 1'
    >>> build_program("    return 1", {"prefix": "def f():\\n", "entry_point": "f"})
    'def f():\\n    return 1'
    """
    prefix, entry = data.get("prefix") or "", data.get("entry_point") or ""
    if not prefix:
        return code
    if entry and re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
        return prefix + "\n\n" + code
    return prefix + code


def code_job(completion: str, problem: Problem) -> tuple[Job, int, list[int], list[int]]:
    """(job, number of reward tests, indices of shown cases, indices of hidden reward tests) for one completion.

    The job's cases are the reward tests followed by the shown statements that are not among them."""
    if not is_code_problem(problem):
        raise ValueError(
            f"problem {problem.uid} has no tests; pass_fraction / all_pass need a code task (mbpp, humaneval, pyfunc)"
        )
    data = problem.data
    tests, shown = list(data["tests"]), list(data.get("shown") or ())
    cases = tests + [s for s in shown if s not in tests]
    shown_idx = [i for i, c in enumerate(cases) if c in shown]
    hidden_idx = [i for i in range(len(tests)) if cases[i] not in shown]
    job = Job(
        build_program(extract_code(completion), data),
        tuple(cases),
        data.get("setup") or "",
        data.get("time_limit_s"),
        entry_points(problem),
    )
    return job, len(tests), shown_idx, hidden_idx


def _mean_ok(result: ExecResult, idx: list[int]) -> float:
    return sum(result.cases[i].ok for i in idx) / len(idx) if idx else math.nan


def outcome(result: ExecResult, n_tests: int, shown_idx: list[int], hidden_idx: list[int], all_pass: bool) -> Scored:
    """The reward of one run: pass fraction (or all-pass) over the reward tests, the first failing test's reason,
    and the shown / hidden pass rates and the run time as extras. A sandbox failure is invalid."""
    if result.infra_error:
        return Scored(None, None, {}, result.infra_error)
    tests = result.cases[:n_tests]
    passed = sum(c.ok for c in tests)
    failed = next((c for c in tests if not c.ok), None)
    value = float(passed == n_tests) if all_pass else passed / n_tests
    extras = {
        "code/shown_pass": _mean_ok(result, shown_idx),
        "code/hidden_pass": _mean_ok(result, hidden_idx),
        "code/run_s": result.wall_s,
    }
    return Scored(value, failed.reason if failed else None, extras)


class CodeRunner:
    """Runs a batch of completions against their problems' tests on the shared pool; remembers the last batch so
    ``pass_fraction`` and ``all_pass`` weighted together run each program once."""

    def __init__(self, limits: SandboxLimits | None = None):
        self.limits = limits or SandboxLimits()
        self._lock = threading.Lock()
        self._last: tuple[tuple, list] | None = None

    def run(self, completions: Sequence[str], problems: Sequence[Problem]) -> list[tuple[ExecResult | Exception, Any]]:
        """Per completion: (its ExecResult, or the exception that kept it from running; its code_job layout)."""
        key = (tuple(completions), tuple(p.uid for p in problems))
        with self._lock:
            if self._last and self._last[0] == key:
                return self._last[1]
        layouts: list[Any] = []
        futures: list[Any] = []
        pool = None
        for completion, problem in zip(completions, problems):
            try:
                job, *layout = code_job(completion, problem)
            except ValueError as exc:
                layouts.append(None)
                futures.append(exc)
                continue
            pool = pool or shared_pool(self.limits)
            layouts.append(layout)
            futures.append(pool.submit(job))
        out = [(f if isinstance(f, Exception) else f.result(), layout) for f, layout in zip(futures, layouts)]
        with self._lock:
            self._last = (key, out)
        return out

    def scores(
        self, completions: Sequence[str], problems: Sequence[Problem], all_pass: bool
    ) -> list[Scored | Exception]:
        return [
            run if isinstance(run, Exception) else outcome(run, *layout, all_pass=all_pass)
            for run, layout in self.run(completions, problems)
        ]


def code_reward_specs(limits: SandboxLimits | None = None) -> dict[str, dict[str, Any]]:
    """The keyword arguments of the RewardSpecs ``pass_fraction`` and ``all_pass`` sharing one runner."""
    runner = CodeRunner(limits)

    def pass_fraction_many(completions: Sequence[str], problems: Sequence[Problem]) -> list[Scored | Exception]:
        return runner.scores(completions, problems, all_pass=False)

    def all_pass_many(completions: Sequence[str], problems: Sequence[Problem]) -> list[Scored | Exception]:
        return runner.scores(completions, problems, all_pass=True)

    def one(many):
        def fn(completion: str, problem: Problem) -> Scored:
            result = many([completion], [problem])[0]
            if isinstance(result, Exception):
                raise result
            return result

        return fn

    where = "run in the sandbox against the problem's tests (docs/code.md)"
    return {
        "pass_fraction": dict(
            fn=one(pass_fraction_many),
            batch=pass_fraction_many,
            takes_problem=True,
            time_limit_s=None,
            description=f"share of the tests that pass, code {where}",
        ),
        "all_pass": dict(
            fn=one(all_pass_many),
            batch=all_pass_many,
            takes_problem=True,
            time_limit_s=None,
            description=f"1.0 if every test passes, code {where}",
        ),
    }
