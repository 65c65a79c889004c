"""The pass-rate prompt schedule (grpolab/training/prompt_sampler.py): saturated prompts are revisited less often, never
starved, the shuffle schedule is unchanged, the memory comes from what the collector saw, and a resume is exact."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import earnable
import pytest
import torch
from test_resume import assert_same_run, rows

from grpolab.card import objective_card
from grpolab.config import from_dict
from grpolab.errors import ConfigError
from grpolab.models import checkpoint as ckpt
from grpolab.runs import resume_run, start_run
from grpolab.tasks.base import Problem
from grpolab.training.prompt_sampler import PromptSampler, revisit_draw


def problems(n: int) -> list[Problem]:
    return [Problem(uid=f"p{i}", question=f"q{i}", answer=str(i)) for i in range(n)]


def epoch_order(seed: int, epoch: int, n: int) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).tolist()


def test_shuffle_is_each_prompt_once_per_epoch_in_the_seeded_order():
    ps = problems(5)
    s = PromptSampler(ps, seed=3)
    s.observe(ps, [True] * 5, [1.0] * 5)  # memory is ignored by the shuffle schedule
    taken = [p.uid for p in s.take(12)]
    expected = [f"p{i}" for i in epoch_order(3, 0, 5) + epoch_order(3, 1, 5) + epoch_order(3, 2, 5)[:2]]
    assert taken == expected


def test_pass_rate_skips_a_saturated_prompt_exactly_when_the_draw_is_above_the_floor():
    ps = problems(4)
    s = PromptSampler(ps, seed=1, schedule="pass_rate", floor=0.5)
    s.observe(ps, [True, False, True, False], [1.0, 0.5, 0.0, 0.25])  # p0 solved G/G, p2 0/G
    taken = [p.uid for p in s.take(6)]
    expected, epoch, pos, skips = [], 0, 0, {"p0": 0, "p2": 0}
    while len(expected) < 6:  # the rule written out: saturated and draw >= floor and skips < 2 -> skip
        order = epoch_order(1, epoch, 4)
        if pos == 4:
            epoch, pos = epoch + 1, 0
            continue
        uid = f"p{order[pos]}"
        if uid in skips and skips[uid] < 2 and revisit_draw(1, epoch, pos) >= 0.5:
            skips[uid] += 1
        else:
            expected.append(uid)
        pos += 1
    assert taken == expected
    assert s.skipped == sum(skips.values()) > 0


def test_no_prompt_is_starved_and_unsaturated_ones_are_never_skipped():
    ps = problems(10)
    s = PromptSampler(ps, seed=0, schedule="pass_rate", floor=0.25)
    s.observe(ps[:8], [True] * 8, [0.0] * 8)  # 8 saturated, 2 with signal
    counts = {p.uid: 0 for p in ps}
    last_seen: dict[str, int] = {}
    longest = 0
    for _ in range(400):
        for p in s.take(1):  # one at a time, so s.epoch is the epoch it was drawn in
            counts[p.uid] += 1
            longest = max(longest, s.epoch - last_seen.get(p.uid, 0))
            last_seen[p.uid] = s.epoch
            s.observe([p], [p.uid in {q.uid for q in ps[:8]}], [0.0])  # saturated ones stay saturated
    epochs = s.epoch
    assert all(counts[f"p{i}"] >= epochs - 1 for i in (8, 9))  # never skipped: once per epoch
    assert all(0 < counts[f"p{i}"] < epochs / 2 for i in range(8))  # revisited, but less often
    assert longest <= 4 + 1  # ceil(1 / 0.25) skips in a row at most, so at most 5 epochs between visits


def test_state_dict_round_trip_gives_the_same_future():
    ps = problems(7)
    a = PromptSampler(ps, seed=2, schedule="pass_rate", floor=0.3)
    a.observe(ps[:5], [True, True, False, True, True], [1.0, 0.0, 0.5, 1.0, 0.0])
    a.take(5)
    b = PromptSampler(ps, seed=2, schedule="pass_rate", floor=0.3)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))  # checkpoints store it as plain data
    assert [p.uid for p in a.take(20)] == [p.uid for p in b.take(20)]
    assert a.state_dict() == b.state_dict()


def test_bad_floor_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError, match=r"train.prompt_floor: expected a number in \(0, 1\], got 0.0"):
        from_dict({"train": {"prompt_schedule": "pass_rate", "prompt_floor": 0.0}})
    with pytest.raises(ConfigError, match="train.prompt_schedule"):
        from_dict({"train": {"prompt_schedule": "easy_first"}})


def test_the_card_states_the_schedule():
    assert objective_card(from_dict({}))["choices"]["prompt_schedule"].startswith("shuffle")
    card = objective_card(from_dict({"train": {"prompt_schedule": "pass_rate", "prompt_floor": 0.2}}))
    assert card["choices"]["prompt_schedule"].startswith("pass_rate") and "0.2" in card["choices"]["prompt_schedule"]


def scheduled(model_dir: str, out: Path, name: str) -> dict:
    """A tiny run the random model cannot answer correctly: every group is 0/G on `correct` (weighted, so the
    schedule judges by it; always 0, so the gradient is the earnable newline reward's), so the schedule remembers
    every prompt as saturated and skips."""
    reward = earnable.reward_config()
    reward["weights"] = {**reward["weights"], "correct": 1.0}
    return {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 6, "num_test": 4}},
        "reward": reward,
        "rollout": earnable.rollout_config(group_size=4),
        "algorithm": {"preset": "grpo", "beta": 0.0, "entropy_coef": 0.0},
        "train": {
            "steps": 5,
            "prompts_per_step": 2,
            "micro_batch_size": 8,
            "lr": 5e-3,
            "seed": 0,
            "save_every": 1,
            "keep_last": 5,
            "samples_per_step": 2,
            "prompt_schedule": "pass_rate",
            "prompt_floor": 0.25,
        },
        "eval": {"every_steps": 0},
        "run": {"output_dir": str(out), "name": name},
    }


@pytest.mark.usefixtures("one_thread")
def test_the_trainer_feeds_the_memory_and_a_resume_is_exact(tiny_model_dir, tmp_path):
    trainer, _ = start_run(from_dict(scheduled(tiny_model_dir, tmp_path, "whole")))
    trainer.fit()
    whole = tmp_path / "whole"
    last = rows(whole / "metrics.jsonl")[-1]
    assert last["schedule/seen_prompts"] == 6 and last["schedule/saturated_prompts"] == 6
    assert last["schedule/skipped_total"] > 0
    state = ckpt.load_state(ckpt.latest_checkpoint(whole))
    assert state["sampler"]["memory"] and state["sampler"]["skipped"] == last["schedule/skipped_total"]

    cut = tmp_path / "cut"
    shutil.copytree(whole, cut)
    for step in (3, 4, 5):
        shutil.rmtree(cut / "checkpoints" / f"step-{step}")
    resumed, path = resume_run(cut, [], allow_changes=True)  # the run name differs, nothing else
    assert path.name == "step-2" and resumed.sampler.memory  # the memory came back from the checkpoint
    resumed.fit()
    assert_same_run(whole, cut)
