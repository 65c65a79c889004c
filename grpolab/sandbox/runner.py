"""Running one program in the sandbox, from the trainer's side (docs/code.md, "The sandbox").

``run_job`` creates a fresh host directory (with a mount namespace, only the mount point of the run's own root;
the program works in /sandbox there; else its working directory), starts the judge (grpolab.sandbox.harness) in
its own session -- behind ``unshare`` when the machine allows namespaces -- with an empty environment, writes the
program, the tests and the names they may use (grpolab.sandbox.names) to its stdin, reads stdout and stderr up to
a cap and the result pipe, and kills the whole process group when the result is in, the wall-clock limit has
passed or the output cap is exceeded. Without a PID namespace,
processes of the sandbox uid that left the group (``setsid``) are found in /proc and killed. The host directory
is removed afterwards. A malformed result frame is at worst this run's failure, never its batch's.
"""

from __future__ import annotations

import functools
import json
import os
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .image import stdlib_image
from .limits import SandboxLimits
from .names import bound_names

if TYPE_CHECKING:
    from .isolation import Isolation

REASONS = ("syntax", "error", "wrong_answer", "timeout", "limit", "exit")
GRACE_S = 1.0  # the runner's kill comes this long after the judge's own deadline
SETUP_S = 10.0  # the most a run's setup (its root, private copies) may take before the judge is ready
MAX_RESULT_BYTES = 8 << 20
SANDBOX_HOME = "/sandbox"  # the program's working directory inside its own root (with a mount namespace)
JUDGE_UID_OFFSET = (
    1 << 16
)  # a slot's judge runs as limits.uid + JUDGE_UID_OFFSET + slot, its program as limits.uid + slot
FRAME = struct.Struct(">I")


@dataclass(frozen=True)
class Job:
    """A program and its tests. `setup` and `cases` are trusted test code, run by the judge in a namespace of its
    own (grpolab.sandbox.names): builtins, the allowed standard-library modules they read, the program names in
    `entry_points` (bound even where a builtin has that name) and those the tests read that nothing else
    defines (functions as proxies); ``__solution__(name)`` gives the program's own object `name`."""

    program: str
    cases: tuple[str, ...]
    setup: str = ""
    wall_s: float | None = None  # a tighter wall-clock (and CPU) limit for this job than the pool's
    entry_points: tuple[str, ...] = ()


@dataclass(frozen=True)
class CaseResult:
    """One test case: passed, or the reason it did not (one of REASONS) and a one-line detail."""

    ok: bool
    reason: str | None = None
    detail: str = ""


@dataclass
class ExecResult:
    """What one run gave. `infra_error` is set when the sandbox itself failed (no verdict on the program)."""

    cases: list[CaseResult]
    wall_s: float
    infra_error: str | None = None
    stdout: str = ""
    stderr: str = ""
    output_bytes: int = 0
    killed: str | None = None  # "timeout" or "output" when the runner had to kill the run
    meta: dict = field(default_factory=dict)

    @property
    def n_passed(self) -> int:
        return sum(c.ok for c in self.cases)

    @property
    def all_passed(self) -> bool:
        return bool(self.cases) and all(c.ok for c in self.cases) and self.infra_error is None

    @property
    def reason(self) -> str | None:
        """The first failing case's reason (None when every case passed)."""
        return next((c.reason for c in self.cases if not c.ok), None)

    @property
    def detail(self) -> str:
        return self.infra_error or next((c.detail for c in self.cases if not c.ok), "")


@functools.lru_cache(maxsize=1)
def compile_harness() -> None:
    """Write __pycache__ entries for harness.py, confine.py, seccomp.py and wire.py (even under
    PYTHONDONTWRITEBYTECODE) so that no program pays for compiling them; a read-only install just compiles them in
    each run."""
    import importlib.util
    import py_compile

    for name in ("wire.py", "seccomp.py", "confine.py", "harness.py"):
        source = str(Path(__file__).with_name(name))
        try:
            py_compile.compile(source, cfile=importlib.util.cache_from_source(source), doraise=True)
        except (OSError, py_compile.PyCompileError):
            pass


