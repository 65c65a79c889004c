"""Agent episodes with the tiny random model: token-in / token-out, the loss mask, bounds, contained failures, the
training pass equal to the sampler, and gradients that flow only through the model's tokens."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest
import torch

import grpolab.agents.episode as episode_module
from grpolab.agents.env import AgentEnv, EpisodeLimits
from grpolab.agents.episode import EpisodeRunner
from grpolab.agents.tools import Tool, calculate
from grpolab.config import from_dict
from grpolab.models.load import load_causal_lm, load_tokenizer
from grpolab.rollout.base import SamplingParams
from grpolab.rollout.decode import Decoded
from grpolab.rollout.grpolab_engine import eos_ids
from grpolab.tasks.base import Problem
from grpolab.training.forward import completion_logprobs
from grpolab.training.update import PolicyUpdater, UpdateBatch

pytestmark = pytest.mark.usefixtures("one_thread")


def _hang(argument: str) -> str:
    while True:
        time.sleep(0.05)


class Chatty(AgentEnv):
    """Never done by itself: every turn gets the same observation; reward = turns seen."""

    tools = [Tool("calculator", "calculator(expression)", calculate), Tool("hang", "hangs", _hang)]

    def reset(self, problem, rng):
        self.turns = 0
        return problem.question

    def step(self, action):
        self.turns += 1
        return OBSERVATION["text"], False

    def reward(self):
        return float(self.turns)


class Raises(Chatty):
    def step(self, action):
        raise RuntimeError("env bug")


class Garbage(Chatty):
    def step(self, action):
        return "not a tuple"


class Hangs(Chatty):
    def step(self, action):
        time.sleep(3)
        return "", True


OBSERVATION = {"text": "Go on: 12345 apples."}
ENVS = {"chatty": Chatty, "raises": Raises, "garbage": Garbage, "hangs": Hangs}


@pytest.fixture(autouse=True)
def envs(monkeypatch):
    monkeypatch.setattr(episode_module, "load_env", lambda ref: ENVS[ref])


def problem(env: str = "chatty", **limits) -> Problem:
    lim = dataclasses.asdict(
        EpisodeLimits(**{"max_turns": 3, "max_turn_tokens": 8, "max_total_tokens": 200, "time_limit_s": 1.0, **limits})
    )
    return Problem(
        uid=f"t/{env}", question="Count the apples.", answer="0", data={"kind": "agent", "env": env, "limits": lim}
    )


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    return load_causal_lm(tiny_model_dir, "float32"), load_tokenizer(tiny_model_dir)


def runner(model_and_tokenizer, stop_every: int = 3) -> EpisodeRunner:
    """stop_every: the tokens with id % stop_every == 0 end a turn (a random model then ends turns early and often);
    0 = only the real end-of-turn token (the random model practically never samples it)."""
    model, tok = model_and_tokenizer
    stops = eos_ids(model, tok) + ([i for i in range(len(tok)) if i % stop_every == 0] if stop_every else [])
    return EpisodeRunner(model, tok, sorted(set(stops)))


PARAMS = SamplingParams(group_size=2, temperature=1.0)


def test_model_tokens_are_exactly_the_sampled_ids_over_three_turns(model_and_tokenizer, monkeypatch):
    r = runner(model_and_tokenizer, stop_every=5)
    model, tok = model_and_tokenizer
    sampled: list[list[list[int]]] = []
    real = episode_module.decode_turn

    def recording(*args, **kwargs):
        d, caches = real(*args, **kwargs)
        sampled.append([d.tokens[i, : int(d.mask[i].sum())].tolist() for i in range(d.tokens.shape[0])])
        return d, caches

    monkeypatch.setattr(episode_module, "decode_turn", recording)
    out = r.run([problem(max_turn_tokens=30)], 2, PARAMS, seeds=[7])
    res, ro = out.results[0], out.rollout
    assert res.turns == 3 and res.ended_by == "max_turns", res
    turns = [sampled[t][0] for t in range(3)]
    ids, loss = ro.completion_ids[0], ro.loss_mask[0]
    assert ids[loss.bool()].tolist() == [t for turn in turns for t in turn]  # byte for byte, in order
    # the observations are the template's rendering of the new message, once each, between the turns
    obs = r.observation_ids(OBSERVATION["text"], "user")
    n0, n1 = len(turns[0]), len(turns[1])
    assert ids[n0 : n0 + len(obs)].tolist() == obs and loss[n0 : n0 + len(obs)].sum() == 0
    assert ids[n0 + len(obs) + n1 : n0 + 2 * len(obs) + n1].tolist() == obs
    assert ro.completion_mask[0].sum() == len(turns[0]) + len(turns[1]) + len(turns[2]) + 2 * len(obs)
    # what a re-rendering and re-tokenizing of the history would have trained on instead: different ids
    history = tok.apply_chat_template(
        [{"role": "user", "content": "Count the apples."}]
        + [
            m
            for t in turns[:2]
            for m in (
                {"role": "assistant", "content": tok.decode(t, skip_special_tokens=True)},
                {"role": "user", "content": OBSERVATION["text"]},
            )
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    retokenized = tok(history, add_special_tokens=False)["input_ids"]
    ours = ro.prompt_ids[0][ro.prompt_mask[0].bool()].tolist() + ids[: n0 + n1 + 2 * len(obs)].tolist()
    assert retokenized != ours
    assert ro.sampler_logprobs[0][~loss.bool()][: 2 * len(obs)].abs().sum() == 0  # env tokens: logprob 0


@pytest.mark.parametrize(
    "bound, limits, expect",
    [
        ("max_turns", {"max_turns": 2, "max_turn_tokens": 40}, lambda r, n: r.turns == 2),
        ("max_turn_tokens", {"max_turn_tokens": 5}, lambda r, n: r.model_tokens == 5 and r.turns == 1),
        ("max_total_tokens", {"max_turn_tokens": 50, "max_total_tokens": 23}, lambda r, n: n == 23),
    ],
)
def test_each_bound_ends_the_episode_exactly_at_its_limit(model_and_tokenizer, bound, limits, expect):
    stop_every = 2 if bound == "max_turns" else 0  # max_turns: turns that end on their own; else: never
    out = runner(model_and_tokenizer, stop_every).run([problem(**limits)], 2, PARAMS, seeds=[1])
    for i, res in enumerate(out.results):
        n = int(out.rollout.completion_mask[i].sum())
        assert res.ended_by == bound and expect(res, n), (res, n)
        assert n <= limits.get("max_total_tokens", 200)
        assert out.rollout.truncated[i]


def test_failures_end_only_their_episode_as_invalid_with_a_reason(model_and_tokenizer):
    r = runner(model_and_tokenizer, stop_every=2)
    out = r.run(
        [problem("raises"), problem("garbage"), problem("hangs"), problem("chatty")], 2, PARAMS, seeds=[1, 2, 3, 4]
    )
    reasons = [res.error for res in out.results]
    assert all(res.invalid and math.isnan(res.reward) for res in out.results[:6])
    assert "RuntimeError: env bug" in reasons[0] and "expected (observation: str, done: bool)" in reasons[2]
    assert "time limit" in reasons[4]
    assert out.results[6].ended_by == "max_turns" and out.results[6].reward == 3.0


def test_tool_calls_malformed_calls_and_a_hanging_tool(model_and_tokenizer):
    r = runner(model_and_tokenizer)
    ep, first = r.start(problem(), 0, 0, True)
    assert "calculator(expression)" in first and first.endswith("Count the apples.")
    r.respond(ep, "<tool>calculator(6*7)</tool>")
    assert r.tokenizer.decode(ep.tokens).count("calculator result: 42") == 1 and sum(ep.loss) == 0
    r.respond(ep, "<tool>calculator 6*7</tool>")
    assert (
        ep.result.tool_calls == 2 and ep.result.tool_errors == 1 and "Error: malformed" in r.tokenizer.decode(ep.tokens)
    )
    t0 = time.perf_counter()
    r.respond(ep, "<tool>hang(x)</tool>")
    assert time.perf_counter() - t0 < 3.0
    assert ep.result.invalid and "killed" in ep.result.error


def test_training_pass_logprobs_equal_the_samplers_over_two_turns(model_and_tokenizer):
    """Teacher forcing: the policy's logprobs of the episode's model tokens, in the training pass (plain, shared
    prompt, packed), equal those the sampler recorded while it generated them turn by turn."""
    model, _ = model_and_tokenizer
    out = runner(model_and_tokenizer, stop_every=4).run(
        [problem(max_turns=2, max_turn_tokens=20)] * 2, 2, PARAMS, seeds=[3, 4]
    )
    assert any(res.turns == 2 and res.ended_by == "max_turns" for res in out.results)
    ro, rows = out.rollout, torch.arange(4)
    m = ro.loss_mask.bool()
    for share, pack in ((False, False), (True, False), (True, True)):
        fo = completion_logprobs(model, ro, rows, 1.0, share_prompt=share, pack=pack)
        lc = fo.logp.shape[1]
        torch.testing.assert_close(fo.logp[m[:, :lc]], ro.sampler_logprobs[:, :lc][m[:, :lc]], atol=2e-5, rtol=0)


def _updater(model, **train) -> PolicyUpdater:
    cfg = from_dict(
        {
            "algorithm": {"beta": 0.0},
            "rollout": {"group_size": 2},
            "train": {"micro_batch_size": 8, **train},
            "speed": {"share_prompt": False, "pack_completions": False},
        }
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    return PolicyUpdater(cfg, model, None, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0))


def _loss_and_logit_grads(model, ro, advantages):
    """The update's loss of one minibatch and the gradient of that loss w.r.t. the logits of every completion slot."""
    upd = _updater(model)
    grads = {}

    def keep(module, inputs, output):
        output.retain_grad()
        grads["logits"] = output

    handle = model.lm_head.register_forward_hook(keep)
    sums = {}
    from collections import defaultdict

    sums = defaultdict(float)
    try:
        mask = upd.loss_mask(ro, torch.ones(len(ro), dtype=torch.bool))
        upd.minibatch(UpdateBatch(ro, advantages, mask, None, None), torch.arange(len(ro)), sums, None)
    finally:
        handle.remove()
    return sums["loss/total"], grads["logits"].grad


