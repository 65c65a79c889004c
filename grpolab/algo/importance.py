"""Sampler/trainer mismatch correction, separate from the PPO ratio.

When the behaviour policy (log q: the sampler's untruncated softmax(logits / T)) differs from the trainer's pi_old
-- numerically (another engine, another dtype) or because it is older (asynchronous training) -- each token loss is
weighted by a detached w = pi_old / q. With top_p < 1 or top_k > 0 the trainer passes q before truncation: the
truncated q_trunc = q / Z on the kept set would shift every weight by the kept mass Z (token_mask's lower bound would
then drop the high-entropy positions, where Z is small); the truncation itself is not corrected (tokens outside the
kept set are never sampled; DeepSeek-V3.2's keep-sampling mask, which renormalises pi_old and pi_theta over the kept
set, would need the kept sets from the sampler):

* none:              w_it = 1
* token_truncate:    w_it = min(exp(log pi_old - log q), C)                  (truncated IS, "TIS")
* token_mask:        w_it = exp(.) if C_min <= exp(.) <= C_max else 0
* sequence_truncate: w_i = min(exp(sum_t m_it (log pi_old - log q)), C)   broadcast to tokens
* sequence_mask:     w_i = exp(sum_t .) if . <= C_max else 0                broadcast to tokens (masked IS above C
  only, as published and as TRL's; a lower bound on a product of |o_i| ratios would drop long sequences)

IcePop (Ring-1T) is token_mask with its bounds [0.5, 5] -- the same numbers, so it is not a mode of its own (verl calls
token_mask IcePop too); the ``icepop`` preset sets it.

Orthogonal to the weighting, a rejection drops whole sequences (weight 0), so it combines with any mode (as verl's
rollout correction combines rollout_is with rollout_rs):

* reject none:      every sequence kept
* reject geometric: sequence i rejected when g_i = exp((1/|o_i|) sum_t m_it (log pi_old - log q)) leaves
  [lo, hi] (verl's seq_mean_k1 rejection; its geo_rs presets use [0.999, 1.001])

Both take (behaviour logprobs log q, trainer old logprobs log pi_old): whatever sampled -- grpolab's own engine,
an external one, an older policy for stale asynchronous rollouts -- enters as log q. ``correction`` returns the weights
with the flags of what was truncated, masked and rejected; ``correction_stats`` turns those into the per-step
``sampler/*`` shares and the sampler-vs-trainer divergence over the trained tokens,
KL(q || pi_old) by k3 = E_q[rho - 1 - log rho] and chi^2(pi_old || q) = E_q[rho^2] - 1, rho = pi_old / q.

The numeric mismatch itself (|log pi_old - log q_full| per token, q_full the sampler's untruncated
softmax(logits / T), which is what the trainer computes) is always measured, whatever the mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Callable

import torch


class ISMode(StrEnum):
    NONE = "none"
    TOKEN_TRUNCATE = "token_truncate"
    TOKEN_MASK = "token_mask"
    SEQUENCE_TRUNCATE = "sequence_truncate"
    SEQUENCE_MASK = "sequence_mask"


class ISReject(StrEnum):
    NONE = "none"
    GEOMETRIC = "geometric"


@dataclass(frozen=True)
class ISParams:
    """Bounds of the importance weight: truncated at c_max, or masked outside [c_min, c_max] (token_mask) or above
    c_max (sequence_mask).
    No defaults: the algorithm's defaults are defined once, by AlgorithmConfig (grpolab/config/schema.py)."""

    c_max: float
    c_min: float


def _seq_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (log_ratio * mask).sum(-1, keepdim=True).expand_as(log_ratio)


def _mask_outside(ratio: torch.Tensor, p: ISParams) -> torch.Tensor:
    return torch.where((ratio >= p.c_min) & (ratio <= p.c_max), ratio, torch.zeros_like(ratio))


def is_none(log_ratio, mask, p: ISParams) -> torch.Tensor:
    """w = 1."""
    return torch.ones_like(log_ratio)


