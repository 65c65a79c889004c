"""The process-wide settings a Trainer changes, held for its run and put back when the run ends (docs/robustness.md,
"Process-wide settings").

Two of a run's choices can only be made for the whole process:

- ``train.deterministic``: torch's deterministic algorithms on (warn only) and its NaN fill of new memory off
  (grpolab.training.reproducibility);
- ``speed.keep_freed_memory`` on a CPU: three glibc mallopt values (grpolab.training.cpu_memory).

A Trainer applies its run's values when it is built (before its models load) and again when ``fit`` starts, and puts
back what it found when ``fit`` returns or raises, on ``close()``, or on leaving ``with Trainer(...)``:

- torch's settings are set both ways -- a deterministic run turns deterministic algorithms on, a non-deterministic
  run turns them off for its run (so a run always computes as its manifest says, whatever another trainer or the
  user left) -- and what was there before is read and put back exactly;
- the mallopt values are set only by a run that asks for them; glibc cannot report them, so they go back to what
  glibc started the process with (cpu_memory.restore_freed_memory) and what malloc kept is returned.

Each ProcessSettings puts back the state it found when it first applied: trainers closed in the reverse order of
their construction (or one at a time, the usual case: each ``fit`` ends before the next trainer is built) leave the
process as it was; out of that order the last one closed decides.
"""

from __future__ import annotations

from typing import Any

from . import cpu_memory, reproducibility

DETERMINISTIC_RUN = (True, True, False)  # deterministic algorithms, warn only, no NaN fill (reproducibility.py)
NON_DETERMINISTIC_RUN = (False, False, True)  # torch's defaults


class ProcessSettings:
    """The settings of one run (``deterministic``, ``keep_freed_memory``). `apply` sets them (again, when called
    again); `restore` puts back the state found by the first `apply` (once; again only after another `apply`).
    Usable as a context manager."""

    def __init__(self, deterministic: bool, keep_freed_memory: bool):
        self.deterministic = deterministic
        self.keep_freed_memory = keep_freed_memory
        self.found: Any = None  # torch's deterministic state before the first apply; None: not applied

    def apply(self) -> None:
        if self.found is None:
            self.found = reproducibility.deterministic_state()
        reproducibility.set_deterministic_state(DETERMINISTIC_RUN if self.deterministic else NON_DETERMINISTIC_RUN)
        if self.keep_freed_memory:
            cpu_memory.keep_freed_memory()

    def restore(self) -> None:
        if self.found is None:
            return
        reproducibility.set_deterministic_state(self.found)
        self.found = None
        if self.keep_freed_memory:
            cpu_memory.restore_freed_memory()

    def __enter__(self) -> "ProcessSettings":
        self.apply()
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()
