"""A rollout engine's worker process (engine-neutral; docs/vllm.md).

``EngineProcess`` starts a worker script with a Python of its own over a socket pair and speaks to it with
``multiprocessing.connection`` messages: requests are answered one at a time, in the order sent. ``request`` sends one
and waits for its reply; ``send`` and ``receive`` split the two, so that a trainer can keep requests in flight
(rollout.max_staleness: the next steps' rollouts are generated while it updates) and collect their replies in order.
Every wait is bounded; the worker's death or silence is an error naming it with the tail of its log. The workers
answering these requests: grpolab.rollout.workers.vllm_worker (vLLM) and grpolab.rollout.workers.grpolab_worker (grpolab's own
decode loop); another engine's (SGLang) plugs in the same way.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from multiprocessing.connection import Connection
from pathlib import Path

from ...errors import GrpolabError

LOG_TAIL_LINES = 20


class EngineUnavailable(GrpolabError):
    """The engine cannot be started here: no environment with it installed, or it refused this machine."""


class EngineDied(GrpolabError):
    """The engine's process exited, or stopped answering within its bound, while the trainer waited on it."""


def shared_memory_dir() -> str:
    """/dev/shm when it is a writable directory (a RAM file system: the weights never touch a disk), else the
    system's temporary directory."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else tempfile.gettempdir()


class EngineProcess:
    """A worker process spoken to with ``multiprocessing.connection`` messages over a socket pair.

    ``request`` waits at most `timeout` seconds, polling once a second whether the process still lives: an exit
    raises EngineDied with its exit code and the last lines of its log; silence past the bound kills it and raises
    EngineDied too. A reply ``{"ok": False, "error": ...}`` raises GrpolabError with the worker's traceback."""

    def __init__(
        self,
        python: Path,
        script: Path,
        workdir: Path,
        name: str,
        env: dict[str, str] | None = None,
        install_hint: str = "",
    ):
        if not Path(python).is_file():
            raise EngineUnavailable(f"{name}: no Python at {python}{'; ' + install_hint if install_hint else ''}")
        self.name, self.log_path = name, workdir / "worker.log"
        ours, theirs = socket.socketpair()
        child_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        child_env.update(env or {})
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [str(python), str(script), "--fd", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env,
                cwd=workdir,
                start_new_session=True,  # a Ctrl-C meant for the trainer reaches the trainer only
            )
        theirs.close()
        self.conn = Connection(ours.detach())
        self._finalizer = weakref.finalize(self, _kill, self.proc)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-LOG_TAIL_LINES:])

    def _died(self, op: str) -> EngineDied:
        try:
            code = self.proc.wait(5)  # its socket can close a moment before the exit status is there
        except subprocess.TimeoutExpired:
            _kill(self.proc)
            code = f"{self.proc.returncode} (killed: its socket had closed but it had not exited)"
        return EngineDied(
            f"{self.name} worker (pid {self.proc.pid}) exited with code {code} during {op!r}; "
            f"the last lines of its log ({self.log_path}):\n{self.log_tail()}"
        )

    def send(self, op: str, **fields) -> None:
        """Send request `op` without waiting for its reply (``receive`` takes the replies in the order sent)."""
        if self.proc.poll() is not None:
            raise self._died(op)
        try:
            self.conn.send({"op": op, **fields})
        except OSError:
            raise self._died(op) from None

    def receive(self, op: str, timeout: float) -> dict:
        """The reply to the oldest request not yet answered (`op` names it in errors), waiting at most `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.conn.poll(min(1.0, max(0.0, deadline - time.monotonic()))):
                    reply = self.conn.recv()
                    break
            except (EOFError, OSError):
                raise self._died(op) from None
            if self.proc.poll() is not None:
                raise self._died(op)
            if time.monotonic() >= deadline:
                _kill(self.proc)
                raise EngineDied(
                    f"{self.name} worker (pid {self.proc.pid}) gave no answer to {op!r} within {timeout:g} s and was "
                    f"stopped; the last lines of its log ({self.log_path}):\n{self.log_tail()}"
                )
        if not reply.get("ok"):
            error = str(reply.get("error", "")).strip()
            last = error.splitlines()[-1] if error else "no detail"
            raise GrpolabError(f"{self.name} worker failed in {op!r}: {last}\n{error}")
        return reply

    def request(self, op: str, timeout: float, **fields) -> dict:
        """Send `op` and wait at most `timeout` s for its reply (nothing else may be in flight)."""
        self.send(op, **fields)
        return self.receive(op, timeout)

    def close(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            try:
                self.conn.send({"op": "stop"})
                self.proc.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                pass
        _kill(self.proc)
        self.conn.close()


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker's session: any process vLLM started goes with it
        except (ProcessLookupError, PermissionError):
            proc.kill()
        proc.wait(10)


def cause_line(message: str) -> str:
    """The line of an engine error that names the cause: the last one that reads like an exception
    ("SomeError: ..."), else the first."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    found = [ln for ln in lines if ln.split(":")[0].split(" ")[-1].endswith(("Error", "Exception"))]
    return found[-1] if found else (lines[0] if lines else "no detail")
