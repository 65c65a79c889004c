"""The 2025-26 objective menu (grpolab/algo): CISPO, GMPO, SAPO, Clip-Cov, KL-Cov, the prompt-level aggregation, the
geometric rejection, the off-policy sequence mask and the correction's metrics -- hand-computed values on a 2x3
batch, float64 references written from each paper's formula, degenerate cases and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from grpolab.algo.aggregation import Aggregation, batch_counts, token_weights
from grpolab.algo.importance import ISMode, ISParams, ISReject, RejectParams, correction, correction_stats
from grpolab.algo.kl import KLEstimator
from grpolab.algo.loss import ObjectiveParams, objective, offpolicy_sequence_mask
from grpolab.algo.surrogate import ClipParams, CovSelect, PolicyLossParams, Surrogate, surrogate_loss
from grpolab.card import objective_card
from grpolab.config import from_dict
from grpolab.errors import ConfigError

D = torch.float64
CLIP = ClipParams(eps_low=0.2, eps_high=0.28, dual_clip_c=3.0)
EXTRA = PolicyLossParams(
    cispo_eps_low=0.5,
    cispo_eps_high=1.0,
    sapo_tau_pos=1.0,
    sapo_tau_neg=1.05,
    cov_ratio=0.4,  # rho N = 2 of the 5 unmasked tokens of batch_2x3: floor(2 + u) = 2 whatever u
    clip_cov_lb=0.0,
    clip_cov_ub=5.0,
    kl_cov_coef=0.1,
    clip_cov_select=CovSelect.LARGEST,  # the random draw: tests/algo/test_covariance_selection.py
    dppo_low=0.15,
    dppo_high=0.15,
    dppo_ratio_cap=20.0,
)
NEW = [Surrogate.CISPO, Surrogate.GMPO, Surrogate.SAPO, Surrogate.CLIP_COV, Surrogate.KL_COV]


def batch_2x3():
    """Ratios r = [[0.5, 1, 3], [1.5, 1, (masked)]], A = [1, -2]."""
    old = torch.log(torch.tensor([[0.4, 0.5, 0.1], [0.2, 0.3, 0.6]], dtype=D))
    r = torch.tensor([[0.5, 1.0, 3.0], [1.5, 1.0, 1.0]], dtype=D)
    logp = (old + torch.log(r)).requires_grad_(True)
    adv = torch.tensor([1.0, -2.0], dtype=D)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=D)
    return logp, old, adv, mask


# --------------------------------------------------------------------------------------------- hand-computed values


def test_cispo_hand_values_and_gradient():
    logp, old, adv, mask = batch_2x3()
    out = surrogate_loss("cispo", logp, old, adv, mask, CLIP, EXTRA)  # weight clipped to [0.5, 2]
    w = torch.tensor([[0.5, 1.0, 2.0], [1.5, 1.0, 1.0]], dtype=D)
    want = -w * torch.tensor([[1.0], [-2.0]], dtype=D) * logp.detach() * mask
    torch.testing.assert_close(out.loss.detach() * mask, want)
    assert out.clipped_high.tolist() == [[False, False, True], [False, False, False]]
    (out.loss * mask).sum().backward()
    # every token keeps a gradient: d l / d log pi = -sg(w) A (the clipped ones included)
    torch.testing.assert_close(logp.grad, -w * torch.tensor([[1.0], [-2.0]], dtype=D) * mask)


def test_gmpo_hand_values():
    logp, old, adv, mask = batch_2x3()
    out = surrogate_loss("gmpo", logp, old, adv, mask, ClipParams(0.4, 0.4, 3.0))
    # row 0, A > 0: log r = [log .5, 0, log 3] -> min(log r, clip(log r, -.4, .4)) = [log .5, 0, .4]
    s0 = math.exp((math.log(0.5) + 0.0 + 0.4) / 3)
    # row 1, A < 0: -min(-log r, -clip) = max(log r, clip(log r)) over [log 1.5, 0] -> [log 1.5, 0]
    s1 = math.exp(math.log(1.5) / 2)
    torch.testing.assert_close(out.loss.detach()[:, 0], torch.tensor([-1.0 * s0, 2.0 * s1], dtype=D))
    assert out.loss.detach()[0].unique().numel() == 1  # one sequence loss, broadcast
    assert out.clipped_high[0].tolist() == [False, False, True]


def test_sapo_hand_values_and_slope_one_at_ratio_one():
    logp, old, adv, mask = batch_2x3()
    out = surrogate_loss("sapo", logp, old, adv, mask, CLIP, EXTRA)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    want00 = -4.0 * sig(1.0 * (0.5 - 1)) * 1.0
    want10 = -(4 / 1.05) * sig(1.05 * (1.5 - 1)) * -2.0
    assert out.loss[0, 0].item() == pytest.approx(want00, rel=1e-12)
    assert out.loss[1, 0].item() == pytest.approx(want10, rel=1e-12)
    (out.loss * mask).sum().backward()
    # at r = 1 the gate's gradient equals plain r A's: d l / d log pi = -A
    assert logp.grad[0, 1].item() == pytest.approx(-1.0) and logp.grad[1, 1].item() == pytest.approx(2.0)


def test_clip_cov_largest_selects_unclipped_large_covariance_tokens_and_zeroes_their_gradient():
    logp, old, adv, mask = batch_2x3()
    a = torch.tensor([[1.0, 1, 1], [-2, -2, -2]], dtype=D)
    sel = mask.bool()
    lp = logp.detach()
    cov = (a - a[sel].mean()) * (lp - lp[sel].mean())
    ppo = surrogate_loss("ppo_clip", logp, old, adv, mask, CLIP).loss.detach()
    clipped = ppo > -torch.exp(logp - old).detach() * a
    eligible = sel & ~clipped & (cov > 0.0)
    n = 2  # floor(0.4 * 5 + u)
    order = torch.where(eligible, cov, torch.full_like(cov, -math.inf)).flatten().argsort(descending=True)
    chosen = torch.zeros(6, dtype=torch.bool)
    chosen[order[: min(n, int(eligible.sum()))]] = True
    out = surrogate_loss("clip_cov", logp, old, adv, mask, CLIP, EXTRA)
    assert out.selected.flatten().tolist() == chosen.tolist() and chosen.sum() >= 1
    torch.testing.assert_close(out.loss.detach(), torch.where(chosen.view(2, 3), torch.zeros_like(ppo), ppo))
    (out.loss * mask).sum().backward()
    assert (logp.grad.flatten()[chosen] == 0).all()
    assert (logp.grad.flatten()[~chosen & sel.flatten() & ~clipped.flatten()] != 0).all()


def test_kl_cov_adds_abs_log_ratio_on_top_covariance_tokens_without_clip():
    logp, old, adv, mask = batch_2x3()
    a = torch.tensor([[1.0, 1, 1], [-2, -2, -2]], dtype=D)
    sel = mask.bool()
    lp = logp.detach()
    cov = torch.where(sel, (a - a[sel].mean()) * (lp - lp[sel].mean()), torch.full_like(lp, -math.inf))
    top = cov.flatten().topk(2).indices
    log_r = (logp - old).detach() * mask
    want = -torch.exp(log_r) * a
    want.view(-1)[top] += 0.1 * log_r.view(-1)[top].abs()
    out = surrogate_loss("kl_cov", logp, old, adv, mask, CLIP, EXTRA)
    torch.testing.assert_close(out.loss.detach() * mask, want * mask)
    assert int(out.selected.sum()) == 2


def test_prompt_mean_token_mean_weights():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
    w = token_weights(mask, Aggregation.PROMPT_MEAN_TOKEN_MEAN, 3, group_size=2)
    # groups: rows 0-1 (3 tokens), rows 2-3 (3 tokens); two non-empty groups
    assert w.tolist() == [[1 / 6, 1 / 6, 0.0], [1 / 6, 0.0, 0.0], [1 / 6, 1 / 6, 1 / 6], [0.0, 0.0, 0.0]]
    assert batch_counts(mask, 2).tolist() == [4.0, 3.0, 6.0, 2.0]
    # an empty group counts for nothing; group_size 1 is seq_mean_token_mean
    empty = torch.tensor([[0, 0], [0, 0], [1, 1], [1, 0]])
    assert token_weights(empty, "prompt_mean_token_mean", 2, group_size=2).sum().item() == pytest.approx(1.0)
    assert torch.equal(token_weights(mask, "prompt_mean_token_mean", 3), token_weights(mask, "seq_mean_token_mean", 3))
    with pytest.raises(ValueError, match="group_size"):
        token_weights(mask, "prompt_mean_token_mean", 3, group_size=3)


# --------------------------------------------------------------------------------------------- float64 references


def reference(kind: Surrogate, logp, old, adv, mask, p: ClipParams, q: PolicyLossParams) -> torch.Tensor:
    """The papers' per-token losses, written loop by loop in Python floats."""
    out = torch.zeros_like(logp)
    for i in range(logp.shape[0]):
        toks = [t for t in range(logp.shape[1]) if mask[i, t]]
        a = float(adv[i])
        if kind == Surrogate.GMPO:
            sgn = (a > 0) - (a < 0)
            logs = []
            for t in toks:
                lr = float(logp[i, t] - old[i, t])
                logs.append(sgn * min(sgn * lr, sgn * min(max(lr, -p.eps_low), p.eps_high)))
            s = math.exp(sum(logs) / max(len(logs), 1))
            for t in toks:
                out[i, t] = -a * s
            continue
        for t in toks:
            r = math.exp(float(logp[i, t] - old[i, t]))
            if kind == Surrogate.CISPO:
                w = min(max(r, 1 - q.cispo_eps_low), 1 + q.cispo_eps_high)
                out[i, t] = -w * a * float(logp[i, t])
            elif kind == Surrogate.SAPO:
                tau = q.sapo_tau_pos if a > 0 else q.sapo_tau_neg
                out[i, t] = -(4 / tau) / (1 + math.exp(-tau * (r - 1))) * a
    return out


