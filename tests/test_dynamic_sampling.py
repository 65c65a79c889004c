"""Trainer-level reward handling: dynamic sampling, zero-variance accounting, invalid rewards, overlong shaping and
KL-in-reward, on a tiny random Llama (max_new_tokens 4, G 2-4).

Rewards are controlled exactly by replacing `grpolab.training.batch.score_rollout` with a scripted scorer: each call (one
generation round) returns the next [P, G] block of the script.
"""

from __future__ import annotations

import math

import pytest
import torch

import grpolab.training.batch as batch_mod
from grpolab.algo.advantages import compute_advantages
from grpolab.config import from_dict
from grpolab.rewards import RewardResult, RewardSet
from grpolab.rewards.overlong import soft_overlong_penalty
from grpolab.rollout.base import Rollout
from grpolab.training.batch import Scores, score_rollout
from grpolab.training.forward import completion_logprobs
from grpolab.training.trainer import Trainer

NAN = math.nan


pytestmark = pytest.mark.usefixtures("one_thread")


def make_trainer(
    model_dir: str, tmp_path, *, group_size=2, prompts=2, max_new_tokens=4, task=None, train=None, **algorithm
) -> Trainer:
    raw = {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 40, "num_test": 10, **(task or {})}},
        "rollout": {"group_size": group_size, "max_new_tokens": max_new_tokens, "dtype": "float32"},
        "algorithm": {"preset": "grpo", "beta": 0.0, **algorithm},
        "train": {
            "steps": 1,
            "prompts_per_step": prompts,
            "micro_batch_size": 8,
            "lr": 1e-3,
            "seed": 0,
            "samples_per_step": 2,
            **(train or {}),
        },
        "eval": {"every_steps": 0},
        "run": {"output_dir": str(tmp_path), "name": "t"},
    }
    return Trainer(from_dict(raw), tmp_path)


class Script:
    """A stand-in for score_rollout: the i-th call returns rounds[i] (a [P, G] list; NaN = invalid) as rewards,
    with one component `correct` equal to the reward. Records what each round generated."""

    def __init__(self, rounds, max_calls=None):
        self.rounds = rounds
        self.max_calls = len(rounds) if max_calls is None else max_calls
        self.calls: list[tuple[Rollout, list]] = []

    def __call__(self, rollout, problems, rewards, cfg) -> Scores:
        if len(self.calls) >= self.max_calls:
            raise AssertionError(f"score_rollout called {len(self.calls) + 1} times; budget allows {self.max_calls}")
        r = torch.tensor(self.rounds[min(len(self.calls), len(self.rounds) - 1)], dtype=torch.float64).flatten()
        assert len(r) == len(rollout) == len(problems) * cfg.rollout.group_size
        self.calls.append((rollout, problems))
        invalid = torch.isnan(r)
        results = [
            RewardResult(v, {"correct": v}, bad, f"correct: ValueError: scripted invalid row {i}" if bad else None)
            for i, (v, bad) in enumerate(zip(r.tolist(), invalid.tolist()))
        ]
        return Scores(rewards=r.clone(), components={"correct": r.clone()}, invalid=invalid, results=results)


@pytest.fixture
def script(monkeypatch):
    def install(rounds, max_calls=None) -> Script:
        s = Script(rounds, max_calls)
        monkeypatch.setattr(batch_mod, "score_rollout", s)
        return s

    return install


def rows_of(rollout: Rollout, row: int) -> list[int]:
    """Completion token ids of one row, without padding."""
    return rollout.completion_ids[row][rollout.completion_mask[row].bool()].tolist()


def step_with_batch(t: Trainer):
    """One train_step; also returns the Batch that collect() produced for it (before the update)."""
    seen = []
    collect = t.collect

    def spy():
        seen.append(collect())
        return seen[-1]

    t.collect = spy
    try:
        metrics, samples = t.train_step()
    finally:
        del t.collect
    assert len(seen) == 1
    return metrics, samples, seen[0]


