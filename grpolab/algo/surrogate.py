"""Clipped policy-gradient surrogates (per-token loss, to be minimised).

Notation: r_it = pi_theta(o_it) / pi_old(o_it), A_i the sequence advantage broadcast over tokens -- or, given
per-token advantages A_it ([B, T], e.g. GAE from a critic: grpolab.algo.gae), A_it itself.

* ppo_clip:  l_it = -min(r_it A_i, clip(r_it, 1 - eps_low, 1 + eps_high) A_i)
  (eps_low = eps_high = 0.2: GRPO; 0.2 / 0.28: DAPO clip-higher)
* dual_clip: ppo_clip, and for A_i < 0 additionally l_it = min(l_it, -c A_i), i.e. the objective is capped
  below at c A_i (Ye et al. 2020; c = 3 typical)
* gspo:      the token ratio is replaced by the sequence ratio s_i = exp((1/|o_i|) sum_t m_it log r_it),
  broadcast to every token, then clipped as ppo_clip (GSPO, Zheng et al. 2025; eps ~ 3e-4 / 4e-4)
* cispo:     l_it = -sg(clip(r_it, 1 - eps_low_is, 1 + eps_high_is)) A_i log pi_theta(o_it): a REINFORCE term
  weighted by the clipped, detached ratio; every token keeps a gradient (MiniMax-M1, arXiv 2506.13585)
* gmpo:      the geometric mean of token ratios, clipped in log space: log r~_it = sgn(A_i) min(sgn(A_i) log r_it,
  sgn(A_i) clip(log r_it, -eps_low, eps_high)), s_i = exp(sum_t m_it log r~_it / sum_t m_it), l_it = -A_i s_i for
  every token of o_i (GMPO, arXiv 2507.20673; eps_low = eps_high = 0.4)
* sapo:      a soft gate in place of the clip: l_it = -(4 / tau) sigmoid(tau (r_it - 1)) A_i, tau = tau_pos for
  A_i > 0, tau_neg otherwise (SAPO, arXiv 2511.20347; 1.0 / 1.05)
* clip_cov:  ppo_clip, and the loss of up to n tokens is set to 0 (so is its gradient), drawn uniformly at random
  among the eligible ones: not clipped by ppo_clip, covariance c_it = (A_it - mean A)(log pi_it - mean log pi) in
  (lb, ub) (Cui et al. 2025, arXiv 2505.22617, and verl; rho = 2e-4, lb = 1, ub = 5). clip_cov_select = largest
  takes the largest c_it first instead (grpolab's form before issue 59)
* kl_cov:    l_it = -r_it A_i (no clip), plus k |log r_it| on the n tokens of largest c_it (same paper; rho = 2e-4,
  k = 0.1 as verl's default). At r = 1 the gradient of |log r| is 0: with mu = 1 and one minibatch (pi_old is the
  policy being trained) KL-Cov is plain policy gradient
* dppo_tv:   a trust region by divergence instead of the ratio clip (DPPO-Binary-TV, Qi et al. 2026, arXiv 2602.04879;
  verl dppo_tv): l_it = -A_i sg(min(r_it, C)) log pi_theta(o_it) M_it, whose gradient is -A_i min(r_it, C) / r_it
  d r_it (that of -r_it A_i below the cap C). M_it = 0 drops the token when the sampled token's probability moved
  past the threshold in the advantage's direction: A_i > 0 and p_it - p_old,it > delta_high, or A_i <= 0 and
  p_it - p_old,it < -delta_low (p = exp(log pi)); a move against the advantage is never masked, as PPO's clip
  (delta = 0.15 / 0.15, C = 20)
* dppo_kl:   dppo_tv with the binary KL of the sampled token, D_it = p_old log(p_old / p) + (1 - p_old)
  log((1 - p_old + 1e-8) / (1 - p + 1e-8)): M_it = 0 when D_it > delta_high, A_i > 0 and p > p_old, or
  D_it > delta_low, A_i <= 0 and p < p_old (DPPO-Binary-KL, verl dppo_kl; delta = 0.05 / 0.05)

Clip-Cov and KL-Cov select among the N unmasked tokens of the tensors they are given (one micro-batch), with the
means of c_it over the same tokens; the selection is detached. n = floor(rho N + u), u uniform in [0, 1) drawn once
per micro-batch (``cov_count``): its expectation is rho N, so the expected share selected is rho whatever the
micro-batch size (the papers' and verl's n = max(floor(rho N), 1) selects one token of every micro-batch under
1 / rho tokens: 10x the rate at 500-token micro-batches with rho = 2e-4). A count drawn per micro-batch rather
than one threshold over the step's tokens: c_it uses the current policy's log-probabilities (the paper's, verl's),
which exist one micro-batch at a time -- a step-wide threshold would need another no-grad pass over the step (or
pi_old in their place) and, over several ranks, a gather of every token's covariance. What still depends on the
micro-batch is which tokens compete and the means of c_it. The draws come from a torch.Generator the caller seeds
(the update: from train.seed and the step), so a run and its resume draw the same.

Each returns a SurrogateOut with the token loss and where the clip was active (for clip-fraction metrics):
``clipped_low`` marks tokens with A < 0 and ratio < 1 - eps_low (gradient zeroed by the clip),
``clipped_high`` marks A > 0 and ratio > 1 + eps_high.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Callable

import torch


class Surrogate(StrEnum):
    PPO_CLIP = "ppo_clip"
    DUAL_CLIP = "dual_clip"
    GSPO = "gspo"
    CISPO = "cispo"
    GMPO = "gmpo"
    SAPO = "sapo"
    CLIP_COV = "clip_cov"
    KL_COV = "kl_cov"
    DPPO_TV = "dppo_tv"
    DPPO_KL = "dppo_kl"


class CovSelect(StrEnum):
    """Which eligible tokens Clip-Cov zeroes: drawn uniformly at random (the paper's and verl's), or the largest
    covariances first."""

    RANDOM = "random"
    LARGEST = "largest"


@dataclass(frozen=True)
class ClipParams:
    """Clip range [1 - eps_low, 1 + eps_high] of the ratio, and the dual-clip bound c.
    No defaults: the algorithm's defaults are defined once, by AlgorithmConfig (grpolab/config/schema.py)."""

    eps_low: float
    eps_high: float
    dual_clip_c: float