def test_the_loss_gradient_is_exactly_zero_on_environment_token_logits(model_and_tokenizer):
    model, _ = model_and_tokenizer
    out = runner(model_and_tokenizer, stop_every=3).run(
        [problem(max_turns=2, max_turn_tokens=12)], 2, PARAMS, seeds=[5]
    )
    ro = out.rollout
    loss, grad = _loss_and_logit_grads(model, ro, torch.tensor([1.0, -1.0]))
    # plain pass: logits[:, t] predicts completion token t (the extra last slot predicts nothing)
    lc = grad.shape[1] - 1
    per_slot = grad[:, :lc].abs().sum(-1)
    env = (ro.completion_mask[:, :lc] == 1) & (ro.loss_mask[:, :lc] == 0)
    assert env.any() and (per_slot[env] == 0).all()  # exactly zero
    assert (per_slot[ro.loss_mask[:, :lc].bool()] > 0).all()
    model.zero_grad(set_to_none=True)


def _grad_vector(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten().double() for p in model.parameters() if p.grad is not None])


def test_an_observation_changes_the_loss_only_through_the_model_tokens_context(model_and_tokenizer):
    """The same episodes with other observation tokens: the update's gradient equals, for both, the gradient of a
    reference loss built from the model tokens' logprobs alone -- -(1/B) sum_i A_i (1/|o_i|) sum_{t model} logp_t --
    so the observation enters only as context; the model tokens before it keep their logprobs, those after change."""
    model, _ = model_and_tokenizer
    out = runner(model_and_tokenizer, stop_every=3).run(
        [problem(max_turns=2, max_turn_tokens=12)], 2, PARAMS, seeds=[6]
    )
    a = out.rollout
    assert all(res.turns == 2 for res in out.results)
    b = dataclasses.replace(a, completion_ids=a.completion_ids.clone())
    env = (a.completion_mask == 1) & (a.loss_mask == 0)
    b.completion_ids[env] = (a.completion_ids[env] + 1000) % 40000
    adv = torch.tensor([1.0, -1.0])
    grads, logps = [], []
    for ro in (a, b):
        model.zero_grad(set_to_none=True)
        _loss_and_logit_grads(model, ro, adv)
        update_grad = _grad_vector(model)
        model.zero_grad(set_to_none=True)
        logp = completion_logprobs(model, ro, torch.arange(2), 1.0, share_prompt=False, pack=False).logp
        m = ro.loss_mask[:, : logp.shape[1]].float()
        (-(adv * (logp * m).sum(-1) / m.sum(-1)).mean()).backward()
        torch.testing.assert_close(update_grad, _grad_vector(model), atol=1e-7, rtol=1e-5)
        grads.append(update_grad)
        logps.append(logp.detach())
        model.zero_grad(set_to_none=True)
    assert not torch.allclose(grads[0], grads[1])  # the observation is context: it does change the gradient
    first_env = int(env[0].nonzero()[0])
    assert torch.equal(logps[0][0, :first_env], logps[1][0, :first_env])  # before the observation: untouched
    after = a.loss_mask[0, : logps[0].shape[1]].bool().clone()
    after[:first_env] = False
    assert not torch.allclose(logps[0][0][after], logps[1][0][after])  # after it: a new context


