"""Task sources: a registry of task factories, and the prompt rendering shared by all tasks.

make_task(name, **kwargs) builds a task from config; an unknown name or option raises
ConfigError naming it and listing the accepted ones. A name ``FAMILY:MEMBER`` is a member of a task family
(TASK_FAMILIES: ``reasoning_gym:<generator>``), whose factory checks its own options. Packages above this one
register their tasks with register_task (grpolab.agents: the ``agent`` task), so this package never imports them.
A task whose answers its own library scores names that checker in ``Problem.data["kind"]`` (ANSWER_CHECKERS,
``answer_checker``): the ``correct`` reward asks it, never the held-out metric.

Modules: base (Problem, Task, prompt rendering), prompting (chat-template token ids), code (code problems and
their entry points), one module per data set (arithmetic, gsm8k, math500, humaneval, mbpp, pyfunc with its
pyfunc_templates, jsonl, hf), reasoning_gym (reasoning-gym's procedural generators as a task family).
May import: errors, sandbox (the names a program may bind); reasoning_gym (the optional library). Imported by
nearly everything.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from grpolab.errors import ConfigError
from grpolab.tasks.arithmetic import ArithmeticTask
from grpolab.tasks.base import PROMPT_INSTRUCTION, Problem, Task
from grpolab.tasks.code import CODE_INSTRUCTION, code_problem, is_code_problem
from grpolab.tasks.gsm8k import GSM8KTask
from grpolab.tasks.hf import HFTask
from grpolab.tasks.humaneval import HumanEvalTask
from grpolab.tasks.jsonl import JsonlTask
from grpolab.tasks.math500 import Math500Task
from grpolab.tasks.mbpp import MBPPTask
from grpolab.tasks.pyfunc import PyFuncTask
from grpolab.tasks.reasoning_gym import KIND as REASONING_GYM_KIND
from grpolab.tasks.reasoning_gym import ReasoningGymTask, reasoning_gym_task
from grpolab.tasks.reasoning_gym import score_answer as reasoning_gym_score

TASKS: dict[str, Callable[..., Task]] = {
    "arithmetic": ArithmeticTask,
    "gsm8k": GSM8KTask,
    "hf": HFTask,
    "humaneval": HumanEvalTask,
    "jsonl": JsonlTask,
    "math500": Math500Task,
    "mbpp": MBPPTask,
    "pyfunc": PyFuncTask,
}  # and "agent" (multi-turn episodes of an environment), registered by grpolab.agents when it is imported
# Task families: "FAMILY:MEMBER" builds factory(MEMBER, **options); the factory checks its own options.
TASK_FAMILIES: dict[str, Callable[..., Task]] = {"reasoning_gym": reasoning_gym_task}
# A task's own answer checker, by Problem.data["kind"]: checker(extracted answer or None, problem) -> reward.
ANSWER_CHECKERS: dict[str, Callable[[str | None, Problem], float]] = {REASONING_GYM_KIND: reasoning_gym_score}


def answer_checker(problem: Problem) -> Callable[[str | None, Problem], float] | None:
    """The checker of the task that made `problem` (ANSWER_CHECKERS), or None: compare with the gold string."""
    data = problem.data
    return ANSWER_CHECKERS.get(data.get("kind")) if hasattr(data, "get") else None


def register_task(name: str, factory: Callable[..., Task]) -> None:
    """Make `factory` the task `name` (task.name: NAME). Packages above this one (grpolab.agents) register their
    tasks here, so this package never imports them."""
    TASKS[name] = factory


def _options(factory: Callable[..., Task]) -> tuple[list[str], list[str]]:
    """(all keyword options, the required ones) a task factory takes."""
    params = [
        p for p in inspect.signature(factory).parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    return [p.name for p in params], [p.name for p in params if p.default is inspect.Parameter.empty]


def make_task(name: str, **kwargs: Any) -> Task:
    """Build the task registered as `name` with `kwargs` as its options.

    >>> make_task("arithmetic", digits=2).name
    'arithmetic'
    """
    family, sep, member = name.partition(":")
    if sep and family in TASK_FAMILIES:
        if not member:
            raise ConfigError(f"task.name: {name!r} names no member of the task family {family!r} ({family}:NAME)")
        return TASK_FAMILIES[family](member, **kwargs)
    if name not in TASKS:
        raise ConfigError(
            f"task.name: unknown task {name!r}; expected one of {', '.join(sorted(TASKS))}"
            + (" (the agent task registers when grpolab.agents is imported)" if name == "agent" else "")
            + (f" (a member of the task family: {name}:NAME)" if name in TASK_FAMILIES else "")
        )
    factory = TASKS[name]
    accepted, required = _options(factory)
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise ConfigError(
            f"task.options.{unknown[0]}: unknown option for task {name!r}; accepted: {', '.join(accepted)}"
        )
    missing = [option for option in required if option not in kwargs]
    if missing:
        raise ConfigError(f"task.options.{missing[0]}: required for task {name!r}")
    return factory(**kwargs)


def render_prompt(problem: Problem) -> str:
    """The user message for a problem: its question, a newline, then its answer-format instruction
    (PROMPT_INSTRUCTION for answer tasks, CODE_INSTRUCTION for code tasks)."""
    return problem.question + "\n" + problem.instruction


__all__ = [
    "ANSWER_CHECKERS",
    "CODE_INSTRUCTION",
    "TASKS",
    "ArithmeticTask",
    "GSM8KTask",
    "HFTask",
    "HumanEvalTask",
    "JsonlTask",
    "MBPPTask",
    "Math500Task",
    "PROMPT_INSTRUCTION",
    "PyFuncTask",
    "Problem",
    "ReasoningGymTask",
    "TASK_FAMILIES",
    "Task",
    "answer_checker",
    "code_problem",
    "is_code_problem",
    "make_task",
    "render_prompt",
]
