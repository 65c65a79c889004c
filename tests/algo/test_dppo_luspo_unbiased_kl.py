"""DPPO (Binary-TV / Binary-KL), LUSPO and DeepSeek-V3.2's unbiased KL (issue 59, requirement 4): hand-computed masks
and losses, and float64 gradients with respect to the log-probabilities against the formulas written out here."""

from __future__ import annotations

import math

import pytest
import torch

from grpolab.algo.aggregation import Aggregation, token_weights
from grpolab.algo.kl import KLEstimator, kl_k3, ratio_weighted, token_kl
from grpolab.algo.loss import ObjectiveParams, objective
from grpolab.algo.surrogate import ClipParams, CovSelect, PolicyLossParams, Surrogate, dppo_kept, gspo, surrogate_loss
from grpolab.card import objective_card
from grpolab.config import from_dict
from grpolab.errors import ConfigError

D = torch.float64
CLIP = ClipParams(eps_low=3e-4, eps_high=4e-4, dual_clip_c=3.0)


def extra(low: float = 0.15, high: float = 0.15, cap: float = 20.0) -> PolicyLossParams:
    return PolicyLossParams(1.0, 4.0, 1.0, 1.05, 2e-4, 1.0, 5.0, 0.1, CovSelect.RANDOM, low, high, cap)


def probs_batch():
    """p_old = [[0.6, 0.6, 0.6, 0.5], [0.6, 0.6, 0.6, 0.5]], p = [[0.9, 0.5, 0.2, .], [0.9, 0.5, 0.2, .]] (the last
    token masked), A = [1, -2]."""
    old = torch.log(torch.tensor([[0.6, 0.6, 0.6, 0.5]] * 2, dtype=D))
    logp = torch.log(torch.tensor([[0.9, 0.5, 0.2, 0.99]] * 2, dtype=D)).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 0]] * 2, dtype=D)
    return logp, old, torch.tensor([1.0, -2.0], dtype=D), mask


# --------------------------------------------------------------------------------------------- DPPO


def test_dppo_tv_masks_only_moves_past_the_bound_in_the_advantages_direction():
    logp, old, adv, mask = probs_batch()
    kept = dppo_kept(logp, old, adv, mask, 0.15, 0.15, binary_kl=False)
    # A > 0: +0.3 up is dropped, -0.1 and -0.4 (against the advantage) kept; A < 0: only the -0.4 down is dropped
    assert kept.tolist() == [[False, True, True, True], [True, True, False, True]]
    out = surrogate_loss(Surrogate.DPPO_TV, logp, old, adv, mask, CLIP, extra())
    r = torch.tensor([[1.5, 5 / 6, 1 / 3], [1.5, 5 / 6, 1 / 3]], dtype=D)
    lp = torch.log(torch.tensor([0.9, 0.5, 0.2], dtype=D))
    expected = torch.stack(
        [
            torch.stack([0 * lp[0], -r[0, 1] * lp[1], -r[0, 2] * lp[2], lp.new_tensor(0.0)]),
            torch.stack([2 * r[1, 0] * lp[0], 2 * r[1, 1] * lp[1], 0 * lp[2], lp.new_tensor(0.0)]),
        ]
    )
    torch.testing.assert_close(out.loss.detach(), expected, rtol=1e-12, atol=1e-15)
    assert out.clipped_high.tolist()[0] == [True, False, False, False] and not out.clipped_high[1].any()
    assert out.clipped_low.tolist()[1] == [False, False, True, False] and not out.clipped_low[0].any()
    # the gradient of a kept token is that of -r A: d(-A sg(r) log p)/d log p = -A r
    (grad,) = torch.autograd.grad(out.loss.sum(), logp)
    torch.testing.assert_close(
        grad, torch.cat([-r * adv[:, None], torch.zeros(2, 1, dtype=D)], 1) * kept, rtol=1e-12, atol=0.0
    )


def test_dppo_tv_bounds_are_separate_and_the_cap_bounds_the_detached_ratio():
    logp, old, adv, mask = probs_batch()
    # high 0.35 keeps the +0.3 move of A > 0; low 0.45 keeps the -0.4 move of A < 0
    kept = dppo_kept(logp, old, adv, mask, 0.45, 0.35, binary_kl=False)
    assert kept.all()
    out = surrogate_loss(Surrogate.DPPO_TV, logp, old, adv, mask, CLIP, extra(0.45, 0.35, cap=1.2))
    (grad,) = torch.autograd.grad(out.loss.sum(), logp)
    assert grad[0, 0].item() == pytest.approx(-1.2)  # r = 1.5 capped at 1.2, A = 1
    assert grad[1, 1].item() == pytest.approx(2 * 5 / 6)  # r = 5/6 under the cap, A = -2


