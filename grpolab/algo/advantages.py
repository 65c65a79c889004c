"""Sequence advantages from outcome rewards, broadcast to every token of o_i: the group-relative family
A_i = (R_i - baseline_i) / scale_i (``compute_advantages``) and the pass@k advantage (``pass_at_k_advantages``).

Two orthogonal registries (docs/design.md section 4):

* baseline  -- ``group_mean`` (b_i = mean_g R, sample included: GRPO), ``leave_one_out``
  (b_i = mean_{j != i} R_j: RLOO), ``batch_mean`` (b = mean over every valid reward of the batch:
  REINFORCE++'s global baseline; with ``batch_std`` it is REINFORCE++'s whitening, one mean and one std for all).
* scaling   -- ``group_std`` (s_i = std_g R + eps: GRPO), ``batch_std`` (s = std over the batch + eps),
  ``none`` (s = 1: Dr. GRPO / RLOO).

Rules that hold for every combination:

* statistics are computed in float64 over the *valid* members only (invalid rewards are NaN or flagged,
  excluded and given A = 0);
* a set of samples that shares one baseline and whose valid rewards are all equal (max - min <= ``resolution``)
  or that has fewer than two valid members carries no signal: every member gets exactly A = 0 and is reported in
  ``zero_std``. That set is the group for the group baselines; for ``batch_mean`` it is the whole batch (a group
  whose rewards are all equal still differs from the batch mean, so it carries signal and is not zero_std).
  No epsilon turns rounding noise into a fake signal (docs/design.md section 10).
* ``batch_mean`` with ``group_std`` is refused: an all-equal group would be divided by eps alone.

The pass@k estimator (Chen et al. 2025) replaces baseline and scaling altogether; its rules are in
``pass_at_k_advantages``. So do MaxRL (``maxrl_advantages``: the group-centred reward divided by the group mean) and
GDPO (``gdpo_advantages``: each reward component normalised in its group, summed, then normalised over the batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from functools import lru_cache
from math import comb, sqrt
from typing import Callable

import torch

REWARD_RESOLUTION = 1e-9


class Baseline(StrEnum):
    GROUP_MEAN = "group_mean"
    LEAVE_ONE_OUT = "leave_one_out"
    BATCH_MEAN = "batch_mean"


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


def baseline_batch_mean(r: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """b = (1/n_B) sum_{j valid in the batch} R_j: one number for every sample (REINFORCE++'s global baseline)."""
    return _masked_mean(r, valid, dim=None).expand_as(r)


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
    Baseline.BATCH_MEAN: baseline_batch_mean,
}
BATCH_BASELINES = frozenset({Baseline.BATCH_MEAN})  # one baseline for the whole batch: zero signal is batch-wide
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


