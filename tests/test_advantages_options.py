"""The ``batch_mean`` baseline (REINFORCE++'s global baseline; grpolab.algo.advantages) against hand-computed
values, and against the REINFORCE++ whitening of OpenRLHF and verl transcribed as float64 references: the peers
whiten over tokens, grpolab over sequences -- equal when every completion has the same length, not otherwise."""

from __future__ import annotations

import math

import pytest
import torch

from grpolab.algo.advantages import Baseline, Scaling, StdKind, compute_advantages

NAN = float("nan")
BM = Baseline.BATCH_MEAN


def _run(rows, scaling, std_kind=StdKind.SAMPLE, eps=0.0, valid=None):
    r = torch.tensor(rows, dtype=torch.float64)
    v = None if valid is None else torch.tensor(valid)
    return compute_advantages(r, v, baseline=BM, scaling=scaling, std_kind=std_kind, eps=eps)


# --------------------------------------------------------------------------------------------- hand-computed


def test_batch_mean_no_scaling():
    # batch mean of [1, 0, 1, 1] = 3/4; the all-equal second group still differs from it: signal, not zero_std
    out = _run([[1.0, 0.0], [1.0, 1.0]], Scaling.NONE)
    assert out.advantages.tolist() == [[0.25, -0.75], [0.25, 0.25]]
    assert out.zero_std.tolist() == [False, False]


def test_batch_mean_batch_std_sample_and_population():
    # deviations 1/4, -3/4, 1/4, 1/4: sum of squares 12/16 = 3/4
    # sample std sqrt((3/4)/3) = 1/2 -> A = [1/2, -3/2, 1/2, 1/2]
    out = _run([[1.0, 0.0], [1.0, 1.0]], Scaling.BATCH_STD, StdKind.SAMPLE)
    assert out.advantages.tolist() == [[0.5, -1.5], [0.5, 0.5]]
    # population std sqrt((3/4)/4) = sqrt(3)/4 -> A = [1/sqrt(3), -sqrt(3), ...]
    out = _run([[1.0, 0.0], [1.0, 1.0]], Scaling.BATCH_STD, StdKind.POPULATION)
    a = out.advantages.tolist()
    assert a[0][0] == a[1][0] == a[1][1] == pytest.approx(1 / math.sqrt(3), rel=1e-15)
    assert a[0][1] == pytest.approx(-math.sqrt(3), rel=1e-15)


def test_batch_std_adds_eps_to_the_std():
    out = _run([[1.0, 0.0], [1.0, 1.0]], Scaling.BATCH_STD, StdKind.SAMPLE, eps=0.5)
    assert out.advantages.tolist() == [[0.25, -0.75], [0.25, 0.25]]  # 1/4 / (1/2 + 1/2)


def test_invalid_rewards_are_excluded_from_the_batch_mean():
    # valid: 1, 0, 0 -> mean 1/3; the NaN and the flagged sample get exactly 0
    out = _run([[1.0, NAN], [0.0, 5.0], [0.0, 0.0]], Scaling.NONE, valid=[[True, True], [True, False], [False, True]])
    a = out.advantages.tolist()
    assert a[0][0] == pytest.approx(2 / 3, rel=1e-15)
    assert a[1][0] == a[2][1] == pytest.approx(-1 / 3, rel=1e-15)
    assert a[0][1] == a[1][1] == a[2][0] == 0.0
    assert out.valid.tolist() == [[True, False], [True, False], [False, True]]


def test_advantages_sum_to_zero_over_the_batch():
    g = torch.Generator().manual_seed(0)
    r = torch.randn(16, 5, generator=g).double()
    v = torch.rand(16, 5, generator=g) > 0.2
    out = compute_advantages(r, v, baseline=BM, scaling=Scaling.BATCH_STD)
    assert abs(out.advantages[v].sum().item()) < 1e-12
    assert (out.advantages[~v] == 0).all()


# --------------------------------------------------------------------------------------------- degenerate