# --------------------------------------------------------------------------------------------- dynamic sampling


def test_zero_variance_groups_are_dropped_and_refilled(tiny_model_dir, tmp_path, script):
    t = make_trainer(tiny_model_dir, tmp_path, dynamic_sampling=True, max_extra_rounds=3)
    s = script(
        [
            [[1, 1], [0, 1]],  # round 0: group 0 has no signal, group 1 is kept
            [[0, 0], [1, 0]],
        ],  # round 1: group 1 refills the batch
        max_calls=2,
    )
    batch = t.collect()
    assert len(s.calls) == 2
    assert dynamic(batch) == {"dynamic/extra_rounds": 1.0, "dynamic/kept_groups": 2.0}
    (r0, p0), (r1, p1) = s.calls
    assert [p.uid for p in batch.problems] == [p0[1].uid, p1[1].uid]
    assert batch.rollout.group.tolist() == [0, 0, 1, 1]
    assert batch.scores.rewards.tolist() == [0.0, 1.0, 1.0, 0.0]
    assert batch.scores.components["correct"].tolist() == [0.0, 1.0, 1.0, 0.0]
    # the kept rows are the generated rows of those groups, token for token
    assert [rows_of(batch.rollout, i) for i in range(4)] == [
        rows_of(r0, 2),
        rows_of(r0, 3),
        rows_of(r1, 2),
        rows_of(r1, 3),
    ]
    assert batch.rollout.texts == [r0.texts[2], r0.texts[3], r1.texts[2], r1.texts[3]]
    assert torch.equal(batch.rollout.truncated, torch.cat([r0.truncated[2:], r1.truncated[2:]]))
    # both kept groups carry signal: rewards {0, 1}, mean 0.5, sample std sqrt(0.5): A = -+0.5 / (sqrt(0.5) + eps)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert batch.advantages.tolist() == pytest.approx([-a, a, a, -a], abs=1e-12)
    # zero-variance accounting is of every group sampled (both rounds); the kept batch has its own, prefixed
    assert batch.metrics["groups/frac_zero_std"] == 0.5 and batch.metrics["kept/groups/frac_zero_std"] == 0.0
    assert batch.metrics["reward/mean"] == 0.5 and batch.metrics["kept/reward/mean"] == 0.5


def dynamic(batch) -> dict:
    return {k: v for k, v in batch.metrics.items() if k.startswith("dynamic/")}


def test_refill_stops_as_soon_as_enough_groups_are_kept(tiny_model_dir, tmp_path, script):
    t = make_trainer(tiny_model_dir, tmp_path, prompts=2, dynamic_sampling=True, max_extra_rounds=5)
    s = script(
        [
            [[1, 0], [0, 1]],  # step 1: nothing to drop, no extra round
            [[1, 1], [1, 0]],
            [[0, 1], [1, 0]],
        ],  # step 2: one refill round gives more than needed
        max_calls=3,
    )
    batch = t.collect()
    assert len(s.calls) == 1 and dynamic(batch) == {"dynamic/extra_rounds": 0.0, "dynamic/kept_groups": 2.0}
    b2 = t.collect()
    assert len(s.calls) == 3
    assert dynamic(b2) == {"dynamic/extra_rounds": 1.0, "dynamic/kept_groups": 2.0}
    # more kept than needed: the first P kept groups, in generation order
    assert [p.uid for p in b2.problems] == [s.calls[1][1][1].uid, s.calls[2][1][0].uid]
    assert b2.scores.rewards.tolist() == [1.0, 0.0, 0.0, 1.0]


