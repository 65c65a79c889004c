"""The two processes inside the sandbox: the test *judge* and the program *worker* (standard library only).

The runner starts ``python -s -S -B -c "import sys; sys.path[:] = [<this directory>, <absolute entries>];
import harness; harness.main()"`` (no '' or other relative entry on the path, no site, no user site, an
environment built from scratch), so the compiled harness.py, confine.py and wire.py are loaded from
__pycache__ (no compile per program); importing this module has no side effects.

- The judge ignores every signal it can (it has no timer: its deadline bounds each wait, so no signal, whoever
  sends it, can raise inside it), reads frame 1 (limits, identities, the program) from stdin and, as root,
  builds the run's own root (grpolab.sandbox.confine: private copies of the files Python needs and one scratch
  tmpfs) and sets the rlimits. It forks the worker, which drops to the sandbox uid, then drops to a uid of its
  own (so the program cannot signal it or change its limits) and becomes non-dumpable. Only then does it read
  frame 2 (the tests and the names they may use) -- the worker's memory never held them.
- The worker drops to its uid (refusing to go on if it could write anything on the import path), restores the
  usual signal handling, closes stdin and every other descriptor but its two pipes however high its number
  (close_range), installs the system-call allow-list (grpolab.sandbox.seccomp), runs the program in a fresh
  namespace, reports the ids of its top-level names (nothing the program says about an object is believed), then
  answers requests (value, call, attribute, item, list, len, bool, str) until its pipe closes.
- The judge runs the trusted test code in a namespace of its own: builtins, the standard-library modules the
  tests read (its own imports, from an allowlist), and only the program names the tests ask for (the problem's
  entry points and the names no one else defines), each as a value or a proxy (wire.Remote). It compares the
  values itself and writes one result frame -- per test case ``ok`` and a reason -- to the result pipe, which
  the worker has no descriptor for. Every assert of a test runs whatever the earlier ones returned (a failure
  is recorded, not raised), so the calls the judge makes tell the program nothing about its answers. Whatever
  the program sends or does is at worst that program's 0 with a reason.
"""

from __future__ import annotations

import ast
import builtins
import errno
import operator
import os
import signal
import sys
import time

try:
    from .confine import close_inherited, drop, install_seccomp, prepare, writable_import_paths
    from .wire import (
        CPU_LIMIT,
        Conn,
        Deadline,
        OpaqueValue,
        ProtocolError,
        RemoteError,
        WorkerGone,
        decode,
        encode,
        read_frame,
        write_frame,
    )
except ImportError:  # started by the runner as a top-level module
    from confine import close_inherited, drop, install_seccomp, prepare, writable_import_paths  # type: ignore
    from wire import (  # type: ignore
        CPU_LIMIT,
        Conn,
        Deadline,
        OpaqueValue,
        ProtocolError,
        RemoteError,
        WorkerGone,
        decode,
        encode,
        read_frame,
        write_frame,
    )

# an OSError with one of these errnos means the program ran into a limit (file size, open files, processes,
# disk, memory), not that it is wrong
LIMIT_ERRNOS = {errno.EFBIG, errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOSPC, errno.ENOMEM}
LOAD_REASONS = ("syntax", "error", "limit", "exit")
# what a call refused by the worker's system-call filter returns (grpolab.sandbox.seccomp), said in the detail
REFUSED_NOTE = " (ENOSYS: a system call outside the sandbox's allow-list, docs/code.md)"
OPS = {
    "value": lambda o: o,
    "call": lambda o, *a, **k: o(*a, **k),
    "getattr": getattr,
    "setattr": setattr,
    "getitem": operator.getitem,
    "list": list,
    "len": len,
    "bool": bool,
    "str": str,
    "repr": repr,
    "eq": operator.eq,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
}
# the judge ignores every signal it can (it has no timer: its deadline is a bound on each wait): SIGKILL and
# SIGSTOP cannot be ignored (and cannot reach it from the program: another uid, or init of its PID namespace),
# SIGCHLD's default is already to ignore (and keeps wait4 working)
JUDGE_SIGNALS = sorted(set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD})
FAILED = "__grpolab_failed__"  # the judge's record of a failed assert (bound in the tests' namespace only)


class SandboxFailure(Exception):
    """The worker could not be set up (no verdict on the program)."""


# ----------------------------------------------------------------------------------------------- worker


def _text(exc: BaseException) -> str:
    try:
        text = str(exc)
    except BaseException:
        return ""
    return text[:300] if type(text) is str else ""


