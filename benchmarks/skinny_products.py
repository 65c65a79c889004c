#!/usr/bin/env python
"""Where a decode step's matrix products go: each product of SmolLM2-135M's shapes at decode size (G rows) and at
training size, as PyTorch computes it for an nn.Linear (F.linear) against two equivalent formulations, in one run.

    OMP_NUM_THREADS=2 python benchmarks/skinny_products.py            # rows 8, 32, 512
    OMP_NUM_THREADS=2 python benchmarks/skinny_products.py --rows 8 --repeats 50

For y = x W^T with x [M, K] and W [N, K] (nn.Linear's layout):

  F.linear        what every nn.Linear of the model runs
  x @ W^T (copy)  the product against a transposed, contiguous copy of W
  (W @ x^T)^T     the same product with the weight as the left operand

The three are the same sum in a different order (equal up to float rounding). The decode step's products are the
M = G rows; the output head [M x 576] @ [576 x 49152] is the largest. Prints milliseconds and GFLOP/s (2 M K N
flops) per formulation, and the ratio of the best to F.linear.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cpu_features  # noqa: E402

# (K, N) of SmolLM2-135M's products: attention q/o, k/v (3 KV heads x 64), MLP gate/up and down, the output head
SHAPES = [(576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152)]


def median_seconds(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(m: int, k: int, n: int, repeats: int) -> dict[str, float]:
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)
    wt = w.t().contiguous()
    ways = {"F.linear": lambda: torch.nn.functional.linear(x, w), "x @ W^T (copy)": lambda: x @ wt,
            "(W @ x^T)^T": lambda: (w @ x.t()).t()}
    ref = ways["F.linear"]()
    for name, fn in ways.items():  # the same product, whatever the order of the sums
        torch.testing.assert_close(fn(), ref, rtol=1e-4, atol=1e-3, msg=lambda s, name=name: f"{name}: {s}")
    return {name: median_seconds(fn, repeats) for name, fn in ways.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[8, 32, 512])
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    print(f"machine: {cpu_features()}  threads: {torch.get_num_threads()}  torch {torch.__version__}")
    print("| M x K x N | F.linear ms (GFLOP/s) | x @ W^T (copy) | (W @ x^T)^T | best / F.linear |")
    print("|---|---|---|---|---|")
    for m in args.rows:
        for k, n in SHAPES:
            sec = measure(m, k, n, args.repeats)
            cells = [f"{s * 1e3:.2f} ({2 * m * k * n / s / 1e9:.0f})" for s in sec.values()]
            print(f"| {m} x {k} x {n} | {' | '.join(cells)} | {min(sec.values()) / sec['F.linear']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