@pytest.mark.parametrize("scaling", [Scaling.NONE, Scaling.BATCH_STD])
def test_an_all_equal_batch_carries_no_signal(scaling):
    out = _run([[0.3, 0.3], [0.3, 0.3 + 1e-12]], scaling, eps=1e-6)  # within the 1e-9 resolution
    assert out.advantages.tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert out.zero_std.tolist() == [True, True]


@pytest.mark.parametrize("scaling", [Scaling.NONE, Scaling.BATCH_STD])
def test_fewer_than_two_valid_rewards_in_the_batch(scaling):
    out = _run([[1.0, NAN], [NAN, NAN]], scaling, eps=1e-6)
    assert out.advantages.abs().sum() == 0 and out.zero_std.tolist() == [True, True]
    out = _run([[NAN, NAN], [NAN, NAN]], scaling, eps=1e-6)
    assert out.advantages.abs().sum() == 0 and out.zero_std.tolist() == [True, True]


def test_group_std_is_refused_with_batch_mean():
    with pytest.raises(ValueError, match="algorithm.scaling"):
        _run([[1.0, 0.0], [1.0, 1.0]], Scaling.GROUP_STD)


def test_group_baselines_still_zero_all_equal_groups():
    out = compute_advantages(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), scaling=Scaling.NONE)
    assert out.advantages.tolist() == [[0.5, -0.5], [0.0, 0.0]] and out.zero_std.tolist() == [False, True]


# --------------------------------------------------------------------------------------------- the peers' whitening