@pytest.mark.parametrize("kind", [Surrogate.CISPO, Surrogate.GMPO, Surrogate.SAPO])
def test_float64_reference_on_random_batches(kind):
    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        logp = -torch.rand(4, 7, generator=g, dtype=D) - 0.05
        old = logp + 0.4 * torch.randn(4, 7, generator=g, dtype=D)
        adv = torch.randn(4, generator=g, dtype=D)
        mask = (torch.rand(4, 7, generator=g) > 0.3).to(D)
        p, q = ClipParams(0.3, 0.35, 3.0), EXTRA
        out = surrogate_loss(kind, logp, old, adv, mask, p, q)
        torch.testing.assert_close(out.loss * mask, reference(kind, logp, old, adv, mask, p, q), rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------------------- degenerate cases


@pytest.mark.parametrize("kind", NEW)
def test_all_masked_row_zero_advantages_and_ratio_one(kind):
    logp, old, adv, mask = batch_2x3()
    mask[1] = 0
    logp = logp.detach().clone()
    logp[1] = float("nan")  # padding junk never reaches the loss
    out = surrogate_loss(kind, logp, old, adv, mask, CLIP, EXTRA)
    assert torch.isfinite(out.loss[0]).all() and (out.loss[1][mask[1].bool()]).numel() == 0
    zero = surrogate_loss(kind, old.clone(), old, torch.zeros(2, dtype=D), torch.ones(2, 3, dtype=D), CLIP, EXTRA)
    assert torch.equal(zero.loss, torch.zeros_like(zero.loss))  # zero advantages: zero loss
    one = surrogate_loss(kind, old.clone(), old, adv, torch.ones(2, 3, dtype=D), CLIP, EXTRA)
    a = adv[:, None].expand(2, 3)
    want = {  # ratio exactly 1: CISPO is -A log pi, SAPO's gate is 2 / tau, the others -A (clip_cov: 0 where selected)
        Surrogate.CISPO: -a * old,
        Surrogate.SAPO: -a * 2 / torch.where(a > 0, 1.0, 1.05).to(D),
    }.get(kind, -a)
    if one.selected is not None and kind == Surrogate.CLIP_COV:
        want = torch.where(one.selected, torch.zeros_like(want), want)
    torch.testing.assert_close(one.loss, want)


def test_new_surrogates_need_their_parameters():
    logp, old, adv, mask = batch_2x3()
    with pytest.raises(ValueError, match="cispo"):
        surrogate_loss("cispo", logp, old, adv, mask, CLIP)


# --------------------------------------------------------------------------------------------- mismatch corrections


def test_geometric_rejection_combines_with_truncation():
    q = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]], dtype=D))
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5], [1.0, 0.25, 0.9]], dtype=D))
    mask = torch.ones(2, 3, dtype=D)
    c = correction(q, old, mask, ISMode.TOKEN_TRUNCATE, ISParams(1.5, 0.5), ISReject.GEOMETRIC, RejectParams(0.9, 1.1))
    # row 1: g = exp(mean(log [2, .5, 1.8])) = 1.8^(1/3) = 1.216 > 1.1 -> rejected; row 0: g = 1 kept
    assert c.rejected.tolist() == [False, True]
    assert c.weights.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    assert c.truncated.tolist() == [[False] * 3, [True, False, True]]
    none = correction(q, old, mask, ISMode.TOKEN_TRUNCATE, ISParams(1.5, 0.5))
    assert none.weights[1].tolist() == pytest.approx([1.5, 0.5, 1.5]) and not none.rejected.any()


