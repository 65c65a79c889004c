"""The per-micro-batch GRPO objective: surrogate x IS weight + beta * KL - entropy bonus, aggregated by weights.

    L = sum_{i,t} w_it * ( w^IS_it * l^surr_it + beta * kl_it * [KL in loss] - c_H * H_it )

w_it are the aggregation weights of the whole optimisation batch (aggregation.token_weights), so summing L
over micro-batches gives the batch loss exactly. Everything here is pure torch; the caller supplies tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kl import KLEstimator, token_kl
from .surrogate import ClipParams, Surrogate, surrogate_loss


@dataclass(frozen=True)
class ObjectiveParams:
    """The objective's scalar choices (see the formula above).
    No defaults: the algorithm's defaults are defined once, by AlgorithmConfig (grpolab/config.py)."""

    surrogate: Surrogate
    clip: ClipParams
    beta: float
    kl_estimator: KLEstimator
    kl_in_loss: bool
    entropy_coef: float


@dataclass(frozen=True)
class LossTerms:
    """total: differentiable scalar. The rest are detached sums over this micro-batch's masked tokens."""

    total: torch.Tensor
    policy: float
    kl: float
    entropy_bonus: float
    kl_token_sum: float
    clip_low_count: float
    clip_high_count: float
    token_count: float


def objective(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    is_weights: torch.Tensor,
    mask: torch.Tensor,
    params: ObjectiveParams,
    entropy: torch.Tensor | None = None,
) -> LossTerms:
    """Micro-batch loss L (module docstring). Shapes: [B, T]; advantages [B] (per sequence) or [B, T] (per token)."""
    m = mask.to(logp.dtype)
    w = weights.to(logp.dtype)
    sur = surrogate_loss(params.surrogate, logp, old_logp, advantages.to(logp.dtype), m, params.clip)
    policy = (w * sur.loss * is_weights.to(logp.dtype)).sum()
    total = policy
    kl_value, kl_token_sum = 0.0, 0.0
    if ref_logp is not None:
        kl_tok = token_kl(logp, ref_logp, params.kl_estimator)
        kl = (w * kl_tok).sum()
        kl_value, kl_token_sum = kl.item(), (kl_tok * m).sum().item()
        if params.kl_in_loss and params.beta > 0:
            total = total + params.beta * kl
    ent_value = 0.0
    if entropy is not None and params.entropy_coef != 0.0:
        ent = (w * entropy).sum()
        total = total - params.entropy_coef * ent
        ent_value = ent.item()
    return LossTerms(
        total=total,
        policy=policy.item(),
        kl=kl_value,
        entropy_bonus=ent_value,
        kl_token_sum=kl_token_sum,
        clip_low_count=(sur.clipped_low.to(m.dtype) * m).sum().item(),
        clip_high_count=(sur.clipped_high.to(m.dtype) * m).sum().item(),
        token_count=m.sum().item(),
    )
