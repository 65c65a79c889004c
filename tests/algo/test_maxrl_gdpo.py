"""MaxRL and GDPO advantages (grpolab/algo/advantages.py): hand-computed values, the zero-signal rules, float64
references written loop by loop from the papers' formulas, and their group rules (grpolab/training/group_rules.py)."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from grpolab.algo.advantages import StdKind, gdpo_advantages, maxrl_advantages
from grpolab.training.group_rules import GDPO, MaxRL

D = torch.float64


# --------------------------------------------------------------------------------------------- MaxRL


def test_maxrl_hand_values():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]], dtype=D)
    out = maxrl_advantages(r)
    # p = 1/4: a success gets (1 - p) / p = 3, a failure -1; p = 1/2: 1 and -1; p = 3/4: 1/3 and -1
    assert out.advantages.tolist() == [[3.0, -1.0, -1.0, -1.0], [1.0, 1.0, -1.0, -1.0], [1 / 3, 1 / 3, 1 / 3, -1.0]]
    assert not out.zero_std.any()
    # a graded reward: mean 0.5, A = (R - 0.5) / 0.5
    graded = maxrl_advantages(torch.tensor([[0.25, 0.75]], dtype=D))
    assert graded.advantages.tolist() == [[-0.5, 0.5]]


def test_maxrl_zero_signal_rules():
    r = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [-1.0, 1.0, 0.0], [-2.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=D)
    valid = torch.tensor([[True] * 3] * 4 + [[True, False, False]])
    out = maxrl_advantages(r, valid)
    # all zero, all equal, mean 0, mean < 0 (dividing would reverse the update), one valid member: A = 0 exactly
    assert out.advantages.tolist() == [[0.0] * 3] * 5
    assert out.zero_std.tolist() == [True] * 5
    nan = maxrl_advantages(torch.tensor([[1.0, float("nan"), 0.0, 0.0]], dtype=D))
    # the NaN sample is out: p = 1/3 over the others, (1 - 1/3) / (1/3) = 2 (up to rounding)
    assert nan.advantages[0].tolist() == pytest.approx([2.0, 0.0, -1.0, -1.0], rel=1e-15)


def test_maxrl_float64_reference():
    g = torch.Generator().manual_seed(0)
    r = (torch.rand(6, 5, generator=g, dtype=D) > 0.6).to(D) * torch.rand(6, 5, generator=g, dtype=D)
    out = maxrl_advantages(r)
    for i, row in enumerate(r.tolist()):
        mean = sum(row) / len(row)
        equal = max(row) - min(row) <= 1e-9
        want = [0.0] * len(row) if equal or mean <= 0 else [(x - mean) / mean for x in row]
        assert out.advantages[i].tolist() == pytest.approx(want, rel=1e-14, abs=1e-15)


# --------------------------------------------------------------------------------------------- GDPO


def test_gdpo_hand_values():
    """Two groups of 2, components correct (weight 1) and short (weight 0.5), eps 0. Group 0: correct [1, 0] ->
    (R - 0.5) / sqrt(0.5) (sample std) = +-0.7071, short [1, 1] -> 0. Group 1: correct [1, 1] -> 0, short [1, 0] ->
    +-0.7071, times 0.5. S = [0.7071, -0.7071, 0.3536, -0.3536]: mean 0, sample std sqrt((2 * 0.5 + 2 * 0.125) / 3) =
    sqrt(5/12); A = S / sqrt(5/12) = +-sqrt(6/5), +-sqrt(6/5)/2."""
    correct = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=D)
    short = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=D)
    out = gdpo_advantages([(1.0, correct), (0.5, short)], eps=0.0)
    a, b = math.sqrt(0.5) / math.sqrt(5 / 12), 0.5 * math.sqrt(0.5) / math.sqrt(5 / 12)
    torch.testing.assert_close(out.advantages, torch.tensor([[a, -a], [b, -b]], dtype=D), rtol=1e-15, atol=0)
    assert (a, b) == pytest.approx((math.sqrt(6 / 5), math.sqrt(6 / 5) / 2))
    # GRPO on the weighted total [1.5, 0.5], [1.5, 1.0] gives both groups +-0.7071: GDPO keeps the weights' ratio 2:1
    assert out.advantages[0, 0] / out.advantages[1, 0] == pytest.approx(2.0)


def test_gdpo_zero_signal_and_weight_zero_components():
    flat = torch.tensor([[1.0, 1.0], [0.0, 1.0]], dtype=D)
    logged = torch.tensor([[0.0, 5.0], [float("nan"), 2.0]], dtype=D)  # weight 0: logged only, NaN allowed
    out = gdpo_advantages([(1.0, flat), (0.0, logged)], eps=1e-6)
    assert out.zero_std.tolist() == [True, False]  # group 0: its only weighted component is all-equal
    assert out.advantages[0].tolist() == [0.0, 0.0] and out.valid.all()
    # group 1's S = +-0.7071/(0.7071 + 1e-6); the batch of S = [0, 0, -x, x]: A = S / (std_B S + 1e-6)
    x = 0.5 / (math.sqrt(0.5) + 1e-6)
    std = statistics.stdev([0.0, 0.0, -x, x])
    torch.testing.assert_close(out.advantages[1], torch.tensor([-x, x], dtype=D) / (std + 1e-6), rtol=1e-14, atol=0)
    none = gdpo_advantages([(1.0, flat[:1])], eps=1e-6)
    assert none.zero_std.tolist() == [True] and none.advantages.tolist() == [[0.0, 0.0]]
    with pytest.raises(ValueError, match="at least one"):
        gdpo_advantages([], eps=1e-6)


def reference_gdpo(parts, eps: float, ddof: int) -> list[list[float]]:
    """The paper's formula, loop by loop in Python floats (every sample valid)."""
    groups, size = parts[0][1].shape
    std = lambda xs: math.sqrt(sum((x - sum(xs) / len(xs)) ** 2 for x in xs) / (len(xs) - ddof))  # noqa: E731
    s = [[0.0] * size for _ in range(groups)]
    flat = [True] * groups
    for w, r in parts:
        for i, row in enumerate(r.tolist()):
            if max(row) - min(row) <= 1e-9:
                continue
            flat[i] = False
            mean = sum(row) / size
            for j, x in enumerate(row):
                s[i][j] += w * (x - mean) / (std(row) + eps)
    every = [x for row in s for x in row]
    mean, sd = sum(every) / len(every), std(every)
    return [[0.0] * size if flat[i] else [(x - mean) / (sd + eps) for x in s[i]] for i in range(groups)]


