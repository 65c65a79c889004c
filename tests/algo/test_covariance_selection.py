"""Clip-Cov's and KL-Cov's token selection (grpolab/algo/surrogate.py, issue 59 findings 4 and 5): the count
floor(rho N + u) has expectation rho N, so the selected share does not depend on the micro-batch size; Clip-Cov draws
uniformly among its eligible tokens (the paper's and verl's form), from a seeded stream; clip_cov_select largest keeps
the largest covariances first; KL-Cov's term has no gradient at ratio 1."""

from __future__ import annotations

import pytest
import torch

from grpolab.algo.surrogate import ClipParams, CovSelect, PolicyLossParams, cov_count, surrogate_loss

D = torch.float64
CLIP = ClipParams(eps_low=0.2, eps_high=0.2, dual_clip_c=3.0)


def params(ratio: float, select: CovSelect = CovSelect.RANDOM, lb: float = 0.0) -> PolicyLossParams:
    return PolicyLossParams(
        cispo_eps_low=1.0,
        cispo_eps_high=4.0,
        sapo_tau_pos=1.0,
        sapo_tau_neg=1.05,
        cov_ratio=ratio,
        clip_cov_lb=lb,
        clip_cov_ub=5.0,
        kl_cov_coef=0.1,
        clip_cov_select=select,
        dppo_low=0.15,
        dppo_high=0.15,
        dppo_ratio_cap=20.0,
    )


def test_cov_count_has_expectation_rho_n():
    # rho N = 0.5: floor(0.5 + u) is 0 for u < 0.5 and 1 after; over a uniform grid of u its mean is 0.5
    grid = [k / 8 for k in range(8)]
    assert [cov_count(0.02, 25, u) for u in grid] == [0, 0, 0, 0, 1, 1, 1, 1]
    # rho N = 4.75: 4 for u < 0.25, then 5; mean over the grid 4 + 6/8 = 4.75
    assert sum(cov_count(0.019, 250, u) for u in grid) / 8 == pytest.approx(4.75)
    assert cov_count(1.0, 6, 0.0) == cov_count(1.0, 6, 0.999) == 6  # rho = 1: every token, whatever u
    assert cov_count(2e-4, 500, 0.5) == 0  # no minimum of one token (the old max(floor(rho N), 1) gave 1)


def random_batch(g: torch.Generator, rows: int, tokens: int):
    old = -torch.rand(rows, tokens, generator=g, dtype=D) * 3 - 0.05
    logp = old + 0.1 * torch.randn(rows, tokens, generator=g, dtype=D)
    adv = torch.randn(rows, generator=g, dtype=D)
    return logp, old, adv, torch.ones(rows, tokens, dtype=D)


@pytest.mark.parametrize("kind", ["kl_cov", "clip_cov"])
def test_effective_rate_is_the_same_for_two_micro_batch_sizes(kind):
    """8 sequences of 25 tokens, rho = 0.02: 4 tokens a step expected. One micro-batch of 8 selects floor(4 + u) = 4
    every step; micro-batches of 1 sequence select floor(0.5 + u), 0 or 1 -- 0.5 each in expectation, 4 a step. The
    old count max(floor(rho N), 1) selected 1 per micro-batch there: 8 a step, twice the rate."""
    q = params(0.02, lb=-1e9)  # clip_cov: every unclipped token eligible
    data, draws = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
    steps, selected = 400, {8: 0, 1: 0}
    for _ in range(steps):
        logp, old, adv, mask = random_batch(data, 8, 25)
        if kind == "clip_cov":
            old = logp.clone()  # ratio 1: nothing clipped, every token eligible
        for size in selected:
            for start in range(0, 8, size):
                rows = slice(start, start + size)
                out = surrogate_loss(kind, logp[rows], old[rows], adv[rows], mask[rows], CLIP, q, draws)
                selected[size] += int(out.selected.sum())
    rate = {size: n / (steps * 200) for size, n in selected.items()}
    assert rate[8] == 0.02  # exactly 4 of 200 every step
    assert rate[1] == pytest.approx(0.02, abs=0.002)  # 3200 Bernoulli(1/2) draws: sd 0.00035


def eligible_batch():
    """Ratio 1 (nothing clipped), A = [1, -1], log pi = [[-0.5, -2, -3.5], [-1, -2, -3]] (mean -2):
    c = A (log pi + 2) = [[1.5, 0, -1.5], [-1, 0, 1]]; with (lb, ub) = (0, 5) the eligible tokens are (0, 0), c = 1.5,
    and (1, 2), c = 1."""
    logp = torch.tensor([[-0.5, -2.0, -3.5], [-1.0, -2.0, -3.0]], dtype=D, requires_grad=True)
    return logp, logp.detach().clone(), torch.tensor([1.0, -1.0], dtype=D), torch.ones(2, 3, dtype=D)


def test_clip_cov_draws_uniformly_among_the_eligible_tokens():
    logp, old, adv, mask = eligible_batch()
    q = params(1 / 6)  # rho N = 1: one token
    draws, picks = torch.Generator().manual_seed(0), []
    for _ in range(400):
        out = surrogate_loss("clip_cov", logp, old, adv, mask, CLIP, q, draws)
        assert int(out.selected.sum()) == 1
        picks.append(tuple(out.selected.nonzero()[0].tolist()))
    assert set(picks) == {(0, 0), (1, 2)}  # never a token outside (lb, ub)
    assert 150 <= picks.count((0, 0)) <= 250  # 1/2 each: 200 expected, sd 10 (the largest-first form: 400)
    out = surrogate_loss("clip_cov", logp, old, adv, mask, CLIP, q, torch.Generator().manual_seed(0))
    assert tuple(out.selected.nonzero()[0].tolist()) == picks[0]  # the same seed draws the same tokens
    (out.loss * mask).sum().backward()
    minus_a = torch.tensor([[-1.0] * 3, [1.0] * 3], dtype=D)  # -A at ratio 1
    assert torch.equal(logp.grad, torch.where(out.selected, 0.0, minus_a))  # the selected token's gradient is 0


def test_clip_cov_largest_takes_the_largest_covariance():
    logp, old, adv, mask = eligible_batch()
    draws = torch.Generator().manual_seed(0)
    for _ in range(20):
        out = surrogate_loss("clip_cov", logp, old, adv, mask, CLIP, params(1 / 6, CovSelect.LARGEST), draws)
        assert out.selected.tolist() == [[True, False, False], [False, False, False]]  # c = 1.5


def test_kl_cov_term_has_no_gradient_at_ratio_one():
    """mu = 1, one minibatch: pi_old is the policy being trained, r = 1, and d|log r| = 0 there: every token's
    gradient is plain policy gradient's -A, the selected ones included."""
    logp, old, adv, mask = eligible_batch()
    out = surrogate_loss("kl_cov", logp, old, adv, mask, CLIP, params(0.5))
    assert int(out.selected.sum()) == 3
    (out.loss * mask).sum().backward()
    assert logp.grad.tolist() == [[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]]
