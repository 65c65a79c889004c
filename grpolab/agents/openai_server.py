"""The OpenAI-compatible endpoint a run serves to agent processes (docs/agents.md "Agents through the OpenAI API").

Routes: ``GET /v1/models``; ``POST /v1/chat/completions`` (``messages``, ``tools``, ``n``, ``temperature``,
``max_tokens`` / ``max_completion_tokens``, ``logprobs``); ``POST /v1/grpolab/reward`` (``{"reward": x}``: the
agent's own verdict on its episode). Each request names its session by the API key (``Authorization: Bearer
<key>``): the run opens one session per episode and hands its key to that episode's agent (``OPENAI_API_KEY``). A
key is a random secret of this endpoint, so a request can reach its own session only, never another session's or
another run's. Bound to an address other than 127.0.0.1 / ::1 / localhost the endpoint needs a token (refused
without one), and a key is then ``<token>.<session key>``.

Errors are OpenAI's error object (``{"error": {"message", "type", "param", "code"}}``) with 400 / 401 / 404; a bad
request changes nothing (its session's episode, the other sessions and the server go on).

The logic is ``Endpoint.complete`` (plain Python, tested without HTTP); fastapi and uvicorn only carry it
(``serve``; the optional extra ``grpolab[agents]``, imported when a server starts).
"""

# no `from __future__ import annotations`: fastapi reads the routes' annotations (Request) at run time

import hmac
import secrets
import threading
from dataclasses import dataclass
from typing import Any

from ..rollout.base import SamplingParams
from .chat_tools import ChatError, chat_template, check_tools, tool_format
from .env import EpisodeLimits
from .openai_sessions import (
    ApiError,
    Choice,
    EngineBatcher,
    Session,
    SessionStore,
    check_messages,
    delta_ids,
    render_ids,
    response_body,
    same_message,
)

LOOPBACK = ("127.0.0.1", "::1", "localhost")
MAX_N = 16
INSTALL = "pip install 'grpolab[agents]'"


@dataclass(frozen=True)
class EndpointSettings:
    """model: the id served; temperature: the run's (a training endpoint refuses another one, since the update
    scores tokens at the run's temperature); greedy: every request answered greedily, whatever temperature it
    names (held-out evaluation; n choices are n copies of the one greedy answer); max_prompt_tokens: the longest
    first prompt; tool_format: auto (from the template) or a name of grpolab.agents.chat_tools.TOOL_FORMATS."""

    model: str
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    fixed_temperature: bool = True
    greedy: bool = False
    max_prompt_tokens: int = 1024
    tool_format: str = "auto"
    batch_window_s: float = 0.02  # requests arriving within it share one engine call


