"""Token-in / token-out sessions behind the OpenAI-compatible endpoint (grpolab.agents.openai_server): one session
is one agent episode, one token sequence ``[prompt | turn 1 | new messages | turn 2 | ...]`` as in
grpolab.agents.episode.

- **The first request** is rendered whole by the chat template (``apply_chat_template(messages, tools=...)``, with
  the generation prompt); that is the episode's prompt.
- **A later request** must repeat the session's messages, then one of the choices it was answered with (the
  assistant message as returned: content and tool calls), then new messages (user, tool or system). The choice it
  repeats is the turn the episode continues with (its sampled ids and logprobs, as drawn); the new messages are
  rendered by the template after that turn and tokenized once (the delta), so the next prompt is the previous
  prompt's exact ids + the sampled ids + the delta. Nothing earlier is re-rendered: where a template renders earlier
  turns differently from what the model saw (one that drops earlier ``<think>`` blocks), the episode is what the
  model saw. A request that does not extend the session (edited history, other tools) is refused
  (``session_diverged``): an episode is one sequence.
- **Bounds** (grpolab.agents.env.EpisodeLimits): a turn samples at most ``max_turn_tokens`` (and the request's
  ``max_tokens``); the tokens after the prompt never pass ``max_total_tokens``; a request after ``max_turns`` turns,
  after a turn a bound cut, or whose new messages do not fit, is refused and ends the episode with that bound.
- The model's tool calls are parsed in its template's format (grpolab.agents.chat_tools) and returned as OpenAI
  ``tool_calls``; a malformed call comes back as content (counted as a tool error).

Sampling goes through the run's rollout engine only (``RolloutEngine.generate``), from one thread that batches the
requests arriving together (``EngineBatcher``).
"""

from __future__ import annotations

import json
import queue
import secrets
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from ..rollout.base import SamplingParams
from .chat_tools import ChatError, check_tools, template_messages
from .env import EpisodeLimits
from .episode import _Episode

_SENTINEL = "\u2063GRPOLAB_TURN\u2063"
ROLES = ("system", "user", "assistant", "tool")


class ApiError(Exception):
    """An OpenAI-style error: HTTP status and the ``error`` object (message, type, param, code)."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


def _text(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise ApiError(400, f"{where}.content: expected a string or text parts", f"{where}.content")


def check_messages(messages: Any) -> list[dict]:
    """The request's messages in one canonical form (role, content, tool_calls, tool_call_id); ApiError naming the
    bad message otherwise."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages: expected a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ApiError(400, f"{where}.role: expected one of {', '.join(ROLES)}", f"{where}.role")
        msg: dict = {"role": m["role"], "content": _text(m.get("content"), where)}
        calls = m.get("tool_calls") if m["role"] == "assistant" else None
        if calls:
            try:
                msg["tool_calls"] = [
                    {
                        "id": str(c.get("id", "")),
                        "type": "function",
                        "function": {
                            "name": c["function"]["name"],
                            "arguments": json.dumps(json.loads(c["function"].get("arguments") or "{}")),
                        },
                    }
                    for c in calls
                ]
            except (KeyError, TypeError, AttributeError, json.JSONDecodeError):
                raise ApiError(
                    400, f"{where}.tool_calls: expected function calls with JSON arguments", f"{where}.tool_calls"
                ) from None
        if m["role"] == "tool":
            msg["tool_call_id"] = str(m.get("tool_call_id", ""))
        out.append(msg)
    return out


def same_message(a: dict, b: dict) -> bool:
    """Equal as the model sees them: role, content (None = ""), calls' names and arguments (ids ignored)."""

    def key(m: dict) -> tuple:
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in m.get("tool_calls") or []]
        return m["role"], m.get("content") or "", calls

    return key(a) == key(b)


def _render(tokenizer, messages: list[dict], **kw) -> str:
    """apply_chat_template's text; a template that refuses the messages (its raise_exception, e.g. Llama 3.1's one
    call per message) is an OpenAI-style 400, not a server error."""
    from jinja2 import TemplateError

    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, **kw)
    except TemplateError as exc:
        raise ApiError(400, f"messages: the chat template refuses them: {exc}", "messages", "template_error") from None


