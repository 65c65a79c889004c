"""Bradley-Terry reward-model math: the pairwise loss, pair accuracy and its interval (pure functions)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of the preferences under the Bradley-Terry model.

        P(chosen > rejected) = sigmoid(r_c - r_r)
        L = -(1/N) sum_i log sigmoid(r_c,i - r_r,i) = (1/N) sum_i softplus(r_r,i - r_c,i)

    with gradients dL/dr_c,i = -sigmoid(r_r,i - r_c,i) / N and dL/dr_r,i = +sigmoid(r_r,i - r_c,i) / N
    (softplus: no overflow for large margins). The loss depends on the margin only: adding one constant to every
    score changes nothing.

    >>> round(bradley_terry_loss(torch.tensor([0.0]), torch.tensor([0.0])).item(), 6)  # log 2
    0.693147
    """
    if chosen.shape != rejected.shape:
        raise ValueError(f"chosen {tuple(chosen.shape)} and rejected {tuple(rejected.shape)} scores differ in shape")
    return F.softplus(rejected - chosen).mean()


def pair_outcomes(chosen: Sequence[float], rejected: Sequence[float]) -> list[float]:
    """1 where the chosen completion scores higher, 0 where lower, 0.5 for a tie.

    >>> pair_outcomes([2.0, 0.0, 1.0], [1.0, 1.0, 1.0])
    [1.0, 0.0, 0.5]
    """
    return [1.0 if c > r else 0.0 if c < r else 0.5 for c, r in zip(chosen, rejected)]


def pair_accuracy_interval(
    outcomes: Sequence[float],
    clusters: Sequence[str] | None = None,
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> dict[str, float]:
    """Pair accuracy (mean outcome) and its percentile-bootstrap (1 - alpha) interval.

    Pairs of one prompt are not independent, so with `clusters` (the prompt of each pair) whole prompts are
    resampled: acc* = sum of the outcomes of the drawn prompts / number of their pairs (a cluster bootstrap).

    >>> pair_accuracy_interval([1.0, 1.0, 1.0, 1.0])
    {'accuracy': 1.0, 'ci_low': 1.0, 'ci_high': 1.0, 'n': 4}
    """
    v = np.asarray(outcomes, dtype=float)
    if v.size == 0:
        raise ValueError("pair accuracy of no pairs")
    keys = list(clusters) if clusters is not None else list(range(v.size))
    index = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    ids = np.array([index[k] for k in keys])
    sums, counts = np.bincount(ids, weights=v), np.bincount(ids).astype(float)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(sums), (n_boot, len(sums)))
    boot = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return {"accuracy": float(v.mean()), "ci_low": float(lo), "ci_high": float(hi), "n": int(v.size)}