def _int(body: dict, name: str, default: int | None, lo: int, hi: int | None = None) -> int | None:
    v = body.get(name, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        raise ApiError(
            400, f"{name}: expected an integer in [{lo}, {hi if hi is not None else 'inf'}], got {v!r}", name
        )
    return v


class Endpoint:
    """The endpoint's state and request logic: sessions, the chat template, the tool-call parser and the engine."""

    def __init__(self, engine, tokenizer, settings: EndpointSettings, stop_ids: list[int] | None = None):
        self.tokenizer, self.settings = tokenizer, settings
        self.template = chat_template(tokenizer)
        self.parse = tool_format(settings.tool_format, self.template)
        self.stop_ids = list(stop_ids if stop_ids is not None else engine.stop_ids)
        self.sessions = SessionStore()
        self.batcher = EngineBatcher(engine, settings.batch_window_s)

    def close(self) -> None:
        self.batcher.close()

    def models(self) -> dict:
        return {
            "object": "list",
            "data": [{"id": self.settings.model, "object": "model", "created": 0, "owned_by": "grpolab"}],
        }

    def open(self, limits: EpisodeLimits) -> Session:
        return self.sessions.open(limits)

    def report(self, session: Session, body: Any) -> dict:
        reward = body.get("reward") if isinstance(body, dict) else None
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or reward != reward:
            raise ApiError(400, "reward: expected a finite number", "reward")
        session.reported = float(reward)
        return {"ok": True}

    def _sampling(self, body: dict) -> tuple[SamplingParams, int, bool]:
        s = self.settings
        n = _int(body, "n", 1, 1, MAX_N)
        max_tokens = _int(body, "max_completion_tokens", None, 1) or _int(body, "max_tokens", None, 1)
        t = body.get("temperature")
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 2):
            raise ApiError(400, f"temperature: expected a number in [0, 2], got {t!r}", "temperature")
        if t is not None and s.fixed_temperature and not s.greedy and abs(t - s.temperature) > 1e-9:
            raise ApiError(
                400,
                f"temperature: this endpoint samples for training at temperature {s.temperature} "
                "(rollout.temperature); omit temperature or pass that value",
                "temperature",
            )
        if body.get("top_logprobs"):
            raise ApiError(400, "top_logprobs: not supported (logprobs of the sampled tokens only)", "top_logprobs")
        greedy = s.greedy or (t == 0 and not s.fixed_temperature)
        temp = s.temperature if t is None or greedy else float(t)
        params = SamplingParams(group_size=n, temperature=temp, top_p=s.top_p, top_k=s.top_k, greedy=greedy)
        return params, max_tokens or 0, bool(body.get("logprobs"))

    def _extend(self, session: Session, messages: list[dict], tools: list[dict]) -> None:
        """Grow the session by this request: its first prompt, or the chosen previous answer and the new messages'
        delta. Ends the session (and raises) where a bound refuses the request."""
        ep, lim = session.episode, session.limits
        if session.tools is None:
            ids = render_ids(self.tokenizer, self.template, messages, tools, generation=True)
            if len(ids) > self.settings.max_prompt_tokens:
                raise ApiError(
                    400,
                    f"messages: the prompt is {len(ids)} tokens, more than this endpoint's "
                    f"{self.settings.max_prompt_tokens}",
                    "messages",
                    "context_length_exceeded",
                )
            session.tools, session.messages, ep.prompt = tools, messages, ids
            return
        if tools != session.tools:
            raise ApiError(
                400,
                "tools: differ from the session's first request (an episode is one sequence)",
                "tools",
                "session_diverged",
            )
        k = len(session.messages)
        if not session.pending and len(messages) == k and all(map(same_message, session.messages, messages)):
            return  # a retry of a request whose answer never came (the engine failed): sample again from here
        if len(messages) <= k + 1 or not all(same_message(a, b) for a, b in zip(session.messages, messages)):
            raise ApiError(
                400,
                "messages: must repeat this session's messages, then the answer returned, then new "
                "messages (an episode is one sequence)",
                "messages",
                "session_diverged",
            )
        chosen = [c for c in session.pending if same_message(c.message, messages[k])]
        new = messages[k + 1 :]
        if not chosen or any(m["role"] == "assistant" for m in new):
            raise ApiError(
                400,
                f"messages[{k}]: not an answer this session was given, or an assistant message "
                "after it (an episode is one sequence)",
                f"messages[{k}]",
                "session_diverged",
            )
        last = chosen[0]
        delta: list[int] = []
        if not last.bound and session.answered < lim.max_turns:  # rendered first: a template's refusal changes nothing
            ended_with = last.ids[-1] if last.ids else None
            history = session.messages + [last.message]
            delta = delta_ids(self.tokenizer, self.template, history, new, tools, ended_with, self.stop_ids)
        session.commit(last)
        if not session.ended and session.answered >= lim.max_turns:
            session.end("max_turns")
        if session.ended:
            raise ApiError(400, f"the episode has ended ({session.ended})", None, "episode_ended")
        if len(ep.tokens) + len(delta) >= lim.max_total_tokens:
            session.end("max_total_tokens")
            raise ApiError(
                400,
                f"messages: the episode would pass max_total_tokens ({lim.max_total_tokens})",
                "messages",
                "context_length_exceeded",
            )
        ep.add(delta, False)
        ep.result.trace[-1]["observation"] = self.tokenizer.decode(delta, skip_special_tokens=True)[:500]
        session.messages = session.messages + new

    def complete(self, session: Session, body: Any) -> dict:
        """Answer one chat completion request of `session`. A bad request raises ApiError and changes nothing,
        but one a bound refuses ends the episode (with the answer it repeats as the last turn)."""
        if not isinstance(body, dict):
            raise ApiError(400, "expected a JSON object")
        if body.get("model") != self.settings.model:
            raise ApiError(
                404,
                f"The model '{body.get('model')}' does not exist; this endpoint serves '{self.settings.model}'",
                "model",
                "model_not_found",
            )
        if body.get("stream"):
            raise ApiError(400, "stream: not supported", "stream")
        messages = check_messages(body.get("messages"))
        try:
            tools = check_tools(body.get("tools"))
        except ChatError as exc:
            raise ApiError(400, str(exc), exc.param or "tools") from None
        params, max_tokens, logprobs = self._sampling(body)
        with session.lock:
            if session.ended:
                raise ApiError(400, f"the episode has ended ({session.ended})", None, "episode_ended")
            self._extend(session, messages, tools)
            lim, ep = session.limits, session.episode
            left = lim.max_total_tokens - len(ep.tokens)
            budget = min(lim.max_turn_tokens, left, max_tokens or lim.max_turn_tokens)
            ask = _with_max(params, budget, 1 if params.greedy else params.group_size)
            drawn = self.batcher.generate(ep.prompt + ep.tokens, ask)
            if params.greedy:  # one answer drawn: the n choices asked for are copies of it
                drawn = [tuple(map(list, d[:3])) + (d[3],) for d in drawn for _ in range(params.group_size)]
            session.answered += 1
            session.pending = [self._choice(ids, lp, full, cut, budget, lim, left) for ids, lp, full, cut in drawn]
            session.log.append(
                {
                    "prompt_ids": ep.prompt + ep.tokens,
                    "choices": [c.ids for c in session.pending],
                    "logprobs": [c.logp for c in session.pending],
                }
            )
            return response_body(
                self.settings.model, session.pending, len(ep.prompt) + len(ep.tokens), logprobs, self.tokenizer
            )

    def _choice(self, ids, logp, full, cut: bool, budget: int, lim: EpisodeLimits, left: int) -> Choice:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        parsed = self.parse(text)
        msg: dict = {"role": "assistant", "content": parsed.content}
        if parsed.calls:
            msg["tool_calls"] = [
                {"id": "call_" + secrets.token_hex(8), "type": "function", "function": c} for c in parsed.calls
            ]
        bound = None
        if cut and budget == lim.max_turn_tokens:
            bound = "max_turn_tokens"
        elif cut and budget == left:
            bound = "max_total_tokens"
        if cut and bound is None:
            msg["_cut"] = True  # the agent's own max_tokens: finish_reason length, the episode goes on
        return Choice(ids, logp, full, msg, parsed.error, bound)

    def authorize(self, header: str | None, token: str | None) -> Session:
        """The session an ``Authorization`` header names; ApiError 401 otherwise."""
        key = (header or "").removeprefix("Bearer ").strip()
        if token is not None:
            given, _, key = key.rpartition(".")
            if not hmac.compare_digest(given.encode(), token.encode()):
                raise ApiError(401, "Incorrect API key provided", None, "invalid_api_key")
        session = self.sessions.get(key)
        if session is None:
            raise ApiError(
                401, "Incorrect API key provided: no live session of this run has it", None, "invalid_api_key"
            )
        return session