def harness_command(python: str) -> list[str]:
    """The judge's command line: the interpreter isolated from anything the program can write, equivalent to
    ``python -I`` but for the environment (which the runner builds from scratch, PYTHONHASHSEED included): no
    site, no user site (``-s -S``), no bytecode written (``-B``), and the import path reduced to this directory
    (for harness.py, confine.py, seccomp.py and wire.py, compiled, from __pycache__) and the interpreter's
    absolute entries -- without the '' that ``-c`` puts first (the working directory, which the program can write)."""
    compile_harness()
    here = str(Path(__file__).parent)
    boot = (
        f"import sys; sys.path[:] = [{here!r}] + [p for p in sys.path if p.startswith('/')]; "
        "import harness; harness.main()"
    )
    return [python, "-s", "-S", "-B", "-c", boot]


def frame(obj: object) -> bytes:
    body = json.dumps(obj, separators=(",", ":")).encode()
    return FRAME.pack(len(body)) + body


def parse_frames(buf: bytes) -> tuple[list[dict], bytes]:
    """Complete frames at the start of `buf` and the incomplete rest.

    >>> parse_frames(frame({"ready": True}) + b"\\x00")
    ([{'ready': True}], b'\\x00')
    """
    out = []
    while len(buf) >= FRAME.size:
        size = FRAME.unpack(buf[: FRAME.size])[0]
        if len(buf) < FRAME.size + size:
            break
        try:
            out.append(json.loads(buf[FRAME.size : FRAME.size + size]))
        except Exception:  # ValueError, RecursionError, MemoryError: never more than this run's problem
            out.append({"malformed": True})
        buf = buf[FRAME.size + size :]
    return out, buf


