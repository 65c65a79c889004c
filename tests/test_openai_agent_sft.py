"""The supervised warm start of an ``openai_agent`` task (grpolab/baselines/openai_expert.py): the environment's
solver plays the model's part behind the endpoint while the unmodified example agent drives the episode, so the
expert episodes are the sequences GRPO samples through that agent -- the chat template's rendering of the agent's
final transcript (its own tool schema, Hermes calls), the loss on the assistant turns alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import grpolab.agents  # noqa: F401 -- registers the built-in environments
from grpolab.agents.chat_tools import chat_template, template_messages
from grpolab.agents.openai_agent import OpenAIAgentTask
from grpolab.baselines.agent_sft import AgentSFTSettings, run_agent_sft
from grpolab.baselines.openai_expert import ExpertEngine, only_parameter, openai_expert_data
from grpolab.errors import ConfigError
from grpolab.models.load import load_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
LOOKUP_AGENT = f"{ROOT / 'examples' / 'openai_lookup_agent.py'}:solve"
OPTIONS = {
    "env": "lookup",
    "agent": LOOKUP_AGENT,
    "difficulty": 1,
    "num_train": 6,
    "num_test": 3,
    "max_turns": 5,
    "max_turn_tokens": 48,
    "max_total_tokens": 400,
    "agent_time_limit_s": 60.0,
}


def _transcript(problem, agent) -> list[dict]:
    """The messages the example agent ends with when the model plays the expert (built here by hand)."""
    from grpolab.agents.lookup import chain

    boxes, code = chain(problem.data["start"])
    messages: list[dict] = [{"role": "user", "content": problem.question}]
    for label in boxes:
        call = {"name": "open", "arguments": json.dumps({"label": label})}
        messages.append({"role": "assistant", "content": None, "tool_calls": [{"function": call}]})
        messages.append({"role": "tool", "content": agent.open_tool(label)})
    messages.append({"role": "assistant", "content": f"The code is {code}."})
    return messages


@pytest.fixture()
def examples_agent():
    import importlib.util

    spec = importlib.util.spec_from_file_location("lookup_agent", ROOT / "examples" / "openai_lookup_agent.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_expert_episodes_are_the_template_rendering_of_the_agents_transcript(tiny_model_dir, examples_agent):
    """Every state solved with one call per box; prompt + episode equal, token for token, the chat template's
    rendering of the transcript the agent ends with (its TOOLS in the system message, Hermes calls); the loss mask
    covers the assistant turns alone, each closed by <|im_end|>."""
    tok = load_tokenizer(tiny_model_dir)
    problems = OpenAIAgentTask(**OPTIONS).problems("train")
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    solved, unsolved = openai_expert_data(tok, [eot], eot, problems)
    assert len(solved) == 6 and not unsolved
    template = chat_template(tok)
    for ep in solved:
        messages = _transcript(ep.problem, examples_agent)
        text = tok.apply_chat_template(
            template_messages(messages), tools=examples_agent.TOOLS, chat_template=template, tokenize=False
        )
        assert text.endswith("<|im_end|>\n")  # the episode ends at the model's end of turn, before the newline
        assert ep.prompt + ep.tokens == tok(text[:-1], add_special_tokens=False)["input_ids"]
        assert ep.result.tool_calls == ep.problem.data["expert_calls"] and ep.result.tool_errors == 0
        trained = [t for t, m in zip(ep.tokens, ep.loss_mask) if m]
        turns = tok.decode(trained).split("<|im_end|>")[:-1]
        assert len(turns) == ep.problem.data["expert_calls"] + 1
        assert all(t.startswith('<tool_call>\n{"name": "open"') for t in turns[:-1])
        assert turns[-1] == f"The code is {ep.problem.answer}."
        untrained = tok.decode([t for t, m in zip(ep.tokens, ep.loss_mask) if not m])
        assert "<tool_response>" in untrained and "<tool_call>" not in untrained


def test_a_warm_start_through_the_agent_learns_its_episodes(tiny_model_dir, tmp_path):
    """The warm start of the openai_agent task: a checkpoint whose manifest names the task, the expert's two calls
    per episode on average (hops 1-3), and a loss that fell on the agent's episodes."""
    out = tmp_path / "sft"
    m = run_agent_sft(
        tiny_model_dir, OPTIONS, AgentSFTSettings(steps=4, batch_size=3, lr=1e-2), out, task="openai_agent"
    )
    assert m["num_examples"] == 6 and m["unsolved_by_expert"] == 0 and m["expert"]["tool_calls_mean"] == 2.0
    assert m["config"]["task"]["name"] == "openai_agent" and m["loss_after"] < m["loss_before"] - 1.0
    assert (out / "model.safetensors").exists()


def test_a_tool_the_expert_cannot_call_is_refused_naming_it():
    two = [
        {
            "type": "function",
            "function": {
                "name": "open",
                "parameters": {
                    "type": "object",
                    "properties": {"label": {}, "shelf": {}},
                    "required": ["label", "shelf"],
                },
            },
        }
    ]
    with pytest.raises(ConfigError, match="'open' declares parameters \\['label', 'shelf'\\]"):
        only_parameter(two, "open")
    with pytest.raises(ConfigError, match="expert calls 'open', but the agent offers only the tools \\['peek'\\]"):
        only_parameter([{"type": "function", "function": {"name": "peek"}}], "open")
    one = [{"type": "function", "function": {"name": "open", "parameters": {"properties": {"label": {}}}}}]
    assert only_parameter(one, "open") == "label"


def test_an_agent_that_hides_the_question_is_refused(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    problems = OpenAIAgentTask(**OPTIONS).problems("train")
    engine = ExpertEngine(tok, [0], 0, problems)
    with pytest.raises(ConfigError, match="first user message does not contain the task's question"):
        engine._problem([{"role": "user", "content": "something else"}])