def _with_max(params: SamplingParams, n: int, group_size: int) -> SamplingParams:
    from dataclasses import replace

    return replace(params, max_new_tokens=n, group_size=group_size)


def make_app(endpoint: Endpoint, token: str | None):
    """The fastapi application over `endpoint` (each route's error an OpenAI error object)."""
    try:
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse
        from starlette.concurrency import run_in_threadpool
    except ImportError:
        raise ImportError(f"the OpenAI-compatible endpoint needs fastapi and uvicorn: {INSTALL}") from None

    app = FastAPI(title="grpolab agents endpoint", docs_url=None, redoc_url=None, openapi_url=None)

    def answer(fn, request: Request, *args) -> JSONResponse:
        try:
            session = endpoint.authorize(request.headers.get("authorization"), token)
            return JSONResponse(fn(session, *args))
        except ApiError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        except Exception as exc:  # noqa: BLE001 -- a failure of the engine: this request only
            err = ApiError(500, f"{type(exc).__name__}: {exc}", kind="server_error")
            return JSONResponse(err.body(), status_code=500)

    async def body_of(request: Request) -> Any:
        try:
            return await request.json()
        except ValueError:
            return None

    @app.get("/v1/models")
    async def models(request: Request):
        return answer(lambda s: endpoint.models(), request)

    @app.post("/v1/chat/completions")
    async def completions(request: Request):  # sampling blocks: it runs on the thread pool
        return await run_in_threadpool(answer, endpoint.complete, request, await body_of(request))

    @app.post("/v1/grpolab/reward")
    async def reward(request: Request):
        return answer(endpoint.report, request, await body_of(request))

    return app


class Server:
    """uvicorn serving `endpoint` on a thread of this process; ``base_url`` once started."""

    def __init__(self, endpoint: Endpoint, host: str = "127.0.0.1", port: int = 0, token: str | None = None):
        if host not in LOOPBACK and not token:
            raise ChatError(
                f"host {host}: an endpoint bound to an address other than 127.0.0.1 needs a token (task.options.token)",
                "host",
            )
        try:
            import uvicorn
        except ImportError:
            raise ImportError(f"the OpenAI-compatible endpoint needs fastapi and uvicorn: {INSTALL}") from None
        self.endpoint, self.host, self.token = endpoint, host, token
        config = uvicorn.Config(
            make_app(endpoint, token), host=host, port=port, log_level="warning", access_log=False, lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="grpolab-openai-server", daemon=True)
        self.base_url = ""

    def start(self, timeout_s: float = 20.0) -> "Server":
        import time

        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the OpenAI-compatible endpoint did not start on {self.host}")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.base_url = f"http://{host}:{port}/v1"
        return self

    def api_key(self, session: Session) -> str:
        return f"{self.token}.{session.key}" if self.token else session.key

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.endpoint.close()