def _tokens(rewards: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence rewards [B] broadcast to a right-padded [B, T] token grid and its mask (gamma = 1, no KL in the
    reward: every token's return is the sequence's reward)."""
    t = int(lengths.max())
    mask = (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).double()
    return rewards.double().unsqueeze(1) * mask, mask


def openrlhf_reinforce(rewards: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """OpenRLHF 0.11.2 --algo.advantage.estimator reinforce (experience_maker.py, 'Normalize advantages across all
    experiences'): mean and population variance over every action token, rstd = var.clamp(min=1e-8).rsqrt()."""
    x, m = _tokens(rewards, lengths)
    mean = (x * m).sum() / m.sum()
    var = ((x - mean).pow(2) * m).sum() / m.sum()
    return (x - mean) * var.clamp(min=1e-8).rsqrt() * m


def verl_reinforce_plus_plus(rewards: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """verl 0.9.1 algorithm.adv_estimator=reinforce_plus_plus (core_algos.py): masked_whiten over the response
    tokens: mean, variance with Bessel's correction over the token count, (x - mean) * rsqrt(var + 1e-8)."""
    x, m = _tokens(rewards, lengths)
    mean = (x * m).sum() / m.sum()
    var = ((x - mean) ** 2 * m).sum() / m.sum() * (m.sum() / (m.sum() - 1))
    return (x - mean) * torch.rsqrt(var + 1e-8) * m


def _per_token(adv: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    _, m = _tokens(adv, lengths)
    return adv.unsqueeze(1) * m


REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)


def test_equal_lengths_match_openrlhf_reinforce():
    """Every completion 7 tokens: token whitening weights every sequence alike, so it is grpolab's batch_mean +
    batch_std with population std (adv_eps 0; OpenRLHF's clamp at 1e-8 does not bind here)."""
    lengths = torch.full((8,), 7)
    ours = compute_advantages(REWARDS, baseline=BM, scaling=Scaling.BATCH_STD, std_kind=StdKind.POPULATION, eps=0.0)
    peer = openrlhf_reinforce(REWARDS.view(-1), lengths)
    torch.testing.assert_close(_per_token(ours.advantages.view(-1), lengths), peer, rtol=1e-14, atol=1e-15)


def test_equal_lengths_match_verl_up_to_its_token_bessel_and_eps():
    """verl divides by sqrt(var_tokens * T/(T-1) + 1e-8): with T = 56 tokens it is not the sequence sample std
    (B - 1 = 7); the gap is sqrt(T/(T-1)) against sqrt(B/(B-1)), not rounding."""
    lengths = torch.full((8,), 7)
    ours = compute_advantages(REWARDS, baseline=BM, scaling=Scaling.BATCH_STD, std_kind=StdKind.POPULATION, eps=0.0)
    peer = verl_reinforce_plus_plus(REWARDS.view(-1), lengths)
    t = 56
    var_pop = 15 / 64  # rewards: 3 ones among 8 -> p (1 - p) with p = 3/8
    scale = math.sqrt(var_pop) / math.sqrt(var_pop * t / (t - 1) + 1e-8)
    torch.testing.assert_close(_per_token(ours.advantages.view(-1), lengths) * scale, peer, rtol=1e-13, atol=1e-15)


def test_unequal_lengths_differ_from_token_whitening():
    """Token whitening counts sequence i |o_i| times: its mean is sum_i |o_i| R_i / sum_i |o_i|. grpolab's
    advantages are per sequence, mean over sequences: the two differ as soon as lengths differ."""
    lengths = torch.tensor([10, 2, 2, 2, 2, 2, 2, 10])  # the two long completions (first, last) are rewarded 1
    r = REWARDS.view(-1)
    peer = openrlhf_reinforce(r, lengths)
    token_mean = (r * lengths).sum() / lengths.sum()  # (10 + 10 + 2) / 32
    assert token_mean.item() == pytest.approx(22 / 32, rel=1e-15)
    ours = compute_advantages(REWARDS, baseline=BM, scaling=Scaling.BATCH_STD, std_kind=StdKind.POPULATION, eps=0.0)
    assert not torch.allclose(_per_token(ours.advantages.view(-1), lengths), peer)
    # the token-weighted reference is the sequence whitening with weights |o_i|
    w = lengths.double() / lengths.sum()
    mean = (w * r).sum()
    std = ((w * (r - mean) ** 2).sum()).sqrt()
    torch.testing.assert_close(_per_token((r - mean) / std, lengths), peer, rtol=1e-14, atol=1e-15)


# --------------------------------------------------------------------------------------------- random vs naive


def naive_batch_mean(rows, valid, scaling, eps, std_kind, resolution=1e-9):
    """Plain python floats: b = mean of every valid finite reward of the batch, s = their std + eps (or 1)."""
    ok = [[bool(v) and math.isfinite(x) for x, v in zip(row, vrow)] for row, vrow in zip(rows, valid)]
    vals = [x for row, orow in zip(rows, ok) for x, o in zip(row, orow) if o]
    if len(vals) < 2 or max(vals) - min(vals) <= resolution:
        return [[0.0] * len(row) for row in rows], [True] * len(rows)
    mean = sum(vals) / len(vals)
    ddof = 1 if std_kind == StdKind.SAMPLE else 0
    std = math.sqrt(sum((x - mean) ** 2 for x in vals) / (len(vals) - ddof))
    s = std + eps if scaling == Scaling.BATCH_STD else 1.0
    adv = [[(x - mean) / s if o else 0.0 for x, o in zip(row, orow)] for row, orow in zip(rows, ok)]
    return adv, [False] * len(rows)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("scaling", [Scaling.BATCH_STD, Scaling.NONE])
@pytest.mark.parametrize("std_kind", list(StdKind))
def test_random_vs_naive(seed, scaling, std_kind):
    g = torch.Generator().manual_seed(seed)
    p, n = int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(1, 7, (1,), generator=g))
    dtype = torch.float32 if seed % 2 else torch.float64
    r = torch.where(torch.rand(p, n, generator=g) < 0.5, torch.randn(p, n, generator=g), 1.0).to(dtype)
    r[torch.rand(p, n, generator=g) < 0.1] = NAN
    r[torch.rand(p, n, generator=g) < 0.05] = float("inf")
    v = torch.rand(p, n, generator=g) > 0.15
    eps = [0.0, 1e-6, 0.1][seed % 3]
    out = compute_advantages(r, v, baseline=BM, scaling=scaling, std_kind=std_kind, eps=eps)
    exp_adv, exp_zero = naive_batch_mean(r.double().tolist(), v.tolist(), scaling, eps, std_kind)
    assert out.zero_std.tolist() == exp_zero
    torch.testing.assert_close(out.advantages, torch.tensor(exp_adv, dtype=torch.float64), rtol=1e-10, atol=1e-12)
    assert (out.advantages[~out.valid] == 0).all()
