"""How a step's rewards become sequence-level advantages at collection, and which groups carry signal (dynamic
sampling, the pass_rate prompt schedule): the ``group`` part of an advantage estimator (grpolab.training.estimators).

- ``GroupRelative``: the group-relative family, A_i = (R_i - b_i) / s_i with algorithm.baseline (group_mean,
  leave_one_out, batch_mean...), scaling, std_kind and adv_eps (grpolab.algo.advantages.compute_advantages). A group
  carries signal when its correctness (batch.signal_values) varies among its valid rows.
- ``PassAtK``: the group's unbiased pass@k gain per sample (algorithm.pass_k, pass_threshold, adv_eps;
  grpolab.algo.advantages.pass_at_k_advantages); baseline and scaling do not apply. A group carries signal when its
  pass@k advantages are not all zero.

Both take rewards and invalid flags shaped [P, G] (group-major rows viewed per group).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..algo.advantages import Advantages, compute_advantages, pass_at_k_advantages, zero_signal_groups
from ..config.schema import AlgorithmConfig


class GroupRule(Protocol):
    def advantages(self, rewards: torch.Tensor, invalid: torch.Tensor) -> Advantages:
        """Advantages [P, G] of rewards [P, G] (invalid rows: exactly 0)."""
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

    def advantages(self, rewards: torch.Tensor, invalid: torch.Tensor) -> Advantages:
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

    def advantages(self, rewards: torch.Tensor, invalid: torch.Tensor) -> Advantages:
        return pass_at_k_advantages(rewards, ~invalid, k=self.k, threshold=self.threshold, eps=self.eps)

    def signal(self, rewards: torch.Tensor, correctness: torch.Tensor, invalid: torch.Tensor) -> torch.Tensor:
        return ~self.advantages(rewards, invalid).zero_std
