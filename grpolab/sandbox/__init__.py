"""Running untrusted programs against trusted tests (docs/code.md): a judge process holds the tests and compares
values, the program runs in a second process behind a value-only wire, both in a fresh namespace sandbox with
rlimits, an unprivileged uid, no network, an empty environment and a private temporary directory.

    pool = shared_pool(SandboxLimits(wall_s=5))
    [result] = pool.run_many([Job("def f(x): return x + 1", ("assert f(1) == 2",))])
    result.all_passed, result.cases[0].reason

Modules: runner (one program run, from the trainer's side), pool (slots sized to the cores, each its own uid),
limits (SandboxLimits), isolation and detect (which isolation this machine allows), confine (how the judge confines a
run), seccomp (the program's system-call allow-list), harness (the judge and worker processes) over wire (their
value-only frames), names (which names the tests get), image (the private copies of the files a run may read),
errors, bench (overhead on this machine).

Imports nothing else of grpolab (its own errors: sandbox/errors.py); checked by a contract in pyproject.toml.
"""

from .detect import detect
from .isolation import Isolation
from .limits import SandboxLimits
from .pool import SandboxPool, shared_pool
from .runner import REASONS, CaseResult, ExecResult, Job, run_job

__all__ = [
    "REASONS",
    "CaseResult",
    "ExecResult",
    "Isolation",
    "Job",
    "SandboxLimits",
    "SandboxPool",
    "detect",
    "run_job",
    "shared_pool",
]
