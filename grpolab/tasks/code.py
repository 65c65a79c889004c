"""What every code task puts into a Problem (grpolab.tasks.mbpp, humaneval, pyfunc; docs/code.md).

A code problem's ``data`` (JSON-serialisable, so it is part of the run's data hash):

- ``kind``: "code".
- ``tests``: trusted test statements (``assert f(3) == 9``, or ``check(__solution__("f"))`` for HumanEval), one
  test case each; the training reward is the share of them that pass (``pass_fraction``) or whether all do
  (``all_pass``).
- ``shown``: the test statements shown in the prompt. The reward runs them too, for the visible-vs-hidden gap
  (a policy that special-cases the shown examples passes them and fails the others); a shown statement counts
  toward the reward only where it is also in ``tests`` (MBPP: yes; pyfunc: never, its tests are hidden).
- ``setup``: trusted code the judge runs before the tests (MBPP's ``test_setup_code``; HumanEval's prompt and
  ``check`` definition).
- ``prefix``: code placed before the completion's code in the program (HumanEval's prompt, so helper functions it
  defines exist); "" otherwise.
- ``entry_point``: the function the tests call.
- ``time_limit_s``: the wall-clock limit of one run of the program with all its tests, where the task sets one
  tighter than the sandbox's (pyfunc: 2 s; its functions run in microseconds); None otherwise.

``answer`` holds a reference solution (for baselines and data checks), never what a reward compares against.
"""

from __future__ import annotations

import ast
from typing import Any, Sequence

from grpolab.sandbox.names import global_names
from grpolab.tasks.base import Problem

CODE_INSTRUCTION = "Answer with the complete Python function in one ```python code block."


def code_problem(
    uid: str,
    question: str,
    reference: str,
    tests: Sequence[str],
    *,
    shown: Sequence[str] = (),
    setup: str = "",
    prefix: str = "",
    entry_point: str = "",
    slice: str = "all",
    instruction: str = CODE_INSTRUCTION,
    time_limit_s: float | None = None,
) -> Problem:
    """A Problem carrying its tests in ``data`` (rules in the module docstring)."""
    data: dict[str, Any] = {
        "kind": "code",
        "tests": tuple(tests),
        "shown": tuple(shown),
        "setup": setup,
        "prefix": prefix,
        "entry_point": entry_point,
        "time_limit_s": time_limit_s,
    }
    return Problem(uid=uid, question=question, answer=reference, slice=slice, data=data, instruction=instruction)


def is_code_problem(problem: Problem) -> bool:
    """True for a problem whose reward runs its tests (``data["kind"] == "code"``)."""
    return hasattr(problem.data, "get") and problem.data.get("kind") == "code"


def entry_points(problem: Problem) -> tuple[str, ...]:
    """The program names the problem's tests call, which the tests see even where a builtin has the name: the
    problem's ``entry_point``, else the top-level functions and classes of its reference solution that the tests
    read (MBPP names no entry point; its problem 126 calls a function named ``sum``).

    >>> from grpolab.tasks.code import code_problem
    >>> reference = "def sum(a, b):\\n    return 0\\ndef h():\\n    pass"
    >>> entry_points(code_problem("t", "q", reference, ["assert sum(1, 2) == 3"]))
    ('sum',)
    """
    data = problem.data
    if data.get("entry_point"):
        return (data["entry_point"],)
    try:
        tree = ast.parse(problem.answer or "")
        tests = (data.get("setup") or "", *data["tests"], *(data.get("shown") or ()))
        reads = set().union(*(global_names(t)[0] for t in tests))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    return tuple(sorted(defined & reads))
