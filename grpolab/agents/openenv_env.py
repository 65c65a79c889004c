"""OpenEnv servers (``openenv-core`` 0.3.0) as agent tasks (docs/environments.md).

``task: {name: openenv, options: {command: "python -m my_env.server --port {port}"}}`` (or ``url:
http://127.0.0.1:PORT`` of a server already running): every episode is one OpenEnv session through the library's
client (``GenericEnvClient``: its WebSocket session on the server's port; OpenEnv's plain HTTP ``/reset`` and
``/step`` build a fresh environment per request, so they cannot hold an episode). ``reset(seed=...)`` gives the first
observation, each model turn without a tool call is ``step({action_field: turn})``; the episode is done when the
server says so, and its reward is the sum of the rewards the server returned (None counts 0).

- **The server the run starts** (``command``): bound to 127.0.0.1 on a free port (``{port}`` in the command; the
  command must bind 127.0.0.1 itself), started when the task's problems are first drawn, waited for by polling
  ``GET /health`` for at most ``startup_timeout_s`` (a server that exits first is an error quoting its log's tail),
  stopped -- SIGTERM to its process group, SIGKILL after ``stop_timeout_s`` -- by the task's ``close()`` (the
  trainer closes its task when ``fit`` ends) and at process exit; on Linux the kernel also sends it SIGTERM when the starting thread dies (PR_SET_PDEATHSIG).
- **Bounded waits**: connecting and every message wait at most ``call_timeout_s`` (the episode's ``time_limit_s``
  bounds each reset / step call again). A server failure -- an HTTP or protocol error, a time-out, a server that
  died -- raises in reset / step, which makes that episode invalid with the reason (grpolab.agents.episode);
  the run goes on.
- **Problems** are reset seeds: held-out seeds ``seed * 2^20 + [0, num_test)``, training seeds
  ``seed * 2^20 + 2^19 + [0, num_train)``; the G episodes of a group reset with the same seed and must get the same
  first observation (a server that ignores the seed gets its groups refused as invalid).
- **Observations** are text: the observation's ``observation_field`` when given, else its only string field, else
  its JSON (``done``, ``reward`` and ``metadata`` left out).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import json
import math
import os
import random
import shlex
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..tasks import register_task
from ..tasks.base import Problem
from .env import AgentEnv, AgentTask, register_environment

KIND = "openenv"
INSTALL = "pip install 'grpolab[openenv]' (openenv-core==0.3.0)"
HIDDEN_FIELDS = ("done", "reward", "metadata")


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now (the OS's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child before exec (Linux): SIGTERM when the parent thread dies
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class Server:
    """A server process the run started: its command, port, log file and Popen."""

    command: list[str]
    port: int
    log_path: str
    process: subprocess.Popen | None = None
    url: str = field(init=False)

    def __post_init__(self) -> None:
        self.url = f"http://127.0.0.1:{self.port}"

    def log_tail(self, n: int = 1500) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode(errors="replace").strip()
        except OSError:
            return ""

    def start(self, startup_timeout_s: float) -> None:
        """Start the process and wait (at most startup_timeout_s) until GET /health answers 200; RuntimeError quoting
        the log otherwise (the process is stopped)."""
        log = open(self.log_path, "wb")  # noqa: SIM115 -- the child writes it for its whole life
        main = threading.current_thread() is threading.main_thread()
        self.process = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() ends its children too
            preexec_fn=_die_with_parent if main else None,
        )
        log.close()
        deadline = time.monotonic() + startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code, tail = self.process.returncode, self.log_tail()
                self.stop()
                raise RuntimeError(
                    f"the OpenEnv server exited with code {code} before it answered "
                    f"({shlex.join(self.command)}); its log ends: {tail}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1.0) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        tail = self.log_tail()
        self.stop()
        raise RuntimeError(
            f"the OpenEnv server did not answer {self.url}/health within {startup_timeout_s:g} s "
            f"({shlex.join(self.command)}); its log ends: {tail}"
        )

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM to the server's process group, SIGKILL after timeout_s; idempotent."""
        p = self.process
        if p is None:
            return
        for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, timeout_s)):
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # the group may outlive its leader (a child that ignored SIGTERM): make sure
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process = None
        if self.log_path != os.devnull:
            with contextlib.suppress(OSError):
                os.unlink(self.log_path)