def _refused(code: object) -> str:
    """The note for a failure with errno `code`: the filter's refusal named, so a sample's detail says why.

    >>> _refused(38).startswith(" (ENOSYS"), _refused(2)
    (True, '')
    """
    return REFUSED_NOTE if code == errno.ENOSYS else ""


def _load_detail(exc: BaseException) -> str:
    code = exc.errno if isinstance(exc, OSError) else None
    return f"{type(exc).__name__}: {_text(exc)}"[:300] + _refused(code)


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


def _worker_setup(cfg: dict, rfd: int, wfd: int, handlers: dict) -> None:
    """The worker before the program: its own uid (refused if it could write where the judge imports from), the
    usual signal handling back, nothing but its two pipes open, the seccomp filter."""
    drop(cfg.get("uid"))
    writable = writable_import_paths() if cfg.get("uid") is not None else []
    if writable:
        raise PermissionError(f"the sandbox user can write to the judge's import path: {writable}")
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    close_inherited({1, 2, rfd, wfd})  # everything else, however high: stdin, the result pipe, the judge's ends
    os.open(os.devnull, os.O_RDONLY)  # fd 0: input() reads EOF
    if cfg.get("seccomp"):
        install_seccomp()


def worker_main(cfg: dict, rfd: int, wfd: int, handlers: dict) -> None:
    """The program's process: set up (``_worker_setup``), the program loaded, the ids of its top-level names
    reported, then serve."""
    try:
        _worker_setup(cfg, rfd, wfd, handlers)
    except BaseException as exc:
        write_frame(wfd, {"worker_error": f"{type(exc).__name__}: {_text(exc)}"})
        return
    write_frame(wfd, {"started": True})  # before any code of the program runs
    handles: list = []
    try:
        code = compile(cfg["program"], "<solution>", "exec")
    except BaseException as exc:
        write_frame(wfd, {"load": {"reason": load_reason(exc, True), "detail": _load_detail(exc)}})
        return
    namespace = {"__name__": "solution", "__builtins__": builtins}
    try:
        exec(code, namespace)
    except BaseException as exc:
        write_frame(wfd, {"load": {"reason": load_reason(exc, False), "detail": _load_detail(exc)}})
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
        reason = {"MemoryError": "limit", "SystemExit": "exit", "KeyboardInterrupt": "exit"}.get(
            exc.remote_type, "error"
        )
        reason = "limit" if exc.remote_errno in LIMIT_ERRNOS else reason
        return reason, f"the program raised {exc.remote_type}: {_text(exc)}"[:300] + _refused(exc.remote_errno)
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
    return (reason if reason in LOAD_REASONS else "error"), (detail[:400] if type(detail) is str else "")


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


class _EveryAssert(ast.NodeTransformer):
    """``assert test, msg`` -> ``if not test: __grpolab_failed__(msg)``: the failure is recorded and the test goes
    on, so the judge makes the same calls whatever the program returned (no call-by-call feedback). A message
    that is not a constant is never evaluated (it would call the program only after a failure)."""

    def visit_Assert(self, node: ast.Assert) -> ast.If:
        msg = [node.msg] if isinstance(node.msg, ast.Constant) else []
        record = ast.Call(ast.Name(FAILED, ast.Load()), msg, [])
        return ast.copy_location(ast.If(ast.UnaryOp(ast.Not(), node.test), [ast.Expr(record)], []), node)


def compile_checks(source: str, name: str):
    """Trusted test code compiled with every assert recorded instead of raised (``_EveryAssert``).

    >>> ns = {FAILED: lambda *m: seen.append(m)}; seen = []
    >>> exec(compile_checks("assert 1 == 2, 'a'\\nassert 2 == 2\\nassert 0, str(3)", "<t>"), ns); seen
    [('a',), ()]
    """
    tree = ast.fix_missing_locations(_EveryAssert().visit(ast.parse(source, name, "exec")))
    return compile(tree, name, "exec")


def _failure(failed: list) -> dict:
    msg = failed[0]
    return {"ok": False, "reason": "wrong_answer", "detail": "assertion failed" + (f": {_text(msg)}" if msg else "")}


