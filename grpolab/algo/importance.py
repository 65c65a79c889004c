"""Sampler/trainer mismatch correction, separate from the PPO ratio.

When the distribution the engine sampled from (log q = sampler logprobs: its logits / T after top-k / top-p
truncation) differs from the trainer's policy at sampling time (log pi_old) -- numerically, or because of the
truncation -- each token loss is weighted by a detached w = pi_old / q:

* none:              w_it = 1
* token_truncate:    w_it = min(exp(log pi_old - log q), C)                  (truncated IS, "TIS")
* token_mask:        w_it = exp(.) if C_min <= exp(.) <= C_max else 0
* sequence_truncate: w_i = min(exp(sum_t m_it (log pi_old - log q)), C)   broadcast to tokens
* sequence_mask:     w_i = exp(sum_t .) if C_min <= . <= C_max else 0       broadcast to tokens

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


@dataclass(frozen=True)
class ISParams:
    """Bounds of the importance weight: truncated at c_max, or masked outside [c_min, c_max].
    No defaults: the algorithm's defaults are defined once, by AlgorithmConfig (grpolab/config.py)."""

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
    """w_i = exp(sum_t m_it log_ratio_it) inside [C_min, C_max], else 0."""
    return _mask_outside(torch.exp(_seq_log_ratio(log_ratio, mask).clamp(max=50.0)), p)


IS_CORRECTIONS: dict[ISMode, Callable[[torch.Tensor, torch.Tensor, ISParams], torch.Tensor]] = {
    ISMode.NONE: is_none,
    ISMode.TOKEN_TRUNCATE: is_token_truncate,
    ISMode.TOKEN_MASK: is_token_mask,
    ISMode.SEQUENCE_TRUNCATE: is_sequence_truncate,
    ISMode.SEQUENCE_MASK: is_sequence_mask,
}


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
