"""Task ``openai_agent``: an agent written against the ``openai`` package, trained through the run's
OpenAI-compatible endpoint (grpolab.agents.openai_server; docs/agents.md "Agents through the OpenAI API").

The problems are an environment's initial states (``env``: ``calc``, ``lookup``, ... as in the ``agent`` task); the
episodes are played by the agent, not by grpolab's runner: per initial state, G agents run concurrently (at most
``max_concurrent`` at once), each with its own session on the endpoint, and each session's token sequence is one
episode of the batch (grpolab.training.agent_batch).

- ``agent: module:function`` (or ``path/file.py:function``): called as ``fn(question, base_url=..., api_key=...,
  model=...)`` on a thread; it may return a number, its reward (``reward: reported``).
- ``command: "python my_agent.py"``: a process per episode with ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``,
  ``OPENAI_MODEL`` and ``GRPOLAB_QUESTION`` in its environment (the ``openai`` client reads the first two itself);
  it may report its reward by ``POST /v1/grpolab/reward``. Killed at ``agent_time_limit_s``.
- ``reward``: ``env`` (the environment scores the agent's last answer: reset on the problem, step(answer), reward()),
  ``reported`` (what the agent reported; none makes the episode invalid) or ``path/file.py:fn`` (``fn(answer,
  problem) -> float``, the single-turn reward signature).

An episode is invalid (NaN reward, its reason kept) when the agent raised, exited non-zero, ran past its time limit
or made no request -- unless a bound of the endpoint ended it first (the agent then meets an error it need not
handle). Its record is an EpisodeResult (grpolab.agents.episode) like the built-in runner's.
"""

from __future__ import annotations

import atexit
import importlib.util
import math
import os
import random
import shlex
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from ..errors import ConfigError
from ..rewards import call_with_time_limit
from ..rollout.base import SamplingParams
from ..tasks import register_task
from ..tasks.base import Problem
from .chat_tools import ChatError
from .env import AgentTask, EpisodeLimits, load_env
from .episode import EpisodeRunner, Episodes
from .openai_server import INSTALL, LOOPBACK, Endpoint, EndpointSettings, Server
from .openai_sessions import Session

KIND = "openai_agent"
_SERVERS: set[Server] = set()