def is_token_truncate(log_ratio, mask, p: ISParams) -> torch.Tensor:
    """w_it = min(exp(log_ratio_it), C_max)."""
    return torch.exp(log_ratio).clamp(max=p.c_max)


def is_token_mask(log_ratio, mask, p: ISParams) -> torch.Tensor:
    """w_it = exp(log_ratio_it) inside [C_min, C_max], else 0."""
    return _mask_outside(torch.exp(log_ratio), p)


def is_sequence_truncate(log_ratio, mask, p: ISParams) -> torch.Tensor:
    """w_i = min(exp(sum_t m_it log_ratio_it), C_max)."""
    return torch.exp(_seq_log_ratio(log_ratio, mask).clamp(max=50.0)).clamp(max=p.c_max)


def is_sequence_mask(log_ratio, mask, p: ISParams) -> torch.Tensor:
    """w_i = exp(sum_t m_it log_ratio_it) if it is <= C_max, else 0 (no lower bound: C_min is not used)."""
    w = torch.exp(_seq_log_ratio(log_ratio, mask).clamp(max=50.0))
    return torch.where(w <= p.c_max, w, torch.zeros_like(w))


IS_CORRECTIONS: dict[ISMode, Callable[[torch.Tensor, torch.Tensor, ISParams], torch.Tensor]] = {
    ISMode.NONE: is_none,
    ISMode.TOKEN_TRUNCATE: is_token_truncate,
    ISMode.TOKEN_MASK: is_token_mask,
    ISMode.SEQUENCE_TRUNCATE: is_sequence_truncate,
    ISMode.SEQUENCE_MASK: is_sequence_mask,
}


@dataclass(frozen=True)
class RejectParams:
    """Bounds [lo, hi] of the rejection statistic. No defaults: AlgorithmConfig defines them (grpolab/config/schema.py)."""

    lo: float
    hi: float


def reject_none(log_ratio: torch.Tensor, mask: torch.Tensor, p: RejectParams) -> torch.Tensor:
    """[B] bool: nothing rejected."""
    return torch.zeros(log_ratio.shape[0], dtype=torch.bool, device=log_ratio.device)


def reject_geometric(log_ratio: torch.Tensor, mask: torch.Tensor, p: RejectParams) -> torch.Tensor:
    """[B] bool: g_i = exp(sum_t m_it log_ratio_it / sum_t m_it) outside [lo, hi] (rows without tokens are kept)."""
    n = mask.sum(-1)
    g = torch.exp((log_ratio * mask).sum(-1) / n.clamp(min=1.0))
    return (n > 0) & ((g < p.lo) | (g > p.hi))


IS_REJECTIONS: dict[ISReject, Callable[[torch.Tensor, torch.Tensor, RejectParams], torch.Tensor]] = {
    ISReject.NONE: reject_none,
    ISReject.GEOMETRIC: reject_geometric,
}


@dataclass(frozen=True)
class Correction:
    """The detached weights [B, T] (zero on masked tokens and rejected sequences) and what produced them."""

    weights: torch.Tensor
    log_ratio: torch.Tensor  # [B, T] log pi_old - log q on the loss mask, 0 elsewhere
    truncated: torch.Tensor  # [B, T] bool: the raw weight was above C_max (a *_truncate mode)
    masked: torch.Tensor  # [B, T] bool: a *_mask mode zeroed the raw weight (outside its bounds)
    rejected: torch.Tensor  # [B] bool: the sequence was rejected