def render_ids(tokenizer, template: str, messages: list[dict], tools: list[dict], generation: bool) -> list[int]:
    """Token ids of `messages` rendered by the chat template (tokenized once, no special tokens added)."""
    text = _render(
        tokenizer,
        template_messages(messages),
        tools=tools or None,
        chat_template=template,
        add_generation_prompt=generation,
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def delta_ids(
    tokenizer,
    template: str,
    history: list[dict],
    new: list[dict],
    tools: list[dict],
    ended_with: int | None,
    stop_ids: list[int],
) -> list[int]:
    """The ids the template adds after the model's last turn (the last message of `history`) for the `new`
    messages, up to the next generation prompt: the text after that turn's content when the turn is rendered with a
    sentinel content. The model's own end-of-turn token (``ended_with``) is not repeated when the template closes
    the turn with it."""
    head = template_messages(history[:-1]) + [{"role": "assistant", "content": _SENTINEL}]
    kw = dict(tools=tools or None, chat_template=template)
    closed = _render(tokenizer, head, **kw)
    full = _render(tokenizer, head + template_messages(new), add_generation_prompt=True, **kw)
    delta = full[full.index(_SENTINEL) + len(_SENTINEL) :]
    tail = closed[closed.index(_SENTINEL) + len(_SENTINEL) :]
    end = tokenizer.decode([ended_with]) if ended_with in stop_ids else ""
    if end and tail.startswith(end) and delta.startswith(end):
        delta = delta[len(end) :]
    return tokenizer(delta, add_special_tokens=False)["input_ids"]


@dataclass
class Choice:
    """One sampled answer: its ids and logprobs as drawn, the message returned, and the bound that cut it."""

    ids: list[int]
    logp: list[float]
    full: list[float]
    message: dict
    error: str | None = None  # a malformed tool call
    bound: str | None = None  # max_turn_tokens / max_total_tokens when a bound cut the turn


@dataclass
class Session:
    """One agent episode: its token sequence (an _Episode of grpolab.agents.episode), messages and pending choices."""

    key: str
    limits: EpisodeLimits
    episode: _Episode
    messages: list[dict] = field(default_factory=list)  # the messages of the last request (canonical)
    tools: list[dict] | None = None
    pending: list[Choice] = field(default_factory=list)
    answered: int = 0  # requests answered (model turns sampled)
    reported: float | None = None  # a reward the agent reported
    log: list[dict] = field(default_factory=list)  # per request: prompt ids, each choice's ids and logprobs
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def ended(self) -> str:
        return self.episode.result.ended_by

    def end(self, bound: str) -> None:
        if not self.ended:
            self.episode.result.ended_by = bound

    def commit(self, choice: Choice) -> None:
        """Append the turn the episode continues with (the model's tokens, trained on)."""
        r = self.episode.result
        self.episode.add(choice.ids, True, choice.logp, choice.full)
        r.turns += 1
        r.model_tokens += len(choice.ids)
        r.tool_calls += len(choice.message.get("tool_calls") or []) + (choice.error is not None)
        r.tool_errors += choice.error is not None
        r.final_text = choice.message.get("content") or ""
        kind = "malformed_call" if choice.error else ("call" if choice.message.get("tool_calls") else "action")
        r.trace.append({"turn": r.turns, "kind": kind, "observation": ""})
        self.messages = self.messages + [choice.message]
        self.pending = []
        if choice.bound:
            self.end(choice.bound)

    def finish(self) -> None:
        """The episode as the agent left it: a pending answer is the turn it ended with (the first of n)."""
        if self.pending:
            self.commit(self.pending[0])
        self.end("done")


class SessionStore:
    """The live sessions of one endpoint, by key (a random secret: a key of another run or session matches none)."""

    def __init__(self):
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self, limits: EpisodeLimits) -> Session:
        key = "sess-" + secrets.token_urlsafe(24)
        s = Session(key, limits, _Episode(env=None, limits=limits, prompt=[], generator=None))
        with self._lock:
            self._sessions[key] = s
        return s

    def get(self, key: str) -> Session | None:
        with self._lock:
            return self._sessions.get(key)

    def close(self, key: str) -> Session | None:
        with self._lock:
            return self._sessions.pop(key, None)

    def live(self) -> list[Session]:
        with self._lock:
            return list(self._sessions.values())


