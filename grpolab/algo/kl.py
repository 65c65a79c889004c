"""Per-token KL estimators to the reference policy (Schulman's k1/k2/k3), with log rho = log pi_ref - log pi_theta.

* k1 = -log rho                      (unbiased, can be negative)
* k2 = 0.5 (log rho)^2               (biased, low variance; its gradient is the true KL gradient on-policy)
* k3 = rho - log rho - 1             (DeepSeekMath GRPO; unbiased, always >= 0)

log rho is clamped to [-LOG_RHO_CLAMP, LOG_RHO_CLAMP] before exponentiation so k3 cannot overflow; the clamp
is far outside the range a stable run visits and is recorded on the objective card.

Bias correction (``kl_bias_correction``, DeepSeek-V3.2, arXiv 2512.02556; TRL's use_bias_correction_kl): in the loss,
kl_it <- r_it kl_it with r_it = pi_theta(o_it) / pi_old(o_it), not detached. Tokens are drawn from pi_old, so
E_old[r k3] = E_theta[k3] = KL(pi_theta || pi_ref) and its gradient is the KL's own; for k3 the per-token gradient
with respect to log pi_theta is r_it (log pi_theta - log pi_ref) (``ratio_weighted``).

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


def ratio_weighted(kl: torch.Tensor, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """r_it kl_it, r_it = exp(log pi_theta - log pi_old) on unmasked tokens (1 on masked ones), with its gradient;
    log r is clamped to [-LOG_RHO_CLAMP, LOG_RHO_CLAMP] as log rho is. For k3,
    d(r k3)/d log pi_theta = r (k3 + 1 - rho) = r (log pi_theta - log pi_ref).

    >>> lp = torch.tensor([-1.0], requires_grad=True); ref = torch.tensor([-2.0]); old = torch.tensor([-1.5])
    >>> y = ratio_weighted(kl_k3(lp, ref), lp, old, torch.ones(1))
    >>> round(y.item(), 6), round(torch.autograd.grad(y, lp)[0].item(), 6)  # e^0.5 (e^-1 + 1 - 1), e^0.5 * 1
    (0.606531, 1.648721)
    """
    log_r = torch.where(mask.bool(), logp - old_logp, torch.zeros_like(logp)).clamp(-LOG_RHO_CLAMP, LOG_RHO_CLAMP)
    return torch.exp(log_r) * kl


def token_kl(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token KL estimate, dispatched through KL_ESTIMATORS."""
    return KL_ESTIMATORS[KLEstimator(estimator)](logp, ref_logp)