def correction(
    behaviour_logp: torch.Tensor,
    old_logp: torch.Tensor,
    mask: torch.Tensor,
    mode: ISMode,
    p: ISParams,
    reject: ISReject = ISReject.NONE,
    rp: RejectParams | None = None,
) -> Correction:
    """The sampler-mismatch correction of tokens sampled from q (behaviour logprobs) and trained from pi_old."""
    m = mask.to(old_logp.dtype)
    sel = mask.bool()
    log_ratio = ((old_logp - behaviour_logp) * m).detach()
    mode, reject = ISMode(mode), ISReject(reject)
    w = IS_CORRECTIONS[mode](log_ratio, m, p) * m
    seq_level = mode in (ISMode.SEQUENCE_TRUNCATE, ISMode.SEQUENCE_MASK)
    raw = torch.exp((_seq_log_ratio(log_ratio, m) if seq_level else log_ratio).clamp(max=50.0))
    truncated = sel & (raw > p.c_max) if mode in (ISMode.TOKEN_TRUNCATE, ISMode.SEQUENCE_TRUNCATE) else sel & False
    outside = {ISMode.TOKEN_MASK: (raw < p.c_min) | (raw > p.c_max), ISMode.SEQUENCE_MASK: raw > p.c_max}
    masked = sel & outside[mode] if mode in outside else sel & False
    if reject != ISReject.NONE and rp is None:
        raise ValueError(f"rejection {reject.value!r} needs its RejectParams (got None)")
    rejected = IS_REJECTIONS[reject](log_ratio, m, rp)
    w = torch.where(rejected.unsqueeze(-1), torch.zeros_like(w), w)
    return Correction(weights=w, log_ratio=log_ratio, truncated=truncated, masked=masked, rejected=rejected)


def correction_stats(
    log_ratio: torch.Tensor,
    truncated: torch.Tensor,
    masked: torch.Tensor,
    rejected_tokens: torch.Tensor,
    seq_truncated: torch.Tensor,
    seq_masked: torch.Tensor,
    seq_rejected: torch.Tensor,
) -> dict[str, float]:
    """Shares of trained tokens (flat [n]) and sequences (flat [S], a sequence counts when any of its tokens does)
    truncated / masked / rejected, and the divergence of sampler q and trainer pi_old over the tokens:
    sampler/kl_k3 = mean(rho - 1 - log rho), sampler/chi2 = mean(rho^2) - 1, rho = exp(log pi_old - log q)."""
    if log_ratio.numel() == 0:
        return {}
    lr = log_ratio.double().clamp(-20.0, 20.0)
    rho = torch.exp(lr)
    out = {
        "sampler/kl_k3": (rho - 1.0 - lr).mean().item(),
        "sampler/chi2": (rho**2).mean().item() - 1.0,
        "sampler/token_truncated_frac": truncated.double().mean().item(),
        "sampler/token_masked_frac": masked.double().mean().item(),
        "sampler/token_rejected_frac": rejected_tokens.double().mean().item(),
    }
    if seq_truncated.numel():
        out["sampler/seq_truncated_frac"] = seq_truncated.double().mean().item()
        out["sampler/seq_masked_frac"] = seq_masked.double().mean().item()
        out["sampler/seq_rejected_frac"] = seq_rejected.double().mean().item()
    return out


def is_weights(
    old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, mode: ISMode, p: ISParams
) -> torch.Tensor:
    """Detached [B, T] correction weights (zero on masked tokens), dispatched through IS_CORRECTIONS."""
    m = mask.to(old_logp.dtype)
    log_ratio = ((old_logp - sampler_logp) * m).detach()
    return IS_CORRECTIONS[ISMode(mode)](log_ratio, m, p) * m


def mismatch_stats(
    old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor
) -> dict[str, float]:
    """sampler/logp_diff_{mean,max} = |log pi_old - log q_full| over masked tokens; is_weight_{min,mean,max}.

    sampler_logp here is the untruncated log q_full (Rollout.untruncated_logprobs()): the metric measures numeric
    sampler/trainer disagreement, not top-k/top-p truncation.
    """
    sel = mask.bool()
    if not sel.any():
        return {}
    diff = (old_logp - sampler_logp).abs()[sel]
    w = weights[sel]
    return {
        "sampler/logp_diff_mean": diff.mean().item(),
        "sampler/logp_diff_max": diff.max().item(),
        "sampler/is_weight_min": w.min().item(),
        "sampler/is_weight_mean": w.mean().item(),
        "sampler/is_weight_max": w.max().item(),
    }
