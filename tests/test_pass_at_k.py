"""The pass@k advantage (grpolab.algo.advantages.pass_at_k_group / pass_at_k_advantages; Chen et al. 2025,
arXiv 2508.10751) against hand-computed values, a brute force over every k-subset written from the paper's
definition, the authors' released formula, GRPO at k = 1, and its wiring into BatchCollector.advantages."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction
from types import SimpleNamespace

import pytest
import torch

from grpolab.algo.advantages import (
    Baseline,
    Scaling,
    StdKind,
    compute_advantages,
    pass_at_k_advantages,
    pass_at_k_group,
)
from grpolab.config import from_dict
from grpolab.training.batch import BatchCollector

NAN = float("nan")


def _adv(rows, k, threshold=1.0, eps=0.0, valid=None):
    r = torch.tensor(rows, dtype=torch.float64)
    v = None if valid is None else torch.tensor(valid)
    return pass_at_k_advantages(r, v, k=k, threshold=threshold, eps=eps)


# --------------------------------------------------------------------------------------------- hand-computed


def test_hand_values_n4_k2_one_pass():
    # C(4,2) = 6 pairs, C(3,2) = 3 of them all-failing: R = 1/2, sigma = 1/2; A+ = (1/2)/(1/2) = 1;
    # a failing sample is in C(3,1) = 3 pairs, C(2,1) = 2 of them all-failing: q = 2/3, A- = (1/2 - 2/3)/(1/2) = -1/3
    g = pass_at_k_group(4, 1, 2, 0.0)
    assert (g.rate, g.sigma, g.passing, g.signal) == (0.5, 0.5, 1.0, True)
    assert g.failing == -1 / 3
    out = _adv([[0.0, 1.0, 0.0, 0.0]], k=2)
    assert out.advantages.tolist() == [[-1 / 3, 1.0, -1 / 3, -1 / 3]]
    assert out.zero_std.tolist() == [False]


def test_hand_values_n4_k2_two_passes():
    # C(2,2) = 1 all-failing pair of 6: R = 5/6, sigma = sqrt(5/36) = sqrt(5)/6; A+ = (1/6)/(sqrt(5)/6) = 1/sqrt(5);
    # q = C(1,1)/C(3,1) = 1/3, A- = (1/6 - 1/3)/(sqrt(5)/6) = -1/sqrt(5)
    g = pass_at_k_group(4, 2, 2, 0.0)
    assert g.rate == 5 / 6
    assert g.sigma == pytest.approx(math.sqrt(5) / 6, rel=1e-15)
    assert g.passing == pytest.approx(1 / math.sqrt(5), rel=1e-15)
    assert g.failing == pytest.approx(-1 / math.sqrt(5), rel=1e-15)
    out = _adv([[1.0, 0.0, 1.0, 0.0]], k=2)
    assert out.advantages[0].tolist() == [g.passing, g.failing, g.passing, g.failing]


def test_hand_values_n4_k2_three_passes_is_zero_signal():
    # one failing sample: every pair holds a pass, R = 1 - C(1,2)/C(4,2) = 1, no signal
    g = pass_at_k_group(4, 3, 2, 0.0)
    assert (g.rate, g.sigma, g.passing, g.failing, g.signal) == (1.0, 0.0, 0.0, 0.0, False)
    out = _adv([[1.0, 1.0, 0.0, 1.0]], k=2)
    assert out.advantages.tolist() == [[0.0] * 4]
    assert out.zero_std.tolist() == [True]


def test_hand_values_n5_k2_one_pass():
    # C(5,2) = 10, C(4,2) = 6: R = 2/5, sigma = sqrt(6/25); q = C(3,1)/C(4,1) = 3/4: A- = (3/5 - 3/4)/sigma
    g = pass_at_k_group(5, 1, 2, 0.0)
    assert g.rate == 0.4
    assert g.passing == pytest.approx(0.6 / math.sqrt(0.24), rel=1e-15)
    assert g.failing == pytest.approx(-0.15 / math.sqrt(0.24), rel=1e-15)


def test_invalid_members_are_excluded():
    # valid: [1, 0, 0] (N = 3), k = 2: R = 1 - C(2,2)/C(3,2) = 2/3, sigma = sqrt(2)/3, A+ = (1/3)/sigma = 1/sqrt(2);
    # q = C(1,1)/C(2,1) = 1/2, A- = (1/3 - 1/2)/sigma = -1/(2 sqrt(2))
    for rows, valid in (([[1.0, 0.0, NAN, 0.0]], None), ([[1.0, 0.0, 1.0, 0.0]], [[True, True, False, True]])):
        out = _adv(rows, k=2, valid=valid)
        a = out.advantages[0].tolist()
        assert a[0] == pytest.approx(1 / math.sqrt(2), rel=1e-15)
        assert a[1] == a[3] == pytest.approx(-1 / (2 * math.sqrt(2)), rel=1e-15)
        assert a[2] == 0.0
        assert out.valid.tolist() == [[True, True, False, True]]


def test_threshold_passes_at_equality():
    # reward >= threshold passes: 0.5 passes at threshold 0.5, 0.4999 does not
    out = _adv([[0.5, 0.4999, 0.0, 0.2]], k=2, threshold=0.5)
    assert out.advantages[0].tolist() == [1.0, -1 / 3, -1 / 3, -1 / 3]


# --------------------------------------------------------------------------------------------- degenerate


@pytest.mark.parametrize(
    "row, k",
    [
        ([1.0, 1.0, 1.0, 1.0], 1),  # all pass
        ([0.0, 0.0, 0.0, 0.0], 1),  # all fail
        ([0.0, 0.0, 0.0, 0.0], 4),
        ([1.0, 1.0, 0.0, 0.0], 3),  # N_neg = 2 < k = 3: every 3-subset holds a pass
        ([1.0, 0.0, NAN, NAN], 3),  # fewer than k valid members
        ([NAN, NAN, NAN, NAN], 2),  # nothing valid
        ([1.0, NAN, NAN, NAN], 1),  # a single valid member
    ],
)
def test_zero_signal_groups_get_exactly_zero(row, k):
    # beside a group of 6 with signal for every k <= 5 (one pass, five fails); the first group's last two are invalid
    out = _adv([row + [NAN, NAN], [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]], k=k, eps=1e-6)
    assert out.advantages[0].tolist() == [0.0] * 6
    assert out.zero_std.tolist() == [True, False]


def test_k_equal_to_the_group_size_has_no_signal():
    """k = N: the one k-subset is the whole group, its reward has no spread (sigma = 0), so nothing is learned."""
    for n_pass in range(5):
        assert not pass_at_k_group(4, n_pass, 4, 1e-6).signal
    out = _adv([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], k=4, eps=1e-6)
    assert out.advantages.abs().sum() == 0 and out.zero_std.all()


def test_zero_signal_rule_over_every_count():
    """Signal exactly when 0 < R < 1, i.e. N_pos >= 1 and N_neg >= k."""
    for n in range(0, 9):
        for n_pass in range(n + 1):
            for k in range(1, 9):
                g = pass_at_k_group(n, n_pass, k, 0.0)
                assert g.signal == (n_pass >= 1 and n - n_pass >= k)
                assert g.signal == (0.0 < g.rate < 1.0)


def test_bad_arguments_name_the_field():
    r = torch.zeros(2, 4)
    for k in (0, 5, True, 2.0):
        with pytest.raises(ValueError, match="algorithm.pass_k"):
            pass_at_k_advantages(r, k=k, threshold=1.0, eps=0.0)
    with pytest.raises(ValueError, match="algorithm.pass_k"):
        pass_at_k_group(4, 1, 0, 0.0)
    with pytest.raises(ValueError, match="n_pass"):
        pass_at_k_group(4, 5, 2, 0.0)


# --------------------------------------------------------------------------------------------- brute force


def _brute_force(passes: list[bool], k: int) -> tuple[Fraction, list[float]]:
    """The paper's definition: every k-subset S is a group with reward r_S = any(passes in S); R = mean r_S;
    a subset's advantage (r_S - R) / std(r_S) (population std over the subsets); a sample's advantage the mean
    over the subsets that contain it. Exact rationals up to the one square root."""
    subsets = list(itertools.combinations(range(len(passes)), k))
    reward = {s: Fraction(int(any(passes[i] for i in s))) for s in subsets}
    mean = sum(reward.values()) / len(subsets)
    var = sum((x - mean) ** 2 for x in reward.values()) / len(subsets)
    sigma = math.sqrt(float(var))
    adv = []
    for i in range(len(passes)):
        mine = [reward[s] - mean for s in subsets if i in s]
        adv.append(float(sum(mine) / len(mine)) / sigma if sigma > 0 else 0.0)
    return mean, adv


def test_brute_force_over_every_subset():
    for n in range(1, 9):
        for n_pass in range(n + 1):
            for k in range(1, n + 1):
                passes = [True] * n_pass + [False] * (n - n_pass)
                rate, adv = _brute_force(passes, k)
                g = pass_at_k_group(n, n_pass, k, 0.0)
                assert g.rate == float(rate)  # the same rational, rounded once
                expected = [g.passing if p else g.failing for p in passes]
                assert expected == pytest.approx(adv, rel=1e-13, abs=1e-15), (n, n_pass, k)


def test_subset_average_is_the_k_set_reinforce_estimate():
    """(k / N) sum_i (sigma A_i + R) x_i = (1 / C(N, k)) sum_S r_S sum_{i in S} x_i for any x (x_i stands for
    grad log pi(o_i)): the per-sample pass@k reward is REINFORCE on every k-attempt set, averaged."""
    rng = random.Random(0)
    for n, n_pass, k in [(4, 1, 2), (6, 2, 3), (8, 3, 4), (8, 1, 1), (7, 4, 2)]:
        passes = [True] * n_pass + [False] * (n - n_pass)
        x = [rng.gauss(0, 1) for _ in range(n)]
        g = pass_at_k_group(n, n_pass, k, 0.0)
        lhs = k / n * sum((g.sigma * (g.passing if p else g.failing) + g.rate) * xi for p, xi in zip(passes, x))
        subsets = list(itertools.combinations(range(n), k))
        rhs = sum(any(passes[i] for i in s) * sum(x[i] for i in s) for s in subsets) / len(subsets)
        assert lhs == pytest.approx(rhs, rel=1e-12, abs=1e-13)


def test_rate_is_unbiased_for_pass_at_k():
    """E over N_pos ~ Binomial(N, p) of R = 1 - (1 - p)^k, the true pass@k of a sampler that passes w.p. p."""
    for p in (0.05, 0.3, 0.9):
        for n, k in [(4, 2), (8, 4), (8, 1), (6, 6)]:
            expected = sum(
                math.comb(n, c) * p**c * (1 - p) ** (n - c) * pass_at_k_group(n, c, k, 0.0).rate for c in range(n + 1)
            )
            assert expected == pytest.approx(1 - (1 - p) ** k, rel=1e-13)


def test_advantages_sum_to_zero_over_each_group():
    g = torch.Generator().manual_seed(1)
    r = (torch.rand(64, 8, generator=g) < 0.4).double()
    v = torch.rand(64, 8, generator=g) > 0.1
    for k in (1, 2, 4):
        out = pass_at_k_advantages(r, v, k=k, threshold=1.0, eps=0.0)
        s = out.advantages.sum(dim=1)
        torch.testing.assert_close(s, torch.zeros_like(s), rtol=0, atol=1e-12)
        assert ((out.advantages > 0) == (v & (r == 1) & ~out.zero_std.unsqueeze(1))).all()


# --------------------------------------------------------------------------------------------- peers / GRPO


def _comb0(a: int, b: int) -> float:
    return float(math.comb(a, b)) if 0 <= b <= a else 0.0  # scipy.special.comb's value for b > a or a < 0


def _authors_released(values: list[float], k: int) -> list[float]:
    """A transcription of calc_adv in the authors' code (RUCAIBox/Passk_Training, code/passk_adv.py): rewards
    exactly 1 pass, exactly 0 fail; sigma + 1e-6."""
    c, n = sum(v == 1 for v in values), len(values)
    rho = 1 - _comb0(n - c, k) / _comb0(n, k)
    sigma = math.sqrt(rho * (1 - rho))
    adv_p = (1 - rho) / (sigma + 1e-6)
    adv_n = (1 - rho - _comb0(n - c - 1, k - 1) / _comb0(n - 1, k - 1)) / (sigma + 1e-6)
    return [adv_p if v == 1 else adv_n for v in values]


def test_matches_the_authors_released_code_at_eps_1e6():
    rng = random.Random(3)
    for _ in range(200):
        n, k = rng.randint(1, 10), rng.randint(1, 10)
        if k > n:
            continue
        rows = [[float(rng.random() < rng.random()) for _ in range(n)]]
        out = pass_at_k_advantages(torch.tensor(rows, dtype=torch.float64), k=k, threshold=1.0, eps=1e-6)
        assert out.advantages[0].tolist() == pytest.approx(_authors_released(rows[0], k), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_k1_is_grpo_population_std_on_pass_indicators(eps):
    """k = 1: A_i = (1[pass_i] - p) / (sqrt(p (1 - p)) + eps), GRPO's group_mean + group_std with std_kind
    population on the pass indicators (equal up to float rounding: the two compute p and sigma differently)."""
    g = torch.Generator().manual_seed(2)
    r = torch.rand(50, 6, generator=g)
    v = torch.rand(50, 6, generator=g) > 0.2
    threshold = 0.6
    out = pass_at_k_advantages(r, v, k=1, threshold=threshold, eps=eps)
    grpo = compute_advantages(
        (r >= threshold).double(),
        v,
        baseline=Baseline.GROUP_MEAN,
        scaling=Scaling.GROUP_STD,
        std_kind=StdKind.POPULATION,
        eps=eps,
    )
    torch.testing.assert_close(out.advantages, grpo.advantages, rtol=1e-12, atol=1e-14)
    assert torch.equal(out.zero_std, grpo.zero_std)
    assert torch.equal(out.valid, grpo.valid)


# --------------------------------------------------------------------------------------------- wiring


def _collector(**algorithm) -> BatchCollector:
    from grpolab.training.estimators import estimator_spec

    cfg = from_dict({"algorithm": algorithm, "rollout": {"group_size": 4}})
    # BatchCollector.advantages reads only self.cfg and the estimator's group rule (the registry's)
    return SimpleNamespace(cfg=cfg, group=estimator_spec(cfg).group(cfg.algorithm))


def test_batch_collector_dispatches_pass_at_k():
    values = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, NAN], dtype=torch.float64)
    invalid = torch.tensor([False] * 7 + [True])
    out = BatchCollector.advantages(_collector(estimator="pass_at_k", pass_k=2, adv_eps=0.0), values, invalid)
    assert out.advantages.tolist() == [[-1 / 3, 1.0, -1 / 3, -1 / 3], [0.0] * 4]
    assert out.zero_std.tolist() == [False, True]


def test_batch_collector_group_estimator_unchanged():
    g = torch.Generator().manual_seed(4)
    values = torch.rand(12, generator=g).double()
    invalid = torch.rand(12, generator=g) > 0.8
    for kw in ({}, {"preset": "dr_grpo"}, {"preset": "rloo"}, {"scaling": "batch_std", "std_kind": "population"}):
        c = _collector(**kw)
        a = c.cfg.algorithm
        out = BatchCollector.advantages(c, values, invalid)
        ref = compute_advantages(
            values.view(-1, 4),
            ~invalid.view(-1, 4),
            baseline=a.baseline,
            scaling=a.scaling,
            eps=a.adv_eps,
            std_kind=a.std_kind,
        )
        assert torch.equal(out.advantages, ref.advantages) and torch.equal(out.zero_std, ref.zero_std)