def test_icepop_is_token_mask_with_its_bounds():
    cfg = from_dict({"algorithm": {"preset": "icepop"}}).algorithm
    assert (cfg.is_mode, cfg.is_c_min, cfg.is_c_max) == (ISMode.TOKEN_MASK, 0.5, 5.0)
    q = torch.zeros(1, 4, dtype=D)
    old = torch.log(torch.tensor([[0.4, 0.5, 5.0, 6.0]], dtype=D))
    c = correction(q, old, torch.ones(1, 4, dtype=D), cfg.is_mode, ISParams(cfg.is_c_max, cfg.is_c_min))
    torch.testing.assert_close(c.weights, torch.tensor([[0.0, 0.5, 5.0, 0.0]], dtype=D))
    assert c.masked.tolist() == [[True, False, False, True]]


def test_correction_stats_hand_values():
    lr = torch.log(torch.tensor([2.0, 0.5, 1.0], dtype=D))
    flags = torch.tensor([True, False, False])
    s = correction_stats(lr, flags, ~flags, torch.zeros(3, dtype=torch.bool), flags[:2], flags[:2], flags[:2] & False)
    k3 = ((2 - 1 - math.log(2)) + (0.5 - 1 - math.log(0.5)) + 0) / 3
    assert s["sampler/kl_k3"] == pytest.approx(k3) and s["sampler/chi2"] == pytest.approx((4 + 0.25 + 1) / 3 - 1)
    assert s["sampler/token_truncated_frac"] == pytest.approx(1 / 3) and s["sampler/token_masked_frac"] == 2 / 3
    assert s["sampler/seq_truncated_frac"] == 0.5 and s["sampler/seq_rejected_frac"] == 0.0
    assert correction_stats(torch.zeros(0), *(torch.zeros(0, dtype=torch.bool),) * 6) == {}


