"""A pool of sandbox slots sized to the cores: programs run in parallel, each slot with its own sandbox uid (so a
fork bomb in one slot cannot use up the process count of another). Pools of one process never share a uid: each
takes the next free slots above its limits' base uid (the training reward's pool and the held-out evaluation's
pool, say). Two processes on one machine should use different ``uid`` bases.

``submit`` returns a future, so a caller can hand programs in while it still generates (overlap); ``run_many``
runs a batch and returns the results in input order. One pool per distinct set of limits is shared by the whole
process (``shared_pool``).
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from .detect import detect
from .isolation import Isolation
from .limits import SandboxLimits
from .runner import CaseResult, ExecResult, Job, run_job

_taken: dict[int, int] = {}  # base uid -> slots handed out to pools of this process
_taken_lock = threading.Lock()


def _allocate(base: int, size: int) -> int:
    """The first of `size` slots above `base` no other pool of this process uses."""
    with _taken_lock:
        first = _taken.get(base, 0)
        _taken[base] = first + size
        return first


class SandboxPool:
    """`size` slots (limits.pool_size by default) running jobs under `isolation` (detected when None)."""

    def __init__(self, limits: SandboxLimits | None = None, isolation: Isolation | None = None, size: int = 0):
        self.limits = limits or SandboxLimits()
        self.isolation = isolation or detect(self.limits)
        self.size = size or self.limits.pool_size
        self.first_slot = _allocate(self.limits.uid, self.size)
        self._slots: queue.SimpleQueue[int] = queue.SimpleQueue()
        for slot in range(self.first_slot, self.first_slot + self.size):
            self._slots.put(slot)
        self._executor = ThreadPoolExecutor(self.size, thread_name_prefix="grpolab-sandbox")

    def _run(self, job: Job) -> ExecResult:
        """One job on a free slot. Whatever goes wrong in the runner stays this job's infrastructure error (an
        invalid sample), never an exception that would take its batch down."""
        slot = self._slots.get()
        try:
            result = run_job(job, self.limits, self.isolation, slot)
        except Exception as exc:
            result = ExecResult(
                [CaseResult(False, None, "sandbox failure")] * len(job.cases),
                0.0,
                f"the sandbox failed: {type(exc).__name__}: {exc}"[:500],
            )
        finally:
            self._slots.put(slot)
        result.meta["slot"] = slot
        return result

    def submit(self, job: Job) -> "Future[ExecResult]":
        return self._executor.submit(self._run, job)

    def run_many(self, jobs: list[Job]) -> list[ExecResult]:
        """Every job's result, in input order."""
        return [f.result() for f in [self.submit(job) for job in jobs]]

    def close(self) -> None:
        self._executor.shutdown(wait=True)


_pools: dict[SandboxLimits, SandboxPool] = {}
_lock = threading.Lock()


def shared_pool(limits: SandboxLimits | None = None) -> SandboxPool:
    """The process-wide pool for `limits` (created on first use)."""
    limits = limits or SandboxLimits()
    with _lock:
        if limits not in _pools:
            _pools[limits] = SandboxPool(limits)
        return _pools[limits]
