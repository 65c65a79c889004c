#!/usr/bin/env python
"""Where a decode step's matrix products go: each product of SmolLM2-135M's shapes at decode size (G rows) and at
training size, as PyTorch computes it for an nn.Linear (F.linear) against equivalent formulations, in one run.

    OMP_NUM_THREADS=2 python benchmarks/skinny_products.py                 # rows 8, 32, 512; weights from memory
    OMP_NUM_THREADS=2 python benchmarks/skinny_products.py --rows 8 --dtype bfloat16
    OMP_NUM_THREADS=2 python benchmarks/skinny_products.py --hot           # one weight, hot in cache

For y = x W^T with x [M, K] and W [N, K] (nn.Linear's layout):

  F.linear        what every nn.Linear of the model runs
  x @ W^T (copy)  the product against a transposed, contiguous copy of W
  (W @ x^T)^T     the same product with the weight as the left operand
  prepacked       oneDNN's product against W reordered once into its blocked layout (grpolab/rollout/prepack.py,
                  what the decode loop does); "refused" where oneDNN cannot pack this dtype on this CPU

All are the same sum in a different order (checked equal up to float rounding). By default each timed call cycles
through enough distinct copies of W (at least --cold-mb of them) that every product reads its weight from memory, as
in a real decode step, where 135M parameters pass through the cache once per token; --hot multiplies one weight
again and again (in cache: a rate a decode step never sees -- this is how an earlier reading went wrong,
docs/performance.md). Prints milliseconds, GFLOP/s (2 M K N flops) and the weight's read rate in GB/s per
formulation, and the ratio of the best to F.linear.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cpu_features  # noqa: E402

# (K, N) of SmolLM2-135M's products: attention q/o, k/v (3 KV heads x 64), MLP gate/up and down, the output head
SHAPES = [(576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def median_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def prepacked(weights: list[torch.Tensor], rows: int) -> list[torch.Tensor] | None:
    """Each weight reordered once by oneDNN for `rows` rows; None where this build or CPU refuses."""
    try:
        return [torch.ops.mkldnn._reorder_linear_weight(w, rows) for w in weights]
    except (RuntimeError, AttributeError):
        return None


def measure(m: int, k: int, n: int, dtype: torch.dtype, copies: int, repeats: int) -> dict[str, float | None]:
    """Seconds per product for each formulation (None: refused), each timed call cycling through `copies` weights."""
    from grpolab.rollout.prepack import packed_linear

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=gen).to(dtype)
    ws = [torch.randn(n, k, generator=gen).to(dtype) for _ in range(copies)]
    wts = [w.t().contiguous() for w in ws]
    packs = prepacked(ws, m)
    ways = {
        "F.linear": lambda i: torch.nn.functional.linear(x, ws[i]),
        "x @ W^T (copy)": lambda i: x @ wts[i],
        "(W @ x^T)^T": lambda i: (ws[i] @ x.t()).t(),
    }
    if packs is not None:
        ways["prepacked"] = lambda i: packed_linear(packs[i], None, x)
    ref = ways["F.linear"](0).float()
    tol = {"rtol": 1e-4, "atol": 1e-3} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 0.5}
    for name, fn in ways.items():  # the same product, whatever the order of the sums
        torch.testing.assert_close(fn(0).float(), ref, **tol, msg=lambda s, name=name: f"{name}: {s}")
    sec = {
        name: median_seconds(lambda fn=fn: [fn(i) for i in range(copies)], repeats) / copies
        for name, fn in ways.items()
    }
    return {**sec, "prepacked": sec.get("prepacked")}  # always a prepacked column: None where refused


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[8, 32, 512])
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--hot", action="store_true", help="one weight multiplied again and again (in cache)")
    ap.add_argument("--cold-mb", type=int, default=256, help="without --hot: MB of distinct weights cycled through")
    args = ap.parse_args()
    dtype = DTYPES[args.dtype]
    print(f"machine: {cpu_features()}  threads: {torch.get_num_threads()}  torch {torch.__version__}")
    where = "hot in cache (one copy)" if args.hot else f"from memory (>= {args.cold_mb} MB cycled)"
    print(f"{args.dtype}, weights {where}")
    print("| M x K x N | F.linear ms (GFLOP/s, GB/s) | x @ W^T (copy) | (W @ x^T)^T | prepacked | best / F.linear |")
    print("|---|---|---|---|---|---|")
    for m in args.rows:
        for k, n in SHAPES:
            weight_bytes = k * n * dtype.itemsize
            copies = 1 if args.hot else max(2, math.ceil(args.cold_mb * 1e6 / weight_bytes))
            sec = measure(m, k, n, dtype, copies, args.repeats)
            cells = [
                "refused"
                if s is None
                else f"{s * 1e3:.2f} ({2 * m * k * n / s / 1e9:.0f}, {weight_bytes / s / 1e9:.1f})"
                for s in sec.values()
            ]
            best = min(s for s in sec.values() if s is not None)
            print(f"| {m} x {k} x {n} | {' | '.join(cells)} | {best / sec['F.linear']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