def binary_kl(p_old: float, p: float) -> float:
    return p_old * math.log(p_old / p) + (1 - p_old) * math.log((1 - p_old + 1e-8) / (1 - p + 1e-8))


def test_dppo_kl_masks_by_the_binary_kl_in_the_advantages_direction():
    logp, old, adv, mask = probs_batch()
    d = [binary_kl(0.6, p) for p in (0.9, 0.5, 0.2)]  # 0.3112, 0.0201, 0.3819
    assert d[0] > 0.05 and d[1] < 0.05 and d[2] > 0.05
    kept = dppo_kept(logp, old, adv, mask, 0.05, 0.05, binary_kl=True)
    # A > 0: only the move up (0.6 -> 0.9) past 0.05 is dropped; A < 0: only the move down (0.6 -> 0.2)
    assert kept.tolist() == [[False, True, True, True], [True, True, False, True]]
    assert dppo_kept(logp, old, adv, mask, 0.39, 0.32, binary_kl=True).all()  # bounds above both divergences
    out = surrogate_loss(Surrogate.DPPO_KL, logp, old, adv, mask, CLIP, extra(0.05, 0.05))
    (grad,) = torch.autograd.grad(out.loss.sum(), logp)
    assert grad[0, 0] == 0 and grad[1, 2] == 0 and grad[0, 1].item() == pytest.approx(-5 / 6)


@pytest.mark.parametrize("kind", [Surrogate.DPPO_TV, Surrogate.DPPO_KL])
def test_dppo_float64_gradient_against_the_masked_ratio_objective(kind):
    """Random batch: d L / d log pi equals that of -sum w_it M_it min(r, C)/r * r_it A_i (M from the formula here)."""
    g = torch.Generator().manual_seed(3)
    old = torch.log(torch.rand(4, 6, generator=g, dtype=D) * 0.9 + 0.05)
    logp = (old + 0.6 * torch.randn(4, 6, generator=g, dtype=D)).clamp(max=-1e-3).requires_grad_(True)
    adv = torch.tensor([1.3, -0.7, 0.0, -2.0], dtype=D)
    mask = (torch.rand(4, 6, generator=g) > 0.2).to(D)
    q = extra(0.1, 0.2, cap=1.5) if kind == Surrogate.DPPO_TV else extra(0.02, 0.04, cap=1.5)
    w = token_weights(mask, Aggregation.SEQ_MEAN_TOKEN_MEAN, 6)
    (grad,) = torch.autograd.grad((surrogate_loss(kind, logp, old, adv, mask, CLIP, q).loss * w).sum(), logp)
    p, p_old, a = logp.detach().exp(), old.exp(), adv[:, None].expand(4, 6)
    if kind == Surrogate.DPPO_TV:
        out = torch.where(a > 0, p - p_old > q.dppo_high, p - p_old < -q.dppo_low)
    else:
        kl = p_old * (old - logp.detach()) + (1 - p_old) * torch.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
        out = torch.where(a > 0, (kl > q.dppo_high) & (p > p_old), (kl > q.dppo_low) & (p < p_old))
    assert out[mask.bool()].any() and (~out)[mask.bool() & (a != 0)].any(), "the batch has both kinds of token"
    r = torch.exp(logp - old)
    scale = (r.clamp(max=q.dppo_ratio_cap) / r).detach()
    reference = -(w * (~out) * mask * scale * r * a).sum()
    (expected,) = torch.autograd.grad(reference, logp)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)


def test_dppo_needs_its_parameters_and_at_ratio_one_is_plain_policy_gradient():
    logp, old, adv, mask = probs_batch()
    with pytest.raises(ValueError, match="dppo_tv"):
        surrogate_loss(Surrogate.DPPO_TV, logp, old, adv, mask, CLIP, None)
    out = surrogate_loss("dppo_kl", logp, logp.detach(), adv, mask, CLIP, extra())  # pi_old = pi_theta (mu = 1)
    (grad,) = torch.autograd.grad(out.loss.sum(), logp)
    torch.testing.assert_close(grad, -adv[:, None] * mask, rtol=0, atol=0)


# --------------------------------------------------------------------------------------------- LUSPO


