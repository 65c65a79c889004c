"""Group-relative advantages (grpolab.algo.advantages) against hand values and a naive float64 reference.

docs/design.md section 4 (advantages) and section 10 (float rounding must not fake a signal).
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from grpolab.algo.advantages import (
    BATCH_BASELINES,
    REWARD_RESOLUTION,
    Baseline,
    Scaling,
    StdKind,
    compute_advantages,
)

# the group baselines; batch_mean (one baseline for the whole batch, zero signal batch-wide, group_std refused) is
# tested in tests/test_advantages_options.py
GROUP_BASELINES = [b for b in Baseline if b not in BATCH_BASELINES]
COMBOS = list(itertools.product(GROUP_BASELINES, list(Scaling), list(StdKind)))
COMBO_IDS = [f"{b}-{s}-{k}" for b, s, k in COMBOS]

S3 = math.sqrt(3.0)
S2 = math.sqrt(2.0)


# --------------------------------------------------------------------------------------------------
# Naive reference: plain python floats and loops, no torch reductions.
# --------------------------------------------------------------------------------------------------


def _naive_mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _naive_std(xs: list[float], kind: StdKind) -> float:
    n = len(xs)
    if n == 0:
        return 0.0
    mu = _naive_mean(xs)
    ss = 0.0
    for x in xs:
        ss += (x - mu) * (x - mu)
    ddof = 1 if kind == StdKind.SAMPLE else 0
    return math.sqrt(ss / max(n - ddof, 1))


def naive_advantages(rewards, valid, baseline, scaling, eps, std_kind, resolution=REWARD_RESOLUTION):
    """rewards, valid: nested python lists [P][G]. Returns (adv [P][G], zero_std [P], valid [P][G])."""
    P = len(rewards)
    G = len(rewards[0]) if P else 0
    ok = [[bool(valid[i][j]) and math.isfinite(rewards[i][j]) for j in range(G)] for i in range(P)]
    batch_vals = [rewards[i][j] for i in range(P) for j in range(G) if ok[i][j]]
    batch_std = _naive_std(batch_vals, std_kind)
    adv = [[0.0] * G for _ in range(P)]
    zero = []
    for i in range(P):
        vals = [rewards[i][j] for j in range(G) if ok[i][j]]
        z = len(vals) < 2 or (max(vals) - min(vals)) <= resolution
        zero.append(z)
        if z:
            continue
        n = len(vals)
        total = sum(vals)
        for j in range(G):
            if not ok[i][j]:
                continue
            r = rewards[i][j]
            if baseline == Baseline.GROUP_MEAN:
                b = total / n
            else:
                b = (total - r) / (n - 1)
            if scaling == Scaling.GROUP_STD:
                s = _naive_std(vals, std_kind) + eps
            elif scaling == Scaling.BATCH_STD:
                s = batch_std + eps
            else:
                s = 1.0
            adv[i][j] = (r - b) / s
    return adv, zero, ok


def _run(rewards, valid=None, **kw):
    return compute_advantages(rewards, valid, **kw)


# --------------------------------------------------------------------------------------------------
# Hand-computed examples, every combination
# --------------------------------------------------------------------------------------------------

# rewards [[1, 0, 0, 0]], eps = 0:
#   group mean .25 -> centred [.75, -.25, -.25, -.25]
#   leave-one-out b_i = (1 - R_i)/3 -> centred [1, -1/3, -1/3, -1/3]
#   sum of squares .75 -> population std sqrt(.1875) = sqrt(3)/4, sample std sqrt(.25) = .5
#   one group, so the batch std is the group std.
HAND_ONE_GROUP = {
    ("group_mean", "group_std", "sample"): [1.5, -0.5, -0.5, -0.5],
    ("group_mean", "group_std", "population"): [S3, -1 / S3, -1 / S3, -1 / S3],
    ("group_mean", "batch_std", "sample"): [1.5, -0.5, -0.5, -0.5],
    ("group_mean", "batch_std", "population"): [S3, -1 / S3, -1 / S3, -1 / S3],
    ("group_mean", "none", "sample"): [0.75, -0.25, -0.25, -0.25],
    ("group_mean", "none", "population"): [0.75, -0.25, -0.25, -0.25],
    ("leave_one_out", "group_std", "sample"): [2.0, -2 / 3, -2 / 3, -2 / 3],
    ("leave_one_out", "group_std", "population"): [4 / S3, -4 / (3 * S3), -4 / (3 * S3), -4 / (3 * S3)],
    ("leave_one_out", "batch_std", "sample"): [2.0, -2 / 3, -2 / 3, -2 / 3],
    ("leave_one_out", "batch_std", "population"): [4 / S3, -4 / (3 * S3), -4 / (3 * S3), -4 / (3 * S3)],
    ("leave_one_out", "none", "sample"): [1.0, -1 / 3, -1 / 3, -1 / 3],
    ("leave_one_out", "none", "population"): [1.0, -1 / 3, -1 / 3, -1 / 3],
}

# rewards [[0, 2], [2, 4]], eps = 0:
#   group means 1, 3 -> centred [-1, 1] in both groups; leave-one-out (G = 2: b_i = the other one) -> [-2, 2]
#   group std of {0, 2} or {2, 4}: population 1, sample sqrt(2)
#   batch {0, 2, 2, 4}: mean 2, sum of squares 8 -> population sqrt(2), sample sqrt(8/3)
_Q = math.sqrt(3.0 / 8.0)  # 1 / sqrt(8/3)
HAND_TWO_GROUPS = {
    ("group_mean", "group_std", "sample"): [-1 / S2, 1 / S2],
    ("group_mean", "group_std", "population"): [-1.0, 1.0],
    ("group_mean", "batch_std", "sample"): [-_Q, _Q],
    ("group_mean", "batch_std", "population"): [-1 / S2, 1 / S2],
    ("group_mean", "none", "sample"): [-1.0, 1.0],
    ("group_mean", "none", "population"): [-1.0, 1.0],
    ("leave_one_out", "group_std", "sample"): [-S2, S2],
    ("leave_one_out", "group_std", "population"): [-2.0, 2.0],
    ("leave_one_out", "batch_std", "sample"): [-2 * _Q, 2 * _Q],
    ("leave_one_out", "batch_std", "population"): [-S2, S2],
    ("leave_one_out", "none", "sample"): [-2.0, 2.0],
    ("leave_one_out", "none", "population"): [-2.0, 2.0],
}


def test_hand_tables_cover_every_combination():
    keys = {(str(b), str(s), str(k)) for b, s, k in COMBOS}
    assert set(HAND_ONE_GROUP) == keys
    assert set(HAND_TWO_GROUPS) == keys


@pytest.mark.parametrize("baseline,scaling,std_kind", COMBOS, ids=COMBO_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hand_one_group(baseline, scaling, std_kind, dtype):
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=dtype)
    out = _run(r, baseline=baseline, scaling=scaling, std_kind=std_kind, eps=0.0)
    expected = torch.tensor([HAND_ONE_GROUP[(str(baseline), str(scaling), str(std_kind))]], dtype=torch.float64)
    assert out.advantages.dtype == torch.float64
    assert out.advantages.shape == (1, 4)
    torch.testing.assert_close(out.advantages, expected, rtol=1e-14, atol=1e-14)
    assert out.zero_std.tolist() == [False]
    assert out.valid.tolist() == [[True] * 4]


@pytest.mark.parametrize("baseline,scaling,std_kind", COMBOS, ids=COMBO_IDS)
def test_hand_two_groups(baseline, scaling, std_kind):
    r = torch.tensor([[0.0, 2.0], [2.0, 4.0]])
    out = _run(r, baseline=baseline, scaling=scaling, std_kind=std_kind, eps=0.0)
    row = HAND_TWO_GROUPS[(str(baseline), str(scaling), str(std_kind))]
    expected = torch.tensor([row, row], dtype=torch.float64)
    torch.testing.assert_close(out.advantages, expected, rtol=1e-14, atol=1e-14)
    assert out.zero_std.tolist() == [False, False]


def test_eps_is_added_to_the_std():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    # sample std .5, eps .5 -> s = 1
    out = _run(r, baseline=Baseline.GROUP_MEAN, scaling=Scaling.GROUP_STD, std_kind=StdKind.SAMPLE, eps=0.5)
    torch.testing.assert_close(out.advantages, torch.tensor([[0.75, -0.25, -0.25, -0.25]], dtype=torch.float64))
    out = _run(r, baseline=Baseline.GROUP_MEAN, scaling=Scaling.BATCH_STD, std_kind=StdKind.SAMPLE, eps=0.5)
    torch.testing.assert_close(out.advantages, torch.tensor([[0.75, -0.25, -0.25, -0.25]], dtype=torch.float64))
    # eps is not used without scaling
    out = _run(r, baseline=Baseline.GROUP_MEAN, scaling=Scaling.NONE, std_kind=StdKind.SAMPLE, eps=0.5)
    torch.testing.assert_close(out.advantages, torch.tensor([[0.75, -0.25, -0.25, -0.25]], dtype=torch.float64))


def test_defaults_are_grpo_sample_std():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    out = compute_advantages(r)
    # default eps 1e-6 on sample std .5
    expected = torch.tensor([[0.75, -0.25, -0.25, -0.25]], dtype=torch.float64) / (0.5 + 1e-6)
    torch.testing.assert_close(out.advantages, expected, rtol=1e-14, atol=1e-14)


# --------------------------------------------------------------------------------------------------
# Edge cases
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("baseline,scaling,std_kind", COMBOS, ids=COMBO_IDS)
@pytest.mark.parametrize("eps", [0.0, 1e-8, 1e-6])
def test_all_equal_float32_rewards_give_exact_zero(baseline, scaling, std_kind, eps):
    """docs/design.md section 10: eight float32 0.1 rewards must give exactly 0, not -0.41."""
    r = torch.full((1, 8), 0.1, dtype=torch.float32)
    # the pitfall is real: the naive float32 formula fakes a signal
    naive = (r - r.mean()) / (r.std() + 1e-8)
    assert naive.abs().max().item() > 0.0
    out = _run(r, baseline=baseline, scaling=scaling, std_kind=std_kind, eps=eps)
    assert out.zero_std.tolist() == [True]
    assert (out.advantages == 0.0).all()
    assert out.advantages.tolist() == [[0.0] * 8]


@pytest.mark.parametrize("baseline,scaling,std_kind", COMBOS, ids=COMBO_IDS)
def test_zero_group_next_to_a_live_group(baseline, scaling, std_kind):
    """A zero-variance group stays exactly 0 even when batch scaling has a non-zero std."""
    r = torch.tensor([[0.1] * 4, [1.0, 0.0, 0.0, 0.0]], dtype=torch.float32)
    out = _run(r, baseline=baseline, scaling=scaling, std_kind=std_kind, eps=0.0)
    assert out.zero_std.tolist() == [True, False]
    assert out.advantages[0].tolist() == [0.0] * 4
    assert (out.advantages[1] != 0).all()


@pytest.mark.parametrize("baseline,scaling,std_kind", COMBOS, ids=COMBO_IDS)
def test_one_valid_member_is_zero_signal(baseline, scaling, std_kind):
    nan = float("nan")
    r = torch.tensor([[1.0, nan, nan, nan], [3.0, 5.0, 0.0, 7.0], [0.0, 1.0, 0.0, 1.0]])
    valid = torch.tensor([[True] * 4, [False, True, False, False], [True] * 4])
    out = _run(r, valid, baseline=baseline, scaling=scaling, std_kind=std_kind, eps=0.0)
    assert out.zero_std.tolist() == [True, True, False]
    assert out.advantages[:2].tolist() == [[0.0] * 4, [0.0] * 4]
    assert out.valid.tolist() == [[True, False, False, False], [False, True, False, False], [True] * 4]
    assert torch.isfinite(out.advantages).all()


@pytest.mark.parametrize("baseline,scaling,std_kind", COMBOS, ids=COMBO_IDS)
def test_no_valid_member_is_zero_signal(baseline, scaling, std_kind):
    nan = float("nan")
    r = torch.tensor([[nan, nan, nan], [1.0, 2.0, 4.0]])
    out = _run(r, baseline=baseline, scaling=scaling, std_kind=std_kind, eps=0.0)
    assert out.zero_std.tolist() == [True, False]
    assert out.advantages[0].tolist() == [0.0, 0.0, 0.0]
    assert torch.isfinite(out.advantages).all()


@pytest.mark.parametrize("baseline,scaling,std_kind", COMBOS, ids=COMBO_IDS)
def test_invalid_rewards_are_excluded(baseline, scaling, std_kind):
    """NaN / inf / flagged-invalid rewards get A = 0 and the statistics use the rest only."""
    nan, inf = float("nan"), float("inf")
    key = (str(baseline), str(scaling), str(std_kind))
    exp_valid = HAND_ONE_GROUP[key]
    # NaN
    r = torch.tensor([[1.0, 0.0, nan, 0.0, 0.0]])
    out = _run(r, baseline=baseline, scaling=scaling, std_kind=std_kind, eps=0.0)
    expected = torch.tensor([exp_valid[:2] + [0.0] + exp_valid[2:]], dtype=torch.float64)
    torch.testing.assert_close(out.advantages, expected, rtol=1e-14, atol=1e-14)
    assert out.valid.tolist() == [[True, True, False, True, True]]
    # +inf / -inf
    r = torch.tensor([[inf, 1.0, 0.0, 0.0, -inf, 0.0]])
    out = _run(r, baseline=baseline, scaling=scaling, std_kind=std_kind, eps=0.0)
    expected = torch.tensor([[0.0] + exp_valid[:3] + [0.0] + exp_valid[3:]], dtype=torch.float64)
    torch.testing.assert_close(out.advantages, expected, rtol=1e-14, atol=1e-14)
    # a flagged reward (finite, huge) is excluded too
    r = torch.tensor([[1.0, 0.0, 0.0, 1000.0, 0.0]])
    valid = torch.tensor([[True, True, True, False, True]])
    out = _run(r, valid, baseline=baseline, scaling=scaling, std_kind=std_kind, eps=0.0)
    expected = torch.tensor([exp_valid[:3] + [0.0] + exp_valid[3:]], dtype=torch.float64)
    torch.testing.assert_close(out.advantages, expected, rtol=1e-14, atol=1e-14)


def test_invalid_rewards_excluded_from_batch_std():
    nan = float("nan")
    # batch of valid rewards is {0, 2, 2, 4}; the NaN and the flagged 100 must not enter the batch std
    r = torch.tensor([[0.0, 2.0, nan], [2.0, 100.0, 4.0]])
    valid = torch.tensor([[True, True, True], [True, False, True]])
    out = _run(r, valid, baseline=Baseline.GROUP_MEAN, scaling=Scaling.BATCH_STD, std_kind=StdKind.POPULATION, eps=0.0)
    expected = torch.tensor([[-1 / S2, 1 / S2, 0.0], [-1 / S2, 0.0, 1 / S2]], dtype=torch.float64)
    torch.testing.assert_close(out.advantages, expected, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("baseline,scaling,std_kind", COMBOS, ids=COMBO_IDS)
@pytest.mark.parametrize("pair", [(0.3, 0.7), (0.0, 1.0), (1.1, 0.1)])
def test_group_of_two_distinct_values(baseline, scaling, std_kind, pair):
    """For G = 2 the answer does not depend on the values (one group, so batch std = group std):
    centred +-d/2 (mean) or +-d (leave-one-out); population std d/2, sample std d/sqrt(2)."""
    a, b = pair
    r = torch.tensor([[a, b]], dtype=torch.float32)
    out = _run(r, baseline=baseline, scaling=scaling, std_kind=std_kind, eps=0.0)
    sign = 1.0 if b > a else -1.0
    d = abs(float(r[0, 1]) - float(r[0, 0]))  # the float32 values, exactly
    loo = baseline == Baseline.LEAVE_ONE_OUT
    if scaling == Scaling.NONE:
        mag = d if loo else d / 2
    elif std_kind == StdKind.POPULATION:
        mag = 2.0 if loo else 1.0
    else:
        mag = S2 if loo else 1 / S2
    expected = torch.tensor([[-sign * mag, sign * mag]], dtype=torch.float64)
    torch.testing.assert_close(out.advantages, expected, rtol=1e-12, atol=1e-12)
    assert out.zero_std.tolist() == [False]
    # a group of two equal values is zero-signal
    out = _run(
        torch.tensor([[a, a]], dtype=torch.float32), baseline=baseline, scaling=scaling, std_kind=std_kind, eps=0.0
    )
    assert out.zero_std.tolist() == [True]
    assert out.advantages.tolist() == [[0.0, 0.0]]


def test_resolution_threshold():
    base = 0.1
    # differences at or below the resolution are rounding noise
    r = torch.tensor([[base, base + 1e-12, base, base - 1e-12]], dtype=torch.float64)
    out = compute_advantages(r, eps=0.0)
    assert out.zero_std.tolist() == [True]
    assert out.advantages.tolist() == [[0.0] * 4]
    # a real difference is a signal
    r = torch.tensor([[base, base + 1e-6, base, base]], dtype=torch.float64)
    out = compute_advantages(r, eps=0.0)
    assert out.zero_std.tolist() == [False]
    torch.testing.assert_close(
        out.advantages, torch.tensor([[-0.5, 1.5, -0.5, -0.5]], dtype=torch.float64), rtol=1e-6, atol=1e-6
    )
    # a caller-chosen coarser resolution
    out = compute_advantages(r, eps=0.0, resolution=1e-3)
    assert out.zero_std.tolist() == [True]


def test_input_not_modified():
    nan = float("nan")
    r = torch.tensor([[1.0, nan, 0.0], [0.5, 0.5, 0.5]])
    valid = torch.tensor([[True, True, False], [True, True, True]])
    r0, v0 = r.clone(), valid.clone()
    compute_advantages(r, valid)
    assert torch.equal(valid, v0)
    assert torch.equal(torch.isnan(r), torch.isnan(r0))
    assert torch.equal(torch.nan_to_num(r), torch.nan_to_num(r0))


# --------------------------------------------------------------------------------------------------
# Randomised comparison with the naive reference
# --------------------------------------------------------------------------------------------------


def _random_batch(seed: int):
    rng = random.Random(seed)
    P = rng.randint(1, 6)
    G = rng.randint(1, 8)
    kind = rng.choice(["discrete", "continuous", "mixed"])
    rewards, valid = [], []
    for i in range(P):
        row, vrow = [], []
        group_kind = rng.random()
        for j in range(G):
            if kind == "discrete" or (kind == "mixed" and group_kind < 0.5):
                x = rng.choice([0.0, 0.1, 1.0, 1.1])
            else:
                x = rng.gauss(0.0, 2.0)
            if group_kind > 0.9:  # an all-equal group
                x = 0.1
            u = rng.random()
            if u < 0.1:
                x = float("nan")
            elif u < 0.13:
                x = rng.choice([float("inf"), -float("inf")])
            row.append(x)
            vrow.append(rng.random() > 0.15)
        if rng.random() < 0.1:  # a group with nothing valid
            vrow = [False] * G
        rewards.append(row)
        valid.append(vrow)
    dtype = rng.choice([torch.float32, torch.float64])
    eps = rng.choice([0.0, 1e-6, 0.1])
    return rewards, valid, dtype, eps


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("baseline,scaling,std_kind", COMBOS, ids=COMBO_IDS)
def test_random_vs_naive(seed, baseline, scaling, std_kind):
    rewards, valid, dtype, eps = _random_batch(seed)
    r = torch.tensor(rewards, dtype=dtype)
    v = torch.tensor(valid, dtype=torch.bool)
    # the reference sees exactly the values the function sees (float32 values widened exactly)
    r_list = [[float(x) for x in row] for row in r.tolist()]
    exp_adv, exp_zero, exp_valid = naive_advantages(r_list, valid, baseline, scaling, eps, std_kind)
    out = compute_advantages(r, v, baseline=baseline, scaling=scaling, std_kind=std_kind, eps=eps)
    assert out.valid.tolist() == exp_valid
    assert out.zero_std.tolist() == exp_zero
    torch.testing.assert_close(out.advantages, torch.tensor(exp_adv, dtype=torch.float64), rtol=1e-10, atol=1e-12)
    # structural invariants
    assert torch.isfinite(out.advantages).all()
    assert (out.advantages[~out.valid] == 0).all()
    assert (out.advantages[out.zero_std] == 0).all()
    if baseline == Baseline.GROUP_MEAN:
        # group-mean advantages sum to 0 over the valid members of each group (any per-group scale)
        s = torch.where(out.valid, out.advantages, 0.0).sum(1)
        torch.testing.assert_close(s, torch.zeros_like(s), rtol=0, atol=1e-9)


def test_random_masks_match_nan_marking():
    """Flagging a reward invalid is the same as making it NaN."""
    g = torch.Generator().manual_seed(5)
    for _ in range(5):
        r = torch.randint(0, 3, (4, 6), generator=g).double() / 2
        v = torch.rand(4, 6, generator=g) > 0.3
        a = compute_advantages(r, v)
        b = compute_advantages(torch.where(v, r, float("nan")))
        assert torch.equal(a.advantages, b.advantages)
        assert torch.equal(a.zero_std, b.zero_std)
        assert torch.equal(a.valid, b.valid)
