"""Reward calls under a time limit: one daemon worker thread runs them, the caller waits at most the limit.

A call that runs over raises TimeoutError and its worker is abandoned -- a new one serves later calls, so a hanging
reward never hangs the trainer. A thread cannot be killed: an abandoned call keeps running in the background until
it returns (or the process exits), so a reward that spins forever in pure Python keeps costing CPU. Rewards that
can run away (untrusted code) belong in a sandboxed process (grpolab.sandbox), not here.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Sequence

from grpolab.rewards.spec import RewardShapeError
from grpolab.tasks.base import Problem


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


def call_batched(
    fn: Callable[..., Any], limit_s: float | None, completions: Sequence[str], problems: Sequence[Problem]
) -> list[Any]:
    """fn(completions, problems) of a batched user reward under one time limit for the whole call; a return that is
    not a list or tuple of one value per completion raises RewardShapeError."""
    try:
        out = call_with_time_limit(fn, (list(completions), list(problems)), limit_s)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc} (one batched call for {len(completions)} completions)") from None
    if not isinstance(out, (list, tuple)):
        raise RewardShapeError(
            f"returned {type(out).__name__} {out!r:.40}, expected a list of one float or None per completion"
        )
    if len(out) != len(completions):
        raise RewardShapeError(
            f"returned {len(out)} results for {len(completions)} completions; expected one float or None per completion"
        )
    return list(out)
