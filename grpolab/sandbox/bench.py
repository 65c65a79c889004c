"""Sandbox overhead and throughput on this machine: ``python -m grpolab.sandbox.bench [--n 200] [--host-views]``;
``--channel SLOT_S`` measures instead the channels between two concurrent runs that the sandbox leaves open.

Runs a trivial program (one function, two asserts) `n` times one after another on one slot (per-program wall time:
start, namespaces, the run's root with its private copies, rlimits, fork, the two uid drops, load, two calls over
the wire, verdict, kill, cleanup; median and p95), then `n` times through the pool (programs per second with every
core busy), and prints both with the isolation used and the machine's load average. ``--host-views`` measures the
fallback root instead (read-only views of the host's directories, no private copies: what the copies cost). For a
before/after comparison across commits, run the same command in a checkout of each (``git worktree add``) on an
idle machine, interleaved.

``--channel [--kind cpu|memory]``: a sender run forks two busy processes (plain loops, or copies of buffers larger
than the caches) in each 1-bit slot of `SLOT_S` seconds and sleeps in each 0-bit slot; a receiver run on the
pool's other slot counts its own steps per slot (fewer: its CPU or memory bandwidth was taken), both timed against
the shared monotonic clock. Decoded against the neighbouring slots' counts (``decode``: no knowledge of the
message); prints the bit errors and the capacity of the binary symmetric channel that error rate gives.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import time
from dataclasses import replace

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


# the sender's busy work in a 1-slot and the receiver's counted step: plain loops (CPU time), or copies of buffers
# larger than the caches (the memory bus, shared even between pinned CPUs)
WORK = {
    "cpu": ("", "pass", ""),
    "memory": ("buf = bytearray(48 << 20)", "bytes(buf)", "buf = bytearray(24 << 20)"),
}
SENDER = (
    "def f():\n    {setup}\n    while time.monotonic() < T0:\n        time.sleep(0.001)\n"
    "    for i, bit in enumerate(BITS):\n        end, kids = T0 + (i + 1) * SLOT, []\n"
    "        for _ in range(2 * bit):\n            pid = os.fork()\n            if pid == 0:\n"
    "                while time.monotonic() < end - 0.01:\n                    {busy}\n                os._exit(0)\n"
    "            kids.append(pid)\n        for pid in kids:\n            os.waitpid(pid, 0)\n"
    "        while time.monotonic() < end:\n            time.sleep(0.002)\n    return 0\n"
)
RECEIVER = (
    "def f():\n    {setup}\n    counts = []\n    for i in range(len(BITS)):\n"
    "        start, end, n = T0 + i * SLOT + 0.1 * SLOT, T0 + (i + 0.9) * SLOT, 0\n"
    "        while time.monotonic() < start:\n            pass\n"
    "        while time.monotonic() < end:\n            {busy}\n            n += 1\n        counts.append(n)\n"
    "    print(counts, flush=True)\n    return 0\n"
)


def decode(counts: list[int], window: int = 6) -> list[int]:
    """Bits from the receiver's loop counts without knowledge of the message: a slot is a 1 when its count is
    below 85% of the highest count among its neighbours (``window`` slots either side), so a slow drift in the
    machine's other load moves the reference with it (a two-slot busy sender takes about a third of the CPU).

    >>> decode([100, 60, 98, 101, 62, 59, 99])
    [0, 1, 0, 0, 1, 1, 0]
    """
    out = []
    for i, count in enumerate(counts):
        reference = max(counts[max(0, i - window) : i + window + 1])
        out.append(int(count < 0.85 * reference))
    return out


def channel(slot_s: float, n_bits: int, limits: SandboxLimits, kind: str = "cpu") -> dict:
    """Send `n_bits` random bits from one run to a concurrent one through contention for the CPU or the memory
    bus (`kind`, module docstring)."""
    sender_setup, busy, receiver_setup = WORK[kind]
    rng = random.Random(0)
    bits = [rng.randint(0, 1) for _ in range(n_bits)]
    t0 = time.monotonic() + 3.0  # CLOCK_MONOTONIC is the same in every namespace of the host
    head = f"import os, time\nT0 = {t0!r}\nSLOT = {slot_s!r}\nBITS = {bits!r}\n"
    wall = n_bits * slot_s + 8
    pool = SandboxPool(replace(limits, wall_s=wall, cpu_s=wall), size=2)
    sender = head + SENDER.format(setup=sender_setup or "pass", busy=busy)
    receiver = head + RECEIVER.format(setup=receiver_setup or "pass", busy=busy)
    sent = pool.submit(Job(sender, ("assert f() == 0",), entry_points=("f",)))
    heard = pool.submit(Job(receiver, ("assert f() == 0",), entry_points=("f",)))
    sender, receiver = sent.result(), heard.result()
    pool.close()
    assert sender.all_passed and receiver.all_passed, (sender.cases, receiver.cases)
    counts = json.loads(receiver.stdout.strip())
    errors = sum(a != b for a, b in zip(decode(counts), bits))
    p = min(errors / n_bits, 0.5)
    entropy = 0.0 if p == 0 else -p * math.log2(p) - (1 - p) * math.log2(1 - p)
    return {
        "kind": kind,
        "slot_s": slot_s,
        "bits": n_bits,
        "errors": errors,
        "raw_bit_per_s": round(1 / slot_s, 2),
        "capacity_bit_per_s": round((1 - entropy) / slot_s, 2),
        "load_average_1min": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--workers", type=int, default=0, help="pool slots (0 = CPU cores)")
    parser.add_argument("--host-views", action="store_true", help="the fallback root: no private copies")
    parser.add_argument("--channel", type=float, default=0.0, help="measure the channel between two runs (slot s)")
    parser.add_argument("--kind", choices=sorted(WORK), default="cpu", help="the channel's carrier")
    args = parser.parse_args()
    if args.channel:
        print(json.dumps(channel(args.channel, args.n, SandboxLimits(workers=2), args.kind)))
        return
    if args.host_views:
        runner.stdlib_image = lambda python: None  # what run_job copies from: nothing, so the fallback root
    out = measure(args.n, SandboxLimits(workers=args.workers))
    print(json.dumps({**out, "root": "host views" if args.host_views else "private copies"}))


if __name__ == "__main__":
    main()
