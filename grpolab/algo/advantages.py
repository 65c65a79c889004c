"""Group-relative advantages: A_i = (R_i - baseline_i) / scale_i, broadcast to every token of o_i.

Two orthogonal registries (docs/design.md section 4):

* baseline  -- ``group_mean`` (b_i = mean_g R, sample included: GRPO), ``leave_one_out``
  (b_i = mean_{j != i} R_j: RLOO).
* scaling   -- ``group_std`` (s_i = std_g R + eps: GRPO), ``batch_std`` (s = std over the batch + eps),
  ``none`` (s = 1: Dr. GRPO / RLOO).

Rules that hold for every combination:

* statistics are computed in float64 over the *valid* members of a group only (invalid rewards are NaN
  or flagged, excluded and given A = 0);
* a group whose valid rewards are all equal (max - min <= ``resolution``) or that has fewer than two valid
  members carries no signal: every member gets exactly A = 0 and the group is reported in ``zero_std``.
  No epsilon turns rounding noise into a fake signal (docs/design.md section 10).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Callable

import torch

REWARD_RESOLUTION = 1e-9


class Baseline(StrEnum):
    GROUP_MEAN = "group_mean"
    LEAVE_ONE_OUT = "leave_one_out"


class Scaling(StrEnum):
    GROUP_STD = "group_std"
    BATCH_STD = "batch_std"
    NONE = "none"


class StdKind(StrEnum):
    POPULATION = "population"  # divide by n
    SAMPLE = "sample"  # divide by n - 1 (Bessel), as torch.std() does by default


@dataclass(frozen=True)
class Advantages:
    """advantages: [P, G] float64; zero_std: [P] bool (group carries no signal); valid: [P, G] bool."""

    advantages: torch.Tensor
    zero_std: torch.Tensor
    valid: torch.Tensor


def _masked_mean(r: torch.Tensor, valid: torch.Tensor, dim: int | None) -> torch.Tensor:
    n = valid.sum(dim=dim, keepdim=dim is not None).clamp(min=1)
    return torch.where(valid, r, 0.0).sum(dim=dim, keepdim=dim is not None) / n


def _masked_std(r: torch.Tensor, valid: torch.Tensor, dim: int | None, kind: StdKind) -> torch.Tensor:
    """std = sqrt(sum_valid (R - mean)^2 / (n - ddof)), ddof = 0 (population) or 1 (sample)."""
    mean = _masked_mean(r, valid, dim)
    ddof = 1 if kind == StdKind.SAMPLE else 0
    n = valid.sum(dim=dim, keepdim=dim is not None)
    sq = torch.where(valid, (r - mean) ** 2, 0.0).sum(dim=dim, keepdim=dim is not None)
    return torch.sqrt(sq / (n - ddof).clamp(min=1))


def baseline_group_mean(r: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """b_i = (1/n) sum_{j valid} R_j (the sample itself included)."""
    return _masked_mean(r, valid, dim=1).expand_as(r)


def baseline_leave_one_out(r: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """b_i = (sum_{j valid} R_j - R_i) / (n - 1) (RLOO; needs n >= 2, else the group is zero-signal)."""
    total = torch.where(valid, r, 0.0).sum(dim=1, keepdim=True)
    n = valid.sum(dim=1, keepdim=True)
    return (total - torch.where(valid, r, 0.0)) / (n - 1).clamp(min=1)


def scale_group_std(r: torch.Tensor, valid: torch.Tensor, eps: float, kind: StdKind) -> torch.Tensor:
    """s_i = std_{j in group(i), valid}(R_j) + eps."""
    return (_masked_std(r, valid, dim=1, kind=kind) + eps).expand_as(r)


def scale_batch_std(r: torch.Tensor, valid: torch.Tensor, eps: float, kind: StdKind) -> torch.Tensor:
    """s = std over every valid reward of the batch + eps (one number for all samples)."""
    return (_masked_std(r, valid, dim=None, kind=kind) + eps).expand_as(r)


def scale_none(r: torch.Tensor, valid: torch.Tensor, eps: float, kind: StdKind) -> torch.Tensor:
    """s = 1."""
    return torch.ones_like(r)


BASELINES: dict[Baseline, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    Baseline.GROUP_MEAN: baseline_group_mean,
    Baseline.LEAVE_ONE_OUT: baseline_leave_one_out,
}
SCALINGS: dict[Scaling, Callable[[torch.Tensor, torch.Tensor, float, StdKind], torch.Tensor]] = {
    Scaling.GROUP_STD: scale_group_std,
    Scaling.BATCH_STD: scale_batch_std,
    Scaling.NONE: scale_none,
}


def zero_signal_groups(
    rewards: torch.Tensor, valid: torch.Tensor, resolution: float = REWARD_RESOLUTION
) -> torch.Tensor:
    """[P] bool: True where max_valid R - min_valid R <= resolution, or fewer than 2 valid members."""
    r = rewards.to(torch.float64)
    hi = torch.where(valid, r, -torch.inf).amax(dim=1)
    lo = torch.where(valid, r, torch.inf).amin(dim=1)
    return (valid.sum(dim=1) < 2) | ((hi - lo) <= resolution)


def compute_advantages(
    rewards: torch.Tensor,
    valid: torch.Tensor | None = None,
    *,
    baseline: Baseline = Baseline.GROUP_MEAN,
    scaling: Scaling = Scaling.GROUP_STD,
    eps: float = 1e-6,
    std_kind: StdKind = StdKind.SAMPLE,
    resolution: float = REWARD_RESOLUTION,
) -> Advantages:
    """A_i = (R_i - b_i) / s_i on rewards [P, G]; exactly 0 for invalid samples and zero-signal groups.

    >>> r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.1, 0.1, 0.1, 0.1]])
    >>> out = compute_advantages(r, baseline=Baseline.GROUP_MEAN, scaling=Scaling.NONE)
    >>> out.advantages.tolist()
    [[0.75, -0.25, -0.25, -0.25], [0.0, 0.0, 0.0, 0.0]]
    >>> out.zero_std.tolist()
    [False, True]
    """
    r = rewards.to(torch.float64)
    if valid is None:
        valid = torch.ones_like(r, dtype=torch.bool)
    valid = valid & torch.isfinite(r)
    r = torch.where(valid, r, 0.0)
    zero = zero_signal_groups(r, valid, resolution)
    centered = r - BASELINES[Baseline(baseline)](r, valid)
    adv = centered / SCALINGS[Scaling(scaling)](r, valid, eps, StdKind(std_kind))
    keep = valid & ~zero.unsqueeze(1)
    return Advantages(advantages=torch.where(keep, adv, 0.0), zero_std=zero, valid=valid)
