"""Expert episodes of an ``openai_agent`` task: the environment's scripted solver plays the model's part behind the
run's OpenAI-compatible endpoint, and the agent itself -- unmodified -- drives the episode, so a supervised warm start
trains on exactly the token sequences GRPO will sample through that agent (docs/agents.md, "Supervised warm start").

How: ``ExpertEngine`` is a rollout engine (grpolab.rollout.base.RolloutEngine) whose ``generate`` does not sample.
For each prompt it finds the endpoint session the prompt continues (its recorded ids equal the prompt), reads that
session's messages and tools (what the agent sent), and answers with the solver's next turn written in the model's
own tool-call format:

- the solver (the environment's ``expert(problem, turns)``, grpolab.agents.expert) writes grpolab's native form,
  ``<tool>name(argument)</tool>`` or an answer; ``turns`` pairs each earlier assistant message with the contents of
  the tool messages after it (the observations the agent reported);
- a call becomes the OpenAI message ``{"tool_calls": [{"name": name, "arguments": {P: argument}}]}``, P being the
  one parameter the agent's schema of that tool declares (a schema of another shape is refused, naming the tool);
- the turn's text is what the chat template renders for that message after the generation prompt (Hermes:
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``), tokenized once and closed with the
  template's end-of-turn token, as if the model had sampled those ids.

The endpoint then parses the turn as it parses the model's, the agent runs its tool, and the session records the
episode: prompt, turns (loss mask 1) and the rendered tool results (mask 0), token for token.
"""

from __future__ import annotations

import json
import secrets

import torch

from ..agents.chat_tools import template_messages
from ..agents.env import load_env
from ..agents.tools import parse_tool_call
from ..errors import ConfigError
from ..rollout.base import Rollout
from ..tasks.base import Problem


def solver_turns(messages: list[dict]) -> list[tuple[str, str]]:
    """(assistant turn, observation) per assistant message: its content or calls as text, and the contents of the
    tool (or user) messages after it joined by newlines.

    >>> solver_turns([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
    ...               {"role": "tool", "content": "x"}, {"role": "tool", "content": "y"}])
    [('a', 'x\\ny')]
    """
    turns: list[tuple[str, list[str]]] = []
    for m in messages:
        if m["role"] == "assistant":
            turns.append((m.get("content") or json.dumps(m.get("tool_calls") or []), []))
        elif turns and m["role"] in ("tool", "user"):
            turns[-1][1].append(m.get("content") or "")
    return [(text, "\n".join(obs)) for text, obs in turns]


def only_parameter(tools: list[dict], name: str) -> str:
    """The single parameter the agent's schema of tool `name` declares (its required one when several are listed)."""
    for tool in tools or []:
        fn = tool["function"]
        if fn["name"] != name:
            continue
        params = fn.get("parameters") or {}
        names = list(params.get("required") or params.get("properties") or [])
        if len(names) != 1:
            raise ConfigError(
                f"agent sft: the agent's tool {name!r} declares parameters {names}; the expert's call "
                f"{name}(argument) needs a tool with exactly one (required) parameter"
            )
        return names[0]
    known = [t["function"]["name"] for t in tools or []]
    raise ConfigError(f"agent sft: the expert calls {name!r}, but the agent offers only the tools {known}")


