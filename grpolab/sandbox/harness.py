"""The two processes inside the sandbox: the test *judge* and the program *worker* (standard library only).

The runner starts ``python -s -S -B -c "import sys; sys.path[:] = [<this directory>, <absolute entries>];
import harness; harness.main()"`` (no '' or other relative entry on the path, no site, no user site, an
environment built from scratch), so the compiled harness.py, confine.py and wire.py are loaded from
__pycache__ (no compile per program); importing this module has no side effects.

- The judge reads frame 1 (limits, identity, the program) from stdin and, as root, builds the run's own root
  (grpolab.sandbox.confine: an allowlist of read-only host directories and one scratch tmpfs), sets the
  rlimits, drops to the sandbox uid (refusing to go on if the program could write anything on its import
  path), makes itself non-dumpable, ignores every signal but its own timer's, and forks the worker. Only then
  does it read frame 2 (the tests and the names they may use) -- the worker's memory never held them.
- The worker restores the usual signal handling, closes stdin and every descriptor but its two pipes, installs
  the seccomp filter, runs the program in a fresh namespace, reports the ids of its top-level names (nothing
  the program says about an object is believed), then answers requests (value, call, attribute, item, list,
  len, bool, str) until its pipe closes.
- The judge runs the trusted test code in a namespace of its own: builtins, the standard-library modules the
  tests read (its own imports, from an allowlist), and only the program names the tests ask for (the problem's
  entry points and the names no one else defines), each as a value or a proxy (wire.Remote). It compares the
  values itself and writes one result frame -- per test case ``ok`` and a reason -- to the result pipe, which
  the worker has no descriptor for. Whatever the program sends is at worst that program's 0 with a reason.
"""

from __future__ import annotations

import builtins
import errno
import operator
import os
import signal
import sys
import time

try:
    from .confine import install_seccomp, setup_sandbox
    from .wire import (CPU_LIMIT, Conn, Deadline, OpaqueValue, ProtocolError, Remote, RemoteError, WorkerGone, decode,
                       encode, read_frame, write_frame)
except ImportError:  # started by the runner as a top-level module
    from confine import install_seccomp, setup_sandbox  # type: ignore
    from wire import (CPU_LIMIT, Conn, Deadline, OpaqueValue, ProtocolError, Remote, RemoteError,  # type: ignore
                      WorkerGone, decode, encode, read_frame, write_frame)

# an OSError with one of these errnos means the program ran into a limit (file size, open files, processes,
# disk, memory), not that it is wrong
LIMIT_ERRNOS = {errno.EFBIG, errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOSPC, errno.ENOMEM}
LOAD_REASONS = ("syntax", "error", "limit", "exit")
OPS = {
    "value": lambda o: o, "call": lambda o, *a, **k: o(*a, **k), "getattr": getattr, "setattr": setattr,
    "getitem": operator.getitem, "list": list, "len": len, "bool": bool, "str": str, "repr": repr, "eq": operator.eq,
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
}
# the judge ignores every signal it can but its own timer's (the program may send any): SIGKILL and SIGSTOP
# cannot be ignored, SIGCHLD's default is already to ignore
JUDGE_SIGNALS = sorted(set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP, signal.SIGALRM, signal.SIGCHLD})


class SandboxFailure(Exception):
    """The worker could not be set up (no verdict on the program)."""


# ----------------------------------------------------------------------------------------------- worker


def _text(exc: BaseException) -> str:
    try:
        text = str(exc)
    except BaseException:
        return ""
    return text[:300] if type(text) is str else ""


def load_reason(exc: BaseException, compiling: bool) -> str:
    """The reason a program failed before its tests: syntax, exit, limit or error.

    >>> load_reason(SyntaxError("x"), True), load_reason(SystemExit(0), False), load_reason(MemoryError(), False)
    ('syntax', 'exit', 'limit')
    """
    if compiling and isinstance(exc, (SyntaxError, ValueError)):
        return "syntax"
    if isinstance(exc, (SystemExit, KeyboardInterrupt)):
        return "exit"
    if isinstance(exc, MemoryError) or isinstance(exc, OSError) and exc.errno in LIMIT_ERRNOS:
        return "limit"
    return "error"


def serve(rfd: int, wfd: int, handles: list) -> None:
    """Answer the judge's requests until its pipe closes."""
    def handle_of(v: object) -> dict:
        handles.append(v)
        return {"h": len(handles) - 1}

    def resolve(rid: int) -> object:
        if not 0 <= rid < len(handles):
            raise KeyError(rid)
        return handles[rid]

    while True:
        try:
            req = read_frame(rfd)
        except (EOFError, ProtocolError, OSError):
            return
        try:
            fn, obj = OPS[req["op"]], resolve(req["h"])
            args = [decode(a, resolve) for a in req["a"]]
            kwargs = {k: decode(v, resolve) for k, v in req["k"].items()}
            out = {"ok": encode(fn(obj, *args, **kwargs), handle_of)}
        except BaseException as exc:  # the program's own exception, reported by class name (and errno)
            code = exc.errno if isinstance(exc, OSError) and type(exc.errno) is int else None
            out = {"err": [type(exc).__name__, _text(exc)], "errno": code}
        try:
            write_frame(wfd, out)
        except BaseException:
            return


