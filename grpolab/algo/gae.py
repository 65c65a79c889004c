"""PPO with a learned critic: per-token rewards, GAE, advantage whitening and the clipped value loss.

Notation: m_t the loss mask of one completion (1 on tokens the policy sampled and is trained on; 0 on padding and,
in agent episodes, on environment tokens), t_1 < ... < t_K its model tokens, R the sequence reward, V_t the critic's
value of the state before token t, kl_t the per-token KL estimate to the reference.

* token rewards (classic RLHF placement of the KL, Ziegler et al. 2019 / InstructGPT):
      r_t = -beta * kl_t on every model token,  plus R on the last model token t_K
* GAE(gamma, lambda) over model tokens only (Schulman et al. 2016), the completion's end is terminal:
      delta_k = r_{t_k} + gamma * V_{t_{k+1}} - V_{t_k}      with V_{t_{K+1}} = 0
      A_{t_k} = delta_k + gamma * lambda * A_{t_{k+1}}        with A_{t_{K+1}} = 0
      G_{t_k} = A_{t_k} + V_{t_k}                            (the critic's regression target)
  A masked token between two model tokens is skipped (it carries neither a value nor a TD error); A = G = 0 on it.
* whitening (optional): A <- (A - mean_m A) / sqrt(var_m A + 1e-8), mean and (population) variance over the
  model tokens of the whole batch.
* value loss with clipping (PPO2 / TRL / verl / OpenRLHF):
      l^V_t = 0.5 * max((V_t - G_t)^2, (V_old_t + clip(V_t - V_old_t, -eps_v, eps_v) - G_t)^2)

Everything takes tensors and scalars; statistics are computed in float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

WHITEN_EPS = 1e-8


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """[N] column of each row's last model token (-1 for a row without one).

    >>> last_token_index(torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 1]])).tolist()
    [1, -1, 2]
    """
    cols = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), cols, -1).max(-1).values


def token_rewards(rewards: torch.Tensor, kl: torch.Tensor | None, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """[N, T] float64 r_t = -beta * kl_t * m_t, plus R_i at row i's last model token (module docstring).

    >>> token_rewards(torch.tensor([1.0]), torch.tensor([[0.5, 1.0, 9.0]]), torch.tensor([[1, 1, 0]]), 0.1).tolist()
    [[-0.05, 0.9, -0.0]]
    """
    m = mask.to(torch.float64)
    out = torch.zeros_like(m) if kl is None or beta == 0 else -beta * kl.to(torch.float64) * m
    last = last_token_index(mask)
    rows = (last >= 0).nonzero().squeeze(-1)
    out[rows, last[rows]] += rewards.to(torch.float64).to(out.device)[rows]
    return out


@dataclass(frozen=True)
class GAEOut:
    advantages: torch.Tensor  # [N, T] float64, 0 on masked tokens
    returns: torch.Tensor  # [N, T] float64, 0 on masked tokens


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float) -> GAEOut:
    """GAE(gamma, lambda) over the model tokens of each row, skipping masked ones; the row's end is terminal
    (module docstring). rewards, values, mask: [N, T].

    >>> out = gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.25]]), torch.tensor([[1, 1]]), 1.0, 1.0)
    >>> out.advantages.tolist(), out.returns.tolist()
    ([[0.5, 0.75]], [[1.0, 1.0]])
    """
    r, v, m = rewards.to(torch.float64), values.to(torch.float64), mask.bool()
    adv = torch.zeros_like(r)
    next_value = torch.zeros(r.shape[0], dtype=torch.float64, device=r.device)
    next_adv = torch.zeros_like(next_value)
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + gamma * next_value - v[:, t]
        a = delta + gamma * lam * next_adv
        keep = m[:, t]
        next_value = torch.where(keep, v[:, t], next_value)
        next_adv = torch.where(keep, a, next_adv)
        adv[:, t] = torch.where(keep, a, 0.0)
    returns = torch.where(m, adv + v, 0.0)
    return GAEOut(adv, returns)


def masked_moments(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[sum_m x, sum_m x^2, sum m] in float64 (summable over data-parallel ranks before `whiten`)."""
    m, x = mask.to(torch.float64), x.to(torch.float64)
    return torch.stack([(x * m).sum(), (x * x * m).sum(), m.sum()])


def whiten(x: torch.Tensor, mask: torch.Tensor, moments: torch.Tensor | None = None) -> torch.Tensor:
    """(x - mean) / sqrt(var + 1e-8) on masked tokens (population variance), 0 elsewhere; ``moments`` from
    ``masked_moments`` of the whole batch (default: of these rows).

    >>> [round(v, 4) for v in whiten(torch.tensor([[1.0, 3.0, 7.0]]), torch.tensor([[1, 1, 0]]))[0].tolist()]
    [-1.0, 1.0, 0.0]
    """
    s = masked_moments(x, mask) if moments is None else moments.to(torch.float64)
    n = s[2].clamp(min=1.0)
    mean = s[0] / n
    var = (s[1] / n - mean * mean).clamp(min=0.0)
    return torch.where(mask.bool(), (x.to(torch.float64) - mean) / torch.sqrt(var + WHITEN_EPS), 0.0)


@dataclass(frozen=True)
class ValueLossOut:
    loss: torch.Tensor  # [N, T] per-token 0.5 * max(unclipped, clipped) squared error
    clipped: torch.Tensor  # [N, T] bool: the clipped term is the larger one (its gradient is zero)


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float
) -> ValueLossOut:
    """l_t = 0.5 * max((V - G)^2, (V_old + clip(V - V_old, -clip, clip) - G)^2); clip <= 0 turns clipping off.

    >>> out = clipped_value_loss(torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([2.0]), 0.2)
    >>> round(out.loss.item(), 4), out.clipped.tolist()
    (1.62, [True])
    """
    unclipped = (values - returns) ** 2
    if clip <= 0:
        return ValueLossOut(0.5 * unclipped, torch.zeros_like(unclipped, dtype=torch.bool))
    v_clip = old_values + (values - old_values).clamp(-clip, clip)
    clipped = (v_clip - returns) ** 2
    return ValueLossOut(0.5 * torch.maximum(unclipped, clipped), clipped > unclipped)


def explained_variance(
    values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    reduce: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
) -> float:
    """1 - Var_m(G - V) / Var_m(G) over masked tokens, population variances (nan when the returns do not vary).
    ``reduce`` sums its float64 statistics over data-parallel ranks (grpolab.training.distributed.all_reduce_sum), so the
    variances are those of the whole batch: the means first, then the squared deviations from them."""
    m, g = mask.double(), returns.double()
    d = g - values.double()
    s = reduce(torch.stack([(g * m).sum(), (d * m).sum(), m.sum()]))
    n = s[2].clamp(min=1.0)
    c = reduce(torch.stack([((g - s[0] / n) ** 2 * m).sum(), ((d - s[1] / n) ** 2 * m).sum()]))
    return float("nan") if c[0].item() == 0 else (1 - c[1] / c[0]).item()
