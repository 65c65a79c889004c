#!/usr/bin/env python
"""What touching memory costs on this machine: pages the process gets for the first time against pages it reuses.

    python benchmarks/fresh_memory.py                 # 8 GiB, one GiB at a time
    python benchmarks/fresh_memory.py --gib 16 --pause 30

Where memory is backed up front the two should be close (not measured here). On a virtual machine whose guest
memory the host backs lazily (and takes back when the guest frees it), the first write to a guest page the host
has not backed yet costs far more, and it is paid again whenever the process needs memory it has not held before:
a training run's first update (gradients, optimizer moments, activations), and every checkpoint written through
the page cache (docs/performance.md, "End to end"; speed.checkpoint_direct_io). Printed: seconds per GiB for each GiB written
fresh, then for the same GiB written again (reused), their ratio; with --pause, a second process after the pause
shows whether memory the first one freed is cheap again or went back to the host.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def touch(gib: int) -> tuple[list[float], list[float]]:
    """(seconds to write each GiB the first time, seconds to write it again), holding every GiB until the end."""
    import torch

    held, fresh, again = [], [], []
    for _ in range(gib):
        t = time.perf_counter()
        x = torch.empty(1 << 30, dtype=torch.uint8)
        x.fill_(1)
        fresh.append(time.perf_counter() - t)
        t = time.perf_counter()
        x.fill_(2)
        again.append(time.perf_counter() - t)
        held.append(x)
    return fresh, again


def report(label: str, fresh: list[float], again: list[float]) -> None:
    f, a = statistics.median(fresh), statistics.median(again)
    print(
        f"{label}: first write {f:.2f} s/GiB (each GiB: {' '.join(f'{x:.2f}' for x in fresh)}), "
        f"written again {a:.2f} s/GiB, ratio {f / a:.1f}x"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=int, default=8, help="GiB to hold at the end (stay well below the free memory)")
    p.add_argument("--pause", type=float, default=0.0, help="seconds before a second process does the same")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        report("process", *touch(args.gib))
        return 0
    cmd = [sys.executable, __file__, "--worker", "--gib", str(args.gib)]
    subprocess.run(cmd, check=True)
    if args.pause:
        time.sleep(args.pause)
        print(f"after {args.pause:.0f} s:", end=" ", flush=True)
        subprocess.run(cmd, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
