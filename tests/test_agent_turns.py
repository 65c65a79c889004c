"""The key/value cache kept across the turns of an episode (grpolab/agents/turns.py): the cached runner samples the
same episodes as the reference runner that re-reads every episode's whole sequence each turn -- same tokens, same
loss mask, logprobs within float32 rounding -- greedy and seeded, for episodes of 1, 2 and 4 turns in one batch;
and a turn after the first feeds the model only its new tokens."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import grpolab.agents.episode as episode_module
from grpolab.agents.env import AgentEnv, EpisodeLimits
from grpolab.agents.episode import EpisodeRunner
from grpolab.models.load import load_causal_lm, load_tokenizer
from grpolab.rollout.base import SamplingParams
from grpolab.rollout.grpolab_engine import eos_ids
from grpolab.tasks.base import Problem

pytestmark = pytest.mark.usefixtures("one_thread")
OBSERVATION = "Go on: 12345 apples."


class Endless(AgentEnv):
    """Never done: every turn without a tool call is answered with the same observation."""

    def reset(self, problem, rng):
        return problem.question

    def step(self, action):
        return OBSERVATION, False

    def reward(self):
        return 0.0


@pytest.fixture(autouse=True)
def endless(monkeypatch):
    monkeypatch.setattr(episode_module, "load_env", lambda ref: Endless)


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    return load_causal_lm(tiny_model_dir, "float32"), load_tokenizer(tiny_model_dir)


def problem(i: int, turns: int) -> Problem:
    """Prompts of different lengths (the batch is left-padded and the rows feed different numbers of tokens)."""
    limits = dataclasses.asdict(
        EpisodeLimits(max_turns=turns, max_turn_tokens=12, max_total_tokens=300, time_limit_s=2.0)
    )
    return Problem(
        uid=f"t/{i}",
        question="Count the apples. " * (i + 1),
        answer="0",
        data={"kind": "agent", "env": "endless", "limits": limits},
    )


def runner(model_and_tokenizer, reuse_cache: bool) -> EpisodeRunner:
    """Tokens with an even id end a turn too, so the random model's turns end on their own, greedy or sampled."""
    model, tok = model_and_tokenizer
    stops = sorted(set(eos_ids(model, tok) + list(range(0, len(tok), 2))))
    return EpisodeRunner(model, tok, stops, reuse_cache=reuse_cache)


@pytest.mark.parametrize(
    "params, seeds",
    [
        (SamplingParams(group_size=2, greedy=True), None),
        (SamplingParams(group_size=2, temperature=1.0), [1, 2, 3, 4]),
        (SamplingParams(group_size=2, temperature=0.8, top_k=50), [5, 6, 7, 8]),  # truncated: two logprob streams
    ],
)
def test_the_cached_runner_samples_the_episodes_of_the_rereading_runner(model_and_tokenizer, params, seeds):
    problems = [problem(i, t) for i, t in enumerate([1, 2, 4, 4])]
    ref = runner(model_and_tokenizer, False).run(problems, 2, params, seeds=seeds)
    got = runner(model_and_tokenizer, True).run(problems, 2, params, seeds=seeds)
    turns = [r.turns for r in ref.results]
    assert turns == ([1, 2, 4, 4] if params.greedy else [1, 1, 2, 2, 4, 4, 4, 4])  # every length was exercised
    assert [dataclasses.asdict(r) for r in got.results] == [dataclasses.asdict(r) for r in ref.results]
    a, b = ref.rollout, got.rollout
    for name in ("completion_ids", "completion_mask", "loss_mask", "prompt_ids", "truncated"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    torch.testing.assert_close(b.sampler_logprobs, a.sampler_logprobs, atol=1e-5, rtol=0)
    assert (a.sampler_logprobs_untruncated is None) == (b.sampler_logprobs_untruncated is None) == (params.top_k == 0)
    if params.top_k:
        torch.testing.assert_close(b.sampler_logprobs_untruncated, a.sampler_logprobs_untruncated, atol=1e-5, rtol=0)


def test_a_turn_after_the_first_feeds_only_the_stop_token_and_the_observation(model_and_tokenizer):
    model, _ = model_and_tokenizer
    widths: list[int] = []

    def record(module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[1] > 1:  # a prefill, not a one-token decode step
            widths.append(ids.shape[1])

    r = runner(model_and_tokenizer, True)
    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        out = r.run([problem(0, 3)], 1, SamplingParams(group_size=1, temperature=1.0), seeds=[11])
    finally:
        handle.remove()
    assert out.results[0].turns == 3
    ids, loss = out.rollout.completion_ids[0].tolist(), out.rollout.loss_mask[0].tolist()
    turn_ends = [ids[t] for t in range(len(ids) - 1) if loss[t] == 1 and loss[t + 1] == 0]  # each turn's stop token
    observations = [r.observation_ids(OBSERVATION, "user", ended_with=e) for e in turn_ends]
    prompt = int(out.rollout.prompt_mask[0].sum())
    assert widths == [prompt] + [1 + len(o) for o in observations]
    observation = observations[0]
    # the reference re-reads everything: its second prefill is the prompt, the first turn and the observation
    ref_widths: list[int] = []
    handle = model.register_forward_pre_hook(
        lambda m, a, k: ref_widths.append(k["input_ids"].shape[1]) if k["input_ids"].shape[1] > 1 else None,
        with_kwargs=True,
    )
    try:
        runner(model_and_tokenizer, False).run(
            [problem(0, 3)], 1, SamplingParams(group_size=1, temperature=1.0), seeds=[11]
        )
    finally:
        handle.remove()
    assert ref_widths[0] == prompt and ref_widths[1] > prompt + len(observation)