def test_offpolicy_sequence_mask_drops_only_negative_drifted_sequences():
    logp = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.9, 0.9], [0.5, 0.5]], dtype=D)).requires_grad_(True)
    q = torch.log(torch.tensor([[0.9, 0.9], [0.9, 0.9], [0.9, 0.9], [0.9, 0.9]], dtype=D))
    adv = torch.tensor([-1.0, 1.0, -1.0, -1.0], dtype=D)
    mask = torch.tensor([[1, 1], [1, 1], [1, 1], [0, 0]], dtype=D)
    # drift = log .9 - log .5 = 0.588 > 0.5 for rows 0, 1, 3; only row 0 is negative with tokens
    assert offpolicy_sequence_mask(logp, q, adv, mask, 0.5).tolist() == [True, False, False, False]
    assert offpolicy_sequence_mask(logp, q, adv, mask, 0.6).tolist() == [False] * 4
    params = ObjectiveParams(Surrogate.PPO_CLIP, CLIP, 0.0, KLEstimator.K3, True, 0.0, None, 0.5, False)
    w = token_weights(mask, "seq_mean_token_mean", 2)
    terms = objective(logp, logp.detach(), None, adv, w, torch.ones_like(w), mask, params, behaviour_logp=q)
    terms.total.backward()
    assert terms.offpolicy_masked_seqs == 1.0 and terms.sequence_count == 3.0
    assert (logp.grad[0] == 0).all() and (logp.grad[1] != 0).all()
    with pytest.raises(ValueError, match="behaviour_logp"):
        objective(logp, logp.detach(), None, adv, w, torch.ones_like(w), mask, params)