_SERVERS: dict[str, Server] = {}
_LOCK = threading.Lock()


def ensure_server(command: str | list[str], startup_timeout_s: float, key: str) -> Server:
    """The running server of `command` (started once per process under `key`)."""
    with _LOCK:
        server = _SERVERS.get(key)
        if server is not None and server.process is not None and server.process.poll() is None:
            return server
        if server is not None:  # it died: what is left of its process group and its log go first
            server.stop()
        port = free_port()
        parts = shlex.split(command) if isinstance(command, str) else list(command)
        fd, log_path = tempfile.mkstemp(prefix="grpolab-openenv-", suffix=".log")
        os.close(fd)
        server = Server([p.replace("{port}", str(port)) for p in parts], port, log_path)
        server.start(startup_timeout_s)
        _SERVERS[key] = server
        return server


def stop_server(key: str) -> None:
    """Stop the server started under `key` (nothing when none runs)."""
    with _LOCK:
        server = _SERVERS.pop(key, None)
        if server is not None:
            server.stop()


def stop_servers() -> None:
    """Stop every server this process started (run at exit: the backstop of the tasks' own ``close()``)."""
    with _LOCK:
        for server in _SERVERS.values():
            server.stop()
        _SERVERS.clear()


atexit.register(stop_servers)


def observation_text(observation: Any, field_name: str | None) -> str:
    """The text of an OpenEnv observation (a dict from GenericEnvClient).

    >>> observation_text({"echoed_message": "hi", "message_length": 2}, "echoed_message")
    'hi'
    >>> observation_text({"prompt": "Guess.", "done": False, "metadata": {}}, None)
    'Guess.'
    >>> observation_text({"a": 1, "b": [2]}, None)
    '{"a": 1, "b": [2]}'
    """
    if not isinstance(observation, dict):
        return str(observation)
    if field_name is not None:
        if field_name not in observation:
            raise KeyError(f"the observation has no field {field_name!r} (it has {sorted(observation)})")
        return str(observation[field_name])
    shown = {k: v for k, v in observation.items() if k not in HIDDEN_FIELDS}
    strings = [v for v in shown.values() if isinstance(v, str)]
    return strings[0] if len(strings) == 1 else json.dumps(shown, sort_keys=True)


class OpenEnvEpisodes(AgentEnv):
    """AgentEnv adapter: one OpenEnv session per episode; ``make_agent_env`` binds it to one server."""

    command: str | list[str] | None = None
    url: str | None = None
    server_key: str = ""
    action_field: str = "message"
    observation_field: str | None = None
    call_timeout_s: float = 10.0
    startup_timeout_s: float = 60.0

    @classmethod
    def base_url(cls) -> str:
        if cls.url is not None:
            return cls.url
        return ensure_server(cls.command, cls.startup_timeout_s, cls.server_key).url

    def reset(self, problem: Problem, rng: random.Random) -> str:
        from openenv.core.generic_client import GenericEnvClient

        self.total, self.client = 0.0, None
        client = GenericEnvClient(
            base_url=self.base_url(), connect_timeout_s=self.call_timeout_s, message_timeout_s=self.call_timeout_s
        ).sync()
        self.client = client
        result = client.reset(seed=int(problem.data["openenv_seed"]))
        self._add(result.reward)
        return observation_text(result.observation, self.observation_field)

    def step(self, action: str) -> tuple[str, bool]:
        result = self.client.step({self.action_field: action})
        self._add(result.reward)
        if result.done:
            self.close()
        return observation_text(result.observation, self.observation_field), bool(result.done)

    def _add(self, reward: Any) -> None:
        if reward is None:
            return
        value = float(reward)
        if not math.isfinite(value):
            raise ValueError(f"the server returned the reward {reward!r}")
        self.total += value

    def reward(self) -> float:
        self.close()
        return self.total

    def close(self) -> None:
        client, self.client = getattr(self, "client", None), None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 -- a dead server: nothing left to close
                pass

    def __del__(self) -> None:  # an episode that failed mid-way still lets go of its session
        self.close()

    @classmethod
    def problems(cls, split: str, n: int, seed: int, difficulty: int) -> list[Problem]:
        cls.base_url()  # a server the run starts is started here, from the thread that draws the problems
        first = seed * 2**20 + (0 if split == "test" else 2**19)
        return [
            Problem(
                uid=f"openenv/{split}/{s}",
                question=f"OpenEnv reset seed {s}",
                answer="",
                data={"openenv_seed": s},
                instruction="",
            )
            for s in range(first, first + n)
        ]