def sandbox_env(home: str) -> dict[str, str]:
    """The program's whole environment: nothing inherited, fixed hashing (deterministic set order of strings)."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "HOME": home,
        "TMPDIR": "/tmp",
    }


class _Streams:
    """Reading stdout / stderr (capped) and the result pipe; writing stdin; all non-blocking on one selector."""

    def __init__(self, proc: subprocess.Popen, result_fd: int, data: bytes, cap: int):
        self.sel = selectors.DefaultSelector()
        self.proc, self.result_fd, self.cap = proc, result_fd, cap
        self.pending, self.stdin_fd = memoryview(data), proc.stdin.fileno()
        self.out = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
        self.result, self.frames, self.output_bytes, self.result_eof = b"", [], 0, False
        self.ready_at: float | None = None  # when the judge said it is set up (its wall-clock limit starts there)
        os.set_blocking(self.stdin_fd, False)
        self.sel.register(self.stdin_fd, selectors.EVENT_WRITE)
        for fd in (*self.out, result_fd):
            self.sel.register(fd, selectors.EVENT_READ)

    def done(self) -> bool:
        return self.result_eof or any("cases" in f or "judge_error" in f or "setup_error" in f for f in self.frames)

    def pump(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            fd = key.fd
            if fd == self.stdin_fd:
                self._write(fd)
                continue
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                self.sel.unregister(fd)
                self.result_eof |= fd == self.result_fd
            elif fd == self.result_fd:
                self.result += chunk
                new, self.result = parse_frames(self.result)
                self.frames += new
                if self.ready_at is None and any(type(f) is dict and f.get("ready") for f in new):
                    self.ready_at = time.monotonic()
                if len(self.result) > MAX_RESULT_BYTES:
                    self.result_eof = True
            else:
                self.output_bytes += len(chunk)
                keep = self.cap - len(self.out[fd])
                if keep > 0:
                    self.out[fd] += chunk[:keep]

    def _write(self, fd: int) -> None:
        try:
            n = os.write(fd, self.pending[: 1 << 16])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # the judge is gone
            n = len(self.pending)
        self.pending = self.pending[n:]
        if not self.pending:
            self.sel.unregister(fd)
            self.proc.stdin.close()

    def close(self) -> None:
        self.sel.close()


def kill_uid(uid: int) -> int:
    """SIGKILL every live process whose real uid is `uid` (repeat until none is left); how many were killed.
    Zombies are skipped: they are dead already, and only their parent (often the host's init) can reap them."""
    killed: set[int] = set()
    for _ in range(50):
        found = _live_pids_of(uid)
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                pass
        time.sleep(0.01)
    return len(killed)


def _live_pids_of(uid: int) -> list[int]:
    """Pids of the processes whose real uid is `uid` and that are not zombies (from /proc/PID/status)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = dict(
                ln.split(":", 1) for ln in Path(f"/proc/{entry}/status").read_text().splitlines() if ":" in ln
            )
        except OSError:
            continue
        if status.get("Uid", "").split()[:1] == [str(uid)] and not status.get("State", "").strip().startswith(
            ("Z", "X")
        ):
            out.append(int(entry))
    return out


def verdict(frames: list[dict], killed: str | None, stderr: str, n_cases: int) -> tuple[list[CaseResult], str | None]:
    """Per-case results and the infrastructure error (if the sandbox, not the program, failed)."""
    frames = [f for f in frames if type(f) is dict]
    final = next((f for f in frames if "cases" in f or "judge_error" in f), None)
    if final and "cases" in final and isinstance(final["cases"], list) and len(final["cases"]) == n_cases:
        return [_case(c) for c in final["cases"]], None
    setup = next((f["setup_error"] for f in frames if "setup_error" in f), None)
    if final or setup or not any(f.get("ready") for f in frames):
        why = (final or {}).get("judge_error") or setup or (stderr.strip().splitlines() or ["no output"])[-1]
        return [CaseResult(False, None, "sandbox failure")] * n_cases, f"the sandbox failed: {why}"[:500]
    reason, detail = {
        "timeout": ("timeout", "the wall-clock limit was reached"),
        "output": ("limit", "the output limit was exceeded"),
    }.get(killed or "", ("exit", "the test judge was stopped before it reported (killed by the program)"))
    return [CaseResult(False, reason, detail)] * n_cases, None


def _case(c: object) -> CaseResult:
    """One case of the judge's verdict; a reason outside REASONS (never sent by the judge) counts as "error"."""
    c = c if type(c) is dict else {}
    ok = c.get("ok") is True
    reason = None if ok else (c.get("reason") if c.get("reason") in REASONS else "error")
    return CaseResult(ok, reason, str(c.get("detail", ""))[:500])


def slot_cpu(slot: int) -> int | None:
    """The CPU a slot's run is pinned to: the slot's turn among the CPUs this process may use (so a pool no larger
    than that set gives every slot its own CPU; a larger pool shares them, and its slots can time each other);
    None where the affinity cannot be read.

    >>> slot_cpu(0) == min(os.sched_getaffinity(0))
    True
    """
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    return cpus[slot % len(cpus)] if cpus else None


def run_job(job: Job, limits: SandboxLimits, isolation: "Isolation", slot: int = 0) -> ExecResult:
    """Run `job` in the sandbox with `limits`; `slot` picks the sandbox uid (limits.uid + slot) when root."""
    start = time.monotonic()
    if job.wall_s is not None and job.wall_s < limits.wall_s:
        limits = replace(limits, wall_s=job.wall_s, cpu_s=min(limits.cpu_s, job.wall_s))
    uid = limits.uid + slot if isolation.uid_drop else None
    judge_uid = None if uid is None else uid + JUDGE_UID_OFFSET
    workdir = tempfile.mkdtemp(prefix="grpolab-sbx-")  # with a mount namespace, only the mount point of the run's root
    home = SANDBOX_HOME if isolation.mounts else workdir
    image = stdlib_image(limits.python or sys.executable) if isolation.mounts else None
    result_r, result_w = os.pipe()
    proc, finished = None, False
    try:
        if uid is not None:
            os.chown(workdir, uid, uid)
        cfg = {
            "result_fd": result_w,
            "program": job.program,
            "deadline_s": limits.wall_s,
            "cpu_s": limits.cpu_s,
            "rlimits": limits.rlimits(),
            "uid": uid,
            "judge_uid": judge_uid,
            "mounts": isolation.mounts,
            "workdir": workdir,
            "home": home,
            "disk_mb": limits.disk_mb,
            "max_files": limits.max_files,
            "cpu": slot_cpu(slot),
            "seccomp": isolation.seccomp,
            "image": image
            and {
                "zip_fd": image.zip_fd,
                "zip_path": image.zip_path,
                "zip_bytes": image.zip_bytes,
                "stdlib": image.stdlib,
                "files": list(image.files),
                "path": list(image.path),
            },
        }
        names, modules = bound_names(job.setup, tuple(job.cases), tuple(job.entry_points))
        data = frame(cfg) + frame({"setup": job.setup, "cases": list(job.cases), "names": names, "modules": modules})
        cmd = [*isolation.command(), *harness_command(limits.python or sys.executable)]
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env=sandbox_env(home),
            pass_fds=(result_w,) + ((image.zip_fd,) if image else ()),
            start_new_session=True,
        )
        os.close(result_w)
        result_w = -1
        streams = _Streams(proc, result_r, data, limits.max_output_kb * 1024)
        killed = _pump_until_done(streams, limits.wall_s + GRACE_S, start + SETUP_S, 16 * limits.max_output_kb * 1024)
        stdout, stderr = (bytes(streams.out[p.fileno()]).decode("utf-8", "replace") for p in (proc.stdout, proc.stderr))
        cases, infra = verdict(streams.frames, killed, stderr, len(job.cases))
        finished = killed is None and streams.done()
        streams.close()
        return ExecResult(cases, time.monotonic() - start, infra, stdout, stderr, streams.output_bytes, killed)
    except OSError as exc:
        return ExecResult(
            [CaseResult(False, None, "sandbox failure")] * len(job.cases),
            time.monotonic() - start,
            f"the sandbox failed: {type(exc).__name__}: {exc}",
        )
    finally:
        _cleanup(proc, isolation, (uid, judge_uid), workdir, [fd for fd in (result_r, result_w) if fd >= 0], finished)


