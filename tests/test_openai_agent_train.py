"""The full path of an agent written against the `openai` package: run -> endpoint -> agent -> episodes -> GRPO
update (task ``openai_agent``, grpolab.agents.openai_agent), with the unmodified example agent
examples/openai_calc_agent.py, the tiny random model and a reward it can earn (tests/earnable.py)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import earnable
import pytest
import torch
from openai_scripted import ScriptedEngine

from grpolab.agents.openai_agent import OpenAIAgentRunner, OpenAIAgentTask
from grpolab.errors import ConfigError
from grpolab.rollout.base import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = f"{ROOT / 'examples' / 'openai_calc_agent.py'}:solve"
LOOKUP = f"{ROOT / 'examples' / 'openai_lookup_agent.py'}:solve"


@pytest.mark.parametrize(("env", "agent"), [("calc", EXAMPLE), ("lookup", LOOKUP)])
def test_the_example_agent_trains_through_the_endpoint(env, agent, tiny_model_dir, tmp_path, one_thread):
    """Two GRPO steps of 2 initial states x 4 agents, for each example agent: every episode valid and played through
    the endpoint, rewards that differ within a group, and an update that moved the weights."""
    from safetensors.torch import load_file

    from grpolab.config import from_dict as build
    from grpolab.models import checkpoint as ckpt
    from grpolab.runs import start_run

    cfg = {
        "model": {"name": tiny_model_dir},
        "task": {
            "name": "openai_agent",
            "options": {
                "env": env,
                "agent": agent,
                "reward": earnable.REFERENCE,
                "num_train": 8,
                "num_test": 2,
                "max_turns": 3,
                "max_turn_tokens": earnable.LENGTH,
                "max_total_tokens": 64,
                "agent_time_limit_s": 60.0,
            },
        },
        "reward": {"weights": {"env": 1.0}},
        "rollout": {"group_size": 4, "top_k": 2, "dtype": "float32"},
        "algorithm": {"beta": 0.0},
        "train": {
            "steps": 2,
            "prompts_per_step": 2,
            "micro_batch_size": 8,
            "lr": 5e-3,
            "precision": "fp32",
            "save_every": 2,
        },
        "eval": {"every_steps": 0},
        "run": {"output_dir": str(tmp_path), "name": "oa"},
    }
    trainer, _ = start_run(build(cfg))
    before = {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}
    trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / "oa" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["reward/invalid_frac"] == 0 and r["agent/ended_by/invalid_frac"] == 0
        assert r["agent/turns_mean"] >= 1 and r["agent/model_tokens_mean"] > 0
    assert any(r["reward/std"] > 0 for r in rows)  # an earnable reward: non-zero advantages
    after = load_file(ckpt.latest_checkpoint(tmp_path / "oa") / "model.safetensors")
    assert any(not torch.equal(before[k].cpu(), after[k]) for k in after)
    server = trainer.collector.runner.server
    assert server is not None
    trainer.close()  # the run stops its own endpoint (its collector's runner), not a process-wide set
    assert trainer.collector.runner.server is None


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def tool_then_answer(prompt, k):
    """A scripted policy: call the calculator on the first turn, answer with the tool's result after it."""
    return (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>'
        if "<tool_response>" not in tool_then_answer.tok.decode(prompt)
        else "The answer is 5"
    )


