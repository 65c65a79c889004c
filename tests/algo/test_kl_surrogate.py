"""KL estimators (grpolab.algo.kl) and clipped surrogates (grpolab.algo.surrogate).

docs/design.md section 4: k1 = -log rho, k2 = .5 (log rho)^2, k3 = rho - log rho - 1 with rho = pi_ref / pi_theta;
ppo_clip -min(rA, clip(r, 1-eps_low, 1+eps_high) A), dual_clip caps at -c A for A < 0, GSPO uses
s_i = exp(mean_t log r_it).
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from grpolab.algo.kl import KL_ESTIMATORS, LOG_RHO_CLAMP, KLEstimator, kl_k1, kl_k2, kl_k3, token_kl
from grpolab.algo.surrogate import SURROGATES, ClipParams, Surrogate, surrogate_loss

E = math.e

# ==================================================================================================
# KL
# ==================================================================================================


def naive_kl(estimator: str, logp: float, ref: float) -> float:
    log_rho = min(max(ref - logp, -LOG_RHO_CLAMP), LOG_RHO_CLAMP)
    if estimator == "k1":
        return -log_rho
    if estimator == "k2":
        return 0.5 * log_rho * log_rho
    return math.exp(log_rho) - log_rho - 1.0


def test_kl_registry_complete():
    assert set(KL_ESTIMATORS) == set(KLEstimator)
    assert KL_ESTIMATORS[KLEstimator.K1] is kl_k1
    assert KL_ESTIMATORS[KLEstimator.K2] is kl_k2
    assert KL_ESTIMATORS[KLEstimator.K3] is kl_k3


# (logp, ref_logp) -> (k1, k2, k3); log rho = ref - logp
KL_HAND = [
    ((-1.0, -2.0), (1.0, 0.5, math.exp(-1.0))),  # log rho = -1: e^-1 + 1 - 1
    ((-2.0, -1.0), (-1.0, 0.5, E - 2.0)),  # log rho = 1: e - 1 - 1
    ((-1.0, -3.0), (2.0, 2.0, math.exp(-2.0) + 1.0)),  # log rho = -2
    ((-0.5, -0.5), (0.0, 0.0, 0.0)),  # identical policies
    ((0.0, -math.log(2.0)), (math.log(2.0), 0.5 * math.log(2.0) ** 2, 0.5 + math.log(2.0) - 1.0)),  # rho = 1/2
]


@pytest.mark.parametrize("case", KL_HAND)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kl_hand_values(case, dtype):
    (lp, ref), (k1, k2, k3) = case
    logp = torch.tensor([lp], dtype=dtype)
    refp = torch.tensor([ref], dtype=dtype)
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(token_kl(logp, refp, KLEstimator.K1), torch.tensor([k1], dtype=dtype), **tol)
    torch.testing.assert_close(token_kl(logp, refp, KLEstimator.K2), torch.tensor([k2], dtype=dtype), **tol)
    torch.testing.assert_close(token_kl(logp, refp, KLEstimator.K3), torch.tensor([k3], dtype=dtype), **tol)


def test_kl_identical_policies_exactly_zero():
    x = torch.randn(50, dtype=torch.float64) * 5
    for est in KLEstimator:
        assert (token_kl(x, x.clone(), est) == 0).all()


def test_kl_log_rho_clamp():
    """log rho is clamped at +-LOG_RHO_CLAMP (20) so k3 cannot overflow."""
    logp = torch.tensor([0.0, -100.0], dtype=torch.float64)
    ref = torch.tensor([-100.0, 0.0], dtype=torch.float64)  # log rho = -100, +100
    c = LOG_RHO_CLAMP
    torch.testing.assert_close(token_kl(logp, ref, "k1"), torch.tensor([c, -c], dtype=torch.float64))
    torch.testing.assert_close(token_kl(logp, ref, "k2"), torch.tensor([0.5 * c * c] * 2, dtype=torch.float64))
    torch.testing.assert_close(
        token_kl(logp, ref, "k3"), torch.tensor([math.exp(-c) + c - 1, math.exp(c) - c - 1], dtype=torch.float64)
    )
    # float32 does not overflow either
    for est in KLEstimator:
        assert torch.isfinite(token_kl(logp.float() * 10, ref.float() * 10, est)).all()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("est", list(KLEstimator))
def test_kl_random_vs_naive(seed, est):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(7, 9, generator=g, dtype=torch.float64) * 12
    ref = -torch.rand(7, 9, generator=g, dtype=torch.float64) * 12
    ref[0, 0] = logp[0, 0] + 25.0  # beyond the clamp
    ref[0, 1] = logp[0, 1] - 25.0
    out = token_kl(logp, ref, est)
    expected = torch.tensor(
        [[naive_kl(str(est), a, b) for a, b in zip(ra, rb)] for ra, rb in zip(logp.tolist(), ref.tolist())],
        dtype=torch.float64,
    )
    assert out.shape == logp.shape and out.dtype == torch.float64
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


def test_kl_gradients_float64():
    """d k1/d logp = 1, d k2/d logp = -log rho, d k3/d logp = 1 - rho (inside the clamp)."""
    g = torch.Generator().manual_seed(3)
    logp = (-torch.rand(20, generator=g, dtype=torch.float64) * 5).requires_grad_()
    ref = -torch.rand(20, generator=g, dtype=torch.float64) * 5
    log_rho = (ref - logp).detach()
    for est, expected in [("k1", torch.ones_like(log_rho)), ("k2", -log_rho), ("k3", 1 - torch.exp(log_rho))]:
        (grad,) = torch.autograd.grad(token_kl(logp, ref, est).sum(), logp)
        torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_k3_nonnegative_up_to_rounding(dtype):
    """k3 >= 0 up to one unit of rounding, over many scales of log rho, and k2 >= 0 exactly."""
    g = torch.Generator().manual_seed(0)
    tiny = 2.0**-23 if dtype == torch.float32 else 2.0**-52
    for scale in [1e-8, 1e-5, 1e-3, 1e-1, 1.0, 10.0, 100.0]:
        ref = torch.randn(20000, generator=g, dtype=torch.float64).to(dtype) * 3
        logp = ref + (torch.randn(20000, generator=g, dtype=torch.float64) * scale).to(dtype)
        k3 = token_kl(logp, ref, "k3")
        assert torch.isfinite(k3).all()
        assert k3.min().item() >= -tiny, (scale, k3.min().item())
        assert (token_kl(logp, ref, "k2") >= 0).all()


def test_k3_always_nonnegative_exactly():
    # hand case: log rho = 5e-5 in float32
    k = kl_k3(torch.tensor([0.0]), torch.tensor([5e-5]))
    assert k.item() >= 0.0, k.item()
    # and a sweep in both precisions
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        for scale in [1e-5, 1e-3, 1e-1]:
            lr = (torch.randn(100000, generator=g, dtype=torch.float64) * scale).to(dtype)
            assert (kl_k3(torch.zeros_like(lr), lr) >= 0).all()


# ==================================================================================================
# Surrogates
# ==================================================================================================


def naive_surrogate(kind, logp, old, adv, mask, eps_low, eps_high, c):
    """Plain-python per-token loss and clip flags. Lists [B][T], adv [B]. Returns (loss, ratio, low, high)."""
    B, T = len(logp), len(logp[0])
    loss = [[0.0] * T for _ in range(B)]
    ratio = [[0.0] * T for _ in range(B)]
    low = [[False] * T for _ in range(B)]
    high = [[False] * T for _ in range(B)]
    for i in range(B):
        a = adv[i]
        if kind == "gspo":
            n = 0.0
            s = 0.0
            for t in range(T):
                if mask[i][t]:
                    s += logp[i][t] - old[i][t]
                    n += 1
            seq_lr = s / max(n, 1.0)
        for t in range(T):
            # token ratios are 1 on masked tokens (documented), the sequence ratio is broadcast everywhere
            lr = seq_lr if kind == "gspo" else (logp[i][t] - old[i][t] if mask[i][t] else 0.0)
            r = math.exp(lr)
            rc = min(max(r, 1.0 - eps_low), 1.0 + eps_high)
            l_ = -min(r * a, rc * a)
            if kind == "dual_clip" and a < 0:
                l_ = min(l_, -c * a)
            loss[i][t] = l_
            ratio[i][t] = r
            low[i][t] = a < 0 and r < 1.0 - eps_low
            high[i][t] = a > 0 and r > 1.0 + eps_high
    return loss, ratio, low, high


def test_surrogate_registry_complete():
    assert set(SURROGATES) == set(Surrogate)


RATIOS = [0.5, 0.9, 1.0, 1.1, 1.25, 1.5, 4.0]
# the clipped-ratio surrogates this module's naive reference covers; the 2025-26 menu (cispo, gmpo, sapo, clip_cov,
# kl_cov) has its references, hand values and extreme-ratio checks in tests/test_objective_menu.py
CLIP_FAMILY = [Surrogate.PPO_CLIP, Surrogate.DUAL_CLIP, Surrogate.GSPO]

# per-token loss for A = +2 and A = -2 (rows), written out by hand.
#   A > 0: l = -A min(r, clip(r))   A < 0: l = |A| max(r, clip(r))
SURR_HAND = {
    # symmetric eps .2: clip to [.8, 1.2]
    ("ppo_clip", 0.2, 0.2): (
        [-1.0, -1.8, -2.0, -2.2, -2.4, -2.4, -2.4],
        [1.6, 1.8, 2.0, 2.2, 2.5, 3.0, 8.0],
        [False, False, False, False, True, True, True],  # high (A > 0, r > 1.2)
        [True, False, False, False, False, False, False],  # low (A < 0, r < .8)
    ),
    # clip-higher: clip to [.8, 1.28]
    ("ppo_clip", 0.2, 0.28): (
        [-1.0, -1.8, -2.0, -2.2, -2.5, -2.56, -2.56],
        [1.6, 1.8, 2.0, 2.2, 2.5, 3.0, 8.0],
        [False, False, False, False, False, True, True],
        [True, False, False, False, False, False, False],
    ),
    # dual clip c = 3: A < 0 additionally capped at -c A = 6  (only r = 4 is affected: 8 -> 6)
    ("dual_clip", 0.2, 0.2): (
        [-1.0, -1.8, -2.0, -2.2, -2.4, -2.4, -2.4],
        [1.6, 1.8, 2.0, 2.2, 2.5, 3.0, 6.0],
        [False, False, False, False, True, True, True],
        [True, False, False, False, False, False, False],
    ),
    ("dual_clip", 0.2, 0.28): (
        [-1.0, -1.8, -2.0, -2.2, -2.5, -2.56, -2.56],
        [1.6, 1.8, 2.0, 2.2, 2.5, 3.0, 6.0],
        [False, False, False, False, False, True, True],
        [True, False, False, False, False, False, False],
    ),
}


@pytest.mark.parametrize("key", list(SURR_HAND), ids=[f"{k[0]}-{k[1]}-{k[2]}" for k in SURR_HAND])
def test_token_surrogates_hand(key):
    kind, el, eh = key
    pos, neg, high, low = SURR_HAND[key]
    old = torch.tensor([[-1.3] * 7, [-0.2] * 7, [-2.0] * 7], dtype=torch.float64)
    logp = old + torch.log(torch.tensor([RATIOS] * 3, dtype=torch.float64))
    adv = torch.tensor([2.0, -2.0, 0.0], dtype=torch.float64)
    mask = torch.ones(3, 7)
    out = surrogate_loss(kind, logp, old, adv, mask, ClipParams(eps_low=el, eps_high=eh, dual_clip_c=3.0))
    expected = torch.tensor([pos, neg, [0.0] * 7], dtype=torch.float64)
    torch.testing.assert_close(out.loss, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.ratio, torch.tensor([RATIOS] * 3, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert out.clipped_high.tolist() == [high, [False] * 7, [False] * 7]
    assert out.clipped_low.tolist() == [[False] * 7, low, [False] * 7]


def test_gspo_hand():
    # row 0: log r = [.3, -.1, .1, (7.0 masked)] -> mean .1 -> s = e^.1 = 1.10517 > 1 + 4e-4
    # row 1: log r = [3e-4, -1e-4, 1e-4, (-9 masked)] -> mean 1e-4 -> s = e^1e-4 inside [1 - 3e-4, 1 + 4e-4]
    # row 2: same as row 0 with A < 0: l = |A| max(s, clip(s)) = 2 e^.1 (not clipped)
    # row 3: log r = [-.3, -.3, (0 masked), (0 masked)] -> s = e^-.3 < 1 - 3e-4, A = -1 -> clipped low: l = (1 - 3e-4)
    lr = torch.tensor(
        [[0.3, -0.1, 0.1, 7.0], [3e-4, -1e-4, 1e-4, -9.0], [0.3, -0.1, 0.1, 7.0], [-0.3, -0.3, 0.0, 0.0]],
        dtype=torch.float64,
    )
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 0, 0]])
    old = torch.full_like(lr, -0.7)
    logp = old + lr
    adv = torch.tensor([2.0, 2.0, -2.0, -1.0], dtype=torch.float64)
    p = ClipParams(eps_low=3e-4, eps_high=4e-4, dual_clip_c=3.0)
    out = surrogate_loss(Surrogate.GSPO, logp, old, adv, mask, p)
    s = [math.exp(0.1), math.exp(1e-4), math.exp(0.1), math.exp(-0.3)]
    row_loss = [-2.0 * (1 + 4e-4), -2.0 * math.exp(1e-4), 2.0 * math.exp(0.1), 1.0 * (1 - 3e-4)]
    torch.testing.assert_close(
        out.ratio, torch.tensor(s, dtype=torch.float64)[:, None].expand(4, 4), rtol=1e-12, atol=0
    )
    torch.testing.assert_close(
        out.loss, torch.tensor(row_loss, dtype=torch.float64)[:, None].expand(4, 4), rtol=1e-12, atol=1e-12
    )
    assert out.clipped_high[:, 0].tolist() == [True, False, False, False]
    assert out.clipped_low[:, 0].tolist() == [False, False, False, True]


def _random_surrogate_inputs(seed, dtype=torch.float64):
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    B, T = rng.randint(1, 6), rng.randint(1, 9)
    old = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 6).to(dtype)
    logp = old + (torch.randn(B, T, generator=g, dtype=torch.float64) * rng.choice([0.05, 0.3, 1.5])).to(dtype)
    adv = (torch.randn(B, generator=g, dtype=torch.float64) * 1.5).to(dtype)
    adv[torch.rand(B, generator=g) < 0.2] = 0.0
    mask = (torch.rand(B, T, generator=g) < 0.75).long()
    if B > 1:
        mask[rng.randrange(B)] = 0  # a fully masked row
    eps_low = rng.choice([0.2, 0.1, 3e-4])
    eps_high = rng.choice([eps_low, 0.28, 4e-4])
    c = rng.choice([2.0, 3.0, 5.0])
    return logp, old, adv, mask, ClipParams(eps_low=eps_low, eps_high=eps_high, dual_clip_c=c)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("kind", CLIP_FAMILY)
def test_surrogates_random_vs_naive(seed, kind):
    logp, old, adv, mask, p = _random_surrogate_inputs(seed)
    out = surrogate_loss(kind, logp, old, adv, mask, p)
    loss, ratio, low, high = naive_surrogate(
        str(kind), logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), p.eps_low, p.eps_high, p.dual_clip_c
    )
    assert out.loss.shape == logp.shape
    torch.testing.assert_close(out.loss, torch.tensor(loss, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.ratio, torch.tensor(ratio, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert out.clipped_low.tolist() == low
    assert out.clipped_high.tolist() == high


@pytest.mark.parametrize("kind", CLIP_FAMILY)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_surrogates_extreme_ratios(kind, dtype):
    """log ratio +-30 and +-50 under every mode: loss and gradient finite, flags right, dual cap holds."""
    lrs = [-50.0, -30.0, 30.0, 50.0]
    advs = [1.0, -1.0, 0.0, 0.5, -2.0]
    B, T = len(advs), len(lrs)
    old = torch.full((B, T), -3.0, dtype=dtype)
    logp = (old + torch.tensor([lrs] * B, dtype=dtype)).requires_grad_()
    adv = torch.tensor(advs, dtype=dtype)
    mask = torch.ones(B, T)
    if kind == Surrogate.GSPO:
        # sequence log ratios 40, -40, 0, 50, -50 for A = 1, -1, 0, .5, -2
        mask = torch.tensor([[0, 0, 1, 1], [1, 1, 0, 0], [1, 0, 0, 1], [0, 0, 0, 1], [1, 0, 0, 0]])
    p = ClipParams(eps_low=0.2, eps_high=0.28, dual_clip_c=3.0)
    out = surrogate_loss(kind, logp, old, adv, mask, p)
    assert torch.isfinite(out.loss).all(), out.loss
    (grad,) = torch.autograd.grad((out.loss * mask.to(dtype)).sum(), logp)
    assert torch.isfinite(grad).all()
    ratio = out.ratio.detach().double()
    a = adv.double()[:, None].expand(B, T)
    assert torch.equal(out.clipped_high, (a > 0) & (ratio > 1 + p.eps_high))
    assert torch.equal(out.clipped_low, (a < 0) & (ratio < 1 - p.eps_low))
    # every huge ratio with A > 0 is clipped high; every tiny ratio with A < 0 is clipped low
    assert out.clipped_high[(a > 0) & (ratio > 1e10)].all()
    assert out.clipped_low[(a < 0) & (ratio < 1e-10)].all()
    loss = out.loss.detach().double()
    # clipped tokens carry the clipped value: -(1 + eps_high) A and -(1 - eps_low) A
    torch.testing.assert_close(loss[out.clipped_high], (-(1 + p.eps_high) * a)[out.clipped_high], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(loss[out.clipped_low], (-(1 - p.eps_low) * a)[out.clipped_low], rtol=1e-6, atol=1e-6)
    if kind == Surrogate.DUAL_CLIP:
        neg = a < 0
        assert (loss[neg] <= (-p.dual_clip_c * a)[neg] * (1 + 1e-6)).all()
        # with ratio e^30 / e^50 the cap is the value
        big = neg & (ratio > 1e10)
        assert big.any()
        torch.testing.assert_close(loss[big], (-p.dual_clip_c * a)[big], rtol=1e-6, atol=0)
        # and the gradient there is zero (the cap is a constant)
        assert (grad.double()[big] == 0).all()
    # A = 0 contributes nothing
    zero = a == 0
    assert (loss[zero] == 0).all()


@pytest.mark.parametrize("eps", [(0.2, 0.2), (0.2, 0.28)])
@pytest.mark.parametrize("seed", range(4))
def test_ppo_clip_gradient(seed, eps):
    """d l/d logp = 0 exactly where the clip is active, -A r where it is not (float64 autograd)."""
    g = torch.Generator().manual_seed(100 + seed)
    B, T = 6, 11
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4
    logp = (old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.4).requires_grad_()
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    p = ClipParams(eps_low=eps[0], eps_high=eps[1], dual_clip_c=3.0)
    out = surrogate_loss(Surrogate.PPO_CLIP, logp, old, adv, torch.ones(B, T), p)
    (grad,) = torch.autograd.grad(out.loss.sum(), logp)
    r = torch.exp(logp.detach() - old)
    # stay away from the exact boundaries where max() splits the gradient
    assert ((r - (1 + p.eps_high)).abs() > 1e-9).all() and ((r - (1 - p.eps_low)).abs() > 1e-9).all()
    a = adv[:, None].expand(B, T)
    active = ((a > 0) & (r > 1 + p.eps_high)) | ((a < 0) & (r < 1 - p.eps_low))
    assert active.any() and (~active).any()
    assert torch.equal(active, out.clipped_high | out.clipped_low)
    assert (grad[active] == 0.0).all()
    torch.testing.assert_close(grad[~active], (-a * r)[~active], rtol=1e-12, atol=1e-14)


def test_dual_clip_gradient_zero_where_capped():
    old = torch.zeros(1, 4, dtype=torch.float64)
    logp = torch.log(torch.tensor([[0.5, 1.0, 2.5, 4.0]], dtype=torch.float64)).requires_grad_()
    adv = torch.tensor([-1.0], dtype=torch.float64)
    out = surrogate_loss(Surrogate.DUAL_CLIP, logp, old, adv, torch.ones(1, 4), ClipParams(0.2, 0.2, 3.0))
    torch.testing.assert_close(out.loss, torch.tensor([[0.8, 1.0, 2.5, 3.0]], dtype=torch.float64))
    (grad,) = torch.autograd.grad(out.loss.sum(), logp)
    # r = .5: clipped low (0); r = 1, 2.5: -A r = r; r = 4: capped at 3 (0)
    torch.testing.assert_close(grad, torch.tensor([[0.0, 1.0, 2.5, 0.0]], dtype=torch.float64), rtol=1e-12, atol=0)


# ---------------------------------------------------------------------------------------------------
# GSPO properties
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_gspo_sequence_ratio_and_mask_independence(seed):
    logp, old, adv, mask, _ = _random_surrogate_inputs(seed)
    p = ClipParams(eps_low=3e-4, eps_high=4e-4, dual_clip_c=3.0)
    out = surrogate_loss(Surrogate.GSPO, logp, old, adv, mask, p)
    B, T = logp.shape
    for i in range(B):
        toks = [logp[i, t].item() - old[i, t].item() for t in range(T) if mask[i, t]]
        s = math.exp(sum(toks) / len(toks)) if toks else 1.0
        for t in range(T):
            assert out.ratio[i, t].item() == pytest.approx(s, rel=1e-12)
        # every token of a row carries the same loss and the same flags
        assert (out.loss[i] == out.loss[i, 0]).all()
        assert (out.clipped_low[i] == out.clipped_low[i, 0]).all()
        assert (out.clipped_high[i] == out.clipped_high[i, 0]).all()
    # masked tokens do not matter, whatever their values
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(B, T, generator=g, dtype=torch.float64) * 20
    logp2 = torch.where(mask.bool(), logp, logp + noise)
    old2 = torch.where(mask.bool(), old, old - noise.flip(0))
    out2 = surrogate_loss(Surrogate.GSPO, logp2, old2, adv, mask, p)
    assert torch.equal(out.loss, out2.loss)
    assert torch.equal(out.ratio, out2.ratio)


def test_gspo_differs_from_token_ratio():
    """GSPO is not ppo_clip: with token log-ratios [.5, -.5] the sequence ratio is exactly 1."""
    old = torch.zeros(1, 2, dtype=torch.float64)
    logp = torch.tensor([[0.5, -0.5]], dtype=torch.float64)
    adv = torch.tensor([1.0], dtype=torch.float64)
    g = surrogate_loss("gspo", logp, old, adv, torch.ones(1, 2), ClipParams(0.2, 0.2, 3.0))
    torch.testing.assert_close(g.loss, torch.tensor([[-1.0, -1.0]], dtype=torch.float64))
    t = surrogate_loss("ppo_clip", logp, old, adv, torch.ones(1, 2), ClipParams(0.2, 0.2, 3.0))
    torch.testing.assert_close(t.loss, torch.tensor([[-1.2, -math.exp(-0.5)]], dtype=torch.float64))


def test_gspo_gradient_spread_over_masked_tokens():
    """With per-row mean weights, d/d logp_it of -s_i A_i = -A_i s_i m_it / |o_i| (unclipped), 0 on masked."""
    g = torch.Generator().manual_seed(9)
    B, T = 4, 6
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    logp = (old + torch.randn(B, T, generator=g, dtype=torch.float64) * 1e-5).requires_grad_()
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0], [0, 1, 1, 0, 1, 0]])
    m = mask.double()
    p = ClipParams(eps_low=0.2, eps_high=0.2, dual_clip_c=3.0)  # the small noise keeps every s inside the clip
    out = surrogate_loss("gspo", logp, old, adv, mask, p)
    w = m / m.sum(-1, keepdim=True)
    (grad,) = torch.autograd.grad((w * out.loss).sum(), logp)
    s = out.ratio.detach()
    expected = -adv[:, None] * s * m / m.sum(-1, keepdim=True)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)
    assert (grad[mask == 0] == 0).all()


@pytest.mark.parametrize("kind", CLIP_FAMILY)
def test_surrogate_dispatch_accepts_str(kind):
    """Dispatch accepts the plain string value as well as the enum."""
    logp, old, adv, mask, p = _random_surrogate_inputs(1)
    a = surrogate_loss(kind, logp, old, adv, mask, p)
    b = surrogate_loss(str(kind), logp, old, adv, mask, p)
    assert torch.equal(a.loss, b.loss)


@pytest.mark.parametrize("kind,est", list(itertools.product(CLIP_FAMILY, list(KLEstimator))))
def test_float32_inputs_close_to_float64(kind, est):
    """float32 inputs give the float64 answer to float32 precision (no hidden precision loss)."""
    logp, old, adv, mask, p = _random_surrogate_inputs(7)
    o64 = surrogate_loss(kind, logp, old, adv, mask, p)
    o32 = surrogate_loss(kind, logp.float(), old.float(), adv.float(), mask, p)
    torch.testing.assert_close(o32.loss.double(), o64.loss, rtol=1e-4, atol=1e-5)
    k64 = token_kl(logp, old, est)
    k32 = token_kl(logp.float(), old.float(), est)
    torch.testing.assert_close(k32.double(), k64, rtol=1e-4, atol=1e-5)