# --------------------------------------------------------------------------------------------- config and card


@pytest.mark.parametrize(
    "field, value",
    [
        ("cispo_eps_low", 1.5),
        ("cispo_eps_high", -0.1),
        ("sapo_tau_pos", 0.0),
        ("sapo_tau_neg", -1.0),
        ("cov_ratio", 0.0),
        ("kl_cov_coef", -1.0),
        ("is_reject_lo", 0.0),
        ("offpolicy_mask_delta", -0.1),
    ],
)
def test_config_rejects_out_of_range(field, value):
    with pytest.raises(ConfigError, match=f"algorithm.{field}: expected"):
        from_dict({"algorithm": {field: value}})


def test_config_rejects_inverted_bounds():
    with pytest.raises(ConfigError, match="algorithm.is_reject_lo: expected <="):
        from_dict({"algorithm": {"is_reject_lo": 1.2, "is_reject_hi": 1.1}})
    with pytest.raises(ConfigError, match="algorithm.clip_cov_lb: expected <"):
        from_dict({"algorithm": {"clip_cov_lb": 5.0, "clip_cov_ub": 1.0}})


def test_card_text_of_the_menu():
    card = objective_card(from_dict({"algorithm": {"preset": "cispo"}}))
    assert "-sg(clip(r_it, 0.0, 5.0)) A_i log pi_theta(o_it)" in card["formula"]
    assert r"\mathrm{sg}" in card["formula_latex"]
    assert card["equivalents"]["trl"]["surrogate"]["settings"] == {"loss_type": "cispo", "epsilon_high": 5.0}
    assert card["equivalents"]["verl"]["surrogate"]["match"] == "exact"
    gmpo = objective_card(from_dict({"algorithm": {"preset": "gmpo"}}))
    assert "clip(log r_it, -0.4, 0.4)" in gmpo["formula"]
    sapo = objective_card(from_dict({"algorithm": {"preset": "sapo"}}))
    assert "sigmoid(tau (r_it - 1))" in sapo["formula"] and "1.05" in sapo["formula"]
    scalerl = objective_card(from_dict({"algorithm": {"preset": "scalerl"}}))
    assert scalerl["formula"].startswith("L = (1/P) sum_g (1/sum_{i in g} |o_i|)")
    assert "FP32 LM head" in scalerl["choices"]["not_reproduced"]
    a = from_dict({"algorithm": {"preset": "scalerl"}}).algorithm
    assert (a.dynamic_sampling, a.max_extra_rounds, a.scaling.value) == (True, 0, "batch_std")
    mask = objective_card(from_dict({"algorithm": {"offpolicy_mask_delta": 0.2, "is_reject": "geometric"}}))
    assert "mean_t (log q - log pi_theta) > 0.2" in mask["formula"]
    assert "exp(mean_t log(pi_old/q)) in [0.999, 1.001]" in mask["formula"]
    assert mask["equivalents"]["trl"]["offpolicy_mask"]["settings"] == {"off_policy_mask_threshold": 0.2}


