"""Clipped policy-gradient surrogates (per-token loss, to be minimised).

Notation: r_it = pi_theta(o_it) / pi_old(o_it), A_i the sequence advantage broadcast over tokens -- or, given
per-token advantages A_it ([B, T], e.g. GAE from a critic: grpolab.algo.gae), A_it itself.

* ppo_clip:  l_it = -min(r_it A_i, clip(r_it, 1 - eps_low, 1 + eps_high) A_i)
  (eps_low = eps_high = 0.2: GRPO; 0.2 / 0.28: DAPO clip-higher)
* dual_clip: ppo_clip, and for A_i < 0 additionally l_it = min(l_it, -c A_i), i.e. the objective is capped
  below at c A_i (Ye et al. 2020; c = 3 typical)
* gspo:      the token ratio is replaced by the sequence ratio s_i = exp((1/|o_i|) sum_t m_it log r_it),
  broadcast to every token, then clipped as ppo_clip (GSPO, Zheng et al. 2025; eps ~ 3e-4 / 4e-4)

Each returns a SurrogateOut with the token loss and where the clip was active (for clip-fraction metrics):
``clipped_low`` marks tokens with A < 0 and ratio < 1 - eps_low (gradient zeroed by the clip),
``clipped_high`` marks A > 0 and ratio > 1 + eps_high.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Callable

import torch


class Surrogate(StrEnum):
    PPO_CLIP = "ppo_clip"
    DUAL_CLIP = "dual_clip"
    GSPO = "gspo"


@dataclass(frozen=True)
class ClipParams:
    """Clip range [1 - eps_low, 1 + eps_high] of the ratio, and the dual-clip bound c.
    No defaults: the algorithm's defaults are defined once, by AlgorithmConfig (grpolab/config.py)."""

    eps_low: float
    eps_high: float
    dual_clip_c: float


@dataclass(frozen=True)
class SurrogateOut:
    loss: torch.Tensor  # [B, T]
    ratio: torch.Tensor  # [B, T] the ratio that was clipped (token or broadcast sequence ratio)
    clipped_low: torch.Tensor  # [B, T] bool
    clipped_high: torch.Tensor  # [B, T] bool


def per_token(adv: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[B, T] advantages: per-sequence [B] broadcast over tokens, per-token [B, T] as they are.

    >>> per_token(torch.tensor([1.0, -2.0]), torch.zeros(2, 3)).tolist()
    [[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]]
    """
    return (adv if adv.dim() == like.dim() else adv.unsqueeze(-1)).expand_as(like)


def _clipped(log_ratio: torch.Tensor, adv: torch.Tensor, p: ClipParams) -> SurrogateOut:
    """l = -min(r A, clip(r, 1-eps_low, 1+eps_high) A) for a given log ratio (token or sequence)."""
    ratio = torch.exp(log_ratio)
    unclipped = -ratio * adv
    clipped = -torch.clamp(ratio, 1.0 - p.eps_low, 1.0 + p.eps_high) * adv
    loss = torch.maximum(unclipped, clipped)
    low = (adv < 0) & (ratio < 1.0 - p.eps_low)
    high = (adv > 0) & (ratio > 1.0 + p.eps_high)
    return SurrogateOut(loss=loss, ratio=ratio, clipped_low=low, clipped_high=high)


def ppo_clip(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, p: ClipParams
) -> SurrogateOut:
    """l_it = -min(r_it A_i, clip(r_it, 1-eps_low, 1+eps_high) A_i), r_it = exp(logp - old_logp) on unmasked
    tokens (masked tokens get r = 1, so padding values can never produce inf/NaN)."""
    log_ratio = torch.where(mask.bool(), logp - old_logp, torch.zeros_like(logp))
    return _clipped(log_ratio, per_token(adv, logp), p)


def dual_clip(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, p: ClipParams
) -> SurrogateOut:
    """ppo_clip, then for A_i < 0: l_it = min(l_it, -c A_i)."""
    out = ppo_clip(logp, old_logp, adv, mask, p)
    a = per_token(adv, logp)
    capped = torch.where(a < 0, torch.minimum(out.loss, -p.dual_clip_c * a), out.loss)
    return SurrogateOut(loss=capped, ratio=out.ratio, clipped_low=out.clipped_low, clipped_high=out.clipped_high)


def gspo(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, p: ClipParams
) -> SurrogateOut:
    """log s_i = sum_t m_it (logp - old_logp) / sum_t m_it; l_it = -min(s_i A_i, clip(s_i, ...) A_i) for all t."""
    m = mask.to(logp.dtype)
    log_s = ((logp - old_logp) * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    return _clipped(log_s.unsqueeze(-1).expand_as(logp), per_token(adv, logp), p)


SURROGATES: dict[Surrogate, Callable[..., SurrogateOut]] = {
    Surrogate.PPO_CLIP: ppo_clip,
    Surrogate.DUAL_CLIP: dual_clip,
    Surrogate.GSPO: gspo,
}


def surrogate_loss(kind: Surrogate, logp, old_logp, adv, mask, p: ClipParams) -> SurrogateOut:
    """Dispatch through SURROGATES."""
    return SURROGATES[Surrogate(kind)](logp, old_logp, adv, mask, p)
