"""How token losses become one number: loss = sum_{i,t} w_it * l_it with weights from the *whole* batch.

Modes (m_it the loss mask, B_ne the number of sequences with at least one unmasked token, B all rows; B, B_ne and
sum_{i,t} m_it are counts over the whole optimisation batch -- over every data-parallel rank when the batch is split
across ranks, passed in as `counts`):

* seq_mean_token_mean (GRPO):      w_it = m_it / (B_ne * sum_t m_it)
* token_mean (DAPO):               w_it = m_it / sum_{i,t} m_it
* seq_mean_token_sum_norm (Dr. GRPO): w_it = m_it / (B * L_max), L_max a constant (e.g. max_new_tokens)
* seq_mean_token_sum:              w_it = m_it / B_ne
* prompt_mean_token_mean (ScaleRL's prompt-level average): w_it = m_it / (P_ne * sum_{j in g(i), t} m_jt), the
  tokens averaged within each prompt's group g(i) of G rows, then over the P_ne groups with at least one token
  (rows are grouped G by G in order; G = group_size)

The weights are computed once for the optimisation batch, before it is split into micro-batches; each
micro-batch contributes sum(w[mb] * l[mb]), so the loss and gradient are identical whatever the micro-batch
size, the number of accumulation steps or of data-parallel ranks. A fully masked row gets weight 0 and, in
the seq_mean modes, does not count as a sequence.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Callable

import torch


class Aggregation(StrEnum):
    SEQ_MEAN_TOKEN_MEAN = "seq_mean_token_mean"
    TOKEN_MEAN = "token_mean"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq_mean_token_sum_norm"
    SEQ_MEAN_TOKEN_SUM = "seq_mean_token_sum"
    PROMPT_MEAN_TOKEN_MEAN = "prompt_mean_token_mean"


ROWS, NONEMPTY_ROWS, TOKENS, NONEMPTY_GROUPS = 0, 1, 2, 3


def group_tokens(m: torch.Tensor, group_size: int) -> torch.Tensor:
    """[B / G] the token count of each group of G consecutive rows."""
    if group_size < 1 or m.shape[0] % group_size:
        raise ValueError(f"group_size: expected a divisor of the {m.shape[0]} rows, got {group_size}")
    return m.reshape(-1, group_size, m.shape[-1]).sum((1, 2))


def batch_counts(mask: torch.Tensor, group_size: int = 1) -> torch.Tensor:
    """[B, B_ne, sum_{i,t} m_it, P_ne] of a mask, float64 (summed over ranks, they are the whole batch's counts);
    P_ne counts the groups of group_size consecutive rows with at least one token.

    >>> batch_counts(torch.tensor([[1, 1, 0], [0, 0, 0]])).tolist()
    [2.0, 1.0, 2.0, 1.0]
    """
    m = mask.to(torch.float64)
    rows = torch.tensor(float(m.shape[0]), dtype=torch.float64, device=m.device)
    groups = (group_tokens(m, group_size) > 0).sum().double()
    return torch.stack([rows, (m.sum(-1) > 0).sum().double(), m.sum(), groups])


def seq_mean_token_mean(m: torch.Tensor, l_max: int, c: torch.Tensor, group_size: int = 1) -> torch.Tensor:
    """w_it = m_it / (B_ne * sum_t m_it)."""
    return m / (m.sum(-1, keepdim=True).clamp(min=1.0) * c[NONEMPTY_ROWS].clamp(min=1.0))


def token_mean(m: torch.Tensor, l_max: int, c: torch.Tensor, group_size: int = 1) -> torch.Tensor:
    """w_it = m_it / sum_{i,t} m_it."""
    return m / c[TOKENS].clamp(min=1.0)


def seq_mean_token_sum_norm(m: torch.Tensor, l_max: int, c: torch.Tensor, group_size: int = 1) -> torch.Tensor:
    """w_it = m_it / (B * L_max)."""
    return m / (c[ROWS].clamp(min=1.0) * l_max)


def seq_mean_token_sum(m: torch.Tensor, l_max: int, c: torch.Tensor, group_size: int = 1) -> torch.Tensor:
    """w_it = m_it / B_ne."""
    return m / c[NONEMPTY_ROWS].clamp(min=1.0)


def prompt_mean_token_mean(m: torch.Tensor, l_max: int, c: torch.Tensor, group_size: int = 1) -> torch.Tensor:
    """w_it = m_it / (P_ne * sum_{j in g(i), t} m_jt)."""
    per_group = group_tokens(m, group_size).clamp(min=1.0).repeat_interleave(group_size)
    return m / (per_group.unsqueeze(-1) * c[NONEMPTY_GROUPS].clamp(min=1.0))


AGGREGATIONS: dict[Aggregation, Callable[..., torch.Tensor]] = {
    Aggregation.SEQ_MEAN_TOKEN_MEAN: seq_mean_token_mean,
    Aggregation.TOKEN_MEAN: token_mean,
    Aggregation.SEQ_MEAN_TOKEN_SUM_NORM: seq_mean_token_sum_norm,
    Aggregation.SEQ_MEAN_TOKEN_SUM: seq_mean_token_sum,
    Aggregation.PROMPT_MEAN_TOKEN_MEAN: prompt_mean_token_mean,
}


def token_weights(
    mask: torch.Tensor, mode: Aggregation, l_max: int, counts: torch.Tensor | None = None, group_size: int = 1
) -> torch.Tensor:
    """[B, T] float64 weights w_it of these rows of the optimisation batch (see module docstring); counts is
    batch_counts of the whole batch (default: these rows are the whole batch); group_size: the rows per prompt
    (prompt_mean_token_mean; these rows hold whole groups).

    >>> m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    >>> token_weights(m, Aggregation.SEQ_MEAN_TOKEN_MEAN, 3).tolist()
    [[0.25, 0.25, 0.0], [0.5, 0.0, 0.0]]
    >>> token_weights(m, Aggregation.TOKEN_MEAN, 3).tolist()[0]
    [0.3333333333333333, 0.3333333333333333, 0.0]
    """
    m = mask.to(torch.float64)
    c = batch_counts(m, group_size) if counts is None else counts.to(m.device)
    return AGGREGATIONS[Aggregation(mode)](m, l_max, c, group_size)