def test_without_dynamic_sampling_zero_variance_groups_stay(tiny_model_dir, tmp_path, script):
    t = make_trainer(tiny_model_dir, tmp_path, dynamic_sampling=False, max_extra_rounds=3)
    s = script([[[1, 1], [0, 1]]], max_calls=1)
    metrics, _, batch = step_with_batch(t)
    assert len(s.calls) == 1 and len(batch.rollout) == 4
    assert batch.advantages[:2].tolist() == [0.0, 0.0]  # exactly zero, not an epsilon artefact
    assert not any(k.startswith("dynamic/") for k in metrics)
    assert metrics["groups/frac_zero_std"] == 0.5
    assert metrics["loss/signal_token_frac"] == pytest.approx(
        batch.rollout.completion_mask[2:].sum().item() / batch.rollout.completion_mask.sum().item()
    )


@pytest.mark.parametrize("budget", [0, 2])
def test_budget_runs_out_and_the_step_trains_on_what_it_has(tiny_model_dir, tmp_path, script, budget):
    t = make_trainer(tiny_model_dir, tmp_path, dynamic_sampling=True, max_extra_rounds=budget)
    s = script([[[1, 1], [0, 1]]] + [[[0, 0], [1, 1]]] * budget, max_calls=budget + 1)  # raises on an extra call
    before = [p.detach().clone() for p in t.policy.parameters()]
    metrics, samples = t.train_step()
    assert len(s.calls) == budget + 1
    assert metrics["dynamic/extra_rounds"] == budget
    assert metrics["dynamic/kept_groups"] == 1
    # sampled: every round ([1, 1], [0, 1], then [0, 0], [1, 1] per extra round); kept: the one group [0, 1]
    assert metrics["groups/frac_zero_std"] == pytest.approx((1 + 2 * budget) / (2 + 2 * budget))
    assert metrics["reward/mean"] == pytest.approx((3 + 2 * budget) / (4 + 4 * budget))
    assert metrics["kept/reward/mean"] == 0.5 and metrics["kept/reward/std"] == 0.5
    assert metrics["kept/groups/frac_zero_std"] == 0.0
    assert math.isfinite(metrics["loss/total"]) and metrics["loss/signal_token_frac"] == 1.0
    assert any(not torch.equal(a, b) for a, b in zip(before, t.policy.parameters()))  # it trained
    assert [x["reward"] for x in samples] == [0.0, 1.0]


@pytest.mark.parametrize("budget", [0, 2])
def test_all_zero_variance_falls_back_to_the_first_round(tiny_model_dir, tmp_path, script, budget):
    t = make_trainer(tiny_model_dir, tmp_path, dynamic_sampling=True, max_extra_rounds=budget)
    s = script([[[1, 1], [0, 0]], [[0, 0], [1, 1]], [[1, 1], [1, 1]]][: budget + 1], max_calls=budget + 1)
    metrics, _, batch = step_with_batch(t)  # no crash, no signal, everything logged
    assert len(s.calls) == budget + 1
    first, problems = s.calls[0]
    assert [p.uid for p in batch.problems] == [p.uid for p in problems]
    assert [rows_of(batch.rollout, i) for i in range(4)] == [rows_of(first, i) for i in range(4)]
    assert batch.scores.rewards.tolist() == [1.0, 1.0, 0.0, 0.0]
    assert batch.advantages.tolist() == [0.0] * 4
    assert dynamic(batch) == {"dynamic/extra_rounds": float(budget), "dynamic/kept_groups": 0.0}
    assert metrics["dynamic/extra_rounds"] == budget and metrics["dynamic/kept_groups"] == 0
    assert metrics["groups/frac_zero_std"] == 1.0
    assert metrics["loss/signal_token_frac"] == 0.0
    assert metrics["loss/total"] == 0.0


# --------------------------------------------------------------------------------------------- per-slice accounting


