"""Which isolation this machine allows: each candidate setup (grpolab.sandbox.isolation) is tried on a trivial
program, the first that passes is used and cached per interpreter."""

from __future__ import annotations

import logging
import os
import platform
import shutil
import stat
import sys
import threading
from dataclasses import replace

from .errors import SandboxError
from .isolation import SECCOMP_MACHINES, Isolation, candidates
from .limits import SandboxLimits
from .runner import Job, run_job

log = logging.getLogger("grpolab")


def prefix_closed(uid_drop: bool, python: str) -> str | None:
    """Without a mount namespace the sandbox uid must reach the interpreter's files itself: the first directory
    on the way that others may not enter, else None."""
    if not uid_drop:
        return None
    prefix = os.path.realpath(sys.base_prefix if not python else os.path.dirname(os.path.dirname(python)))
    current = "/"
    for part in [p for p in prefix.split("/") if p]:
        current = os.path.join(current, part)
        if not os.stat(current).st_mode & stat.S_IXOTH:
            return current
    return None


def probe(candidate: Isolation, limits: SandboxLimits) -> str | None:
    """None when a trivial program passes its test under `candidate`, else why not."""
    if candidate.unshare and not candidate.mounts:
        closed = prefix_closed(candidate.uid_drop, limits.python)
        if closed:
            return f"{closed} is closed to other users, so the sandbox uid cannot load the interpreter"
    if not candidate.unshare and candidate.uid_drop:
        closed = prefix_closed(True, limits.python)
        if closed:
            return f"{closed} is closed to other users, so the sandbox uid cannot load the interpreter"
    result = run_job(
        Job("def f(x):\n    return [x, {'k': (x,)}]\n", ("assert f(2) == [2, {'k': (2,)}]",)),
        replace(limits, wall_s=max(limits.wall_s, 10.0), cpu_s=max(limits.cpu_s, 5.0)),
        candidate,
        0,
    )
    if result.all_passed:
        return None
    return result.infra_error or f"{result.reason}: {result.detail}"


_lock = threading.Lock()


_found: dict[str, Isolation] = {}


def detect(limits: SandboxLimits) -> Isolation:
    """The best isolation this machine allows (cached per interpreter); SandboxError when nothing works."""
    key = limits.python or sys.executable
    with _lock:
        if key in _found:
            return _found[key]
        root = os.geteuid() == 0
        seccomp = platform.machine() in SECCOMP_MACHINES
        tried = []
        for candidate in candidates(shutil.which("unshare"), root, seccomp):
            why = probe(candidate, limits)
            if why is None:
                if tried:
                    log.warning("sandbox: using the %r setup (%s)", candidate.name, "; ".join(tried))
                for line in candidate.missing():
                    log.warning("sandbox: %s", line)
                _found[key] = candidate
                return candidate
            tried.append(f"{candidate.name!r} failed: {why}")
        raise SandboxError(
            "sandbox: no setup could run a program here (" + "; ".join(tried) + "); "
            "set reward.sandbox.python to an interpreter the sandbox user can read"
        )
