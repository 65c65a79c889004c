"""Freed memory kept for reuse on a CPU (``speed.keep_freed_memory``, on by default).

glibc's malloc serves every allocation above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and returns it
on ``free``, so the next tensor of that size faults its pages in again; a training step allocates and frees the same
large tensors every micro-batch (the embedding gradient, bf16 weight casts, activations). Three ``mallopt`` settings
make malloc keep what is freed and hand it out again (what jemalloc or tcmalloc give, without a library to install):
    M_MMAP_MAX = 0            every allocation comes from the heap, none from a private mmap
    M_TRIM_THRESHOLD = 1 GiB  free memory at the heap's top is returned only beyond 1 GiB
    M_TOP_PAD = 256 MiB       the heap grows in steps of at least 256 MiB
The numbers computed are the same; peak resident memory may grow by what is kept. Only glibc has mallopt; elsewhere
the run says so in one line and goes on with the system allocator.

The settings are the run's (grpolab.training.process_settings): at its end `restore_freed_memory` puts back what glibc
started the process with (glibc cannot read a mallopt value back: its defaults, or the MALLOC_*_ / GLIBC_TUNABLES
values of the environment) and returns what was kept (malloc_trim). What cannot be put back: docs/robustness.md,
"Process-wide settings". Speed and memory: docs/performance.md, "Levers" (freed memory kept for reuse).
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
from typing import Any, Mapping

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4  # glibc's malloc.h
SETTINGS = {
    "M_MMAP_MAX": (M_MMAP_MAX, 0),
    "M_TRIM_THRESHOLD": (M_TRIM_THRESHOLD, 1 << 30),
    "M_TOP_PAD": (M_TOP_PAD, 256 << 20),
}
GLIBC_DEFAULTS = {"M_MMAP_MAX": 65536, "M_TRIM_THRESHOLD": 128 << 10, "M_TOP_PAD": 128 << 10}
# where the environment sets each at process start: (the environment variable, the GLIBC_TUNABLES name)
STARTUP_SOURCES = {
    "M_MMAP_MAX": ("MALLOC_MMAP_MAX_", "glibc.malloc.mmap_max"),
    "M_TRIM_THRESHOLD": ("MALLOC_TRIM_THRESHOLD_", "glibc.malloc.trim_threshold"),
    "M_TOP_PAD": ("MALLOC_TOP_PAD_", "glibc.malloc.top_pad"),
}


def glibc() -> Any | None:
    """The running process's C library when it is glibc (its mallopt), else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    lib = ctypes.CDLL(None)
    return lib if hasattr(lib, "mallopt") else None


def keep_freed_memory(libc: Any | None = None) -> bool:
    """Apply SETTINGS through glibc's mallopt (process-wide, from the next allocation on, for the rest of the
    process: a notebook that builds a trainer keeps them); True when all took."""
    libc = libc if libc is not None else glibc()
    if libc is None:
        log.info(
            "speed.keep_freed_memory: not a glibc system (%s); the system allocator is used as it is", platform.system()
        )
        return False
    refused = [name for name, (param, value) in SETTINGS.items() if libc.mallopt(param, value) != 1]
    if refused:
        log.warning("speed.keep_freed_memory: mallopt refused %s; freed memory may be returned to the system", refused)
    return not refused


def startup_values(environ: Mapping[str, str] | None = None) -> dict[str, int]:
    """The values glibc started the process with, by SETTINGS name: GLIBC_TUNABLES (``name=value`` pairs joined by
    ``:``) over the MALLOC_*_ variable over glibc's default. A value that is not a whole number is skipped (glibc
    ignores it too)."""
    env = os.environ if environ is None else environ
    tunables = dict(item.split("=", 1) for item in env.get("GLIBC_TUNABLES", "").split(":") if "=" in item)
    values = dict(GLIBC_DEFAULTS)
    for name, (variable, tunable) in STARTUP_SOURCES.items():
        for given in (env.get(variable), tunables.get(tunable)):  # the tunable wins
            if given is not None and given.strip().isdigit():
                values[name] = int(given)
    return values


def restore_freed_memory(libc: Any | None = None, environ: Mapping[str, str] | None = None) -> bool:
    """Put the three SETTINGS back to what the process started with (`startup_values`) and return what malloc kept
    to the system (malloc_trim(0)); True when all took. Nothing to do without glibc."""
    libc = libc if libc is not None else glibc()
    if libc is None:
        return False
    start = startup_values(environ)
    refused = [name for name, (param, _) in SETTINGS.items() if libc.mallopt(param, start[name]) != 1]
    if refused:
        log.warning("speed.keep_freed_memory: mallopt refused to restore %s", refused)
    if hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
    return not refused