class ExpertEngine:
    """The scripted solver as a rollout engine behind an endpoint (module docstring). ``attach(endpoint)`` before
    the first ``generate``; ``problems``: the states the agents play (found by their question in the agent's first
    user message)."""

    version, last_sync = "", {}

    def __init__(self, tokenizer, stop_ids: list[int], eot: int, problems: list[Problem]):
        self.tokenizer, self.stop_ids, self.eot = tokenizer, list(stop_ids), eot
        self.problems = problems
        self.endpoint = None

    def attach(self, endpoint) -> None:
        self.endpoint = endpoint

    def _session(self, prompt: list[int]):
        for session in self.endpoint.sessions.live():
            if session.episode.prompt + session.episode.tokens == prompt:
                return session
        raise RuntimeError("expert engine: no endpoint session continues this prompt")

    def _problem(self, messages: list[dict]) -> Problem:
        users = [m.get("content") or "" for m in messages if m["role"] == "user"]
        for p in self.problems:
            if users and p.question in users[0]:
                return p
        raise ConfigError(
            "agent sft: the agent's first user message does not contain the task's question; the expert cannot "
            "tell which state it plays"
        )

    def turn_ids(self, messages: list[dict], tools: list[dict]) -> list[int]:
        """The solver's next turn after `messages`, as the ids the model would sample (module docstring)."""
        problem = self._problem(messages)
        env = load_env(problem.data["env"])
        text = env.expert(problem, solver_turns(messages))
        call = parse_tool_call(text, {t.name for t in env.tools})
        if call is None or call.error:
            return self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.eot]
        args = json.dumps({only_parameter(tools, call.name): call.argument})
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_" + secrets.token_hex(4),
                    "type": "function",
                    "function": {"name": call.name, "arguments": args},
                }
            ],
        }
        render = lambda ms, gen: self.tokenizer.apply_chat_template(  # noqa: E731
            template_messages(ms),
            tools=tools or None,
            chat_template=self.endpoint.template,
            add_generation_prompt=gen,
            tokenize=False,
        )
        head, full = render(messages, True), render(messages + [message], False)
        end = self.tokenizer.decode([self.eot])
        if not full.startswith(head) or end not in full[len(head) :]:
            raise ConfigError(
                "agent sft: the chat template does not render an assistant tool call after its "
                "generation prompt, closed by its end-of-turn token"
            )
        turn = full[len(head) :]
        turn = turn[: turn.rindex(end)]
        return self.tokenizer(turn, add_special_tokens=False)["input_ids"] + [self.eot]

    def generate(self, prompts: list[list[int]], params, seeds=None) -> Rollout:
        """One turn per prompt and per sample (all alike: the solver is deterministic), logprob 0 (not sampled)."""
        rows = []
        for p in prompts:
            s = self._session(list(p))
            ids = self.turn_ids(s.messages, s.tools or [])
            rows += [ids[: params.max_new_tokens]] * (1 if params.greedy else params.group_size)
        width, pad = max(len(r) for r in rows), self.tokenizer.pad_token_id
        n = len(rows)
        return Rollout(
            prompt_ids=torch.zeros(n, 1, dtype=torch.long),
            prompt_mask=torch.ones(n, 1, dtype=torch.long),
            completion_ids=torch.tensor([r + [pad] * (width - len(r)) for r in rows]),
            completion_mask=torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
            sampler_logprobs=torch.zeros(n, width),
            truncated=torch.tensor([r[-1] != self.eot for r in rows]),
            group=torch.arange(len(prompts)).repeat_interleave(n // len(prompts)),
            texts=[self.tokenizer.decode(r, skip_special_tokens=True) for r in rows],
        )

    def sync_weights(self, policy) -> None:
        pass

    def close(self) -> None:
        pass


def openai_expert_data(tokenizer, stop_ids: list[int], eot: int, problems: list[Problem]) -> tuple[list, list]:
    """(solved, unsolved) expert episodes (grpolab.agents.expert.ExpertEpisode), one per problem: the task's agent
    plays each against an endpoint whose engine is the solver, judged by the environment."""
    from ..agents.expert import ExpertEpisode
    from ..agents.openai_agent import OpenAIAgentRunner
    from ..rollout.base import SamplingParams

    engine = ExpertEngine(tokenizer, stop_ids, eot, problems)
    runner = OpenAIAgentRunner(engine, tokenizer, "expert", stop_ids, held_out=True)
    params = SamplingParams(group_size=1, greedy=True)
    try:
        engine.attach(runner.start(problems[0].data["openai"], params).endpoint)
        episodes = runner.run(problems, 1, params)
    finally:
        runner.close()
    solved, unsolved = [], []
    for i, (problem, result) in enumerate(zip(problems, episodes.results)):
        r = episodes.rollout
        prompt = r.prompt_ids[i][r.prompt_mask[i].bool()].tolist()
        keep = r.completion_mask[i].bool()
        ep = ExpertEpisode(
            problem, prompt, r.completion_ids[i][keep].tolist(), r.trained_mask()[i][keep].tolist(), result
        )
        (solved if result.reward >= 1.0 else unsolved).append(ep)
    return solved, unsolved