def test_frac_zero_std_per_slice(tiny_model_dir, tmp_path, script):
    """Per-slice zero-variance fractions of everything sampled, refill rounds included."""
    t = make_trainer(tiny_model_dir, tmp_path, prompts=6, task={"digits": 2}, dynamic_sampling=True, max_extra_rounds=1)
    first = [[1, 1], [0, 1], [0, 0], [1, 0], [0.5, 0.5], [0.25, 0.5]]  # zero-variance: groups 0, 2, 4
    s = script([first, [[0, 1]] * 6], max_calls=2)
    metrics, _ = t.train_step()
    slices = [p.slice for p in s.calls[0][1]] + [p.slice for p in s.calls[1][1]]
    assert len(set(slices)) > 1, slices  # precondition: this seed samples both digits=1 and digits=2
    assert metrics["dynamic/kept_groups"] == 6 and metrics["dynamic/extra_rounds"] == 1
    zero = [1.0, 0.0, 1.0, 0.0, 1.0, 0.0] + [0.0] * 6
    assert metrics["groups/frac_zero_std"] == 0.25
    for sl in set(slices):
        vals = [z for z, x in zip(zero, slices) if x == sl]
        assert metrics[f"groups/frac_zero_std/{sl}"] == pytest.approx(sum(vals) / len(vals)), sl
    per_slice = {k.split("/", 2)[2] for k in metrics if k.startswith("groups/frac_zero_std/")}
    assert per_slice == set(slices)


def test_no_per_slice_metric_with_one_slice(tiny_model_dir, tmp_path, script):
    t = make_trainer(tiny_model_dir, tmp_path, prompts=2, task={"digits": 1})
    s = script([[[1, 1], [0, 1]]])
    metrics, _ = t.train_step()
    assert {p.slice for p in s.calls[0][1]} == {"digits=1"}
    assert [k for k in metrics if k.startswith("groups/frac_zero_std")] == ["groups/frac_zero_std"]


# --------------------------------------------------------------------------------------------- invalid rewards


def test_invalid_rewards_are_excluded_and_counted(tiny_model_dir, tmp_path, script):
    t = make_trainer(tiny_model_dir, tmp_path, group_size=4, prompts=2)
    script([[[1, NAN, 0, 1], [0, 0, NAN, 0]]])
    metrics, samples, batch = step_with_batch(t)
    # group 0: valid rewards [1, 0, 1]: mean 2/3, sample std sqrt(1/3); group 1: valid [0, 0, 0] -> no signal
    sd = math.sqrt(1 / 3) + 1e-6
    expected = [(1 - 2 / 3) / sd, 0.0, (0 - 2 / 3) / sd, (1 - 2 / 3) / sd, 0.0, 0.0, 0.0, 0.0]
    assert batch.advantages.tolist() == pytest.approx(expected, abs=1e-12)
    assert batch.advantages[1] == 0.0 and batch.advantages[6] == 0.0  # invalid: exactly 0, never NaN
    assert batch.metrics["groups/frac_zero_std"] == 0.5
    mask = t.updater.loss_mask(batch.rollout, ~batch.scores.invalid)
    assert mask[1].sum() == 0 and mask[6].sum() == 0  # invalid completions are out of the loss
    assert mask[0].sum() == batch.rollout.completion_mask[0].sum()
    assert metrics["reward/invalid_frac"] == 0.25
    assert metrics["reward/mean"] == pytest.approx(1 / 3)  # mean over the 6 valid rewards [1, 0, 1, 0, 0, 0]
    assert metrics["reward/correct/mean"] == pytest.approx(1 / 3)
    assert metrics["groups/frac_zero_std"] == 0.5
    assert all(math.isfinite(v) for k, v in metrics.items() if k.startswith(("loss/", "policy/", "optim/")))
    # signal tokens: rows 0, 2, 3 of group 0 (row 1 is invalid and masked out of the loss)
    m = batch.rollout.completion_mask
    assert metrics["loss/signal_token_frac"] == pytest.approx(
        (m[0].sum() + m[2].sum() + m[3].sum()).item() / mask.sum().item()
    )


def test_all_invalid_step_does_not_crash(tiny_model_dir, tmp_path, script):
    t = make_trainer(tiny_model_dir, tmp_path, group_size=2, prompts=2)
    script([[[NAN, NAN], [NAN, NAN]]])
    metrics, _ = t.train_step()
    assert metrics["reward/invalid_frac"] == 1.0 and math.isnan(metrics["reward/mean"])
    assert metrics["groups/frac_zero_std"] == 1.0
    assert math.isfinite(metrics["loss/total"])