def test_luspo_is_gspo_summed_over_tokens_length_times_the_sequence_loss():
    """LUSPO (TRL loss_type luspo): (1/B) sum_i |o_i| l_i with GSPO's l_i -- the gspo surrogate under
    seq_mean_token_sum. Value and float64 gradient against the sequence formula; a clipped sequence has none."""
    logp = torch.tensor([[-1.0, -0.5, -2.0, -0.7], [-0.3, -0.9, -1.1, -0.4]], dtype=D, requires_grad=True)
    old = logp.detach() + torch.tensor([[0.0002, -0.0001, 0.0001, 0.0], [0.002, 0.001, 0.0, 0.003]], dtype=D)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=D)
    adv = torch.tensor([0.5, -1.5], dtype=D)
    w = token_weights(mask, Aggregation.SEQ_MEAN_TOKEN_SUM, 4)
    torch.testing.assert_close(w, mask / 2, rtol=0, atol=0)  # w_it = m_it / B: the token sum, mean over sequences
    loss = (gspo(logp, old, adv, mask, CLIP).loss * w).sum()
    s = torch.exp(((logp - old) * mask).sum(-1) / mask.sum(-1))
    seq = -torch.minimum(s * adv, s.clamp(1 - CLIP.eps_low, 1 + CLIP.eps_high) * adv)
    reference = (mask.sum(-1) * seq).mean()
    assert loss.item() == pytest.approx(reference.item(), rel=1e-14)
    # by hand: s_0 = exp(-0.0002 / 3) (unclipped, A > 0), s_1 = exp(-0.0015) < 1 - 3e-4 clipped for A < 0
    hand = (3 * -(math.exp(-0.0002 / 3) * 0.5) + 4 * (1 - 3e-4) * 1.5) / 2
    assert loss.item() == pytest.approx(hand, rel=1e-14)
    (grad,) = torch.autograd.grad(loss, logp, retain_graph=True)
    (expected,) = torch.autograd.grad(reference, logp)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)
    assert (grad[1] == 0).all() and grad[0, 0].item() == pytest.approx(-0.5 * math.exp(-0.0002 / 3) / 2)


# --------------------------------------------------------------------------------------------- unbiased KL


def params(bias_correction: bool, beta: float = 0.1) -> ObjectiveParams:
    clip = ClipParams(0.2, 0.2, 3.0)
    return ObjectiveParams(Surrogate.PPO_CLIP, clip, beta, KLEstimator.K3, True, 0.0, None, 0.0, bias_correction)


def test_unbiased_kl_hand_values_and_its_gradient_is_r_times_log_pi_over_pi_ref():
    logp = torch.tensor([[-1.0, -0.5]], dtype=D, requires_grad=True)
    old = torch.tensor([[-1.5, -0.5]], dtype=D)
    ref = torch.tensor([[-2.0, -0.25]], dtype=D)
    mask = torch.ones(1, 2, dtype=D)
    k = ratio_weighted(kl_k3(logp, ref), logp, old, mask)
    # token 0: r = e^0.5, k3 = e^-1 + 1 - 1; token 1: r = 1, k3 = e^0.25 - 0.25 - 1
    hand = [math.exp(0.5) * math.exp(-1), math.exp(0.25) - 1.25]
    torch.testing.assert_close(k.detach(), torch.tensor([hand], dtype=D), rtol=1e-14, atol=0)
    (grad,) = torch.autograd.grad(k.sum(), logp)
    torch.testing.assert_close(grad, torch.tensor([[math.exp(0.5) * 1.0, -0.25]], dtype=D), rtol=1e-14, atol=1e-16)


def test_unbiased_kl_in_the_objective_float64_gradient_and_mean_matches_the_true_kl():
    g = torch.Generator().manual_seed(9)
    logp = (-torch.rand(3, 5, generator=g, dtype=D) - 0.2).requires_grad_(True)
    old = logp.detach() + 0.2 * torch.randn(3, 5, generator=g, dtype=D)
    ref = logp.detach() + 0.3 * torch.randn(3, 5, generator=g, dtype=D)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=D)
    adv = torch.tensor([0.4, -0.6, 0.0], dtype=D)
    w = token_weights(mask, Aggregation.SEQ_MEAN_TOKEN_MEAN, 5)
    one = torch.ones_like(w)
    on = objective(logp, old, ref, adv, w, one, mask, params(True))
    off = objective(logp, old, ref, adv, w, one, mask, params(False))
    r = torch.where(mask.bool(), torch.exp(logp.detach() - old), torch.ones_like(old))
    k3 = token_kl(logp.detach(), ref, KLEstimator.K3)
    assert on.kl == pytest.approx((w * r * k3).sum().item(), rel=1e-13)
    assert off.kl == pytest.approx((w * k3).sum().item(), rel=1e-13)
    (g_on,) = torch.autograd.grad(on.total, logp)
    (g_off,) = torch.autograd.grad(off.total, logp)
    # the policy term is the same; the KL term's gradient is beta w r (log pi - log pi_ref) with the correction and
    # beta w (1 - pi_ref / pi) without it, on unmasked tokens
    lp = logp.detach()
    expected = 0.1 * w * mask * (r * (lp - ref) - (1 - torch.exp(ref - lp)))
    torch.testing.assert_close(g_on - g_off, expected, rtol=1e-10, atol=1e-14)