def valid(ok: Callable[[Any], bool], expected: str) -> dict[str, Any]:
    """A parameter's range as dataclass field metadata: ``ok(value)`` and the words an error gives when it fails."""
    return {"valid": (ok, expected)}


@dataclass(frozen=True)
class PolicyLossParams:
    """The parameters of cispo (IS-weight bounds), sapo (gate temperatures), clip_cov / kl_cov (share of tokens
    selected, covariance bounds, KL coefficient, how Clip-Cov picks its tokens), dppo_tv / dppo_kl (divergence
    bounds, cap of the detached ratio). No defaults: AlgorithmConfig defines
    them (grpolab/config/schema.py), under the same names. A field's ``valid`` metadata is its range (predicate, what is expected), checked on the
    config by grpolab.config.checks; the trainer and the objective card read every field by name, so a new
    parameter is this field, its AlgorithmConfig default and its use in a surrogate (and the card's formula)."""

    cispo_eps_low: float = field(metadata=valid(lambda v: 0 <= v <= 1, "a number in [0, 1] (1 = no lower bound)"))
    cispo_eps_high: float = field(metadata=valid(lambda v: v >= 0, "a number >= 0"))
    sapo_tau_pos: float = field(metadata=valid(lambda v: v > 0, "a number > 0"))
    sapo_tau_neg: float = field(metadata=valid(lambda v: v > 0, "a number > 0"))
    cov_ratio: float = field(metadata=valid(lambda v: 0 < v <= 1, "a number in (0, 1]"))
    clip_cov_lb: float  # any finite number (every float of the config is)
    clip_cov_ub: float
    kl_cov_coef: float = field(metadata=valid(lambda v: v >= 0, "a number >= 0"))
    clip_cov_select: CovSelect  # one of CovSelect (the config's type checks it)
    dppo_low: float = field(metadata=valid(lambda v: v > 0, "a number > 0 (the divergence bound where A <= 0)"))
    dppo_high: float = field(metadata=valid(lambda v: v > 0, "a number > 0 (the divergence bound where A > 0)"))
    dppo_ratio_cap: float = field(metadata=valid(lambda v: v >= 1, "a number >= 1 (the cap C of the detached ratio)"))


