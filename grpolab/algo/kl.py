"""Per-token KL estimators to the reference policy (Schulman's k1/k2/k3), with log rho = log pi_ref - log pi_theta.

* k1 = -log rho                      (unbiased, can be negative)
* k2 = 0.5 (log rho)^2               (biased, low variance; its gradient is the true KL gradient on-policy)
* k3 = rho - log rho - 1             (DeepSeekMath GRPO; unbiased, always >= 0)

log rho is clamped to [-LOG_RHO_CLAMP, LOG_RHO_CLAMP] before exponentiation so k3 cannot overflow; the clamp
is far outside the range a stable run visits and is recorded on the objective card.

Placement (``KLPlacement``): ``loss`` adds beta * kl_it to the token loss; ``reward`` subtracts
beta * sum_t kl_it from the sequence reward before advantages are computed.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Callable

import torch

LOG_RHO_CLAMP = 20.0


class KLEstimator(StrEnum):
    K1 = "k1"
    K2 = "k2"
    K3 = "k3"


class KLPlacement(StrEnum):
    LOSS = "loss"
    REWARD = "reward"


def _log_rho(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return (ref_logp - logp).clamp(-LOG_RHO_CLAMP, LOG_RHO_CLAMP)


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = -log rho = log pi_theta - log pi_ref.

    >>> kl_k1(torch.tensor([-1.0]), torch.tensor([-2.0])).item()
    1.0
    """
    return -_log_rho(logp, ref_logp)


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 * (log rho)^2.

    >>> kl_k2(torch.tensor([-1.0]), torch.tensor([-3.0])).item()
    2.0
    """
    return 0.5 * _log_rho(logp, ref_logp) ** 2


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = rho - log rho - 1, rho = pi_ref / pi_theta.

    >>> round(kl_k3(torch.tensor([0.0]), torch.tensor([-1.0])).item(), 6)  # e^-1 + 1 - 1
    0.367879
    """
    log_rho = _log_rho(logp, ref_logp)
    return torch.expm1(log_rho) - log_rho  # expm1: exact near rho = 1, so k3 >= 0 holds in floating point


KL_ESTIMATORS: dict[KLEstimator, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    KLEstimator.K1: kl_k1,
    KLEstimator.K2: kl_k2,
    KLEstimator.K3: kl_k3,
}


def token_kl(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token KL estimate, dispatched through KL_ESTIMATORS."""
    return KL_ESTIMATORS[KLEstimator(estimator)](logp, ref_logp)
