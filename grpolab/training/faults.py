"""Faults inside the training loop: Ctrl-C, non-finite losses and gradients.

Ctrl-C (SIGINT) policy, installed by Trainer.fit in the main thread; SIGTERM (what a cluster scheduler sends
before pre-empting a job) is treated exactly like Ctrl-C:

- during rollout and reward scoring the step has changed nothing that matters yet: the interrupt is raised at
  once, the trainer rolls the step back (RNG states and prompt cursor as they were after the last step) and
  writes a checkpoint of the last completed step -- exactly what an uninterrupted run had at that point;
- during the update, the periodic eval, logging and checkpointing (the "critical section") the interrupt is
  deferred to the end of the step, which is then checkpointed;
- a second Ctrl-C inside the critical section stops at once without a new checkpoint; the newest complete one
  is untouched (checkpoints are atomic).

Either way the trainer raises TrainingInterrupted, which the CLI prints (naming the checkpoint) and exits 130.
"""

from __future__ import annotations

import logging
import signal
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

log = logging.getLogger("grpolab")


class TrainingInterrupted(Exception):
    """Training stopped by Ctrl-C. `checkpoint` is the newest complete checkpoint (None: none yet)."""

    def __init__(self, run_dir: Path, checkpoint: Path | None, written: bool):
        self.run_dir, self.checkpoint, self.written = Path(run_dir), checkpoint, written
        again = f"continue with: grpolab train --resume {self.run_dir}"
        if checkpoint is None:
            msg = f"interrupted before the first checkpoint; {again} (starts again from step 0)"
        elif written:
            msg = f"interrupted: checkpoint written to {checkpoint}; {again}"
        else:
            msg = f"interrupted: no new checkpoint; the newest complete one is {checkpoint}; {again}"
        super().__init__(msg)


class InterruptGuard:
    """SIGINT / SIGTERM handling of the loop (see the module docstring). A no-op outside the main thread."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.critical = False
        self.requested = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "InterruptGuard":
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        if self.critical and not self.requested:
            self.requested = True
            log.warning(
                "%s: finishing this step, then writing a checkpoint (interrupt again to stop at once)",
                signal.Signals(signum).name,
            )
            return
        raise KeyboardInterrupt

    @contextmanager
    def critical_section(self) -> Iterator[None]:
        self.critical = True
        try:
            yield
        finally:
            self.critical = False


class NonFiniteTracker:
    """Counts steps whose loss or gradient was NaN/Inf (their optimizer steps are skipped by the updater) and
    decides when to give up: after `limit` consecutive ones."""

    def __init__(self, limit: int):
        self.limit = limit
        self.streak = 0

    def record(self, step: int, bad: bool, skipped_total: int) -> bool:
        """Record one training step; True when the run must stop."""
        if not bad:
            self.streak = 0
            return False
        self.streak += 1
        log.warning(
            "step %d: non-finite loss or gradient, update skipped (%d in a row, stop after %d; %d skipped in total)",
            step,
            self.streak,
            self.limit,
            skipped_total,
        )
        return self.streak >= self.limit
