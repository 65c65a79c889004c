"""Aggregation weights (grpolab.algo.aggregation) and the micro-batch invariance of the objective (loss.py).

docs/design.md section 4: "Denominators are computed over the whole optimisation batch before it is split into
micro-batches, so the loss and gradient do not depend on micro-batch size, gradient accumulation, or the
number of data-parallel ranks."
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

from grpolab.algo.aggregation import AGGREGATIONS, Aggregation, token_weights
from grpolab.algo.importance import ISMode, ISParams, is_weights
from grpolab.algo.kl import KLEstimator
from grpolab.algo.logprobs import logprobs_and_entropy, token_logprobs
from grpolab.algo.loss import ObjectiveParams, objective
from grpolab.algo.surrogate import ClipParams, CovSelect, PolicyLossParams, Surrogate

# --------------------------------------------------------------------------------------------------
# Hand values
# --------------------------------------------------------------------------------------------------

# mask: row 0 two tokens, row 1 one token, row 2 fully masked; L_max = 4
HAND_MASK = [[1, 1, 0], [1, 0, 0], [0, 0, 0]]
HAND_WEIGHTS = {
    # B_ne = 2: row 0 1/(2*2), row 1 1/(2*1)
    "seq_mean_token_mean": [[0.25, 0.25, 0.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]],
    # 3 tokens
    "token_mean": [[1 / 3, 1 / 3, 0.0], [1 / 3, 0.0, 0.0], [0.0, 0.0, 0.0]],
    # B = 3 rows (all rows, module docstring), L_max = 4 -> 1/12
    "seq_mean_token_sum_norm": [[1 / 12, 1 / 12, 0.0], [1 / 12, 0.0, 0.0], [0.0, 0.0, 0.0]],
    # B_ne = 2
    "seq_mean_token_sum": [[0.5, 0.5, 0.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]],
    # one row per prompt group (group_size 1): the per-sequence token mean
    "prompt_mean_token_mean": [[0.25, 0.25, 0.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]],
}
# token losses [[1, 2, x], [4, x, x], [x, x, x]] (x anything finite, masked):
HAND_LOSS = {
    "seq_mean_token_mean": (1.5 + 4.0) / 2,  # mean over sequences of token means
    "token_mean": 7.0 / 3,
    "seq_mean_token_sum_norm": 7.0 / 12,
    "seq_mean_token_sum": (3.0 + 4.0) / 2,
    "prompt_mean_token_mean": (1.5 + 4.0) / 2,
}


def test_registry_complete():
    assert set(AGGREGATIONS) == set(Aggregation)
    assert set(HAND_WEIGHTS) == {str(a) for a in Aggregation}


@pytest.mark.parametrize("mode", list(Aggregation))
@pytest.mark.parametrize("mask_dtype", [torch.long, torch.bool, torch.float32])
def test_hand_weights(mode, mask_dtype):
    m = torch.tensor(HAND_MASK).to(mask_dtype)
    w = token_weights(m, mode, 4)
    assert w.dtype == torch.float64
    torch.testing.assert_close(w, torch.tensor(HAND_WEIGHTS[str(mode)], dtype=torch.float64), rtol=1e-15, atol=0)
    losses = torch.tensor([[1.0, 2.0, 99.0], [4.0, -7.0, 3.0], [5.0, 6.0, 8.0]], dtype=torch.float64)
    assert (w * losses).sum().item() == pytest.approx(HAND_LOSS[str(mode)], rel=1e-14)


@pytest.mark.parametrize("mode", list(Aggregation))
def test_fully_masked_batch_gives_zero_weights(mode):
    w = token_weights(torch.zeros(3, 5), mode, 8)
    assert torch.isfinite(w).all()
    assert (w == 0).all()


@pytest.mark.parametrize("mode", [Aggregation.SEQ_MEAN_TOKEN_MEAN, Aggregation.TOKEN_MEAN])
def test_mean_modes_sum_to_one(mode):
    g = torch.Generator().manual_seed(0)
    m = (torch.rand(7, 9, generator=g) < 0.6).long()
    m[2] = 0
    assert token_weights(m, mode, 9).sum().item() == pytest.approx(1.0, rel=1e-14)


def test_fully_masked_row_does_not_count_as_a_sequence():
    m = torch.tensor([[1, 1], [0, 0]])
    m_alone = torch.tensor([[1, 1]])
    for mode in (Aggregation.SEQ_MEAN_TOKEN_MEAN, Aggregation.SEQ_MEAN_TOKEN_SUM):
        assert torch.equal(token_weights(m, mode, 2)[:1], token_weights(m_alone, mode, 2))


# --------------------------------------------------------------------------------------------------
# Micro-batch invariance with a small float64 "policy"
# --------------------------------------------------------------------------------------------------

B, T, D, V, L_MAX = 5, 6, 4, 7, 8


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: intra-op threading only adds overhead (10x here); restore the setting afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


TEMPERATURE = 0.9


def _setup(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    W0 = torch.randn(D, V, generator=g, dtype=torch.float64) * 0.7
    ids = torch.randint(0, V, (B, T), generator=g)
    lengths = [6, 3, 0, 1, 5]  # row 2 fully masked, others ragged
    mask = torch.zeros(B, T, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    mask[4, 1] = 0  # a hole in the middle of a row
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    adv[3] = 0.0
    with torch.no_grad():
        logp0 = token_logprobs(X @ W0, ids, TEMPERATURE)
    old = logp0 + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.15
    ref = logp0 + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    sampler = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.2
    isw = is_weights(old, sampler, mask, ISMode.TOKEN_TRUNCATE, ISParams(c_max=1.5, c_min=0.5))
    return X, W0, ids, mask, adv, old, ref, isw


def _micro_batches(size: int):
    return [slice(s, min(s + size, B)) for s in range(0, B, size)]


def _run(setup, params, mode, mb_size, per_mb_weights=False):
    """Sum the objective over micro-batches (backward per micro-batch). Returns (loss, grad, terms list)."""
    X, W0, ids, mask, adv, old, ref, isw = setup
    W = W0.clone().requires_grad_()
    full_w = token_weights(mask, mode, L_MAX)
    total = 0.0
    terms = []
    mbs = _micro_batches(mb_size)
    for sl in mbs:
        logits = X[sl] @ W
        logp, ent = logprobs_and_entropy(logits, ids[sl], TEMPERATURE, with_entropy=True, entropy_grad=True)
        if per_mb_weights:
            # the naive way: normalise each micro-batch on its own and average over accumulation steps
            w = token_weights(mask[sl], mode, L_MAX) / len(mbs)
        else:
            w = full_w[sl]
        out = objective(logp, old[sl], ref[sl], adv[sl], w, isw[sl], mask[sl], params, entropy=ent)
        out.total.backward()
        total += out.total.item()
        terms.append(out)
    return total, W.grad.clone(), terms


# clip_cov / kl_cov select their tokens per micro-batch (docs/algorithms.md): the expected share selected is the same
# at any size (tests/algo/test_covariance_selection.py), the tokens are not
INVARIANT = [s for s in Surrogate if s not in (Surrogate.CLIP_COV, Surrogate.KL_COV)]
PARAM_GRID = list(itertools.product(list(Aggregation), INVARIANT, list(KLEstimator)))
MENU = PolicyLossParams(0.5, 1.0, 1.0, 1.05, 2e-4, 1.0, 5.0, 0.1, CovSelect.RANDOM, 0.15, 0.15, 20.0)


def _params(surrogate, kl):
    clip = ClipParams(0.2, 0.28, 3.0) if surrogate != Surrogate.GSPO else ClipParams(0.03, 0.04, 3.0)
    return ObjectiveParams(
        surrogate=surrogate,
        clip=clip,
        beta=0.07,
        kl_estimator=kl,
        kl_in_loss=True,
        entropy_coef=0.013,
        policy_loss=MENU,
        offpolicy_mask_delta=0.0,
        kl_bias_correction=False,
    )


@pytest.mark.parametrize("mode,surrogate,kl", PARAM_GRID, ids=[f"{a}-{s}-{k}" for a, s, k in PARAM_GRID])
def test_microbatch_invariance(mode, surrogate, kl):
    setup = _setup(0)
    params = _params(surrogate, kl)
    loss_full, grad_full, terms_full = _run(setup, params, mode, B)
    assert grad_full.abs().sum() > 0
    assert math.isfinite(loss_full)
    (tf,) = terms_full
    # the setup exercises every term
    assert tf.kl != 0.0 and tf.entropy_bonus != 0.0 and tf.policy != 0.0
    for size in (1, 2, 3):
        loss, grad, terms = _run(setup, params, mode, size)
        assert abs(loss - loss_full) <= 1e-12, (size, loss, loss_full)
        torch.testing.assert_close(grad, grad_full, rtol=0, atol=1e-12)
        # the detached per-micro-batch terms add up to the full-batch ones too
        for name in (
            "policy",
            "kl",
            "entropy_bonus",
            "kl_token_sum",
            "clip_low_count",
            "clip_high_count",
            "token_count",
        ):
            assert sum(getattr(t, name) for t in terms) == pytest.approx(getattr(tf, name), rel=1e-12, abs=1e-12), name


@pytest.mark.parametrize("mode", [Aggregation.TOKEN_MEAN, Aggregation.SEQ_MEAN_TOKEN_MEAN])
@pytest.mark.parametrize("size", [1, 2])
def test_naive_per_microbatch_normalisation_differs(mode, size):
    """Teeth: recomputing the weights per micro-batch (and averaging) gives a different loss and gradient."""
    setup = _setup(0)
    params = _params(Surrogate.PPO_CLIP, KLEstimator.K3)
    loss_full, grad_full, _ = _run(setup, params, mode, B)
    loss_naive, grad_naive, _ = _run(setup, params, mode, size, per_mb_weights=True)
    assert abs(loss_naive - loss_full) > 1e-6
    assert (grad_naive - grad_full).abs().max() > 1e-6


def test_objective_matches_naive_formula():
    """Full-batch L = sum_it w_it (w^IS_it l_it + beta kl_it - c_H H_it) written out with python loops
    (ppo_clip, k3, seq_mean_token_mean)."""
    X, W0, ids, mask, adv, old, ref, isw = _setup(1)
    params = _params(Surrogate.PPO_CLIP, KLEstimator.K3)
    logits = X @ W0
    logp, ent = logprobs_and_entropy(logits, ids, TEMPERATURE, with_entropy=True, entropy_grad=True)
    w = token_weights(mask, Aggregation.SEQ_MEAN_TOKEN_MEAN, L_MAX)
    out = objective(logp, old, ref, adv, w, isw, mask, params, entropy=ent)
    el, eh, beta, c_h = params.clip.eps_low, params.clip.eps_high, params.beta, params.entropy_coef
    seq_terms = []
    for i in range(B):
        n = sum(mask[i].tolist())
        if n == 0:
            continue
        acc = 0.0
        for t in range(T):
            if not mask[i, t]:
                continue
            r = math.exp(logp[i, t].item() - old[i, t].item())
            a = adv[i].item()
            l_ = -min(r * a, min(max(r, 1 - el), 1 + eh) * a)
            lr = ref[i, t].item() - logp[i, t].item()
            k3 = math.exp(lr) - lr - 1
            acc += isw[i, t].item() * l_ + beta * k3 - c_h * ent[i, t].item()
        seq_terms.append(acc / n)
    expected = sum(seq_terms) / len(seq_terms)
    assert out.total.item() == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert out.token_count == float(mask.sum())


def test_beta_zero_or_reward_placement_leaves_kl_out_of_the_loss():
    X, W0, ids, mask, adv, old, ref, isw = _setup(2)
    logits = X @ W0
    logp = token_logprobs(logits, ids, TEMPERATURE)
    w = token_weights(mask, Aggregation.TOKEN_MEAN, L_MAX)
    base = ObjectiveParams(
        surrogate=Surrogate.PPO_CLIP,
        clip=ClipParams(0.2, 0.2, 3.0),
        beta=0.0,
        kl_estimator=KLEstimator.K3,
        kl_in_loss=True,
        entropy_coef=0.0,
        policy_loss=None,
        offpolicy_mask_delta=0.0,
        kl_bias_correction=False,
    )
    a = objective(logp, old, None, adv, w, isw, mask, base)
    b = objective(logp, old, ref, adv, w, isw, mask, base)
    c = objective(logp, old, ref, adv, w, isw, mask, dataclasses.replace(base, beta=0.5, kl_in_loss=False))
    d = objective(logp, old, ref, adv, w, isw, mask, dataclasses.replace(base, beta=0.5))
    assert a.total.item() == b.total.item() == c.total.item()
    assert b.kl == c.kl == d.kl != 0.0
    assert d.total.item() == pytest.approx(a.total.item() + 0.5 * d.kl, rel=1e-12)