class OpenAIAgentTask(AgentTask):
    """Task ``openai_agent``: the ``agent`` task's initial states, episodes played by an OpenAI-client agent."""

    name = KIND

    def __init__(
        self,
        env: str = "calc",
        agent: str | None = None,
        command: str | None = None,
        reward: str = "env",
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        tool_format: str = "auto",
        max_concurrent: int = 8,
        max_prompt_tokens: int = 1024,
        agent_time_limit_s: float = 120.0,
        seed: int = 0,
        num_train: int = 2000,
        num_test: int = 200,
        difficulty: int = 1,
        max_turns: int = 4,
        max_turn_tokens: int = 64,
        max_total_tokens: int = 256,
        time_limit_s: float = 5.0,
    ):
        super().__init__(
            env, seed, num_train, num_test, difficulty, max_turns, max_turn_tokens, max_total_tokens, time_limit_s
        )
        missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
        if missing:
            raise ConfigError(f"task openai_agent: its endpoint needs {' and '.join(missing)}: {INSTALL}")
        if host not in LOOPBACK and not token:
            raise ConfigError(f"task.options.token: the endpoint binds {host}, not 127.0.0.1: it needs a token")
        if (agent is None) == (command is None):
            raise ConfigError("task.options: give exactly one of agent ('module:function') or command")
        if agent is not None:
            load_callable(agent, "task.options.agent")
        if reward not in ("env", "reported"):
            load_callable(reward, "task.options.reward")
        for name, value in (("max_concurrent", max_concurrent), ("max_prompt_tokens", max_prompt_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"task.options.{name}: expected an integer >= 1, got {value!r}")
        self.openai = dict(
            agent=agent,
            command=command,
            reward=reward,
            host=host,
            port=port,
            token=token,
            tool_format=tool_format,
            max_concurrent=max_concurrent,
            max_prompt_tokens=max_prompt_tokens,
            agent_time_limit_s=float(agent_time_limit_s),
        )

    def problems(self, split: str) -> list[Problem]:
        import dataclasses

        return [
            dataclasses.replace(p, data={**p.data, "kind": KIND, "openai": self.openai})
            for p in super().problems(split)
        ]

    def close(self) -> None:
        """Nothing: each run's endpoint is stopped by its own collector (the trainer's close)."""


def is_openai_agent_problem(problem: Problem) -> bool:
    return problem.data.get("kind") == KIND


def load_callable(ref: str, field: str) -> Callable:
    from ..rewards.user import _load_module, _split_reference

    where, name = _split_reference(field, ref)
    fn = getattr(_load_module(field, where), name, None)
    if not callable(fn):
        raise ConfigError(f"{field}: {where} has no function {name!r}")
    return fn


def stop_servers() -> None:
    """Stop every endpoint this process still serves, at exit (a run stops its own when its trainer closes)."""
    for server in list(_SERVERS):
        server.stop()
        _SERVERS.discard(server)


atexit.register(stop_servers)


def _in_thread(fn: Callable, limit_s: float) -> Any:
    """fn() on a thread of its own, TimeoutError past limit_s (the thread is abandoned; its session is closed)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 -- the agent's failure, reported for its episode
            box["error"] = exc

    t = threading.Thread(target=target, name="grpolab-openai-agent", daemon=True)
    t.start()
    t.join(limit_s)
    if t.is_alive():
        raise TimeoutError(f"the agent ran past agent_time_limit_s ({limit_s:g} s)")
    if "error" in box:
        raise box["error"]
    return box.get("value")


class OpenAIAgentRunner:
    """Plays episodes by running the configured agent against an endpoint in front of `engine` (started on the first
    ``run``); the same ``run(problems, group_size, params, seeds) -> Episodes`` as grpolab.agents.episode.EpisodeRunner.

    ``held_out``: the runner of held-out evaluation (grpolab.evaluation.episodes): its endpoint answers every request
    greedily whatever temperature the agent names, and an episode is judged by its environment (``reward: env``)
    whatever the training reward is, so held-out success never depends on the agent's own verdict or a reward
    function trained on."""

    def __init__(self, engine, tokenizer, model_id: str, stop_ids: list[int] | None = None, held_out: bool = False):
        self.engine, self.tokenizer, self.model_id, self.held_out = engine, tokenizer, model_id, held_out
        self.stop_ids = list(stop_ids if stop_ids is not None else engine.stop_ids)
        self.server: Server | None = None

    def start(self, options: dict, params: SamplingParams) -> Server:
        if self.server is None:
            settings = EndpointSettings(
                self.model_id,
                params.temperature,
                params.top_p,
                params.top_k,
                greedy=self.held_out,
                max_prompt_tokens=options["max_prompt_tokens"],
                tool_format=options["tool_format"],
            )
            try:
                endpoint = Endpoint(self.engine, self.tokenizer, settings, self.stop_ids)
            except ChatError as exc:
                raise ConfigError(f"task.options.tool_format: {exc}") from None
            self.server = Server(endpoint, options["host"], options["port"], options["token"]).start()
            _SERVERS.add(self.server)
        return self.server

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            _SERVERS.discard(self.server)
            self.server = None

    def run(
        self, problems: list[Problem], group_size: int, params: SamplingParams, seeds: list[int] | None = None
    ) -> Episodes:
        """group_size episodes per problem (1 when greedy), group-major; seeds: the groups' (the environments')."""
        options = problems[0].data["openai"]
        server = self.start(options, params)
        g = 1 if params.greedy else group_size
        jobs = []
        for j, problem in enumerate(problems):
            limits = EpisodeLimits.from_data(dict(problem.data["limits"]))
            seed = seeds[j] if seeds is not None else 0
            jobs += [(problem, seed, server.endpoint.open(limits)) for _ in range(g)]
        with ThreadPoolExecutor(max_workers=options["max_concurrent"]) as pool:
            outcomes = list(pool.map(lambda job: self._play(server, options, job[0], job[2]), jobs))
        episodes = []
        for (problem, seed, session), (value, error) in zip(jobs, outcomes):
            server.endpoint.sessions.close(session.key)
            with session.lock:  # an abandoned agent's request in flight finishes first; later ones find it ended
                self._settle(session, problem, seed, options, value, error)
            episodes.append(session.episode)
        runner = EpisodeRunner(None, self.tokenizer, self.stop_ids)
        for ep in episodes:
            if not ep.prompt:  # no request: the question rendered alone keeps the row well-formed (it is invalid)
                ep.prompt = runner.prompt_ids(ep.result.error or "no request")
        return Episodes(runner.rollout(episodes, problems, g), [ep.result for ep in episodes])

    def _play(self, server: Server, options: dict, problem: Problem, session: Session) -> tuple[Any, str | None]:
        """Run one agent for `session`: (its return value, None) or (None, why it failed)."""
        key, limit = server.api_key(session), options["agent_time_limit_s"]
        try:
            if options["agent"] is not None:
                fn = load_callable(options["agent"], "task.options.agent")
                call = lambda: fn(problem.question, base_url=server.base_url, api_key=key, model=self.model_id)  # noqa: E731
                return _in_thread(call, limit), None
            env = {
                **os.environ,
                "OPENAI_BASE_URL": server.base_url,
                "OPENAI_API_KEY": key,
                "OPENAI_MODEL": self.model_id,
                "GRPOLAB_QUESTION": problem.question,
            }
            done = subprocess.run(
                shlex.split(options["command"]), env=env, capture_output=True, text=True, timeout=limit
            )
            if done.returncode != 0:
                return None, f"agent command exited {done.returncode}: {done.stderr.strip()[-300:]}"
            return None, None
        except subprocess.TimeoutExpired:
            return None, f"the agent command ran past agent_time_limit_s ({limit:g} s)"
        except Exception as exc:  # noqa: BLE001 -- the agent's failure: its episode only
            return None, f"agent: {type(exc).__name__}: {exc}"[:400]

    def _settle(
        self, session: Session, problem: Problem, seed: int, options: dict, value: Any, error: str | None
    ) -> None:
        """End the episode and give it its reward (or make it invalid with the reason)."""
        ep, result = session.episode, session.episode.result
        env_cls = load_env(problem.data["env"])
        result.requires_tools = bool(getattr(env_cls, "requires_tools", False))
        bounded = bool(session.ended)
        if not ep.prompt:
            error = error or "the agent made no request"
        if error is not None and not bounded:
            result.ended_by, result.error, result.reward = "invalid", error, math.nan
            return
        session.finish()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            session.reported = float(value)
        try:
            reward = self._reward(session, problem, seed, "env" if self.held_out else options["reward"])
            if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
                raise TypeError(f"expected a finite number, got {reward!r:.40}")
            result.reward = float(reward)
        except Exception as exc:  # noqa: BLE001
            result.ended_by, result.error, result.reward = "invalid", f"reward: {type(exc).__name__}: {exc}", math.nan

    def _reward(self, session: Session, problem: Problem, seed: int, mode: str) -> float:
        answer = session.episode.result.final_text
        if mode == "reported":
            if session.reported is None:
                raise ValueError("the agent reported no reward")
            return session.reported
        if mode != "env":
            return call_with_time_limit(
                load_callable(mode, "task.options.reward"), (answer, problem), session.limits.time_limit_s
            )
        limit = session.limits.time_limit_s
        env = call_with_time_limit(load_env(problem.data["env"]), (), limit)
        call_with_time_limit(env.reset, (problem, random.Random(seed)), limit)
        if session.ended == "done":  # a bound ended it: no answer turn (as grpolab's own runner scores it)
            call_with_time_limit(env.step, (answer,), limit)
        return call_with_time_limit(env.reward, (), limit)


register_task(KIND, OpenAIAgentTask)
