"""Freed memory kept for reuse on a CPU (``train.keep_freed_memory``, on by default).

glibc's malloc serves every allocation above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and returns
it to the system on ``free``; the next tensor of that size faults in its pages again, one 4 KiB page at a time.
A training step allocates and frees the same large tensors every micro-batch (the [vocabulary x hidden] embedding
gradient, the bf16 casts of the weights, activations): on the quickstart the update took 0.84x its time in bf16
and 0.79x in fp32 with freed memory kept (benchmarks/keep_freed_memory.py, Intel AMX, docs/performance.md).

With these three ``mallopt`` settings malloc keeps what is freed and hands it out again:
    M_MMAP_MAX = 0            every allocation comes from the heap, none from a private mmap
    M_TRIM_THRESHOLD = 1 GiB  free memory at the heap's top is returned only beyond 1 GiB
    M_TOP_PAD = 256 MiB       the heap grows in steps of at least 256 MiB
The numbers computed are the same (it changes where memory comes from, not what is computed); a run's peak resident
memory may grow by what is kept (Intel AMX: +250 MiB over 6 bf16 quickstart steps, -50 MiB in fp32, +0.7 GiB over
the 30-step bf16 quickstart). What TRL users get from LD_PRELOADing jemalloc or tcmalloc, without a library to
install. Only glibc (Linux) has mallopt; elsewhere the run says so in one line and goes on with the system allocator.
"""

from __future__ import annotations

import ctypes
import logging
import platform
from typing import Any

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4  # glibc's malloc.h
SETTINGS = {"M_MMAP_MAX": (M_MMAP_MAX, 0), "M_TRIM_THRESHOLD": (M_TRIM_THRESHOLD, 1 << 30),
            "M_TOP_PAD": (M_TOP_PAD, 256 << 20)}


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
        log.info("train.keep_freed_memory: not a glibc system (%s); the system allocator is used as it is", platform.system())
        return False
    refused = [name for name, (param, value) in SETTINGS.items() if libc.mallopt(param, value) != 1]
    if refused:
        log.warning("train.keep_freed_memory: mallopt refused %s; freed memory may be returned to the system", refused)
    return not refused
