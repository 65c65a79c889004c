"""Progress lines for the report's long steps (safety probe, pass@k sampling, capability eval): a heartbeat that
prints the step's latest progress and elapsed time every ``every`` seconds from a daemon thread while the step
runs. It only prints; what the step computes is untouched."""

from __future__ import annotations

import threading
import time
from typing import Callable


class Heartbeat:
    """``with Heartbeat(log, "safety: base model") as hb: ...`` -- log("safety: base model: <state> (40 s)") every
    `every` seconds until the block ends, then one line with the total time. ``hb.progress(what, done, total)`` (the
    shape of grpolab.evaluation.heldout.Progress) updates the state shown."""

    def __init__(self, log: Callable[[str], None], what: str, every: float = 20.0) -> None:
        if every <= 0:
            raise ValueError(f"Heartbeat every={every}: expected seconds > 0")
        self.log, self.what, self.every = log, what, every
        self.state = "running"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = 0.0

    def progress(self, what: str, done: int, total: int) -> None:
        self.state = f"{what} {done}/{total}"

    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            self.log(f"{self.what}: {self.state} ({self.elapsed():.0f} s)")

    def __enter__(self) -> "Heartbeat":
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._beat, name="grpolab-report-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if exc_type is None:
            self.log(f"{self.what}: done in {self.elapsed():.0f} s")