def test_card_and_config_of_the_covariance_selection():
    card = objective_card(from_dict({"algorithm": {"surrogate": "clip_cov"}}))
    assert "a random 0.0002 of unclipped tokens with cov(A, log pi) in (1.0, 5.0)" in card["formula"]
    assert card["choices"]["clip_cov_select"] == "random"
    assert "drawn at random" in card["choices"]["cov_selection"]
    assert "floor(cov_ratio N + u)" in card["choices"]["cov_selection"]
    verl = card["equivalents"]["verl"]["surrogate"]
    assert verl["match"] == "nearest" and "global generator" in verl["difference"] and "u uniform" in verl["difference"]
    largest = objective_card(from_dict({"algorithm": {"surrogate": "clip_cov", "clip_cov_select": "largest"}}))
    assert "the top 0.0002 of unclipped tokens" in largest["formula"]
    assert "not the largest first" in largest["equivalents"]["verl"]["surrogate"]["difference"]
    for kind in ("clip_cov", "kl_cov"):  # cov_ratio 1: every eligible token, as verl
        every = objective_card(from_dict({"algorithm": {"surrogate": kind, "cov_ratio": 1.0}}))
        assert every["equivalents"]["verl"]["surrogate"]["match"] == "exact"
    with pytest.raises(ConfigError, match="algorithm.clip_cov_select: expected one of 'random', 'largest'"):
        from_dict({"algorithm": {"clip_cov_select": "top"}})


def test_kl_cov_with_one_pass_is_warned_when_the_update_is_built(caplog):
    """mu = 1 and one minibatch: r = 1 and |log r| has gradient 0, so KL-Cov is plain policy gradient (the
    gradient itself: tests/algo/test_covariance_selection.py). Warned once, when the run's updater is built."""
    from grpolab.training.update import PolicyUpdater, inert_at_one_pass

    with caplog.at_level("WARNING", logger="grpolab"):
        PolicyUpdater(from_dict({"algorithm": {"surrogate": "kl_cov"}}), None, None, None, None)
    assert "kl_cov with train.mu 1 and train.minibatches 1" in caplog.text and "does nothing" in caplog.text
    for train in ({"mu": 2}, {"minibatches": 2}):
        assert inert_at_one_pass(from_dict({"algorithm": {"surrogate": "kl_cov"}, "train": train})) is None
    assert inert_at_one_pass(from_dict({"algorithm": {"surrogate": "clip_cov"}})) is None


# --------------------------------------------------------------------------------------------- robustness


@pytest.mark.parametrize("kind", NEW)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extreme_log_ratios_keep_loss_and_gradient_finite(kind, dtype):
    lrs = [-50.0, -30.0, 30.0, 50.0]
    advs = [1.0, -1.0, 0.0, 0.5, -2.0]
    old = torch.full((len(advs), len(lrs)), -3.0, dtype=dtype)
    logp = (old + torch.tensor([lrs] * len(advs), dtype=dtype)).requires_grad_()
    mask = torch.ones(len(advs), len(lrs), dtype=dtype)
    out = surrogate_loss(kind, logp, old, torch.tensor(advs, dtype=dtype), mask, CLIP, EXTRA)
    assert torch.isfinite(out.loss).all()
    out.loss.sum().backward()
    assert torch.isfinite(logp.grad).all()


@pytest.mark.parametrize("kind", NEW)
def test_float32_close_to_float64_and_str_dispatch(kind):
    g = torch.Generator().manual_seed(11)
    logp = -torch.rand(3, 5, generator=g, dtype=D) * 4
    old = logp + 0.3 * torch.randn(3, 5, generator=g, dtype=D)
    adv = torch.randn(3, generator=g, dtype=D)
    mask = torch.ones(3, 5, dtype=D)
    o64 = surrogate_loss(kind, logp, old, adv, mask, CLIP, EXTRA)
    o32 = surrogate_loss(kind, logp.float(), old.float(), adv.float(), mask.float(), CLIP, EXTRA)
    torch.testing.assert_close(o32.loss.double(), o64.loss, rtol=1e-4, atol=1e-5)
    assert torch.equal(surrogate_loss(str(kind.value), logp, old, adv, mask, CLIP, EXTRA).loss, o64.loss)