# --------------------------------------------------------------------------------------------- overlong shaping


def _rollout_with_lengths(lengths: list[int], width: int, group_size: int) -> Rollout:
    n = len(lengths)
    mask = torch.zeros(n, width, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
    return Rollout(
        prompt_ids=torch.ones(n, 1, dtype=torch.long),
        prompt_mask=torch.ones(n, 1, dtype=torch.long),
        completion_ids=torch.ones(n, width, dtype=torch.long),
        completion_mask=mask,
        sampler_logprobs=torch.zeros(n, width),
        truncated=torch.tensor([length == width for length in lengths]),
        group=torch.arange(n // group_size).repeat_interleave(group_size),
        texts=["no answer"] * n,
    )


def test_overlong_penalty_for_known_lengths():
    """L_max = 8, buffer 4, factor 0.5: 0 up to 4 tokens, then -0.5 * (L - 4) / 4."""
    cfg = from_dict(
        {
            "rollout": {"group_size": 4, "max_new_tokens": 8},
            "algorithm": {"overlong_buffer": 4, "overlong_penalty": 0.5},
            "reward": {"weights": {"correct": 1.0}},
        }
    )
    from grpolab.tasks.base import Problem

    problems = [Problem(uid="p0", question="1+1", answer="2"), Problem(uid="p1", question="2+2", answer="4")]
    scores = score_rollout(
        _rollout_with_lengths([1, 4, 5, 6, 7, 8, 3, 8], 8, 4), problems, RewardSet(cfg.reward.weights), cfg
    )
    expected = [0.0, 0.0, -0.125, -0.25, -0.375, -0.5, 0.0, -0.5]
    assert scores.components["overlong"].tolist() == expected
    assert scores.components["correct"].tolist() == [0.0] * 8
    assert scores.rewards.tolist() == expected  # added to the reward, unweighted
    assert not scores.invalid.any()
    assert [soft_overlong_penalty(n, 8, 4, 0.5) for n in [1, 4, 5, 6, 7, 8, 3, 8]] == expected


def test_no_overlong_component_when_off():
    cfg = from_dict({"rollout": {"group_size": 2, "max_new_tokens": 8}, "algorithm": {"overlong_buffer": 0}})
    from grpolab.tasks.base import Problem

    scores = score_rollout(
        _rollout_with_lengths([8, 8], 8, 2),
        [Problem(uid="p", question="q", answer="1")],
        RewardSet(cfg.reward.weights),
        cfg,
    )
    assert "overlong" not in scores.components and scores.rewards.tolist() == [0.0, 0.0]


def test_overlong_metric_in_a_training_step(tiny_model_dir, tmp_path):
    """Real scoring (no stub): reward/overlong/mean equals the penalty computed by hand from the sampled lengths."""
    t = make_trainer(
        tiny_model_dir, tmp_path, group_size=4, prompts=2, max_new_tokens=4, overlong_buffer=2, overlong_penalty=0.5
    )
    metrics, _, batch = step_with_batch(t)
    lengths = batch.rollout.completion_mask.sum(-1).tolist()
    by_hand = [0.0 if n <= 2 else -0.5 * (n - 2) / 2 for n in lengths]  # L_max 4, buffer 2
    assert batch.scores.components["overlong"].tolist() == by_hand
    valid = (~batch.scores.invalid).tolist()
    kept = [p for p, v in zip(by_hand, valid) if v]
    assert metrics["reward/overlong/mean"] == pytest.approx(sum(kept) / len(kept))
    assert any(p < 0 for p in by_hand), lengths  # a random tiny model runs into the 4-token limit
    weights = t.cfg.reward.weights
    base = sum(weights[k] * batch.scores.components[k] for k in weights)
    assert torch.allclose(batch.scores.rewards, base + batch.scores.components["overlong"], equal_nan=True)


# --------------------------------------------------------------------------------------------- KL in the reward


def _perturb(model, scale=0.05, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def _logprobs_row_by_row(model, ro: Rollout, temperature: float) -> torch.Tensor:
    """[N, Lc] completion logprobs from the trainer's forward function, one row at a time (no shared prompt)."""
    out = torch.zeros(ro.completion_ids.shape)
    with torch.no_grad():
        for i in range(len(ro)):
            fo = completion_logprobs(model, ro, torch.tensor([i]), temperature, "fp32")
            out[i, fo.cols] = fo.logp
    return out


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_kl_in_reward_subtracts_beta_times_summed_token_kl(tiny_model_dir, tmp_path, script, estimator):
    beta = 0.1
    # the expectation is built in float32 from the trainer's own logprob function: the update's precision is pinned
    # (under bf16 the trainer's old logprobs round differently; make test runs this file in both)
    t = make_trainer(
        tiny_model_dir,
        tmp_path,
        group_size=2,
        prompts=2,
        beta=beta,
        kl_placement="reward",
        kl_estimator=estimator,
        train={"precision": "fp32"},
    )
    assert t.reference is not None
    _perturb(t.policy)  # the policy moves away from the frozen reference, so the KL is not zero
    script([[[1, 0], [0, 0]]])
    seen = {}
    prepare = t.estimator.prepare

    def spy(ctx):
        batch = ctx.batch
        ro = batch.rollout
        seen["before"] = batch.scores.rewards.clone()
        # the expectation, computed before the update from the trainer's own logprob function
        seen["old"] = _logprobs_row_by_row(t.policy, ro, t.cfg.rollout.temperature)
        seen["ref"] = _logprobs_row_by_row(t.reference, ro, t.cfg.rollout.temperature)
        seen["out"] = prepare(ctx)
        seen["after"] = batch.scores.rewards.clone()
        seen["advantages"] = batch.advantages.clone()
        return seen["out"]

    t.estimator.prepare = spy
    metrics, _, batch = step_with_batch(t)
    m = batch.rollout.completion_mask
    log_rho = (seen["ref"] - seen["old"]).double()
    k = -log_rho if estimator == "k1" else torch.exp(log_rho) - log_rho - 1
    kl_seq = (k * m).sum(-1)
    assert (kl_seq.abs() > 1e-4).all()  # the check is not vacuous
    assert torch.allclose(seen["after"], seen["before"] - beta * kl_seq, atol=1e-5, rtol=0)
    if estimator == "k3":
        assert (seen["after"] < seen["before"]).all()  # k3 >= 0: the penalty only lowers rewards
    # the logprobs the penalty used are the ones returned (and handed to the update as ref / old)
    ref_lp, old_lp = seen["out"]
    assert torch.allclose(old_lp * m, seen["old"] * m, atol=1e-5)
    assert torch.allclose(ref_lp * m, seen["ref"] * m, atol=1e-5)
    # advantages are recomputed from the penalised rewards; group 1 ([0, 0] before) now has signal from the KL
    adv = compute_advantages(seen["after"].view(-1, 2), eps=1e-6).advantages.view(-1)
    assert torch.equal(seen["advantages"], adv)
    assert seen["advantages"][2:].abs().sum() > 0
    # the step: KL measured and logged, not added to the loss; the logged reward is the task reward (what the
    # release checks judge), the penalty is logged beside it
    assert math.isfinite(metrics["loss/total"]) and metrics["policy/kl"] != 0
    assert metrics["loss/total"] == pytest.approx(metrics["loss/policy"])
    assert metrics["reward/mean"] == pytest.approx(seen["before"].mean().item())
    assert metrics["reward/kl_penalty/mean"] == pytest.approx((beta * kl_seq).mean().item(), abs=1e-6)
    assert metrics["reward/correct/mean"] == 0.25  # the components stay the raw task reward


def test_kl_in_loss_leaves_rewards_alone(tiny_model_dir, tmp_path, script):
    t = make_trainer(tiny_model_dir, tmp_path, beta=0.1, kl_placement="loss")
    _perturb(t.policy)
    script([[[1, 0], [0, 0]]])
    batch = t.collect()
    before = batch.scores.rewards.clone()
    assert t.estimator.prepare(t.advantage_context(batch)) == (None, None)
    assert torch.equal(batch.scores.rewards, before)


def test_beta_zero_loads_no_reference(tiny_model_dir, tmp_path):
    t = make_trainer(tiny_model_dir, tmp_path, beta=0.0, kl_placement="reward")
    assert t.reference is None


# --------------------------------------------------------------------------------------------- once-bugs (regressions)


def test_dynamic_sampling_keeps_the_errors_of_invalid_kept_rows(tiny_model_dir, tmp_path, script):
    t = make_trainer(tiny_model_dir, tmp_path, group_size=3, prompts=2, dynamic_sampling=True, max_extra_rounds=1)
    script([[[1, 0, NAN], [1, 1, 1]], [[0, 1, 0], [1, 1, 1]]], max_calls=2)
    batch = t.collect()
    assert batch.scores.invalid.tolist() == [False, False, True, False, False, False]
    assert batch.scores.errors == [None, None, "correct: ValueError: scripted invalid row 2", None, None, None]


# --------------------------------------------------------------------------------------------- issue-11 regressions


def test_dynamic_sampling_judges_groups_by_correctness_not_bonuses(tiny_model_dir, tmp_path, monkeypatch):
    """DAPO filters on accuracy: an all-wrong group whose format bonus varies has no signal and is dropped."""
    t = make_trainer(tiny_model_dir, tmp_path, dynamic_sampling=True, max_extra_rounds=0)

    def scorer(rollout, problems, rewards, cfg):
        correct = torch.tensor([0.0, 0.0, 1.0, 0.0], dtype=torch.float64)  # group 0 all wrong, group 1 mixed
        fmt = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)  # ... but group 0's bonus varies
        return Scores(
            correct + 0.1 * fmt,
            {"correct": correct, "format": fmt},
            torch.zeros(4, dtype=torch.bool),
            [RewardResult(0.0)] * 4,
        )

    monkeypatch.setattr(batch_mod, "score_rollout", scorer)
    batch = t.collect()
    assert batch.metrics["dynamic/kept_groups"] == 1.0
    assert batch.scores.components["correct"].tolist() == [1.0, 0.0]  # only group 1 is trained on
    assert batch.metrics["groups/frac_zero_std"] == 0.0  # (the total reward varies in both groups)


def test_lr_schedule_follows_the_plan_when_fewer_groups_are_kept(tiny_model_dir, tmp_path, script):
    """4 minibatches planned per step; dynamic sampling keeps 1 group (2 rows), so the update takes 2 optimizer
    steps. The schedule must still stand at step 4 * s after training step s."""
    t = make_trainer(
        tiny_model_dir,
        tmp_path,
        dynamic_sampling=True,
        max_extra_rounds=0,
        train={"steps": 3, "minibatches": 4, "schedule": "cosine", "warmup_steps": 1},
    )
    script([[[1, 1], [0, 1]]] * 2)
    for step in (1, 2):
        metrics, _ = t.train_step()
        assert t.scheduler.last_epoch == 4 * step
        assert metrics["optim/lr"] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * (4 * step - 1) / 11)))


def test_samples_come_from_every_group(tiny_model_dir, tmp_path, script):
    t = make_trainer(tiny_model_dir, tmp_path, group_size=2, prompts=2)
    script([[[1, 0], [0, 1]]])
    _, samples, batch = step_with_batch(t)
    assert [s["uid"] for s in samples] == [p.uid for p in batch.problems]  # one from each group, not two of group 0
