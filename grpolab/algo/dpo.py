"""Direct preference losses on (chosen y_w, rejected y_l) pairs of the same prompt x, reference pi_ref fixed.

With log-ratios h_w = log pi_theta(y_w|x) - log pi_ref(y_w|x) and h_l likewise, and h = h_w - h_l:

* sigmoid (DPO, Rafailov et al. 2023):  l = -log sigma(beta * h),   log pi(y|x) = sum_t log pi(y_t | x, y_<t)
  (with label smoothing eps (cDPO): l = -(1 - eps) log sigma(beta h) - eps log sigma(-beta h))
* ipo (Azar et al. 2023):                l = (h - 1 / (2 beta))^2,   log pi(y|x) = (1/|y|) sum_t ... (token mean,
  as TRL computes it for IPO)

``implicit rewards`` beta * h_w and beta * h_l are what DPO papers plot; the pair is ranked right when h > 0.
Each loss takes the per-sequence log-probabilities (already summed or averaged) and returns the per-pair loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Callable

import torch
import torch.nn.functional as F


class PreferenceLoss(StrEnum):
    SIGMOID = "sigmoid"
    IPO = "ipo"


@dataclass(frozen=True)
class PairLogps:
    """[B] sequence log-probabilities of chosen / rejected under the policy and the reference."""

    policy_chosen: torch.Tensor
    policy_rejected: torch.Tensor
    ref_chosen: torch.Tensor
    ref_rejected: torch.Tensor

    def margin(self) -> torch.Tensor:
        """h = (log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l))."""
        return (self.policy_chosen - self.ref_chosen) - (self.policy_rejected - self.ref_rejected)


def sigmoid_loss(p: PairLogps, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """l = -(1 - eps) log sigma(beta h) - eps log sigma(-beta h).

    >>> round(sigmoid_loss(PairLogps(*map(torch.tensor, ([-1.0], [-2.0], [-1.5], [-1.5]))), 0.5).item(), 6)  # h = 1
    0.474077
    """
    z = beta * p.margin()
    return -(1 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)


def ipo_loss(p: PairLogps, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """l = (h - 1 / (2 beta))^2 (label smoothing does not apply).

    >>> ipo_loss(PairLogps(*map(torch.tensor, ([-1.0], [-2.0], [-1.5], [-1.5]))), 0.25).item()  # (1 - 2)^2
    1.0
    """
    return (p.margin() - 1 / (2 * beta)) ** 2


LOSSES: dict[PreferenceLoss, Callable[[PairLogps, float, float], torch.Tensor]] = {
    PreferenceLoss.SIGMOID: sigmoid_loss,
    PreferenceLoss.IPO: ipo_loss,
}
# how token logprobs become log pi(y|x) for each loss: sum (DPO), mean (IPO, as TRL does)
SEQUENCE_REDUCTION: dict[PreferenceLoss, str] = {PreferenceLoss.SIGMOID: "sum", PreferenceLoss.IPO: "mean"}


def sequence_logps(token_logps: torch.Tensor, mask: torch.Tensor, kind: PreferenceLoss) -> torch.Tensor:
    """[B] sum_t m_t logp_t (sigmoid) or that sum / sum_t m_t (ipo).

    >>> sequence_logps(torch.tensor([[-1.0, -2.0, -9.0]]), torch.tensor([[1, 1, 0]]), PreferenceLoss.IPO).tolist()
    [-1.5]
    """
    m = mask.to(token_logps.dtype)
    total = (token_logps * m).sum(-1)
    if SEQUENCE_REDUCTION[PreferenceLoss(kind)] == "mean":
        return total / m.sum(-1).clamp(min=1.0)
    return total


def preference_loss(kind: PreferenceLoss, p: PairLogps, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """[B] per-pair loss, dispatched through LOSSES."""
    return LOSSES[PreferenceLoss(kind)](p, beta, label_smoothing)