def worker_main(cfg: dict, rfd: int, wfd: int, handlers: dict) -> None:
    """The program's process: the usual signal handling back (`handlers`), nothing but its two pipes open, the
    seccomp filter, the program loaded, the ids of its top-level names reported, then serve."""
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    previous = -1
    for fd in sorted({1, 2, rfd, wfd}) + [4096]:  # close everything else: stdin, the result pipe, the judge's ends
        os.closerange(previous + 1, fd)
        previous = fd
    try:
        os.open(os.devnull, os.O_RDONLY)  # fd 0: input() reads EOF
        if cfg.get("seccomp"):
            install_seccomp()
    except BaseException as exc:
        write_frame(wfd, {"worker_error": f"{type(exc).__name__}: {_text(exc)}"})
        return
    write_frame(wfd, {"started": True})  # before any code of the program runs
    handles: list = []
    try:
        code = compile(cfg["program"], "<solution>", "exec")
    except BaseException as exc:
        write_frame(wfd, {"load": {"reason": load_reason(exc, True), "detail": f"{type(exc).__name__}: {_text(exc)}"}})
        return
    namespace = {"__name__": "solution", "__builtins__": builtins}
    try:
        exec(code, namespace)
    except BaseException as exc:
        write_frame(wfd, {"load": {"reason": load_reason(exc, False), "detail": f"{type(exc).__name__}: {_text(exc)}"}})
        return
    names = {}
    for key, value in list(namespace.items()):
        if type(key) is str and not key.startswith("__"):
            handles.append(value)
            names[key] = len(handles) - 1
    write_frame(wfd, {"names": names})
    serve(rfd, wfd, handles)


# ----------------------------------------------------------------------------------------------- judge


def classify(exc: BaseException) -> tuple[str, str]:
    """(reason, detail) of a failed test case.

    >>> classify(AssertionError())[0], classify(NameError("f"))[0]
    ('wrong_answer', 'error')
    """
    if isinstance(exc, RemoteError):
        reason = {"MemoryError": "limit", "SystemExit": "exit", "KeyboardInterrupt": "exit"}.get(exc.remote_type, "error")
        reason = "limit" if exc.remote_errno in LIMIT_ERRNOS else reason
        return reason, f"the program raised {exc.remote_type}: {_text(exc)}"[:300]
    if isinstance(exc, OpaqueValue):
        return "wrong_answer", _text(exc)
    if isinstance(exc, AssertionError):
        return "wrong_answer", "assertion failed" + (f": {_text(exc)}" if _text(exc) else "")
    if isinstance(exc, WorkerGone):
        return exc.reason, _text(exc)
    if isinstance(exc, ProtocolError):
        return "error", f"malformed reply from the program ({_text(exc)})"
    return "error", f"{type(exc).__name__}: {_text(exc)}"[:300]


def load_failure(load: object) -> tuple[str, str]:
    """(reason, detail) of a program that failed before its tests, from the worker's message: only a known
    reason and a short text are taken from it."""
    load = load if type(load) is dict else {}
    reason, detail = load.get("reason"), load.get("detail")
    return (reason if reason in LOAD_REASONS else "error"), (detail[:300] if type(detail) is str else "")


def namespace_for_tests(conn: Conn, ids: object, tests: dict) -> dict:
    """The namespace the tests run in: builtins, the allowed standard-library modules they read (the judge's
    own), the program names they may use (``tests["names"]``; each a value or a Remote) and
    ``__solution__(name)`` for any other program name the tests ask for explicitly. Nothing else of the program."""
    if type(ids) is not dict or any(type(k) is not str or type(v) is not int for k, v in ids.items()):
        raise ProtocolError("malformed list of names")

    def solution(name: str) -> object:
        if name not in ids:
            raise NameError(f"the program does not define {name!r}")
        return conn.request("value", ids[name])

    namespace = {"__name__": "__test__", "__builtins__": builtins, "__solution__": solution}
    for module in tests.get("modules") or ():
        namespace[module] = __import__(module)
    for name in tests.get("names") or ():
        if name in ids:
            namespace[name] = solution(name)
    return namespace


