"""The environment interface, the registry of built-in environments, user environments from a Python file, and the
``agent`` task (its problems are the initial states of episodes).

An environment is a class; one instance plays one episode:

    class MyEnv(AgentEnv):
        tools = [Tool("lookup", "lookup(key) returns the value of key", my_lookup)]   # optional
        def reset(self, problem, rng): ...      -> the first observation (text)
        def step(self, action): ...             -> (observation text, done)  -- the model's turn without a tool call
        def reward(self): ...                   -> float, read once when the episode ends
        @classmethod
        def problems(cls, split, n, seed, difficulty): ...  -> list[Problem], train and test disjoint
        @classmethod
        def expert(cls, problem, turns): ...    -> the scripted solver's next turn (optional; grpolab.agents.expert)

A turn with a tool call (grpolab.agents.tools) is answered by the runner with the tool's result and never reaches
``step``. ``requires_tools`` says the task cannot be solved honestly without a tool (the report flags rewards
reached without one); ``observation_role`` is the chat role observations are rendered as.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..tasks import register_task
from .tools import Tool

if TYPE_CHECKING:  # grpolab.tasks imports this module (its `agent` task): no import of grpolab.tasks at load time
    from ..tasks.base import Problem

AGENT_KIND = "agent"


class AgentEnv(abc.ABC):
    """The base of the built-in environments (subclassing it is optional: any class with the methods works). Its
    episode methods are abstract, so a subclass that forgets one is refused when it is loaded (load_env), not half-way
    through an episode."""

    tools: list[Tool] = []
    requires_tools: bool = False
    observation_role: str = "user"

    @abc.abstractmethod
    def reset(self, problem: Problem, rng: random.Random) -> str: ...

    @abc.abstractmethod
    def step(self, action: str) -> tuple[str, bool]: ...

    @abc.abstractmethod
    def reward(self) -> float: ...

    # and, for a task of its own, a classmethod problems(split, n, seed, difficulty) -> list[Problem] (load_env checks)


@dataclass(frozen=True)
class EpisodeLimits:
    """The bounds of every episode: model turns, sampled tokens per turn, tokens in the whole episode (model and
    environment tokens after the prompt), and seconds per environment or tool call."""

    max_turns: int = 4
    max_turn_tokens: int = 64
    max_total_tokens: int = 256
    time_limit_s: float = 5.0

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> "EpisodeLimits":
        return cls(**data)


ENVIRONMENTS: dict[str, type] = {}  # built-in environments by name; each registers itself (register_environment)


def register_environment(name: str):
    """Class decorator: make an AgentEnv subclass the built-in environment `name` (task.options.env: NAME). The built-ins
    (calc, guess, lookup) register when grpolab.agents is imported; this module never imports them."""

    def register(cls: type) -> type:
        ENVIRONMENTS[name] = cls
        return cls

    return register


def builtin_envs() -> dict[str, type]:
    return dict(ENVIRONMENTS)


_LOADED: dict[str, type] = {}


def load_env(ref: str, field: str = "task.options.env") -> type:
    """The environment class `ref` names: a built-in (``calc``, ``guess``) or ``path/file.py:Class`` /
    ``package.module:Class``; ConfigError naming `field` otherwise."""
    envs = builtin_envs()
    if ref in envs:
        return envs[ref]
    if ref in _LOADED:
        return _LOADED[ref]
    if not isinstance(ref, str) or ":" not in ref:
        raise ConfigError(f"{field}: expected one of {', '.join(sorted(envs))} or 'path/to/file.py:Class', got {ref!r}")
    from ..rewards.user import _load_module, _split_reference

    where, name = _split_reference(field, ref)
    cls = getattr(_load_module(field, where), name, None)
    if not inspect.isclass(cls):
        raise ConfigError(f"{field}: {where} has no class {name!r}")
    missing = [
        m
        for m in ("reset", "step", "reward", "problems")
        if not callable(getattr(cls, m, None)) or m in getattr(cls, "__abstractmethods__", ())
    ]
    if missing:
        raise ConfigError(
            f"{field}: {ref} lacks {', '.join(missing)}; an environment needs reset(problem, rng), "
            "step(action) -> (observation, done), reward() and problems(split, n, seed, difficulty)"
        )
    for tool in getattr(cls, "tools", []):
        if not isinstance(tool, Tool):
            raise ConfigError(f"{field}: {ref}.tools must hold grpolab.agents.tools.Tool records, got {tool!r}")
    _LOADED[ref] = cls
    return cls


def horizon_slice(calls: int) -> str:
    """The horizon slice of an instance an expert solves with `calls` tool calls (``problem.data["expert_calls"]``):
    calls=0, calls=1, calls=2 or calls=3+ -- evaluation reports success per slice (grpolab.evaluation.episodes)."""
    return f"calls={calls}" if calls < 3 else "calls=3+"


def is_agent_problem(problem: Problem) -> bool:
    return problem.data.get("kind") == AGENT_KIND


def _positive(field: str, value: Any, kind: type = int) -> Any:
    ok = isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool) and value > 0
    if not ok:
        raise ConfigError(
            f"task.options.{field}: expected {'a number' if kind is float else 'an integer'} > 0, got {value!r}"
        )
    return value


class AgentTask:
    """Task ``agent``: episodes of environment `env` (a built-in name or 'path/file.py:Class'); each problem is an
    initial state and carries the episode bounds in its data."""

    name = "agent"

    def __init__(
        self,
        env: str,
        seed: int = 0,
        num_train: int = 2000,
        num_test: int = 200,
        difficulty: int = 1,
        max_turns: int = 4,
        max_turn_tokens: int = 64,
        max_total_tokens: int = 256,
        time_limit_s: float = 5.0,
    ):
        self.env_ref, self.env_cls = env, load_env(env)
        self.seed, self.difficulty = seed, _positive("difficulty", difficulty)
        self.sizes = {"train": _positive("num_train", num_train), "test": _positive("num_test", num_test)}
        self.limits = EpisodeLimits(
            _positive("max_turns", max_turns),
            _positive("max_turn_tokens", max_turn_tokens),
            _positive("max_total_tokens", max_total_tokens),
            float(_positive("time_limit_s", time_limit_s, float)),
        )

    def problems(self, split: str) -> list[Problem]:
        from ..tasks.base import Problem

        if split not in self.sizes:
            raise ConfigError(f"task agent: unknown split {split!r}; expected train or test")
        made = self.env_cls.problems(split, self.sizes[split], self.seed, self.difficulty)
        if not isinstance(made, list) or not all(isinstance(p, Problem) for p in made):
            raise ConfigError(
                f"task.options.env: {self.env_ref}.problems({split!r}, ...) must return a list of Problem"
            )
        data = {"kind": AGENT_KIND, "env": self.env_ref, "limits": dataclasses.asdict(self.limits)}
        return [dataclasses.replace(p, data={**p.data, **data}) for p in made]

    def close(self) -> None:
        """Let go of what the environment holds beyond its episodes (a server the task started); nothing here."""


register_task("agent", AgentTask)