def _valid_rewards(rewards: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 rewards with invalid entries set to 0, valid mask): invalid = flagged, NaN or infinite."""
    r = rewards.to(torch.float64)
    if valid is None:
        valid = torch.ones_like(r, dtype=torch.bool)
    valid = valid & torch.isfinite(r)
    return torch.where(valid, r, 0.0), valid


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
    baseline, scaling = Baseline(baseline), Scaling(scaling)
    if baseline in BATCH_BASELINES and scaling == Scaling.GROUP_STD:
        raise ValueError(
            f"algorithm.scaling: expected batch_std or none with baseline {baseline.value}, got group_std "
            "(a group whose rewards are all equal would be divided by adv_eps alone)"
        )
    r, valid = _valid_rewards(rewards, valid)
    if baseline in BATCH_BASELINES:  # the batch shares one baseline: it carries signal unless all of it is equal
        zero = zero_signal_groups(r.reshape(1, -1), valid.reshape(1, -1), resolution).expand(r.shape[0])
    else:
        zero = zero_signal_groups(r, valid, resolution)
    centered = r - BASELINES[baseline](r, valid)
    adv = centered / SCALINGS[scaling](r, valid, eps, StdKind(std_kind))
    keep = valid & ~zero.unsqueeze(1)
    return Advantages(advantages=torch.where(keep, adv, 0.0), zero_std=zero, valid=valid)


# --------------------------------------------------------------------------------------------- pass@k


@dataclass(frozen=True)
class PassAtKGroup:
    """The pass@k statistics of one group of ``n`` valid samples of which ``n_pass`` pass (``pass_at_k_group``):
    ``rate`` is R (the unbiased pass@k estimate), ``sigma`` = sqrt(R (1 - R)), ``passing`` / ``failing`` the
    advantage of every passing / failing sample. Without signal (``signal`` False: R is 0 or 1) sigma, passing
    and failing are 0 and rate is 0 (nothing passes) or 1 (fewer than k failures)."""

    rate: float
    sigma: float
    passing: float
    failing: float
    signal: bool


@lru_cache(maxsize=4096)
def pass_at_k_group(n: int, n_pass: int, k: int, eps: float) -> PassAtKGroup:
    """Pass@k advantages of a group (Chen et al. 2025, arXiv 2508.10751, "analytical derivation").

    A group of N valid samples, N_pos = ``n_pass`` of them passing and N_neg = N - N_pos failing. Each of its
    C(N, k) k-subsets S is a virtual group of k attempts with reward r_S = 1 when any member passes:

    * mean over the subsets: R = 1 - C(N_neg, k) / C(N, k), the unbiased pass@k estimate (Chen et al. 2021);
    * r_S is 0/1, so its (population) std over the subsets is sigma = sqrt(R (1 - R));
    * a subset's GRPO advantage is (r_S - R) / sigma; a sample's advantage is the mean over the C(N-1, k-1)
      subsets that contain it. Every subset holding a passing sample passes, and C(N_neg-1, k-1) of a failing
      sample's subsets fail, so with q = C(N_neg-1, k-1) / C(N-1, k-1):

          A_pos = (1 - R) / sigma,    A_neg = (1 - R - q) / sigma = -(N_pos / N) q / sigma

      (1 - R = (N_neg / N) q, hence N_pos A_pos + N_neg A_neg = 0: the advantages sum to 0 over the group).

    What it estimates: sigma A_i + R = mean_{S containing i} r_S, and (k / N) sum_i mean_{S contains i}(r_S)
    grad log pi(o_i) = (1 / C(N, k)) sum_S r_S sum_{i in S} grad log pi(o_i), the average over all k-subsets of
    REINFORCE on k-attempt sets: an unbiased estimate of grad pass@k. Subtracting R (which contains o_i, as GRPO's
    group mean does) and dividing by sigma are GRPO's centring and scaling of that pass@k direction.

    k = 1: R = N_pos / N = p, q = 1, A_i = (1[pass_i] - p) / (sqrt(p (1 - p)) + eps): GRPO's group_mean +
    group_std with std_kind population, on the pass indicators 1[R_i >= threshold] rather than the raw rewards.

    Zero signal (every advantage exactly 0): R = 0 (no sample passes) or R = 1 (N_neg < k: every k-subset holds a
    passing sample -- this includes all-pass groups and groups with fewer than k valid samples). So a group needs
    at least k + 1 valid samples, one passing and k failing, and k = N never has signal. With signal,
    sigma >= sqrt(c (1 - c)) > 0 for c = 1 / C(N, k); the division is by sigma + eps (eps = algorithm.adv_eps:
    1e-6, the default, is the authors' released code, passk_adv.py; 0 is the paper's formula).

    R, 1 - R - q and R (1 - R) are exact rationals (math.comb), each rounded to float64 once.

    >>> g = pass_at_k_group(4, 1, 2, 0.0)  # C(4,2) = 6 pairs, 3 of them all-failing: R = 1/2, sigma = 1/2
    >>> (g.rate, g.sigma, g.passing, g.failing)
    (0.5, 0.5, 1.0, -0.3333333333333333)
    """
    if k < 1:
        raise ValueError(f"algorithm.pass_k: expected an integer >= 1, got {k}")
    if not 0 <= n_pass <= n:
        raise ValueError(f"pass@k: expected 0 <= n_pass <= n, got n_pass={n_pass}, n={n}")
    n_fail = n - n_pass
    if n_pass == 0 or n_fail < k:
        return PassAtKGroup(rate=float(n_pass > 0), sigma=0.0, passing=0.0, failing=0.0, signal=False)
    rate = 1 - Fraction(comb(n_fail, k), comb(n, k))
    q = Fraction(comb(n_fail - 1, k - 1), comb(n - 1, k - 1))
    sigma = sqrt(float(rate * (1 - rate)))
    return PassAtKGroup(
        rate=float(rate),
        sigma=sigma,
        passing=float(1 - rate) / (sigma + eps),
        failing=float(1 - rate - q) / (sigma + eps),
        signal=True,
    )


def pass_at_k_advantages(
    rewards: torch.Tensor, valid: torch.Tensor | None = None, *, k: int, threshold: float, eps: float
) -> Advantages:
    """Pass@k advantages on rewards [P, G] (``pass_at_k_group`` per group): a sample passes when it is valid and its
    reward is >= ``threshold``; N counts the valid samples only; invalid samples and zero-signal groups get exactly
    A = 0, the latter reported in ``zero_std``.

    >>> r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    >>> out = pass_at_k_advantages(r, k=2, threshold=1.0, eps=0.0)
    >>> [round(a, 12) for a in out.advantages[0].tolist()], out.advantages[1].tolist()
    ([1.0, -0.333333333333, -0.333333333333, -0.333333333333], [0.0, 0.0, 0.0, 0.0])
    >>> out.zero_std.tolist()
    [False, True]
    """
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= rewards.shape[1]:
        raise ValueError(f"algorithm.pass_k: expected an integer in [1, group size {rewards.shape[1]}], got {k!r}")
    r, valid = _valid_rewards(rewards, valid)
    passed = valid & (r >= threshold)
    groups = [
        pass_at_k_group(n, n_pass, k, float(eps))
        for n, n_pass in zip(valid.sum(dim=1).tolist(), passed.sum(dim=1).tolist())
    ]
    a_pass = torch.tensor([g.passing for g in groups], dtype=torch.float64, device=r.device).unsqueeze(1)
    a_fail = torch.tensor([g.failing for g in groups], dtype=torch.float64, device=r.device).unsqueeze(1)
    zero = torch.tensor([not g.signal for g in groups], dtype=torch.bool, device=r.device)
    adv = torch.where(passed, a_pass, a_fail)
    keep = valid & ~zero.unsqueeze(1)
    return Advantages(advantages=torch.where(keep, adv, 0.0), zero_std=zero, valid=valid)


# --------------------------------------------------------------------------------------------- MaxRL, GDPO


def maxrl_advantages(
    rewards: torch.Tensor, valid: torch.Tensor | None = None, *, resolution: float = REWARD_RESOLUTION
) -> Advantages:
    """MaxRL (Tajwar et al. 2026, arXiv 2602.02710) on rewards [P, G]:

        A_i = (R_i - mean_g R) / mean_g R        (means over the group's valid members)

    With 0/1 rewards mean_g R = p, the group's success rate: a success gets (1 - p) / p, a failure -1. The group
    sum sum_i A_i grad log pi(o_i) is GRPO's centred REINFORCE divided by p, an estimate of grad p / p =
    grad log p: maximum likelihood of success rather than its probability, so hard prompts (small p) weigh more.

    Zero signal (every advantage exactly 0, reported in zero_std): the group's valid rewards all equal (within
    ``resolution``), fewer than two valid members, or mean_g R <= 0 -- MaxRL's rewards are success rates in [0, 1],
    and dividing by a mean <= 0 would reverse or blow up the update. Invalid samples get A = 0.

    >>> out = maxrl_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [-1.0, 1.0, 0.0, 0.0]]))
    >>> out.advantages.tolist(), out.zero_std.tolist()
    ([[3.0, -1.0, -1.0, -1.0], [1.0, 1.0, -1.0, -1.0], [0.0, 0.0, 0.0, 0.0]], [False, False, True])
    """
    r, valid = _valid_rewards(rewards, valid)
    mean = _masked_mean(r, valid, dim=1)
    zero = zero_signal_groups(r, valid, resolution) | (mean.squeeze(1) <= 0)
    adv = (r - mean) / torch.where(mean > 0, mean, 1.0)
    keep = valid & ~zero.unsqueeze(1)
    return Advantages(advantages=torch.where(keep, adv, 0.0), zero_std=zero, valid=valid)


def gdpo_advantages(
    parts: list[tuple[float, torch.Tensor]],
    valid: torch.Tensor | None = None,
    *,
    eps: float,
    std_kind: StdKind = StdKind.SAMPLE,
    resolution: float = REWARD_RESOLUTION,
) -> Advantages:
    """GDPO (group reward-decoupled normalisation, NVIDIA 2026, arXiv 2601.05242) on reward components: ``parts`` is
    one (weight w_k, rewards R^k [P, G]) per component. Each component is normalised within its group, the results
    summed with the weights, and the sum normalised over the batch:

        A^k_i = (R^k_i - mean_g R^k) / (std_g R^k + eps)      (0 in a group whose R^k are all equal)
        S_i   = sum_k w_k A^k_i
        A_i   = (S_i - mean_B S) / (std_B S + eps)

    (std: ``std_kind``; statistics over the valid members, float64). GRPO normalises the weighted total instead, so a
    component with a large spread decides the scale; here each counts by its weight, whatever its spread.

    Zero signal (A exactly 0, zero_std): a group in which every component of non-zero weight is all-equal (S = 0
    there), and the whole batch when S is all-equal. Invalid samples -- flagged, or a weighted component not finite --
    get A = 0 and are left out of every statistic. A component at weight 0 (logged only) takes no part.

    >>> correct = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    >>> short = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    >>> out = gdpo_advantages([(1.0, correct), (0.5, short)], eps=0.0)
    >>> [[round(a, 12) for a in row] for row in out.advantages.tolist()], out.zero_std.tolist()
    ([[1.09544511501, -1.09544511501], [0.547722557505, -0.547722557505]], [False, False])
    """
    if not parts:
        raise ValueError("gdpo_advantages: expected at least one reward component")
    weighted = [(w, r) for w, r in parts if w != 0]  # a component at weight 0 is only logged
    _, valid = _valid_rewards(parts[0][1], valid)
    for _, r in weighted:
        valid = valid & torch.isfinite(r.to(torch.float64))
    zero = torch.ones(valid.shape[0], dtype=torch.bool, device=valid.device)
    summed = torch.zeros(valid.shape, dtype=torch.float64, device=valid.device)
    for w, r in weighted:
        own = compute_advantages(r, valid, scaling=Scaling.GROUP_STD, eps=eps, std_kind=std_kind, resolution=resolution)
        summed, zero = summed + w * own.advantages, zero & own.zero_std
    batch = compute_advantages(
        summed, valid, baseline=Baseline.BATCH_MEAN, scaling=Scaling.BATCH_STD, eps=eps, std_kind=std_kind
    )
    zero = zero | batch.zero_std
    keep = valid & ~zero.unsqueeze(1)
    return Advantages(advantages=torch.where(keep, batch.advantages, 0.0), zero_std=zero, valid=valid)