@pytest.mark.parametrize("kind, ddof", [(StdKind.SAMPLE, 1), (StdKind.POPULATION, 0)])
def test_gdpo_float64_reference(kind, ddof):
    g = torch.Generator().manual_seed(4)
    for _ in range(5):
        parts = [
            (1.0, (torch.rand(4, 6, generator=g, dtype=D) > 0.5).to(D)),
            (0.3, torch.rand(4, 6, generator=g, dtype=D)),
            (2.0, torch.randn(4, 6, generator=g, dtype=D)),
        ]
        out = gdpo_advantages(parts, eps=1e-4, std_kind=kind)
        want = torch.tensor(reference_gdpo(parts, 1e-4, ddof), dtype=D)
        torch.testing.assert_close(out.advantages, want, rtol=1e-12, atol=1e-13)


# --------------------------------------------------------------------------------------------- group rules


def test_group_rules_read_rewards_and_components():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=D)
    invalid = torch.tensor([[False, False, False, True]])
    maxrl = MaxRL().advantages(rewards, invalid)
    assert maxrl.advantages[0].tolist() == pytest.approx([2.0, -1.0, -1.0, 0.0], rel=1e-15)  # p = 1/3, three valid
    assert MaxRL().signal(rewards, rewards, invalid).tolist() == [True]
    rule = GDPO(eps=0.0, std_kind="population")
    parts = [(1.0, torch.tensor([[1.0, 0.0, 1.0, 0.0]], dtype=D))]
    got = rule.advantages(rewards, torch.zeros(1, 4, dtype=torch.bool), parts)
    assert got.advantages.tolist() == [[1.0, -1.0, 1.0, -1.0]]  # one component, std 1/2: +-1, then batch std 1
    with pytest.raises(ValueError, match="reward components"):
        rule.advantages(rewards, invalid)


def test_the_collector_gives_gdpo_each_component_with_its_weight():
    """BatchCollector.advantages hands the rule every component with its reward.weights weight (the overlong penalty,
    added unweighted, with 1): the same advantages as gdpo_advantages on those parts."""
    from types import SimpleNamespace

    from grpolab.config import from_dict
    from grpolab.training.batch import BatchCollector

    collector = object.__new__(BatchCollector)
    collector.cfg = from_dict({"rollout": {"group_size": 2}, "algorithm": {"estimator": "gdpo"}})
    collector.rewards = SimpleNamespace(weights={"correct": 1.0, "format": 0.5})
    collector.group = GDPO(eps=0.0, std_kind="sample")
    components = {
        "correct": torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=D),
        "format": torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=D),
        "overlong": torch.tensor([0.0, -1.0, 0.0, 0.0], dtype=D),
    }
    total = components["correct"] + 0.5 * components["format"] + components["overlong"]
    got = collector.advantages(total, torch.zeros(4, dtype=torch.bool), components)
    parts = [(1.0, components["correct"].view(2, 2)), (0.5, components["format"].view(2, 2))]
    parts.append((1.0, components["overlong"].view(2, 2)))
    torch.testing.assert_close(got.advantages, gdpo_advantages(parts, eps=0.0).advantages, rtol=0, atol=0)
    # group 0: correct and overlong both +-0.7071, S = +-1.4142; group 1: format +-0.7071 * 0.5 = +-0.3536
    s = [math.sqrt(2), -math.sqrt(2), math.sqrt(0.125), -math.sqrt(0.125)]
    want = torch.tensor(s, dtype=D).view(2, 2) / statistics.stdev(s)
    torch.testing.assert_close(got.advantages, want, rtol=1e-14, atol=0)