def run_cases(namespace: dict, setup, codes: list, results: list) -> None:
    """Run the setup, then each case not yet decided, appending one result per case."""
    try:
        exec(setup, namespace)
    except (Deadline, WorkerGone):
        raise
    except BaseException as exc:
        reason, detail = classify(exc)
        results.extend([{"ok": False, "reason": reason, "detail": "test setup failed: " + detail}] * len(codes))
    for code in codes[len(results):]:
        t0 = time.monotonic()
        try:
            exec(code, namespace)
            results.append({"ok": True, "reason": None, "detail": "", "s": round(time.monotonic() - t0, 4)})
        except (Deadline, WorkerGone):
            raise
        except BaseException as exc:
            reason, detail = classify(exc)
            results.append({"ok": False, "reason": reason, "detail": detail, "s": round(time.monotonic() - t0, 4)})


def judge(conn: Conn, tests: dict) -> dict:
    """Run the setup and every case of `tests` against the program behind `conn`; one result per case. The
    tests are compiled first (broken tests are the judge's failure); from then on anything the program does or
    sends decides only its own results."""
    codes = [compile(c, f"<test {i}>", "exec") for i, c in enumerate(tests["cases"])]
    setup = compile(tests.get("setup") or "", "<test setup>", "exec")
    results: list[dict] = []
    fill = lambda reason, detail: results.extend([{"ok": False, "reason": reason, "detail": detail}] * (len(codes) - len(results)))  # noqa: E731
    try:
        started = conn.reply()
        if type(started) is not dict or not started.get("started"):
            raise SandboxFailure(f"the program's process could not be set up: {started}"[:300])
        first = conn.reply()
        if type(first) is dict and "load" in first:
            fill(*load_failure(first["load"]))
            return {"cases": results}
        if type(first) is not dict or "names" not in first:
            raise ProtocolError("malformed load message")
        run_cases(namespace_for_tests(conn, first["names"], tests), setup, codes, results)
    except SandboxFailure:
        raise
    except Deadline:
        fill("timeout", "the wall-clock limit was reached")
    except WorkerGone as gone:
        fill(gone.reason, _text(gone))
    except ProtocolError as exc:
        fill("error", f"malformed message from the program ({_text(exc)})")
    except Exception as exc:  # e.g. a value that cannot be rebuilt here: still only this program's failure
        fill("error", f"the program's reply could not be judged ({type(exc).__name__}: {_text(exc)})"[:300])
    return {"cases": results}


def _on_alarm(signum, frame):
    """The judge's timer: Deadline once the deadline has passed; an early SIGALRM (sent by anyone else) re-arms
    the timer for the time left and is otherwise ignored."""
    left = DEADLINE[0] - time.monotonic()
    if left > 0:
        signal.setitimer(signal.ITIMER_REAL, max(0.001, left))
        return
    raise Deadline()


DEADLINE = [0.0]


def run_judge(cfg: dict, start: float) -> dict:
    """Ignore signals, fork the worker, read the tests, judge; the outcome frame (``judge_error`` when the sandbox
    itself failed)."""
    CPU_LIMIT[0] = float(cfg["cpu_s"])
    sys.set_int_max_str_digits(0)
    handlers = {sig: signal.signal(sig, signal.SIG_IGN) for sig in JUDGE_SIGNALS}
    to_worker, from_worker = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(to_worker[1])
            os.close(from_worker[0])
            worker_main(cfg, to_worker[0], from_worker[1], handlers)
        finally:
            os._exit(0)
    os.close(to_worker[0])
    os.close(from_worker[1])
    tests = read_frame(0)
    os.close(0)
    DEADLINE[0] = start + float(cfg["deadline_s"])
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(0.001, DEADLINE[0] - time.monotonic()))
    try:
        outcome = judge(Conn(from_worker[0], to_worker[1], pid, DEADLINE[0]), tests)
    except Deadline:
        outcome = {"cases": [{"ok": False, "reason": "timeout", "detail": "the wall-clock limit was reached"}] * len(tests["cases"])}
    signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    return outcome


def main() -> None:
    """The judge: read the job, set up the sandbox, report ready, judge, report the outcome."""
    start = time.monotonic()
    sys.path[:] = [p for p in sys.path if p.startswith("/") and p != os.path.dirname(os.path.abspath(__file__))]
    cfg = read_frame(0)
    result_fd = cfg["result_fd"]
    try:
        setup_sandbox(cfg)
    except BaseException as exc:
        write_frame(result_fd, {"setup_error": f"{type(exc).__name__}: {exc}"})
        os._exit(3)
    write_frame(result_fd, {"ready": True})
    try:
        outcome = run_judge(cfg, start)
    except BaseException as exc:  # the judge itself failed (fork refused, broken test code): no verdict
        signal.setitimer(signal.ITIMER_REAL, 0)
        outcome = {"judge_error": f"{type(exc).__name__}: {exc}"}
    write_frame(result_fd, outcome)
    os._exit(0)


if __name__ == "__main__":
    main()