class OpenEnvTask(AgentTask):
    """The ``agent`` task over an OpenEnv server, with the server's identity as its ``source``."""

    source: dict[str, Any] = {}

    def close(self) -> None:
        """Stop the server this task's environment started (none when it was pointed at a running one's url)."""
        if self.env_cls.command is not None:
            stop_server(self.env_cls.server_key)


def openenv_task(
    command: str | list[str] | None = None,
    url: str | None = None,
    action_field: str = "message",
    observation_field: str | None = None,
    call_timeout_s: float = 10.0,
    startup_timeout_s: float = 60.0,
    seed: int = 0,
    num_train: int = 2000,
    num_test: int = 200,
    max_turns: int = 4,
    max_turn_tokens: int = 64,
    max_total_tokens: int = 256,
    time_limit_s: float = 15.0,
) -> OpenEnvTask:
    """Task ``openenv``: episodes of the OpenEnv server `command` starts (``{port}`` replaced by a free port) or that
    runs at `url` (on 127.0.0.1 / localhost)."""
    try:
        import openenv
        from openenv.core.generic_client import GenericEnvClient  # noqa: F401
    except ImportError as e:
        raise ConfigError(
            f"task.options.command: OpenEnv servers need the openenv-core package: {INSTALL} ({e})"
        ) from None
    if (command is None) == (url is None):
        raise ConfigError(
            "task.options.command: give exactly one of command (a server the run starts) or url (one running)"
        )
    if command is not None:
        text = command if isinstance(command, str) else " ".join(map(str, command))
        if not isinstance(command, (str, list)) or "{port}" not in text:
            raise ConfigError(f"task.options.command: expected a command with a {{port}} placeholder, got {command!r}")
    if url is not None:
        host = urllib.parse.urlparse(url).hostname if isinstance(url, str) else None
        if host not in ("127.0.0.1", "localhost"):
            raise ConfigError(
                f"task.options.url: expected http://127.0.0.1:PORT (a server on this machine), got {url!r}"
            )
    for name, value in (("call_timeout_s", call_timeout_s), ("startup_timeout_s", startup_timeout_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"task.options.{name}: expected a number of seconds > 0, got {value!r}")
    if not isinstance(action_field, str) or not action_field:
        raise ConfigError(f"task.options.action_field: expected the action's text field name, got {action_field!r}")
    attrs = {
        "command": command,
        "url": url.rstrip("/") if url else None,
        "action_field": action_field,
        "observation_field": observation_field,
        "call_timeout_s": float(call_timeout_s),
        "startup_timeout_s": float(startup_timeout_s),
    }
    key = hashlib.sha256(json.dumps(attrs, sort_keys=True).encode()).hexdigest()[:12]
    name = f"openenv#{key}"
    register_environment(name)(type("OpenEnvEpisodes", (OpenEnvEpisodes,), {**attrs, "server_key": key}))
    task = OpenEnvTask(name, seed, num_train, num_test, 1, max_turns, max_turn_tokens, max_total_tokens, time_limit_s)
    task.source = {
        "library": "openenv-core",
        "library_version": openenv.__version__,
        "server": {"command": command} if command is not None else {"url": url},
        "action_field": action_field,
        "observation_field": observation_field,
    }
    return task


register_task(KIND, openenv_task)
