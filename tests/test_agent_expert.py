"""Tasks the tool is needed for and their scripted experts: the ``lookup`` environment's directory and chains
(hand-checked rules, disjoint splits, horizon slices), and expert episodes of calc, lookup and guess rendered as
sampled episodes are (same prompt, same observation tokens, loss mask on the expert's turns), each solving its
instance with exactly the tool calls its label says."""

from __future__ import annotations

import hashlib

import pytest

import grpolab.agents  # noqa: F401 -- registers the built-in environments
from grpolab.agents.env import AgentTask, horizon_slice
from grpolab.agents.episode import EpisodeRunner
from grpolab.agents.expert import end_of_turn_id, expert_episode
from grpolab.agents.lookup import chain, directory, make_problems, open_box, split_of
from grpolab.agents.tools import ToolError
from grpolab.models.load import load_causal_lm, load_tokenizer
from grpolab.rollout.grpolab_engine import eos_ids


def test_a_box_holds_what_the_hash_of_its_label_says():
    for label in ("amber-100", "navy-555", "teal-999", "red-412"):
        h = int(hashlib.sha256(("lookup:" + label).encode()).hexdigest(), 16)
        kind, value = directory(label)
        if h % 2 == 0:
            assert (kind, value) == ("code", str(1000 + (h // 2) % 9000))
            assert open_box(f" '{label}' ") == f"The code is {value}."
        else:
            assert kind == "box" and split_of(value) == split_of(label)
            assert open_box(label) == f"A note: open box {value}."
    for bad in ("purple-123", "amber-12", "amber412", "", "amber-1000"):
        with pytest.raises(ToolError, match="no box labelled"):
            open_box(bad)


def test_instances_are_chains_of_the_labelled_length_and_the_splits_share_no_box():
    train, test = make_problems("train", 60, 0, 1), make_problems("test", 30, 0, 1)
    boxes = {}
    for split, problems in (("train", train), ("test", test)):
        assert [p.data["expert_calls"] for p in problems] == [i % 3 + 1 for i in range(len(problems))]
        assert len({p.uid for p in problems}) == len(problems)
        boxes[split] = set()
        for p in problems:
            found, code = chain(p.data["start"])
            assert len(found) == p.data["expert_calls"] and code == p.answer and p.slice == f"hops={len(found)}"
            assert {split_of(b) for b in found} == {split}
            boxes[split] |= set(found)
    assert not boxes["train"] & boxes["test"]
    assert make_problems("test", 30, 0, 1) == test and make_problems("test", 30, 1, 1) != test
    assert [horizon_slice(n) for n in (0, 1, 2, 3, 7)] == ["calls=0", "calls=1", "calls=2", "calls=3+", "calls=3+"]


@pytest.fixture(scope="module")
def runner(tiny_model_dir):
    model, tok = load_causal_lm(tiny_model_dir, "float32"), load_tokenizer(tiny_model_dir)
    return EpisodeRunner(model, tok, eos_ids(model, tok))


@pytest.mark.parametrize(
    "env, difficulty, calls",
    [
        ("lookup", 1, lambda p: p.data["expert_calls"]),
        ("calc", 3, lambda p: 1),
        ("calc", 1, lambda p: 0),
        ("guess", 1, lambda p: 0),
    ],
)
def test_expert_episodes_succeed_with_the_calls_their_label_says(runner, env, difficulty, calls):
    task = AgentTask(
        env, num_train=9, num_test=3, difficulty=difficulty, max_turns=6, max_turn_tokens=40, max_total_tokens=400
    )
    eot = end_of_turn_id(runner)
    assert runner.tokenizer.convert_ids_to_tokens([eot]) == ["<|im_end|>"]
    for problem in task.problems("train"):
        ep = expert_episode(runner, problem, eot)
        assert ep.result.reward == 1.0 and ep.result.ended_by == "done", (problem, ep.result)
        assert ep.result.tool_calls == calls(problem) and ep.result.tool_errors == 0
        # the rendering is the chat template's conversation: prompt, then turn / observation, token for token
        assert problem.question in runner.tokenizer.decode(ep.prompt)
        text = runner.tokenizer.decode(ep.tokens)
        assert text.count("<|im_end|>") == 2 * ep.result.turns - 1  # each turn closed, each observation closed
        model_ids = [t for t, m in zip(ep.tokens, ep.loss_mask) if m]
        assert model_ids.count(eot) == ep.result.turns and sum(ep.loss_mask) == ep.result.model_tokens
        for step in ep.result.trace[:-1]:
            assert step["observation"] in text


def test_an_expert_episode_is_what_the_runner_makes_of_the_same_turns_sampled(runner, monkeypatch):
    """The sampled path fed the expert's ids as if the model drew them gives the same episode ids and mask."""
    import torch

    import grpolab.agents.episode as episode_module
    from grpolab.rollout.base import SamplingParams
    from grpolab.rollout.decode import Decoded

    problem = AgentTask(
        "lookup", num_train=3, num_test=3, difficulty=1, max_turns=5, max_turn_tokens=40, max_total_tokens=400
    ).problems("train")[1]  # two boxes: three turns
    expert = expert_episode(runner, problem)
    turns, current = [], []
    for t, m in zip(expert.tokens, expert.loss_mask):
        if m:
            current.append(t)
        elif current:
            turns.append(current)
            current = []
    turns.append(current)
    assert len(turns) == 3
    scripted = iter(turns)

    def decode(model, seqs, stores, *args, **kwargs):
        ids = next(scripted)
        return Decoded(
            torch.tensor([ids]),
            torch.ones(1, len(ids), dtype=torch.long),
            torch.zeros(1, len(ids)),
            torch.zeros(1, dtype=torch.bool),
        ), [None]

    monkeypatch.setattr(episode_module, "decode_turn", decode)
    out = runner.run([problem], 1, SamplingParams(group_size=1, greedy=True))
    ro = out.rollout
    assert ro.prompt_ids[0][ro.prompt_mask[0].bool()].tolist() == expert.prompt
    assert ro.completion_ids[0].tolist() == expert.tokens and ro.loss_mask[0].tolist() == expert.loss_mask
    assert out.results[0].reward == 1.0 and out.results[0].tool_calls == 2
