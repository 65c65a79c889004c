"""Limits of one sandboxed program run, and the pool settings (docs/code.md, "The sandbox").

Every limit has a safe default; ``SandboxLimits.from_options`` builds them from a config mapping
(``reward.sandbox`` / ``--sandbox-option``) and names the field in one line when a value is wrong.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import SandboxConfigError

MIB = 1 << 20


@dataclass(frozen=True)
class SandboxLimits:
    """What one program may use. Sizes in MiB (``max_output_kb`` in KiB), times in seconds.

    wall_s:         wall-clock limit of the whole run (load + every test); then the process group is killed.
    cpu_s:          RLIMIT_CPU of each sandbox process (the program and the test judge).
    memory_mb:      RLIMIT_AS (address space) of each sandbox process.
    max_procs:      RLIMIT_NPROC: processes of the sandbox user (binds only after the drop to an unprivileged uid).
    max_open_files: RLIMIT_NOFILE.
    max_file_mb:    RLIMIT_FSIZE: the largest file the program may write.
    disk_mb:        size of the run's scratch tmpfs (with a mount namespace): the working directory, /tmp, /var/tmp
                    and /dev/shm share it.
    max_files:      files and directories the run may create in its scratch tmpfs (its inode limit).
    max_output_kb:  stdout and stderr are each kept up to this size; past 16x this in total the run is killed.
    workers:        programs run at the same time (0 = the number of CPU cores).
    uid:            first sandbox user id when running as root (one id per slot for programs: uid, uid + 1, ...;
                    their judges run as uid + 65536 + slot, so a program cannot signal its judge or change its limits).
    python:         the interpreter that runs programs ("" = this one); it runs with -S (standard library only).
    """

    wall_s: float = 20.0
    cpu_s: float = 10.0
    memory_mb: int = 512
    max_procs: int = 16
    max_open_files: int = 64
    max_file_mb: int = 16
    disk_mb: int = 32
    max_files: int = 2048
    max_output_kb: int = 64
    workers: int = 0
    uid: int = 60000
    python: str = ""

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None, field_prefix: str = "reward.sandbox") -> "SandboxLimits":
        """Limits from a mapping of overrides; an unknown key or a bad value raises SandboxConfigError naming it.

        >>> SandboxLimits.from_options({"wall_s": 2}).wall_s
        2.0
        """
        known = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in (options or {}).items():
            if key not in known:
                raise SandboxConfigError(f"{field_prefix}.{key}: unknown sandbox option; known: {', '.join(known)}")
            values[key] = _coerce(f"{field_prefix}.{key}", known[key].type, value)
        limits = cls(**values)
        limits.validate(field_prefix)
        return limits

    def validate(self, field_prefix: str = "reward.sandbox") -> None:
        """Range checks; SandboxConfigError naming the field."""
        checks = [
            ("wall_s", self.wall_s > 0),
            ("cpu_s", self.cpu_s > 0),
            ("memory_mb", self.memory_mb >= 64),
            ("max_procs", self.max_procs >= 2),
            ("max_open_files", self.max_open_files >= 16),
            ("max_file_mb", self.max_file_mb >= 1),
            ("disk_mb", self.disk_mb >= 1),
            ("max_files", self.max_files >= 16),
            ("max_output_kb", self.max_output_kb >= 1),
            ("workers", 0 <= self.workers <= 64),
            ("uid", 1 <= self.uid <= 2**31 - 65),
        ]
        for name, ok in checks:
            if not ok:
                bound = {
                    "memory_mb": ">= 64",
                    "max_procs": ">= 2 (the program and its test judge)",
                    "max_open_files": ">= 16",
                    "max_files": ">= 16",
                    "workers": "in 0..64",
                    "uid": "in 1..2**31-65",
                }.get(name, "> 0")
                raise SandboxConfigError(f"{field_prefix}.{name}: expected {bound}, got {getattr(self, name)!r}")

    @property
    def pool_size(self) -> int:
        """Concurrent programs: `workers`, or the number of CPU cores this process may use."""
        if self.workers:
            return self.workers
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except (AttributeError, OSError):
            return max(1, os.cpu_count() or 1)

    def rlimits(self) -> dict[str, tuple[int, int]]:
        """The rlimits (soft, hard) the sandbox sets on itself, by resource name.

        CPU: the soft limit sends SIGXCPU (the program dies of it), the hard one a second later SIGKILL. CORE: a
        hard limit of 1 byte, below any core file and the value the kernel reads as "no dump" for a core_pattern
        that pipes to a helper (0 would not stop that); the worker cannot raise it.

        >>> SandboxLimits(cpu_s=2.5).rlimits()["RLIMIT_CPU"]
        (3, 4)
        """
        cpu = max(1, int(-(-self.cpu_s // 1)))
        return {
            "RLIMIT_CPU": (cpu, cpu + 1),
            "RLIMIT_AS": (self.memory_mb * MIB, self.memory_mb * MIB),
            "RLIMIT_NPROC": (self.max_procs, self.max_procs),
            "RLIMIT_NOFILE": (self.max_open_files, self.max_open_files),
            "RLIMIT_FSIZE": (self.max_file_mb * MIB, self.max_file_mb * MIB),
            "RLIMIT_CORE": (1, 1),  # 1, not 0: the kernel's "never" for a core_pattern that pipes to a helper too
        }


def _coerce(field: str, tp: Any, value: Any) -> Any:
    """A config value as the field's type (ints accepted for floats; numeric strings from the command line)."""
    kind = {"float": float, "int": int, "str": str}.get(tp if isinstance(tp, str) else getattr(tp, "__name__", ""), str)
    if kind is str:
        if not isinstance(value, str):
            raise SandboxConfigError(f"{field}: expected a string, got {value!r}")
        return value
    if isinstance(value, str):
        try:
            value = float(value) if kind is float else int(value)
        except ValueError:
            pass
    ok = (
        isinstance(value, (int, float)) and not isinstance(value, bool) and (kind is float or float(value).is_integer())
    )
    if not ok:
        raise SandboxConfigError(f"{field}: expected {'a number' if kind is float else 'an integer'}, got {value!r}")
    return kind(value)
