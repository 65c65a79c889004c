"""Sandbox overhead and throughput on this machine: ``python -m grpolab.sandbox.bench [--n 200] [--host-views]``.

Runs a trivial program (one function, two asserts) `n` times one after another on one slot (per-program wall time:
start, namespaces, the run's root with its private copies, rlimits, fork, the two uid drops, load, two calls over
the wire, verdict, kill, cleanup; median and p95), then `n` times through the pool (programs per second with every
core busy), and prints both with the isolation used and the machine's load average. ``--host-views`` measures the
fallback root instead (read-only views of the host's directories, no private copies: what the copies cost). For a
before/after comparison across commits, run the same command in a checkout of each (``git worktree add``) on an
idle machine, interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from . import runner
from .detect import detect
from .limits import SandboxLimits
from .pool import SandboxPool
from .runner import Job, run_job

PROGRAM = "def f(x):\n    return x * x\n"
CASES = ("assert f(2) == 4", "assert f(-3) == 9")


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 0.5)
    2.5
    """
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (pos - lo)


def measure(n: int, limits: SandboxLimits) -> dict:
    isolation = detect(limits)
    job = Job(PROGRAM, CASES)
    latencies = []
    for _ in range(n):
        t0 = time.perf_counter()
        result = run_job(job, limits, isolation, 0)
        latencies.append(time.perf_counter() - t0)
        assert result.all_passed, (result.infra_error, result.cases)
    pool = SandboxPool(limits, isolation)
    t0 = time.perf_counter()
    results = pool.run_many([job] * n)
    elapsed = time.perf_counter() - t0
    pool.close()
    assert all(r.all_passed for r in results)
    return {
        "isolation": isolation.name,
        "n": n,
        "slots": pool.size,
        "overhead_median_ms": round(1000 * statistics.median(latencies), 1),
        "overhead_p95_ms": round(1000 * percentile(latencies, 0.95), 1),
        "programs_per_s": round(n / elapsed, 2),
        "load_average_1min": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--workers", type=int, default=0, help="pool slots (0 = CPU cores)")
    parser.add_argument("--host-views", action="store_true", help="the fallback root: no private copies")
    args = parser.parse_args()
    if args.host_views:
        runner.stdlib_image = lambda python: None  # what run_job copies from: nothing, so the fallback root
    out = measure(args.n, SandboxLimits(workers=args.workers))
    print(json.dumps({**out, "root": "host views" if args.host_views else "private copies"}))


if __name__ == "__main__":
    main()