def test_unbiased_kl_is_unbiased_where_plain_k3_is_not():
    """Tokens drawn from pi_old: E_old[r k3] = KL(pi_theta || pi_ref) exactly (a 3-token vocabulary, the expectation
    taken as a sum), while E_old[k3] is another number."""
    pi = torch.tensor([0.5, 0.3, 0.2], dtype=D)
    old = torch.tensor([0.2, 0.3, 0.5], dtype=D)
    ref = torch.tensor([0.4, 0.4, 0.2], dtype=D)
    k3 = kl_k3(pi.log(), ref.log())
    weighted = (old * ratio_weighted(k3, pi.log(), old.log(), torch.ones(3))).sum()
    true = (pi * (pi / ref).log()).sum()
    assert weighted.item() == pytest.approx(true.item(), rel=1e-14)
    assert abs((old * k3).sum().item() - true.item()) > 1e-3


# --------------------------------------------------------------------------------------------- config and card


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"dppo_low": 0.0}, r"algorithm.dppo_low: expected a number > 0"),
        ({"dppo_high": -0.1}, r"algorithm.dppo_high: expected a number > 0"),
        ({"dppo_ratio_cap": 0.9}, r"algorithm.dppo_ratio_cap: expected a number >= 1"),
        (
            {"kl_bias_correction": True, "beta": 0.04, "kl_placement": "reward"},
            r"algorithm.kl_placement: expected loss",
        ),
    ],
)
def test_config_refuses_out_of_range_values_naming_the_field(fields, message):
    with pytest.raises(ConfigError, match=message):
        from_dict({"algorithm": fields})


def test_presets_and_card_of_the_new_options():
    tv, kl, lu = (from_dict({"algorithm": {"preset": p}}).algorithm for p in ("dppo_tv", "dppo_kl", "luspo"))
    assert (tv.surrogate, tv.dppo_low, tv.dppo_high, tv.scaling, tv.aggregation, tv.beta) == (
        "dppo_tv",
        0.15,
        0.15,
        "none",
        "seq_mean_token_sum_norm",
        0.0,
    )
    assert (kl.surrogate, kl.dppo_low, kl.dppo_high) == ("dppo_kl", 0.05, 0.05)
    assert (lu.surrogate, lu.eps_low, lu.eps_high, lu.aggregation) == ("gspo", 3e-4, 4e-4, "seq_mean_token_sum")
    card = objective_card(from_dict({"algorithm": {"preset": "dppo_tv"}}))
    assert "p - p_old > 0.15" in card["formula"] and "sg(min(r_it, 20.0))" in card["formula"]
    assert r"\min(r_{i,t}, 20.0)" in card["formula_latex"] and "prime-rl" in card["choices"]["dppo_trust_region"]
    verl = card["equivalents"]["verl"]["surrogate"]
    assert verl["match"] == "exact" and verl["settings"]["actor_rollout_ref.actor.policy_loss.loss_mode"] == "dppo_tv"
    assert verl["settings"]["actor_rollout_ref.actor.clip_ratio_c"] == 20.0
    assert card["equivalents"]["trl"]["surrogate"]["match"] == "none"
    card = objective_card(from_dict({"algorithm": {"preset": "luspo"}}))
    assert "-(1/B) sum_i sum_t [ min(s_i" in card["formula"] and "luspo" in card["choices"]
    assert card["equivalents"]["trl"]["aggregation"]["settings"] == {"loss_type": "luspo"}
    assert card["equivalents"]["trl"]["surrogate"]["settings"]["importance_sampling_level"] == "sequence"
    card = objective_card(from_dict({"algorithm": {"beta": 0.04, "kl_bias_correction": True}}))
    assert "- 0.04 r_it KL_k3(pi_theta || pi_ref)" in card["formula"] and card["choices"]["kl_bias_correction"]
    trl, verl = card["equivalents"]["trl"]["kl"], card["equivalents"]["verl"]["kl"]
    assert trl["match"] == "exact" and trl["settings"]["use_bias_correction_kl"] is True
    assert verl["match"] == "nearest" and "pi_theta / pi_old" in verl["difference"]  # their KL loss, unweighted
    assert verl["settings"]["actor_rollout_ref.actor.kl_loss_coef"] == 0.04
    gspo_kl = objective_card(from_dict({"algorithm": {"preset": "gspo", "beta": 0.04, "kl_bias_correction": True}}))
    assert gspo_kl["equivalents"]["trl"]["kl"]["match"] == "nearest"
