"""Which values dynamic sampling and the pass_rate schedule judge a group by (grpolab.training.batch.signal_values): the
first *positively weighted* correctness component, else the total reward -- never a component the run does not
train on (weight 0)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from grpolab.config import from_dict
from grpolab.rewards import RewardResult
from grpolab.training.batch import BatchCollector, Scores, signal_values
from grpolab.training.group_rules import GroupRelative

RM = [0.3, -1.2, 2.0, 0.1, 0.5, 0.5, 0.5, 0.5]  # group 0: the reward model's scores vary; group 1: they do not
CORRECT = [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0]  # group 0 all wrong, group 1 mixed


def scores(weights: dict[str, float]) -> Scores:
    comps = {"model": torch.tensor(RM, dtype=torch.float64), "correct": torch.tensor(CORRECT, dtype=torch.float64)}
    total = sum(w * comps[n] for n, w in weights.items())
    return Scores(total, comps, torch.zeros(8, dtype=torch.bool), [RewardResult(0.0)] * 8)


def collector(weights: dict[str, float]) -> BatchCollector:
    cfg = from_dict(
        {"model": {"name": "unused"}, "rollout": {"group_size": 4, "dtype": "float32"}, "train": {"precision": "fp32"}}
    )
    return BatchCollector(cfg, None, None, None, SimpleNamespace(weights=weights), GroupRelative.of(cfg.algorithm))


def test_a_zero_weighted_verifier_does_not_decide_which_groups_train():
    """{model: 1, correct: 0} (docs/reward_models.md): the trained reward is the RM's, so a group whose RM scores
    vary has signal even though `correct` is 0 everywhere, and a group of equal RM scores has none."""
    weights = {"model": 1.0, "correct": 0.0}
    signal, pass_rates = collector(weights).group_signal(scores(weights))
    assert signal == [True, False]
    assert pass_rates == pytest.approx([0.3, 0.5])  # (0.3 - 1.2 + 2.0 + 0.1) / 4; the pass_rate schedule's memory
    assert signal_values(scores(weights), weights).tolist() == RM


def test_a_positively_weighted_verifier_still_decides():
    """{correct: 1, model: 0.5}: DAPO's rule, by correctness -- the all-wrong group is dropped whatever the RM says."""
    weights = {"correct": 1.0, "model": 0.5}
    assert collector(weights).group_signal(scores(weights)) == ([False, True], [0.0, 0.5])
    assert signal_values(scores(weights), weights).tolist() == CORRECT


@pytest.mark.parametrize("w", [0.0, -1.0])
def test_without_a_positively_weighted_verifier_the_total_reward_decides(w):
    weights = {"model": 2.0, "correct": w}
    s = scores(weights)
    assert torch.equal(signal_values(s, weights), s.rewards)