def _objective_sum(kind, mode, logp, old, adv, mask, size, group_size):
    """The objective summed over micro-batches of `size` rows, with the whole batch's weights; its gradient."""
    x = logp.clone().requires_grad_(True)
    params = ObjectiveParams(kind, CLIP, 0.0, KLEstimator.K3, True, 0.0, EXTRA, 0.0, False)
    w = token_weights(mask, mode, 6, group_size=group_size)
    total = 0.0
    for s in range(0, logp.shape[0], size):
        sl = slice(s, s + size)
        out = objective(x[sl], old[sl], None, adv[sl], w[sl], torch.ones_like(w[sl]), mask[sl], params)
        out.total.backward()
        total += out.total.item()
    return total, x.grad


@pytest.mark.parametrize("kind", [Surrogate.CISPO, Surrogate.GMPO, Surrogate.SAPO])
@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "prompt_mean_token_mean"])
def test_micro_batch_invariance_of_the_per_sequence_options(kind, mode):
    """CISPO, GMPO and SAPO are per token or per sequence, and prompt_mean_token_mean's weights come from the whole
    batch: the loss and gradient do not depend on the micro-batch size (Clip-Cov / KL-Cov select per micro-batch,
    the expected share the same at any size: tests/algo/test_covariance_selection.py)."""
    g = torch.Generator().manual_seed(5)
    logp = -torch.rand(8, 6, generator=g, dtype=D) - 0.1
    old = logp + 0.2 * torch.randn(8, 6, generator=g, dtype=D)
    adv = torch.randn(8, generator=g, dtype=D)
    mask = (torch.rand(8, 6, generator=g) > 0.3).to(D)
    mask[3] = 0
    full, grad = _objective_sum(kind, mode, logp, old, adv, mask, 8, 4)
    for size in (1, 2, 4):
        part, grad_part = _objective_sum(kind, mode, logp, old, adv, mask, size, 4)
        assert part == pytest.approx(full, rel=1e-12, abs=1e-14)
        torch.testing.assert_close(grad_part, grad, rtol=1e-12, atol=1e-14)


def test_default_correction_is_the_old_is_weights_bitwise():
    from grpolab.algo.importance import is_weights

    g = torch.Generator().manual_seed(2)
    old = -torch.rand(4, 5, generator=g, dtype=D)
    q = old + 0.3 * torch.randn(4, 5, generator=g, dtype=D)
    mask = (torch.rand(4, 5, generator=g) > 0.2).to(D)
    for mode in ISMode:
        p = ISParams(1.5, 0.6)
        assert torch.equal(correction(q, old, mask, mode, p).weights, is_weights(old, q, mask, mode, p))


@pytest.mark.parametrize("estimator", ["maxrl", "gdpo"])
def test_maxrl_and_gdpo_are_named_estimators_with_their_card(estimator):
    from grpolab.training.estimators import ESTIMATORS, estimator_spec

    cfg = from_dict({"algorithm": {"estimator": estimator, "beta": 0.0}})
    assert estimator_spec(cfg) is ESTIMATORS[estimator]
    card = objective_card(cfg)
    want = {
        "maxrl": "A_i = (R_i - mean_g R) / mean_g R (0 where mean_g R <= 0)",
        "gdpo": "A_i = (S_i - mean_batch S) / (std_batch S + 1e-06), S_i = sum_k w_k (R^k_i - mean_g R^k) / "
        "(std_g R^k + 1e-06)",
    }[estimator]
    assert card["formula"].endswith(want)
    assert r"\mathrm{mean}_g R" in card["formula_latex"]
    for peer in ("trl", "verl", "openrlhf"):
        assert card["equivalents"][peer]["advantage"]["match"] == "none"
    with pytest.raises(ConfigError, match=f"algorithm.kl_placement: expected loss with estimator {estimator}"):
        from_dict({"algorithm": {"estimator": estimator, "beta": 0.04, "kl_placement": "reward"}})
    with pytest.raises(ConfigError, match="algorithm.estimator: expected one of"):
        from_dict({"algorithm": {"estimator": estimator.upper()}})