@dataclass(frozen=True)
class SurrogateOut:
    loss: torch.Tensor  # [B, T]
    ratio: torch.Tensor  # [B, T] the ratio that was clipped (token or broadcast sequence ratio)
    clipped_low: torch.Tensor  # [B, T] bool
    clipped_high: torch.Tensor  # [B, T] bool
    selected: torch.Tensor | None = None  # [B, T] bool: clip_cov / kl_cov's covariance-selected tokens


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
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    p: ClipParams,
    extra: PolicyLossParams | None = None,
) -> SurrogateOut:
    """l_it = -min(r_it A_i, clip(r_it, 1-eps_low, 1+eps_high) A_i), r_it = exp(logp - old_logp) on unmasked
    tokens (masked tokens get r = 1, so padding values can never produce inf/NaN)."""
    log_ratio = torch.where(mask.bool(), logp - old_logp, torch.zeros_like(logp))
    return _clipped(log_ratio, per_token(adv, logp), p)


def dual_clip(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    p: ClipParams,
    extra: PolicyLossParams | None = None,
) -> SurrogateOut:
    """ppo_clip, then for A_i < 0: l_it = min(l_it, -c A_i)."""
    out = ppo_clip(logp, old_logp, adv, mask, p)
    a = per_token(adv, logp)
    capped = torch.where(a < 0, torch.minimum(out.loss, -p.dual_clip_c * a), out.loss)
    return SurrogateOut(loss=capped, ratio=out.ratio, clipped_low=out.clipped_low, clipped_high=out.clipped_high)


