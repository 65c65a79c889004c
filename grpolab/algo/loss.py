"""The per-micro-batch GRPO objective: surrogate x IS weight + beta * KL - entropy bonus, aggregated by weights.

    L = sum_{i,t} w_it * ( w^IS_it * l^surr_it + beta * kl_it * [KL in loss] - c_H * H_it )

with kl_it <- (pi_theta / pi_old)_it kl_it under kl_bias_correction (DeepSeek-V3.2's unbiased KL: grpolab.algo.kl).

w_it are the aggregation weights of the whole optimisation batch (aggregation.token_weights), so summing L
over micro-batches gives the batch loss exactly. Everything here is pure torch; the caller supplies tensors.

Off-policy sequence masking (DeepSeek-V3.2), with delta > 0 and the behaviour logprobs log q given: the policy term
of sequence i is dropped when

    A_i < 0  and  (1/|o_i|) sum_t m_it (log q(o_it) - sg(log pi_theta(o_it))) > delta

(the mask is computed here, detached, from the current policy; a KL or entropy term keeps its tokens). The
sequence's advantage is its mean over unmasked tokens when advantages are per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kl import KLEstimator, ratio_weighted, token_kl
from .surrogate import ClipParams, PolicyLossParams, Surrogate, surrogate_loss


@dataclass(frozen=True)
class ObjectiveParams:
    """The objective's scalar choices (see the formula above).
    No defaults: the algorithm's defaults are defined once, by AlgorithmConfig (grpolab/config/schema.py). policy_loss carries
    the parameters of the surrogates that need them (cispo, sapo, clip_cov, kl_cov; None: not given, and those
    surrogates refuse to run), offpolicy_mask_delta the off-policy sequence mask's delta (0: off), kl_bias_correction
    whether the KL in the loss is weighted by r = pi_theta / pi_old (DeepSeek-V3.2; grpolab.algo.kl.ratio_weighted)."""

    surrogate: Surrogate
    clip: ClipParams
    beta: float
    kl_estimator: KLEstimator
    kl_in_loss: bool
    entropy_coef: float
    policy_loss: PolicyLossParams | None
    offpolicy_mask_delta: float
    kl_bias_correction: bool


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
    cov_selected_count: float  # tokens selected by clip_cov / kl_cov
    offpolicy_masked_seqs: float  # sequences (with tokens) dropped by the off-policy sequence mask
    sequence_count: float  # sequences with at least one unmasked token


def offpolicy_sequence_mask(
    logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, delta: float
) -> torch.Tensor:
    """[B] bool, detached: A_i < 0 and mean_t m_it (log q - log pi_theta) > delta (rows without tokens: False).

    >>> lp = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
    >>> q = torch.log(torch.tensor([[0.9, 0.9], [0.9, 0.9]]))
    >>> offpolicy_sequence_mask(lp, q, torch.tensor([-1.0, 1.0]), torch.ones(2, 2), 0.5).tolist()
    [True, False]
    """
    m = mask.to(logp.dtype)
    n = m.sum(-1)
    drift = ((behaviour_logp - logp.detach()) * m).sum(-1) / n.clamp(min=1.0)
    adv = advantages if advantages.dim() == 1 else (advantages * m).sum(-1) / n.clamp(min=1.0)
    return (n > 0) & (adv < 0) & (drift > delta)


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
    behaviour_logp: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> LossTerms:
    """Micro-batch loss L (module docstring). Shapes: [B, T]; advantages [B] (per sequence) or [B, T] (per token);
    behaviour_logp: the sampler's logprobs log q, needed by the off-policy sequence mask; generator: the stream of
    clip_cov's and kl_cov's draws (grpolab.algo.surrogate; None = a new one seeded 0)."""
    m = mask.to(logp.dtype)
    w = weights.to(logp.dtype)
    adv = advantages.to(logp.dtype)
    sur = surrogate_loss(params.surrogate, logp, old_logp, adv, m, params.clip, params.policy_loss, generator)
    token_policy = w * sur.loss * is_weights.to(logp.dtype)
    dropped = torch.zeros(logp.shape[0], dtype=torch.bool, device=logp.device)
    if params.offpolicy_mask_delta > 0:
        if behaviour_logp is None:
            raise ValueError("offpolicy_mask_delta > 0 needs behaviour_logp (the sampler's logprobs)")
        dropped = offpolicy_sequence_mask(logp, behaviour_logp.to(logp.dtype), adv, m, params.offpolicy_mask_delta)
        token_policy = torch.where(dropped.unsqueeze(-1), torch.zeros_like(token_policy), token_policy)
    policy = token_policy.sum()
    total = policy
    kl_value, kl_token_sum = 0.0, 0.0
    if ref_logp is not None:
        kl_tok = token_kl(logp, ref_logp, params.kl_estimator)
        if params.kl_bias_correction:
            kl_tok = ratio_weighted(kl_tok, logp, old_logp, m)
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
        cov_selected_count=0.0 if sur.selected is None else (sur.selected.to(m.dtype) * m).sum().item(),
        offpolicy_masked_seqs=float(dropped.sum().item()),
        sequence_count=float((m.sum(-1) > 0).sum().item()),
    )
