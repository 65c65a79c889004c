"""The judge's client for an OpenAI-compatible chat endpoint (``vllm serve``, a llama.cpp server, ollama, a hosted
API): ``POST {base_url}/chat/completions`` with the rendered rubric as the user message, greedy by default.

One judgement has ``time_limit_s`` seconds in all, its retries included: every attempt gets the time that is left as
its socket time-out, and a judgement that runs out of time fails (its sample is invalid with the reason) while the
other judgements of the batch go on. A failed attempt is retried up to ``retries`` times when it may succeed later --
HTTP 408, 429 and 5xx, a refused or reset connection -- after the server's ``Retry-After`` (seconds or an HTTP date)
when it sends one, else after 0.5 s x 2^k (k = 0, 1, ...); a wait that would end past the time limit fails at once,
naming it. Other HTTP errors (400, 401, 404...) fail at once with the server's message.
"""

from __future__ import annotations

import email.utils
import json
import os
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Mapping

RETRYABLE = {408, 429, 500, 502, 503, 504}
BACKOFF_S = 0.5


class JudgeCallError(RuntimeError):
    """A judgement that failed for good: HTTP error, time limit, unreachable endpoint, a reply without text."""


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: a number of seconds, or an HTTP date (seconds until it, >= 0).

    >>> retry_after_s("2"), retry_after_s(None), retry_after_s("soon")
    (2.0, None, None)
    >>> retry_after_s("Thu, 01 Jan 1970 00:00:10 GMT", now=4.0)
    6.0
    """
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible endpoint: base URL (ending before /chat/completions, e.g. http://127.0.0.1:8000/v1), the
    served model's name, the name of the environment variable holding the API key ("" = none) and sampling."""

    base_url: str
    model: str
    api_key_env: str = ""
    temperature: float = 0.0
    max_tokens: int = 64

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key_env:
            headers["Authorization"] = f"Bearer {os.environ.get(self.api_key_env, '')}"
        return headers

    def _url(self, route: str) -> str:
        return self.base_url.rstrip("/") + route

    def reported_model(self, timeout_s: float = 5.0) -> dict[str, Any] | None:
        """What ``GET {base_url}/models`` reports of the served model (its entry without the volatile ``created``
        and ``object``), part of the judge's identity; None when the endpoint does not answer or does not list it."""
        req = urllib.request.Request(self._url("/models"), headers=self._headers())
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                listed = json.loads(resp.read().decode("utf-8", "replace")).get("data") or []
        except (OSError, ValueError, AttributeError):
            return None
        for entry in listed:
            if isinstance(entry, dict) and entry.get("id") == self.model:
                return {k: v for k, v in entry.items() if k not in ("created", "object")}
        return None

    def _attempt(self, prompt: str, timeout_s: float) -> str:
        body = json.dumps(
            {
                "model": self.model,
                "messages": [{"role": "user", "content": prompt}],
                "temperature": self.temperature,
                "max_tokens": self.max_tokens,
            }
        ).encode()
        req = urllib.request.Request(self._url("/chat/completions"), data=body, headers=self._headers(), method="POST")
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            reply = json.loads(resp.read().decode("utf-8", "replace"))
        try:
            text = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise JudgeCallError(
                f"the endpoint's reply has no choices[0].message.content: {str(reply)[:120]!r}"
            ) from None
        if not isinstance(text, str):
            raise JudgeCallError(f"the endpoint's reply has no text content: {text!r:.80}")
        return text

    def complete(self, prompt: str, time_limit_s: float, retries: int) -> str:
        """The judge's reply to `prompt` (module docstring: time limit, retries, Retry-After); JudgeCallError if none."""
        deadline = time.monotonic() + time_limit_s
        for attempt in range(retries + 1):
            left = deadline - time.monotonic()
            if left <= 0:
                raise JudgeCallError(f"time limit of {time_limit_s:g} s reached after {attempt} attempt(s)")
            try:
                return self._attempt(prompt, left)
            except urllib.error.HTTPError as e:
                detail = e.read().decode("utf-8", "replace")[:120] if e.fp else ""
                why, wait, retryable = (
                    f"HTTP {e.code} {detail!r}",
                    retry_after_s(e.headers.get("Retry-After")),
                    e.code in RETRYABLE,
                )
            except (socket.timeout, TimeoutError):
                raise JudgeCallError(
                    f"no reply within the time limit of {time_limit_s:g} s (attempt {attempt + 1})"
                ) from None
            except urllib.error.URLError as e:
                if isinstance(e.reason, (socket.timeout, TimeoutError)):
                    raise JudgeCallError(
                        f"no reply within the time limit of {time_limit_s:g} s (attempt {attempt + 1})"
                    ) from None
                why, wait, retryable = f"cannot reach {self.base_url}: {e.reason}", None, True
            except (ConnectionError, ValueError) as e:  # reset connection, a reply that is not JSON
                why, wait, retryable = f"{type(e).__name__}: {e}", None, isinstance(e, ConnectionError)
            if not retryable or attempt == retries:
                raise JudgeCallError(f"{why}; {attempt + 1} attempt(s), {retries} retries allowed")
            wait = BACKOFF_S * 2**attempt if wait is None else wait
            if time.monotonic() + wait >= deadline:
                raise JudgeCallError(
                    f"{why}; the wait before retrying ({wait:g} s) would pass the time limit of {time_limit_s:g} s"
                )
            time.sleep(wait)
        # only with retries < 0, which config forbids
        raise JudgeCallError(f"no attempt made ({retries} retries allowed)")


def endpoint_from(options: Mapping[str, Any]) -> Endpoint:
    """The Endpoint of a reward.judge section (``endpoint``, ``model``, ``api_key_env``, sampling)."""
    return Endpoint(
        str(options["endpoint"]),
        str(options["model"]),
        str(options.get("api_key_env") or ""),
        float(options.get("temperature", 0.0)),
        int(options.get("max_new_tokens", 64)),
    )
