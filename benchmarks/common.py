"""Shared pieces of the benchmarks: FLOP accounting of a GRPO step, this machine's matrix rate, CPU features (all three
in the package, grpolab.training.flops, re-exported here), representative matrix shapes, a least-squares line.
tests/test_benchmark_flops.py tests them without the `bench` extra.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Iterable, Sequence

from grpolab.training.flops import (  # noqa: F401  (re-exported: the benchmarks import them from here)
    ModelShape,
    cpu_features,
    group_forward_flops,
    matmul_rate,
    sequence_forward_flops,
    span_flops,
    step_flops,
)


def representative_shapes(
    shape: ModelShape, d_ff: int | None = None, tokens: int = 512, decode_rows: int = 32
) -> list[tuple[str, int, int, int]]:
    """(label, m, k, n): a training-size MLP product, a decode-size one, and a training-size LM-head product."""
    ff = d_ff or 4 * shape.d_model
    return [
        (f"train mlp  [{tokens} x {shape.d_model}] @ [{shape.d_model} x {ff}]", tokens, shape.d_model, ff),
        (f"decode mlp [{decode_rows} x {shape.d_model}] @ [{shape.d_model} x {ff}]", decode_rows, shape.d_model, ff),
        (
            f"lm head    [{tokens} x {shape.d_model}] @ [{shape.d_model} x {shape.vocab}]",
            tokens,
            shape.d_model,
            shape.vocab,
        ),
    ]


# --------------------------------------------------------------------------------------------- statistics


def median(xs: Iterable[float]) -> float:
    s = sorted(xs)
    if not s:
        return math.nan
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> dict[str, float]:
    """Least squares y = intercept + slope * x, with R^2 (NaN where undefined).

    >>> f = linear_fit([1, 2, 3], [3, 5, 7])
    >>> round(f["slope"], 6), round(f["intercept"], 6), round(f["r2"], 6)
    (2.0, 1.0, 1.0)
    """
    n = len(xs)
    if n < 2 or n != len(ys):
        return {"slope": math.nan, "intercept": math.nan, "r2": math.nan, "n": n}
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return {"slope": math.nan, "intercept": math.nan, "r2": math.nan, "n": n}
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys))
    return {"slope": slope, "intercept": intercept, "r2": 1 - ss_res / ss_tot if ss_tot else math.nan, "n": n}


def shape_dict(shape: ModelShape) -> dict[str, int]:
    return asdict(shape)
