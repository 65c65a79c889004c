"""Multi-turn verifiers environments as grpolab agent episodes (docs/environments.md; loading, rows and the rubric:
grpolab.agents.verifiers_env).

The environment's ``Env.run(task, agents)`` runs unchanged on a private event loop per episode. ``agents`` has the one
seat the environment declares, played by the policy: ``seat.interaction(task)`` yields an Interaction whose
``turn(message)`` (a user turn; a bare ``turn()`` takes a prompted task's opening) pauses ``run`` -- the message (for
the opening, the row's prompt with its system prompt below it, as a single-turn prompt renders them) is the episode's
observation -- and resumes it with the model's next turn as the reply (a ``Segment`` of one assistant message).
Leaving the interaction scores the trace with the task's rubric (the library's ``Task.score``), as the library's own
interaction does when it closes; ``run`` may record more rewards after it; then ``Env.finalize`` runs.

- ``step(action)``: the reply; the next ``turn`` is the next observation; ``run`` returning is ``done``.
- ``reward()``: the trace's weighted sum sum_k w_k * s_k over every recorded reward. A grpolab bound (max_turns,
  tokens) that ends the episode first answers the pending turn with a ``terminated`` segment -- what the library's
  own limits return -- so ``run`` ends and scores as it would at its own limit.
- A raise in ``run``, ``finalize`` or the rubric, or a reward that did not score, makes the episode invalid with the
  reason (grpolab.agents.episode); so does a second seat asked for by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import random
from typing import Any

from ..tasks.base import Problem
from .env import AgentEnv, register_environment
from .verifiers_env import LoadedEnv, chat_message, load, make_trace, row_task, row_text, split_rows

TERMINATED = object()  # the reply that ends an exchange grpolab's bounds cut short


class _Exchange:
    """One episode of a multi-turn environment: its ``run`` on a private event loop, paused at every turn."""

    def __init__(self, loaded: LoadedEnv, task: Any):
        self.loaded, self.task = loaded, task
        self.trace = make_trace(task, [])
        self.loop = asyncio.new_event_loop()
        self.asked: asyncio.Future = self.loop.create_future()  # the next observation, set by turn()
        self.reply: asyncio.Future | None = None  # the model's reply turn() waits for
        self.over = False
        self.scored = False
        self.main = self.loop.create_task(self._run())

    async def _run(self) -> None:
        env, agents = self.loaded.env, _Agents(self)
        await env.setup(agents)
        await env.run(self.task, agents)
        if not self.scored:  # run() never opened an interaction
            raise RuntimeError(f"{type(env).__name__}.run() ran no agent")
        from verifiers.v1.episode import EnvInfo, Episode

        episode = Episode(env=EnvInfo(id=env.config.env_id), task=self.trace.task, traces=[self.trace])
        await env.finalize(self.task, episode)

    def advance(self) -> str | None:
        """Run the environment until it asks for the next model turn (its observation) or returns (None)."""
        self.loop.run_until_complete(asyncio.wait({self.asked, self.main}, return_when=asyncio.FIRST_COMPLETED))
        if self.asked.done():
            return self.asked.result()
        self.main.result()  # raises what run() raised
        return None

    def answer(self, reply: Any) -> str | None:
        self.asked = self.loop.create_future()
        self.reply.set_result(reply)
        return self.advance()

    def finish(self) -> float:
        """End the exchange (a pending turn is answered as terminated) and the trace's weighted reward."""
        while not self.main.done():
            if self.reply is None or self.reply.done():
                self.advance()
                continue
            self.answer(TERMINATED)
        self.main.result()
        self.loop.close()
        missing = [name for name, r in self.trace.rewards.items() if r is None]
        if missing:
            raise ValueError(f"the rubric did not score {', '.join(missing)}")
        return float(sum(r.score * r.weight for r in self.trace.rewards.values()))