def run_cases(namespace: dict, setup, codes: list, results: list, deadline: float) -> None:
    """Run the setup, then each case not yet decided, appending one result per case: a case fails when any of
    its asserts failed (the first one is reported) or it raised. Deadline between cases and in every wait."""
    failed: list = []
    namespace[FAILED] = lambda msg=None: failed.append(msg if msg is None or type(msg) is str else _text(msg) or "")
    try:
        exec(setup, namespace)
        if failed:
            raise AssertionError(failed[0] or "")
    except (Deadline, WorkerGone):
        raise
    except BaseException as exc:
        reason, detail = classify(exc)
        results.extend([{"ok": False, "reason": reason, "detail": "test setup failed: " + detail}] * len(codes))
    for code in codes[len(results) :]:
        if time.monotonic() >= deadline:
            raise Deadline()
        failed.clear()
        t0 = time.monotonic()
        try:
            exec(code, namespace)
            results.append({"ok": True, "reason": None, "detail": ""} if not failed else _failure(failed))
        except (Deadline, WorkerGone):
            if failed:
                results.append(_failure(failed))
            raise
        except BaseException as exc:
            reason, detail = classify(exc)
            results.append(_failure(failed) if failed else {"ok": False, "reason": reason, "detail": detail})
        results[-1]["s"] = round(time.monotonic() - t0, 4)


def judge(conn: Conn, tests: dict, codes: list, setup, deadline: float) -> dict:
    """Run the setup and every case against the program behind `conn`; one result per case. Anything the
    program does or sends decides only its own results: every exception ends as that program's failure, but a
    worker that could not be set up (SandboxFailure: no verdict)."""
    results: list[dict] = []
    fill = lambda reason, detail: results.extend(
        [{"ok": False, "reason": reason, "detail": detail}] * (len(codes) - len(results))
    )  # noqa: E731
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
        run_cases(namespace_for_tests(conn, first["names"], tests), setup, codes, results, deadline)
    except SandboxFailure:
        raise
    except Deadline:
        fill("timeout", "the wall-clock limit was reached")
    except WorkerGone as gone:
        fill(gone.reason, _text(gone))
    except ProtocolError as exc:
        fill("error", f"malformed message from the program ({_text(exc)})")
    except BaseException as exc:  # a value that cannot be rebuilt here, memory: still only this program's failure
        fill("error", f"the program's reply could not be judged ({type(exc).__name__}: {_text(exc)})"[:300])
    return {"cases": results}


def run_judge(cfg: dict, start: float, handlers: dict) -> dict:
    """Fork the worker (still root: it drops to its own uid), drop to the judge's uid, read and compile the
    tests, judge; the outcome frame. Only a failure of the sandbox itself (fork, the drop, the tests) raises."""
    CPU_LIMIT[0] = float(cfg["cpu_s"])
    sys.set_int_max_str_digits(0)
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
    drop(cfg.get("judge_uid"))
    tests = read_frame(0)
    os.close(0)
    codes = [compile_checks(c, f"<test {i}>") for i, c in enumerate(tests["cases"])]
    setup = compile_checks(tests.get("setup") or "", "<test setup>")
    deadline = start + float(cfg["deadline_s"])
    try:
        outcome = judge(Conn(from_worker[0], to_worker[1], pid, deadline), tests, codes, setup, deadline)
    except SandboxFailure:
        raise
    except BaseException as exc:  # never the program's doing to make the sample invalid
        failure = {"ok": False, "reason": "error", "detail": f"{type(exc).__name__}: {_text(exc)}"[:300]}
        outcome = {"cases": [failure] * len(codes)}
    try:
        os.kill(pid, signal.SIGKILL)  # refused under another uid: then the run's end takes the worker
    except OSError:
        pass
    return outcome


def main() -> None:
    """The judge: ignore every signal, read the job, set up the sandbox, report ready, judge, report the outcome.
    The wall-clock limit counts from ready (the runner's own limit does too)."""
    handlers = {sig: signal.signal(sig, signal.SIG_IGN) for sig in JUDGE_SIGNALS}
    sys.path[:] = [p for p in sys.path if p.startswith("/") and p != os.path.dirname(os.path.abspath(__file__))]
    cfg = read_frame(0)
    result_fd = cfg["result_fd"]
    try:
        prepare(cfg)
    except BaseException as exc:
        write_frame(result_fd, {"setup_error": f"{type(exc).__name__}: {exc}"})
        os._exit(3)
    start = time.monotonic()
    write_frame(result_fd, {"ready": True})
    try:
        outcome = run_judge(cfg, start, handlers)
    except BaseException as exc:  # the sandbox itself failed (fork, the drop, broken test code): no verdict
        outcome = {"judge_error": f"{type(exc).__name__}: {exc}"}
    write_frame(result_fd, outcome)
    os._exit(0)


if __name__ == "__main__":
    main()
