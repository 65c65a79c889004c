"""Reward registry and weighted scoring of one completion.

A built-in reward is a plain function ``fn(completion, gold) -> float``; a user's own reward (config
``reward.functions``, grpolab.rewards.user) is ``fn(completion, problem) -> float | None``. ``RewardSet`` combines
the named ones as ``total = sum(weights[name] * fn(...))``. A reward that raises, times out or returns None / NaN /
a non-number makes the result invalid (``total`` is NaN and ``error`` says which reward failed and why); it is
never silently counted as 0.

Time limits: each ``RewardSpec`` declares ``time_limit_s`` (None = no limit), and it is enforced. Rewards run
in a daemon worker thread and the caller waits at most the limit; a call that runs over makes the result
invalid (``"<name>: TimeoutError: ..."``) and the worker is abandoned -- a new one serves later calls, so a
hanging reward never hangs the trainer. A thread cannot be killed: an abandoned call keeps running in the
background until it returns (or the process exits), so a reward that spins forever in pure Python keeps
costing CPU. Rewards that can run away (untrusted code) belong in a sandboxed process, not here.
"""

from __future__ import annotations

from math import isnan
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from grpolab.errors import ConfigError
from grpolab.rewards.math import correctness_reward, extract_answer, format_reward, normalize_answer
from grpolab.tasks.base import Problem


@dataclass(frozen=True)
class RewardSpec:
    """A registered reward: the function, what it measures, and its time limit in seconds (None = none)."""

    fn: Callable[[str, str], float]
    description: str
    time_limit_s: float | None = 5.0


class _Worker:
    """One daemon thread running calls from its queue, one at a time."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="grpolab-reward", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn, args, box, done = self.jobs.get()
            try:
                box["value"] = fn(*args)
            except BaseException as exc:  # reported to the caller, who decides
                box["error"] = exc
            done.set()


_worker: _Worker | None = None
_worker_lock = threading.Lock()


def call_with_time_limit(fn: Callable[..., Any], args: tuple, limit_s: float | None) -> Any:
    """fn(*args), raising TimeoutError when it has not returned within limit_s seconds (None: call directly).

    >>> call_with_time_limit(max, (1, 2), 1.0)
    2
    """
    global _worker
    if limit_s is None:
        return fn(*args)
    with _worker_lock:
        if _worker is None:
            _worker = _Worker()
        worker = _worker
        box: dict[str, Any] = {}
        done = threading.Event()
        worker.jobs.put((fn, args, box, done))
        try:
            finished = done.wait(limit_s)
        except BaseException:  # Ctrl-C while waiting: the worker may still be busy, do not reuse it
            _worker = None
            raise
        if not finished:
            _worker = None  # this one is stuck in fn: abandon it, the next call starts a fresh worker
            raise TimeoutError(f"exceeded its time limit of {limit_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


@dataclass(frozen=True)
class RewardResult:
    """Outcome of scoring one completion.

    ``components`` holds the unweighted value of every reward named in the weights (NaN for one
    that raised); ``total`` is their weighted sum, or NaN when ``invalid``; ``error`` is
    ``"<name>: <ExceptionType>: <message>"`` (several joined by ``"; "``) or None.
    """

    total: float
    components: dict[str, float] = field(default_factory=dict)
    invalid: bool = False
    error: str | None = None


REWARD_FUNCTIONS: dict[str, RewardSpec] = {
    "correct": RewardSpec(correctness_reward, "1.0 if the last boxed answer (or last number) equals the gold answer"),
    "format": RewardSpec(format_reward, "1.0 if the completion contains \\boxed{"),
}


def _as_reward(value: Any) -> float:
    """A reward function's return value as a float; None, NaN and non-numbers raise (the sample is invalid)."""
    if value is None:
        raise ValueError("returned None (no valid reward)")
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise TypeError(f"returned {type(value).__name__} {value!r:.40}, expected a float or None")
    out = float(value)
    if isnan(out):
        raise ValueError("returned NaN")
    return out


class RewardSet:
    """The weighted rewards of a run: built-ins (``fn(completion, gold)``) and the user's own functions
    (``fn(completion, problem)``, grpolab.rewards.user), each run under its time limit.

    ``score(completion, problem)`` gives ``total = sum(weights[name] * fn(...))``; a reward that raises, times out
    or returns None / NaN / a non-number makes the result invalid with the reason, never a silent 0.
    """

    def __init__(self, weights: dict[str, float], functions: dict[str, str] | None = None, time_limit_s: float | None = 5.0):
        from .user import load_reward_function

        self.weights = dict(weights)
        self.specs = dict(REWARD_FUNCTIONS)
        self.user: dict[str, Callable[..., Any]] = {}
        for name, ref in (functions or {}).items():
            field_path = f"reward.functions.{name}"
            if name in REWARD_FUNCTIONS:
                raise ConfigError(f"{field_path}: {name!r} is a built-in reward; give your function another name")
            fn = load_reward_function(field_path, ref)
            self.user[name] = fn
            self.specs[name] = RewardSpec(fn, f"user reward {ref}", time_limit_s)
        unknown = [name for name in self.weights if name not in self.specs]
        if unknown:
            raise ConfigError(
                f"reward.weights: unknown reward component(s) {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(map(repr, sorted(self.specs)))} (add your own under reward.functions)"
            )

    def score(self, completion: str, problem: Problem) -> RewardResult:
        components: dict[str, float] = {}
        errors: list[str] = []
        for name in self.weights:
            spec = self.specs[name]
            arg = problem if name in self.user else problem.answer
            try:
                components[name] = _as_reward(call_with_time_limit(spec.fn, (completion, arg), spec.time_limit_s))
            except Exception as exc:  # a broken reward must be visible, never a silent 0
                components[name] = float("nan")
                errors.append(f"{name}: {type(exc).__name__}: {exc}")
        if errors:
            return RewardResult(float("nan"), components, True, "; ".join(errors))
        total = sum(self.weights[name] * components[name] for name in self.weights)
        return RewardResult(float(total), components, False, None)


def score_completion(completion: str, gold: str, weights: dict[str, float]) -> RewardResult:
    """Weighted sum of the built-in rewards named in ``weights``; unknown names raise ConfigError.

    >>> r = score_completion("\\\\boxed{4}", "4", {"correct": 1.0, "format": 0.1})
    >>> r.total, r.components, r.invalid
    (1.1, {'correct': 1.0, 'format': 1.0}, False)
    """
    return RewardSet(weights).score(completion, Problem(uid="", question="", answer=gold))


__all__ = [
    "REWARD_FUNCTIONS",
    "RewardResult",
    "RewardSet",
    "RewardSpec",
    "call_with_time_limit",
    "correctness_reward",
    "extract_answer",
    "format_reward",
    "normalize_answer",
    "score_completion",
]