class _Interaction:
    """The library's Interaction as an environment sees it; the policy answers each turn through grpolab."""

    def __init__(self, exchange: _Exchange):
        self.exchange = exchange

    @property
    def trace(self) -> Any:
        return self.exchange.trace

    async def turn(self, message: Any = None) -> Any:
        from verifiers.v1.agent import Segment

        ex = self.exchange
        if ex.over:
            raise RuntimeError("the exchange is over (the run ended); read interaction.trace")
        first = not any(n.sampled for n in ex.trace.nodes)
        if message is None and not (first and ex.task.data.prompt is not None):
            raise ValueError("nothing to run a turn on: a bare turn() takes a prompted task's opening reply")
        if message is not None:
            text = message if isinstance(message, str) else "\n\n".join(_texts(message))
            ex.trace.nodes.append(_node(ex.trace, chat_message("user", text), False))
        else:
            text = row_text(ex.task, "task.options.env")
        if first and ex.task.data.system_prompt:
            text = f"{text}\n{ex.task.data.system_prompt}"  # as a single-turn prompt renders it
        ex.reply = ex.loop.create_future()
        ex.asked.set_result(text)
        reply = await ex.reply
        if reply is TERMINATED:
            ex.over = True
            return Segment(messages=[], terminated=True)
        node = _node(ex.trace, chat_message("model", reply), True)
        ex.trace.nodes.append(node)
        return Segment(messages=[node.message])

    async def close(self) -> Any:
        ex = self.exchange
        if not ex.scored:
            ex.scored = True
            ex.over = True
            await ex.task.score(ex.trace)
        return ex.trace


def _texts(messages: Any) -> list[str]:
    from verifiers.v1.types import content_text

    return [content_text(m["content"] if isinstance(m, dict) else m.content) for m in messages]


def _node(trace: Any, message: Any, sampled: bool) -> Any:
    from verifiers.v1.graph import MessageNode

    return MessageNode(parent=len(trace.nodes) - 1 if trace.nodes else None, message=message, sampled=sampled)


class _Seat:
    """An agent seat played by the policy: ``interaction(task)`` (turn by turn) and ``run(task)`` (one turn)."""

    trainable = True

    def __init__(self, exchange: _Exchange):
        self.exchange = exchange

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any, **_: Any):
        if task.data != self.exchange.task.data and task.data.prompt is not None:
            raise ValueError("grpolab plays the episode's own task; this seat was handed another")
        interaction = _Interaction(self.exchange)
        try:
            yield interaction
        finally:
            await interaction.close()

    async def run(self, task: Any, **kw: Any) -> Any:
        async with self.interaction(task, **kw) as interaction:
            await interaction.turn()
        return interaction.trace


class _Agents:
    def __init__(self, exchange: _Exchange):
        self._seat_name, self._seat = exchange.loaded.seat, _Seat(exchange)

    def __getattr__(self, name: str) -> _Seat:
        if name.startswith("_") or name != self.__dict__.get("_seat_name"):
            raise AttributeError(f"no agent {name!r}; grpolab plays the one seat {self.__dict__.get('_seat_name')!r}")
        return self._seat


class VerifiersEpisodes(AgentEnv):
    """AgentEnv adapter of a multi-turn verifiers environment; ``make_agent_env`` binds it to one (ref, args)."""

    ref: str = ""
    args: dict[str, Any] = {}
    test_args: dict[str, Any] | None = None
    max_rows: int = 10_000

    def reset(self, problem: Problem, rng: random.Random) -> str:
        loaded = load(problem.data["vf_env"], problem.data.get("args"))
        self.exchange = _Exchange(loaded, row_task(loaded, dict(problem.data["row"])))
        first = self.exchange.advance()
        if first is None:
            raise RuntimeError("the environment's run() ended before its first turn")
        return first

    def step(self, action: str) -> tuple[str, bool]:
        observation = self.exchange.answer(action)
        return ("", True) if observation is None else (observation, False)

    def reward(self) -> float:
        value = self.exchange.finish()
        if not math.isfinite(value):
            raise ValueError(f"the rubric's weighted sum is {value}")
        return value

    @classmethod
    def problems(cls, split: str, n: int, seed: int, difficulty: int) -> list[Problem]:
        return split_rows(cls.ref, cls.args, cls.test_args, split, n, seed, cls.max_rows)


def make_agent_env(ref: str, args: dict[str, Any], test_args: dict[str, Any] | None, max_rows: int) -> str:
    """Register (once) the AgentEnv of the multi-turn environment `ref` with `args`; its registry name."""
    key = json.dumps([ref, args, test_args, max_rows], sort_keys=True)
    name = f"verifiers:{ref}#{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    attrs = {"ref": ref, "args": dict(args), "test_args": test_args, "max_rows": max_rows}
    register_environment(name)(type("VerifiersEpisodes", (VerifiersEpisodes,), attrs))
    return name