class EngineBatcher:
    """Runs every generation on one thread, batching requests that arrive within ``window_s`` with the same
    sampling parameters into one ``engine.generate`` call. ``generate`` blocks until its answers are drawn."""

    def __init__(self, engine, window_s: float = 0.02):
        self.engine, self.window_s = engine, window_s
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="grpolab-openai-engine", daemon=True)
        self._thread.start()

    def generate(
        self, prompt: list[int], params: SamplingParams
    ) -> list[tuple[list[int], list[float], list[float], bool]]:
        """params.group_size answers to `prompt`: (ids, logprobs, untruncated logprobs, truncated) each."""
        fut: Future = Future()
        self._queue.put((prompt, params, fut))
        return fut.result()

    def close(self) -> None:
        self._queue.put(None)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            items, deadline = [item], time.monotonic() + self.window_s
            while (left := deadline - time.monotonic()) > 0:
                try:
                    nxt = self._queue.get(timeout=left)
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                items.append(nxt)
            by_params: dict[SamplingParams, list] = {}
            for it in items:  # one call for every token budget: each answer is cut to its own after sampling
                by_params.setdefault(replace(it[1], max_new_tokens=0), []).append(it)
            for params, group in by_params.items():
                self._run(replace(params, max_new_tokens=max(it[1].max_new_tokens for it in group)), group)

    def _run(self, params: SamplingParams, group: list) -> None:
        import torch

        try:
            with torch.no_grad():  # grad mode is per thread: this one's is on
                r = self.engine.generate([it[0] for it in group], params)
            full = r.untruncated_logprobs()
            g = 1 if params.greedy else params.group_size
            for j, (_, own, fut) in enumerate(group):
                rows = []
                for row in range(j * g, j * g + g):
                    keep = r.completion_mask[row].bool()
                    ids, n = r.completion_ids[row][keep].tolist(), own.max_new_tokens
                    cut = bool(r.truncated[row]) or len(ids) > n  # past its own budget: cut there, as if drawn so
                    rows.append(
                        (ids[:n], r.sampler_logprobs[row][keep].tolist()[:n], full[row][keep].tolist()[:n], cut)
                    )
                fut.set_result(rows)
        except Exception as exc:  # noqa: BLE001 -- the engine failed: every waiting request gets the error
            for _, _, fut in group:
                if not fut.done():
                    fut.set_exception(exc)


def response_body(model: str, choices: list[Choice], prompt_len: int, logprobs: bool, tokenizer) -> dict:
    """The OpenAI chat.completion object of `choices` (finish_reason tool_calls / length / stop)."""
    out = []
    for i, c in enumerate(choices):
        reason = (
            "tool_calls" if c.message.get("tool_calls") else ("length" if c.bound or c.message.get("_cut") else "stop")
        )
        msg = {k: v for k, v in c.message.items() if not k.startswith("_")}
        lp = None
        if logprobs:
            lp = {
                "content": [
                    {
                        "token": (t := tokenizer.decode([tid])),
                        "logprob": p,
                        "bytes": list(t.encode()),
                        "top_logprobs": [],
                    }
                    for tid, p in zip(c.ids, c.logp)
                ]
            }
        out.append({"index": i, "message": msg, "finish_reason": reason, "logprobs": lp})
    completion = sum(len(c.ids) for c in choices)
    return {
        "id": "chatcmpl-" + secrets.token_hex(12),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": out,
        "usage": {
            "prompt_tokens": prompt_len,
            "completion_tokens": completion,
            "total_tokens": prompt_len + completion,
        },
    }


__all__ = [
    "ApiError",
    "ChatError",
    "Choice",
    "EngineBatcher",
    "Session",
    "SessionStore",
    "check_messages",
    "check_tools",
    "delta_ids",
    "render_ids",
    "response_body",
    "same_message",
]