def gspo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    p: ClipParams,
    extra: PolicyLossParams | None = None,
) -> SurrogateOut:
    """log s_i = sum_t m_it (logp - old_logp) / sum_t m_it; l_it = -min(s_it A_i, clip(s_it, ...) A_i), with the
    token form s_it = sg(s_i) pi_theta(o_it) / sg(pi_theta(o_it)) (GSPO-token, verl's gspo): s_it = s_i in value,
    and the gradient of token t flows through its own term only, so a token weight (an IS weight, a mask) of 0
    removes that token's gradient. With weights equal over a sequence's tokens the gradient is GSPO's."""
    m = mask.to(logp.dtype)
    log_s = ((logp - old_logp) * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    return _clipped(_own_gradient(log_s.unsqueeze(-1).detach(), logp, mask), per_token(adv, logp), p)


def _needs(extra: PolicyLossParams | None, kind: str) -> PolicyLossParams:
    if extra is None:
        raise ValueError(f"surrogate {kind!r} needs its PolicyLossParams (got None)")
    return extra


def _own_gradient(log_value: torch.Tensor, log_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] log_value + log_token - sg(log_token) on unmasked tokens (log_value, without gradient, elsewhere): the
    value of the detached sequence quantity `log_value` ([B, 1]) on every token, with each token's gradient that of
    its own log_token.

    >>> x = torch.tensor([[0.25, 0.75]], requires_grad=True)
    >>> y = _own_gradient(torch.tensor([[0.5]]), x, torch.ones(1, 2))
    >>> y.tolist(), torch.autograd.grad(y[0, 0], x)[0].tolist()
    ([[0.5, 0.5]], [[1.0, 0.0]])
    """
    own = log_value + (log_token - log_token.detach())
    return torch.where(mask.bool(), own, log_value.expand_as(own))


def _token_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log r_it on unmasked tokens, 0 on masked ones (padding values never produce inf/NaN)."""
    return torch.where(mask.bool(), logp - old_logp, torch.zeros_like(logp))


def cispo(logp, old_logp, adv, mask, p: ClipParams, extra: PolicyLossParams | None = None) -> SurrogateOut:
    """l_it = -sg(clip(r_it, 1 - eps_low_is, 1 + eps_high_is)) A_i log pi_theta(o_it); the gradient of every token
    is -sg(w_it) A_i d log pi_theta(o_it). clipped_low / clipped_high mark where the weight was bounded."""
    q = _needs(extra, "cispo")
    ratio = torch.exp(_token_log_ratio(logp, old_logp, mask))
    lo, hi = 1.0 - q.cispo_eps_low, 1.0 + q.cispo_eps_high
    w = torch.clamp(ratio, lo, hi).detach()
    a = per_token(adv, logp)
    loss = -w * a * torch.where(mask.bool(), logp, torch.zeros_like(logp))
    return SurrogateOut(loss=loss, ratio=ratio, clipped_low=ratio < lo, clipped_high=ratio > hi)


def gmpo(logp, old_logp, adv, mask, p: ClipParams, extra: PolicyLossParams | None = None) -> SurrogateOut:
    """log r~_it = sgn(A_i) min(sgn(A_i) log r_it, sgn(A_i) clip(log r_it, -eps_low, eps_high));
    s_i = exp(sum_t m_it log r~_it / sum_t m_it); l_it = -A_i s_it on every token of o_i, in the token form
    s_it = sg(s_i) exp(log r~_it - sg(log r~_it)) (= s_i in value; the gradient of token t flows through its own
    term only, so a token weight of 0 removes its gradient; with weights equal over a sequence's tokens the
    gradient is GMPO's). Per-token advantages enter as their mean over the sequence's unmasked tokens."""
    m = mask.to(logp.dtype)
    log_r = _token_log_ratio(logp, old_logp, mask)
    a_tok = per_token(adv, logp)
    a_seq = (a_tok * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    sgn = torch.sign(a_seq).unsqueeze(-1)
    log_r_clipped = sgn * torch.minimum(sgn * log_r, sgn * torch.clamp(log_r, -p.eps_low, p.eps_high))
    log_s = ((log_r_clipped * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1).detach()
    s = torch.exp(log_s).squeeze(-1)
    loss = -a_seq.unsqueeze(-1) * torch.exp(_own_gradient(log_s, log_r_clipped, mask))
    low = (sgn < 0) & (log_r < -p.eps_low)
    high = (sgn > 0) & (log_r > p.eps_high)
    return SurrogateOut(loss=loss, ratio=s.unsqueeze(-1).expand_as(logp), clipped_low=low, clipped_high=high)


def sapo(logp, old_logp, adv, mask, p: ClipParams, extra: PolicyLossParams | None = None) -> SurrogateOut:
    """l_it = -(4 / tau_it) sigmoid(tau_it (r_it - 1)) A_i, tau_it = tau_pos if A_i > 0 else tau_neg. The gate's slope
    at r = 1 is 1 (the gradient of plain r A there); no token is clipped."""
    q = _needs(extra, "sapo")
    ratio = torch.exp(_token_log_ratio(logp, old_logp, mask))
    a = per_token(adv, logp)
    tau = torch.where(a > 0, a.new_tensor(q.sapo_tau_pos), a.new_tensor(q.sapo_tau_neg))
    loss = -torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * a
    none = torch.zeros_like(mask, dtype=torch.bool)
    return SurrogateOut(loss=loss, ratio=ratio, clipped_low=none, clipped_high=none)


def _covariance(logp: torch.Tensor, a: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
    """c_it = (A_it - mean A)(log pi_it - mean log pi), means over the selected tokens; detached."""
    lp, aa = logp.detach(), a.detach()
    n = sel.sum().clamp(min=1)
    mean_a = torch.where(sel, aa, torch.zeros_like(aa)).sum() / n
    mean_lp = torch.where(sel, lp, torch.zeros_like(lp)).sum() / n
    return (aa - mean_a) * (lp - mean_lp)


def _top(score: torch.Tensor, eligible: torch.Tensor, n: int) -> torch.Tensor:
    """[B, T] bool: the (at most n) eligible tokens of largest score."""
    flat = torch.where(eligible, score, torch.full_like(score, -torch.inf)).reshape(-1)
    k = min(n, int(eligible.sum().item()))
    out = torch.zeros_like(flat, dtype=torch.bool)
    if k > 0:
        out[torch.topk(flat, k).indices] = True
    return out.view_as(score)


def _drawn(eligible: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """[B, T] bool: min(n, |eligible|) eligible tokens drawn uniformly at random, without replacement."""
    where = eligible.reshape(-1).nonzero().squeeze(1)
    out = torch.zeros(eligible.numel(), dtype=torch.bool, device=eligible.device)
    k = min(n, where.numel())
    if k > 0:
        out[where[torch.randperm(where.numel(), generator=generator)[:k].to(where.device)]] = True
    return out.view_as(eligible)


def cov_count(ratio: float, tokens: int, u: float) -> int:
    """n = floor(rho N + u) for u in [0, 1): with u uniform, E[n] = rho N exactly (floor(rho N) + 1 with probability
    frac(rho N)), so the expected share of tokens selected is rho at any micro-batch size.

    >>> [cov_count(0.02, 25, u) for u in (0.0, 0.25, 0.5, 0.75)]  # rho N = 0.5: one token half of the time
    [0, 0, 1, 1]
    >>> cov_count(1.0, 7, 0.999)
    7
    """
    return math.floor(ratio * tokens + u)


def _draws(generator: torch.Generator | None) -> torch.Generator:
    """The stream of the selection's draws: the caller's, or (None) a new one seeded 0."""
    return generator if generator is not None else torch.Generator().manual_seed(0)


def _count(ratio: float, sel: torch.Tensor, generator: torch.Generator) -> int:
    """cov_count over the N unmasked tokens, u drawn from `generator`."""
    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    return cov_count(ratio, int(sel.sum().item()), u)


def clip_cov(
    logp, old_logp, adv, mask, p: ClipParams, extra: PolicyLossParams | None = None, generator=None
) -> SurrogateOut:
    """ppo_clip with l_it = 0 on the selected tokens: n = cov_count tokens among those not clipped with c_it in
    (lb, ub), drawn uniformly at random (clip_cov_select random) or the largest c_it first (largest)."""
    q, g = _needs(extra, "clip_cov"), _draws(generator)
    sel = mask.bool()
    a = per_token(adv, logp)
    base = _clipped(_token_log_ratio(logp, old_logp, mask), a, p)
    unclipped_value = -base.ratio * a
    clipped_by_ppo = base.loss.detach() > unclipped_value.detach()
    cov = _covariance(logp, a, sel)
    eligible = sel & ~clipped_by_ppo & (cov > q.clip_cov_lb) & (cov < q.clip_cov_ub)
    n = _count(q.cov_ratio, sel, g)
    chosen = _top(cov, eligible, n) if q.clip_cov_select == CovSelect.LARGEST else _drawn(eligible, n, g)
    loss = torch.where(chosen, torch.zeros_like(base.loss), base.loss)
    return SurrogateOut(loss, base.ratio, base.clipped_low, base.clipped_high, selected=chosen)


def kl_cov(
    logp, old_logp, adv, mask, p: ClipParams, extra: PolicyLossParams | None = None, generator=None
) -> SurrogateOut:
    """l_it = -r_it A_i, plus k |log r_it| on the n = cov_count unmasked tokens of largest c_it (no clip)."""
    q = _needs(extra, "kl_cov")
    sel = mask.bool()
    a = per_token(adv, logp)
    log_r = _token_log_ratio(logp, old_logp, mask)
    ratio = torch.exp(log_r)
    chosen = _top(_covariance(logp, a, sel), sel, _count(q.cov_ratio, sel, _draws(generator)))
    loss = -ratio * a + torch.where(chosen, q.kl_cov_coef * log_r.abs(), torch.zeros_like(log_r))
    none = torch.zeros_like(sel)
    return SurrogateOut(loss=loss, ratio=ratio, clipped_low=none, clipped_high=none, selected=chosen)


def dppo_kept(logp, old_logp, adv, mask, low: float, high: float, binary_kl: bool) -> torch.Tensor:
    """[B, T] bool, detached: DPPO's trust region M_it (module docstring) on the sampled token's probabilities
    p = exp(logp), p_old = exp(old_logp); masked tokens are kept (their loss is 0 anyway).

    >>> lp = torch.log(torch.tensor([[0.9, 0.5, 0.2]])); old = torch.log(torch.tensor([[0.6, 0.6, 0.6]]))
    >>> dppo_kept(lp, old, torch.tensor([1.0]), torch.ones(1, 3), 0.15, 0.15, False).tolist()  # +0.3 up: dropped
    [[False, True, True]]
    >>> dppo_kept(lp, old, torch.tensor([-1.0]), torch.ones(1, 3), 0.15, 0.15, False).tolist()  # -0.4 down: dropped
    [[True, True, False]]
    """
    p, p_old = torch.exp(logp.detach()), torch.exp(old_logp)
    a = per_token(adv, logp)
    if binary_kl:
        d = p_old * (old_logp - logp.detach()) + (1 - p_old) * torch.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
        out_high, out_low = (d > high) & (p > p_old), (d > low) & (p < p_old)
    else:
        out_high, out_low = p - p_old > high, p - p_old < -low
    return ~torch.where(a > 0, out_high, out_low) | ~mask.bool()


def _dppo(logp, old_logp, adv, mask, extra: PolicyLossParams | None, binary_kl: bool) -> SurrogateOut:
    """l_it = -A_i sg(min(r_it, C)) log pi_theta(o_it) M_it (module docstring)."""
    q = _needs(extra, "dppo_kl" if binary_kl else "dppo_tv")
    ratio = torch.exp(_token_log_ratio(logp, old_logp, mask))
    kept = dppo_kept(logp, old_logp, adv, mask, q.dppo_low, q.dppo_high, binary_kl)
    a = per_token(adv, logp)
    w = torch.clamp(ratio, max=q.dppo_ratio_cap).detach()
    loss = torch.where(kept & mask.bool(), -a * w * logp, torch.zeros_like(logp))
    return SurrogateOut(loss=loss, ratio=ratio, clipped_low=~kept & (a < 0), clipped_high=~kept & (a > 0))


def dppo_tv(logp, old_logp, adv, mask, p: ClipParams, extra: PolicyLossParams | None = None) -> SurrogateOut:
    """DPPO-Binary-TV: l_it = -A_i sg(min(r_it, C)) log pi_theta(o_it) M_it, M_it = 0 where A_i > 0 and
    p_it - p_old,it > delta_high or A_i <= 0 and p_it - p_old,it < -delta_low. clipped_high / clipped_low mark the
    dropped tokens (A > 0 / A < 0)."""
    return _dppo(logp, old_logp, adv, mask, extra, binary_kl=False)


def dppo_kl(logp, old_logp, adv, mask, p: ClipParams, extra: PolicyLossParams | None = None) -> SurrogateOut:
    """DPPO-Binary-KL: dppo_tv with M_it = 0 where D_it > delta_high, A_i > 0 and p > p_old, or D_it > delta_low,
    A_i <= 0 and p < p_old; D_it the binary KL of the sampled token (module docstring)."""
    return _dppo(logp, old_logp, adv, mask, extra, binary_kl=True)


SURROGATES: dict[Surrogate, Callable[..., SurrogateOut]] = {
    Surrogate.PPO_CLIP: ppo_clip,
    Surrogate.DUAL_CLIP: dual_clip,
    Surrogate.GSPO: gspo,
    Surrogate.CISPO: cispo,
    Surrogate.GMPO: gmpo,
    Surrogate.SAPO: sapo,
    Surrogate.CLIP_COV: clip_cov,
    Surrogate.KL_COV: kl_cov,
    Surrogate.DPPO_TV: dppo_tv,
    Surrogate.DPPO_KL: dppo_kl,
}


DRAWING = frozenset({Surrogate.CLIP_COV, Surrogate.KL_COV})  # the surrogates that draw from a generator


def surrogate_loss(
    kind: Surrogate,
    logp,
    old_logp,
    adv,
    mask,
    p: ClipParams,
    extra: PolicyLossParams | None = None,
    generator: torch.Generator | None = None,
) -> SurrogateOut:
    """Dispatch through SURROGATES (extra: the parameters of cispo, sapo, clip_cov and kl_cov; generator: the stream
    of clip_cov's and kl_cov's draws, None = a new one seeded 0)."""
    kind = Surrogate(kind)
    if kind in DRAWING:
        return SURROGATES[kind](logp, old_logp, adv, mask, p, extra, generator)
    return SURROGATES[kind](logp, old_logp, adv, mask, p, extra)