def _pump_until_done(streams: _Streams, budget: float, setup_deadline: float, output_hard_cap: int) -> str | None:
    """Pump the streams until the verdict is in or the judge is gone; "timeout" / "output" when killed for it. The
    judge has until `setup_deadline` to be ready, then `budget` seconds from then (its limit and the grace)."""
    while not streams.done():
        deadline = setup_deadline if streams.ready_at is None else streams.ready_at + budget
        left = deadline - time.monotonic()
        if left <= 0:
            return "timeout"
        if streams.output_bytes > output_hard_cap:
            return "output"
        streams.pump(min(left, 0.25))
        if streams.proc.poll() is not None and not streams.done():
            streams.pump(0.0)  # read what is left once; then the judge is gone without a verdict
            if not streams.done():
                break
    return None


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _stop(proc: subprocess.Popen, isolation: "Isolation", finished: bool) -> None:
    """End the run's processes so that every one of them is reaped before the slot's uid is used again.

    A judge that reported exits by itself (and, as init of its PID namespace, takes every process there with it).
    Otherwise, with a PID namespace the judge is killed and `unshare` reaps it (killing `unshare` first would leave
    the judge to the host's init, whose late reaping keeps it counted against the sandbox uid's process limit);
    without one, the whole process group is killed before its leader is reaped (so the group id cannot be reused).
    """
    if finished:
        try:
            proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None and isolation.pid and isolation.unshare:
        for child in _children(proc.pid):
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass
        try:
            proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def _cleanup(
    proc: subprocess.Popen | None,
    isolation: "Isolation",
    uids: tuple,
    workdir: str,
    fds: list[int],
    finished: bool = False,
) -> None:
    """Stop the processes, kill the stragglers of the program's and the judge's uids without a PID namespace,
    close pipes, remove the working directory."""
    if proc is not None:
        _stop(proc, isolation, finished)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream and not stream.closed:
                try:
                    stream.close()
                except OSError:
                    pass
    for uid in uids:
        if uid is not None and not isolation.pid:
            kill_uid(uid)
    for fd in fds:
        os.close(fd)
    remove_workdir(workdir)


def remove_workdir(workdir: str, delays: tuple[float, ...] = (0.0, 0.05, 0.2, 0.5)) -> None:
    """Remove a run's host working directory, retried after each of `delays` (a straggler's last write racing the
    removal, a mount not yet gone); one still there after the last is warned of by path and error, never left
    silently."""
    error: OSError | None = None
    for delay in delays:
        time.sleep(delay)
        try:
            shutil.rmtree(workdir)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            error = exc
    warnings.warn(f"the sandbox could not remove its working directory {workdir}: {error}", RuntimeWarning)
