"""How token losses become one number: loss = sum_{i,t} w_it * l_it with weights from the *whole* batch.

Modes (m_it the loss mask, B_ne the number of sequences with at least one unmasked token, B all rows):

* seq_mean_token_mean (GRPO):      w_it = m_it / (B_ne * sum_t m_it)
* token_mean (DAPO):               w_it = m_it / sum_{i,t} m_it
* seq_mean_token_sum_norm (Dr. GRPO): w_it = m_it / (B * L_max), L_max a constant (e.g. max_new_tokens)
* seq_mean_token_sum:              w_it = m_it / B_ne

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


def _nonempty_rows(m: torch.Tensor) -> torch.Tensor:
    return (m.sum(-1) > 0).sum().clamp(min=1)


def seq_mean_token_mean(m: torch.Tensor, l_max: int) -> torch.Tensor:
    """w_it = m_it / (B_ne * sum_t m_it)."""
    return m / (m.sum(-1, keepdim=True).clamp(min=1.0) * _nonempty_rows(m))


def token_mean(m: torch.Tensor, l_max: int) -> torch.Tensor:
    """w_it = m_it / sum_{i,t} m_it."""
    return m / m.sum().clamp(min=1.0)


def seq_mean_token_sum_norm(m: torch.Tensor, l_max: int) -> torch.Tensor:
    """w_it = m_it / (B * L_max)."""
    return m / (m.shape[0] * l_max)


def seq_mean_token_sum(m: torch.Tensor, l_max: int) -> torch.Tensor:
    """w_it = m_it / B_ne."""
    return m / _nonempty_rows(m)


AGGREGATIONS: dict[Aggregation, Callable[[torch.Tensor, int], torch.Tensor]] = {
    Aggregation.SEQ_MEAN_TOKEN_MEAN: seq_mean_token_mean,
    Aggregation.TOKEN_MEAN: token_mean,
    Aggregation.SEQ_MEAN_TOKEN_SUM_NORM: seq_mean_token_sum_norm,
    Aggregation.SEQ_MEAN_TOKEN_SUM: seq_mean_token_sum,
}


def token_weights(mask: torch.Tensor, mode: Aggregation, l_max: int) -> torch.Tensor:
    """[B, T] float64 weights w_it for the whole optimisation batch (see module docstring).

    >>> m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    >>> token_weights(m, Aggregation.SEQ_MEAN_TOKEN_MEAN, 3).tolist()
    [[0.25, 0.25, 0.0], [0.5, 0.0, 0.0]]
    >>> token_weights(m, Aggregation.TOKEN_MEAN, 3).tolist()[0]
    [0.3333333333333333, 0.3333333333333333, 0.0]
    """
    return AGGREGATIONS[Aggregation(mode)](mask.to(torch.float64), l_max)
