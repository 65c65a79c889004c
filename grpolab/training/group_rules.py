"""How a step's rewards become sequence-level advantages at collection, and which groups carry signal (dynamic
sampling, the pass_rate prompt schedule): the ``group`` part of an advantage estimator (grpolab.training.estimators).

- ``GroupRelative``: the group-relative family, A_i = (R_i - b_i) / s_i with algorithm.baseline (group_mean,
  leave_one_out, batch_mean...), scaling, std_kind and adv_eps (grpolab.algo.advantages.compute_advantages). A group
  carries signal when its correctness (batch.signal_values) varies among its valid rows.
- ``PassAtK``: the group's unbiased pass@k gain per sample (algorithm.pass_k, pass_threshold, adv_eps;
  grpolab.algo.advantages.pass_at_k_advantages); baseline and scaling do not apply. A group carries signal when its
  pass@k advantages are not all zero.
- ``MaxRL``: (R_i - mean_g R) / mean_g R (grpolab.algo.advantages.maxrl_advantages); baseline, scaling and adv_eps
  do not apply. A group carries signal when its advantages are not all zero.
- ``GDPO``: each reward component normalised in its group, summed with the reward weights, normalised over the batch
  (grpolab.algo.advantages.gdpo_advantages; adv_eps, std_kind). It reads the components (``parts``: each one's
  weight in reward.weights, 1 for the overlong penalty, and its values). Signal as GroupRelative.

All take rewards and invalid flags shaped [P, G] (group-major rows viewed per group), and the reward components
(``Parts``) where the collector has them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..algo.advantages import (
    Advantages,
    compute_advantages,
    gdpo_advantages,
    maxrl_advantages,
    pass_at_k_advantages,
    zero_signal_groups,
)
from ..config.schema import AlgorithmConfig

Parts = list[tuple[float, torch.Tensor]]
"""The reward components of a batch: (weight in the total reward, values [P, G]) each."""


class GroupRule(Protocol):
    def advantages(self, rewards: torch.Tensor, invalid: torch.Tensor, parts: Parts | None = None) -> Advantages:
        """Advantages [P, G] of rewards [P, G] (invalid rows: exactly 0); parts: the reward components, for the rules
        that read them (GDPO)."""
        ...

    def signal(self, rewards: torch.Tensor, correctness: torch.Tensor, invalid: torch.Tensor) -> torch.Tensor:
        """[P] bool: whether each group carries signal; correctness: the values dynamic sampling judges by."""
        ...


@dataclass(frozen=True)
class GroupRelative:
    baseline: str
    scaling: str
    eps: float
    std_kind: str

    @classmethod
    def of(cls, a: AlgorithmConfig) -> "GroupRelative":
        return cls(a.baseline, a.scaling, a.adv_eps, a.std_kind)

    def advantages(self, rewards: torch.Tensor, invalid: torch.Tensor, parts: Parts | None = None) -> Advantages:
        return compute_advantages(
            rewards, ~invalid, baseline=self.baseline, scaling=self.scaling, eps=self.eps, std_kind=self.std_kind
        )

    def signal(self, rewards: torch.Tensor, correctness: torch.Tensor, invalid: torch.Tensor) -> torch.Tensor:
        valid = ~invalid & torch.isfinite(correctness)
        return ~zero_signal_groups(torch.where(valid, correctness, 0.0), valid)


@dataclass(frozen=True)
class PassAtK:
    k: int
    threshold: float
    eps: float

    @classmethod
    def of(cls, a: AlgorithmConfig) -> "PassAtK":
        return cls(a.pass_k, a.pass_threshold, a.adv_eps)

    def advantages(self, rewards: torch.Tensor, invalid: torch.Tensor, parts: Parts | None = None) -> Advantages:
        return pass_at_k_advantages(rewards, ~invalid, k=self.k, threshold=self.threshold, eps=self.eps)

    def signal(self, rewards: torch.Tensor, correctness: torch.Tensor, invalid: torch.Tensor) -> torch.Tensor:
        return ~self.advantages(rewards, invalid).zero_std


@dataclass(frozen=True)
class MaxRL:
    @classmethod
    def of(cls, a: AlgorithmConfig) -> "MaxRL":
        return cls()

    def advantages(self, rewards: torch.Tensor, invalid: torch.Tensor, parts: Parts | None = None) -> Advantages:
        return maxrl_advantages(rewards, ~invalid)

    def signal(self, rewards: torch.Tensor, correctness: torch.Tensor, invalid: torch.Tensor) -> torch.Tensor:
        return ~self.advantages(rewards, invalid).zero_std


@dataclass(frozen=True)
class GDPO:
    eps: float
    std_kind: str

    @classmethod
    def of(cls, a: AlgorithmConfig) -> "GDPO":
        return cls(a.adv_eps, a.std_kind)

    def advantages(self, rewards: torch.Tensor, invalid: torch.Tensor, parts: Parts | None = None) -> Advantages:
        if not parts:
            raise ValueError("the gdpo estimator needs the reward components (parts), got none")
        return gdpo_advantages(parts, ~invalid, eps=self.eps, std_kind=self.std_kind)

    def signal(self, rewards: torch.Tensor, correctness: torch.Tensor, invalid: torch.Tensor) -> torch.Tensor:
        valid = ~invalid & torch.isfinite(correctness)
        return ~zero_signal_groups(torch.where(valid, correctness, 0.0), valid)