def test_a_command_agent_its_tool_turns_and_the_environments_reward(tok, tmp_path):
    """The example as a command (OPENAI_* in its environment): the tool call is parsed in the Hermes format, the
    agent runs it, the episode gets the env's reward of the final answer; a failing command is an invalid episode."""
    tool_then_answer.tok = tok
    task = OpenAIAgentTask(
        "calc",
        command=f"{sys.executable} {ROOT / 'examples' / 'openai_calc_agent.py'}",
        num_train=4,
        max_turns=3,
        max_turn_tokens=64,
        max_total_tokens=400,
    )
    problems = task.problems("train")[:2]
    gold = [p.answer for p in problems]
    runner = OpenAIAgentRunner(ScriptedEngine(tok, tool_then_answer), tok, "policy")
    try:
        eps = runner.run(problems, 2, SamplingParams(group_size=2))
        for r, g in zip(eps.results, [gold[0], gold[0], gold[1], gold[1]]):
            assert r.ended_by == "done" and r.turns == 2 and r.tool_calls == 1 and r.final_text == "The answer is 5"
            assert r.reward == float(g == "5")
        mask = eps.rollout.loss_mask
        assert int(mask.sum()) == sum(r.model_tokens for r in eps.results)
        assert eps.rollout.completion_mask.sum() > mask.sum()  # the tool's result is attended to, not trained
        row, keep = eps.rollout.completion_ids[0], eps.rollout.completion_mask[0].bool()
        trained, seen = tok.decode(row[mask[0].bool()]), tok.decode(row[keep & ~mask[0].bool()])
        assert (
            "<tool_call>" in trained
            and trained.endswith("The answer is 5<|im_end|>")
            and "tool_response" not in trained
        )
        assert "<tool_response>\n5\n</tool_response>" in seen  # the agent ran the call; its result is in the episode
        bad = OpenAIAgentTask("calc", command=f"{sys.executable} -c 'import sys; sys.exit(3)'", num_train=4)
        eps = runner.run(bad.problems("train")[:1], 2, SamplingParams(group_size=2))
        assert all(r.invalid and math.isnan(r.reward) for r in eps.results)
        assert "no request" in eps.results[0].error or "exited 3" in eps.results[0].error
    finally:
        runner.close()


def test_task_options_are_checked():
    with pytest.raises(ConfigError, match="exactly one of agent"):
        OpenAIAgentTask("calc")
    with pytest.raises(ConfigError, match="max_concurrent"):
        OpenAIAgentTask("calc", command="true", max_concurrent=0)
    with pytest.raises(ConfigError, match="task.options.token"):
        OpenAIAgentTask("calc", command="true", host="0.0.0.0")
    with pytest.raises(ConfigError, match="task.options.reward"):
        OpenAIAgentTask("calc", command="true", reward="nowhere.py:fn")


def test_the_documented_config_builds_its_task():
    """The yaml of docs/agents.md "Agents through the OpenAI API" names options the task takes, and the example."""
    import re

    import yaml

    from grpolab.tasks import make_task

    text = (ROOT / "docs" / "agents.md").read_text().split("## Agents through the OpenAI API")[1]
    doc = yaml.safe_load(re.search(r"```yaml\n(.*?)```", text, re.S).group(1))
    options = dict(doc["task"]["options"], agent=str(ROOT / doc["task"]["options"]["agent"]))
    task = make_task(doc["task"]["name"], **options)
    assert isinstance(task, OpenAIAgentTask) and task.openai["agent"].endswith("openai_calc_agent.py:solve")
    assert task.problems("train")[0].data["kind"] == "openai_agent"


AGENTS = """
import time
from openai import OpenAI


def sleeper(question, base_url, api_key, model):
    time.sleep(30)


def chatty(question, base_url, api_key, model):  # asks until refused: the refusal raises out of it
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": question}]
    while True:
        reply = client.chat.completions.create(model=model, messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]


def reporter(question, base_url, api_key, model):
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}])
    return 0.25
"""


def test_time_limits_turn_bounds_and_reported_rewards(tok, tmp_path):
    """An agent past agent_time_limit_s: invalid, with the reason; one that keeps asking: ended by max_turns after
    exactly max_turns turns, valid even though it raised; a returned number is the reward of ``reward: reported``."""
    (tmp_path / "agents.py").write_text(AGENTS)
    runner = OpenAIAgentRunner(ScriptedEngine(tok, lambda p, k: "ok"), tok, "policy")

    def episodes(agent: str, **options):
        task = OpenAIAgentTask("calc", agent=f"{tmp_path / 'agents.py'}:{agent}", num_train=4, **options)
        return runner.run(task.problems("train")[:1], 2, SamplingParams(group_size=2)).results

    try:
        slow = episodes("sleeper", agent_time_limit_s=0.5)
        assert all(r.invalid and "agent_time_limit_s" in r.error for r in slow)
        chatty = episodes("chatty", max_turns=3)
        assert all(r.ended_by == "max_turns" and r.turns == 3 and r.reward == 0.0 for r in chatty)
        reported = episodes("reporter", reward="reported")
        assert all(r.ended_by == "done" and r.reward == 0.25 for r in reported)
    finally:
        runner.close()
