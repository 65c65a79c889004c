"""Token log-probabilities and entropy from logits, without materialising more than one chunk of log-softmax."""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T)[token]: [B, T, V] x [B, T] -> [B, T], computed in float32 or wider.

    log p = z_tok - logsumexp(z), z = logits / T; the full log-softmax tensor is never built.
    """
    z = logits.float() / temperature if logits.dtype in (torch.float16, torch.bfloat16) else logits / temperature
    picked = torch.gather(z, -1, token_ids.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(z, dim=-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """H = logsumexp(z) - sum_v softmax(z)_v z_v, z = logits / T; [B, T, V] -> [B, T]."""
    z = logits.float() / temperature if logits.dtype in (torch.float16, torch.bfloat16) else logits / temperature
    p = torch.softmax(z, dim=-1)
    return torch.logsumexp(z, dim=-1) - (p * z).sum(-1)