NEWLINE_ENV = '''
from grpolab.agents.env import AgentEnv
from grpolab.tasks.base import Problem


class Newlines(AgentEnv):
    """Two turns; reward = the share of newlines in the model's turns (the tiny model earns it: tests/earnable.py)."""

    def reset(self, problem, rng):
        self.text = ""
        return problem.question

    def step(self, action):
        self.text += action
        return "Again.", False

    def reward(self):
        return self.text.count("\\n") / max(len(self.text), 1)

    @classmethod
    def problems(cls, split, n, seed, difficulty):
        return [Problem(uid=f"nl/{split}/{i}", question=f"Write newlines {i}.", answer="") for i in range(n)]
'''


def test_exact_resume_mid_run_with_agent_episodes(tiny_model_dir, tmp_path, monkeypatch):
    """3 steps in one go == 2 steps, then a resume for the third: the same metrics and bitwise the same weights."""
    import json

    from safetensors.torch import load_file

    from grpolab.config import from_dict as build
    from grpolab.models import checkpoint as ckpt
    from grpolab.runs import resume_run, start_run

    monkeypatch.setattr(episode_module, "load_env", __import__("grpolab.agents.env", fromlist=["load_env"]).load_env)
    # turns that end on their own: tokens with id % 7 == 0 stop a turn too (the newline, 198, does not)
    monkeypatch.setattr(
        EpisodeRunner,
        "from_engine",
        classmethod(
            lambda cls, engine: EpisodeRunner(
                engine.model, engine.tokenizer, sorted(set(engine.stop_ids) | set(range(0, len(engine.tokenizer), 7)))
            )
        ),
    )
    (tmp_path / "nl.py").write_text(NEWLINE_ENV)

    def config(name: str, steps: int) -> dict:
        return {
            "model": {"name": tiny_model_dir},
            "task": {
                "name": "agent",
                "options": {
                    "env": f"{tmp_path / 'nl.py'}:Newlines",
                    "num_train": 8,
                    "num_test": 2,
                    "max_turns": 2,
                    "max_turn_tokens": 6,
                    "max_total_tokens": 60,
                },
            },
            "reward": {"weights": {"env": 1.0}},
            "rollout": {"group_size": 4, "top_k": 2, "dtype": "float32"},
            "algorithm": {"beta": 0.0},
            "train": {
                "steps": steps,
                "prompts_per_step": 2,
                "micro_batch_size": 8,
                "lr": 5e-3,
                "precision": "fp32",
                "save_every": 1,
            },
            "eval": {"every_steps": 0},
            "run": {"output_dir": str(tmp_path), "name": name},
        }

    whole, _ = start_run(build(config("whole", 3)))
    whole.fit()
    cut, _ = start_run(build(config("cut", 2)))
    cut.fit()
    resumed, path = resume_run(tmp_path / "cut", ["train.steps=3"], allow_changes=True)
    assert path is not None and path.name == "step-2"
    resumed.fit()
    volatile = ("time/", "throughput/", "memory/")
    ra, rb = (
        [
            {k: v for k, v in json.loads(line).items() if not k.startswith(volatile)}
            for line in (tmp_path / n / "metrics.jsonl").read_text().splitlines()
        ]
        for n in ("whole", "cut")
    )
    assert [r["step"] for r in rb] == [1, 2, 3] and ra == rb
    assert any(r["reward/std"] > 0 and r["agent/turns_mean"] > 1 for r in ra)  # the episodes mattered
    wa = load_file(ckpt.latest_checkpoint(tmp_path / "whole") / "model.safetensors")
    wb = load_file(ckpt.latest_checkpoint(tmp_path / "cut") / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("stop_ids", [[0, 2], [2, 0]])
def test_the_observation_follows_the_end_of_turn_token_the_model_sampled(model_and_tokenizer, monkeypatch, stop_ids):
    """A tokenizer with two end ids (SmolLM2's <|endoftext|> = 0 and <|im_end|> = 2, like Qwen2.5's pair): the model
    ends its turn with <|im_end|>; the episode is then exactly the chat template's rendering of the conversation --
    the observation does not open with a second <|im_end|>, whatever the order of the stop ids."""
    model, tok = model_and_tokenizer
    assert tok.convert_ids_to_tokens([0, 2]) == ["<|endoftext|>", "<|im_end|>"]
    answer = tok("Four.", add_special_tokens=False)["input_ids"]
    turn = answer + [2]  # the model's turn, ended by the template's own end-of-turn token

    def scripted(model, ids, mask, *args, **kwargs):
        n = ids.shape[0]
        return Decoded(
            tokens=torch.tensor([turn] * n),
            mask=torch.ones(n, len(turn), dtype=torch.long),
            logprobs=torch.zeros(n, len(turn)),
            truncated=torch.zeros(n, dtype=torch.bool),
        )

    monkeypatch.setattr(episode_module, "decode_groups", scripted)
    out = EpisodeRunner(model, tok, stop_ids, reuse_cache=False).run(
        [problem(max_turns=2, max_turn_tokens=8)], 1, PARAMS, seeds=[0]
    )
    assert out.results[0].ended_by == "max_turns"
    conversation = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "Four."},
        {"role": "user", "content": OBSERVATION["text"]},
    ]
    rendered = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    after_prompt = rendered[
        rendered.index("q<|im_end|>\n<|im_start|>assistant\n") + len("q<|im_end|>\n<|im_start|>assistant\n") :
    ]
    ids = out.rollout.completion_ids[0][out.rollout.completion_mask[0].bool()].tolist()
    assert tok.decode(ids) == after_prompt + "Four.<|im_end|>"
    assert ids[len(turn)] != 2  # the observation's first token
