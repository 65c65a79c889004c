"""The two processes inside the sandbox: the test *judge* and the program *worker* (standard library only).

The runner starts ``python -S -B -c "import harness; harness.main()"`` with this directory first on sys.path, so
the compiled harness.py and wire.py are loaded from __pycache__ (no compile per program); importing this module
has no side effects.

- The judge reads frame 1 (limits, identity, the program) from stdin and, as root, mounts private tmpfs
  directories (working directory, /tmp, /var/tmp, /dev/shm; the interpreter's prefix made readable if a parent
  directory is closed to others), sets the rlimits, drops to the sandbox uid, makes itself non-dumpable and
  forks the worker. Only then does it read frame 2 (the tests) -- the worker's memory never held them.
- The worker closes stdin and every descriptor but its two pipes, refuses network sockets with a seccomp filter,
  runs the program in a fresh namespace, reports its top-level names, then answers requests (call, attribute,
  item, list, len, bool, str) until its pipe closes.
- The judge runs the trusted test code with the program's functions as proxies (wire.Remote), compares the
  values itself, and writes one result frame -- per test case ``ok`` and a reason -- to the result pipe, which
  the worker has no descriptor for.
"""

from __future__ import annotations

import builtins
import ctypes
import errno
import operator
import os
import resource
import signal
import sys
import time
import types

try:
    from .wire import (CPU_LIMIT, Conn, Deadline, OpaqueValue, ProtocolError, Remote, RemoteError, WorkerGone, decode,
                       encode, read_frame, resolve_global, write_frame)
except ImportError:  # started by the runner as a top-level module
    from wire import (CPU_LIMIT, Conn, Deadline, OpaqueValue, ProtocolError, Remote, RemoteError,  # type: ignore
                      WorkerGone, decode, encode, read_frame, resolve_global, write_frame)

MS_NOSUID, MS_NODEV, MS_BIND, MS_MOVE, MS_REC = 2, 4, 4096, 8192, 16384
PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 4, 38, 22, 2
# seccomp: (audit arch, socket, io_uring_setup) per machine; every other architecture gets no filter
SECCOMP_ARCH = {"x86_64": (0xC000003E, 41, 425), "aarch64": (0xC00000B7, 198, 425)}
# standard-library names the judge does not take from its own library but leaves in the worker (a handle)
RISKY_MODULES = {"os", "posix", "sys", "subprocess", "signal", "ctypes", "_ctypes", "shutil", "socket", "importlib",
                 "builtins", "gc", "inspect", "threading", "_thread", "multiprocessing", "resource", "pty", "code",
                 "io", "_io", "pathlib", "tempfile", "runpy", "pickle", "marshal"}
RISKY_BUILTINS = {"eval", "exec", "compile", "open", "input", "breakpoint", "globals", "locals", "vars", "getattr",
                  "setattr", "delattr", "exit", "quit", "help", "memoryview", "print", "super", "object", "type"}
# an OSError with one of these errnos means the program ran into a limit (file size, open files, processes,
# disk, memory), not that it is wrong
LIMIT_ERRNOS = {errno.EFBIG, errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOSPC, errno.ENOMEM}
OPS = {
    "call": lambda o, *a, **k: o(*a, **k), "getattr": getattr, "setattr": setattr, "getitem": operator.getitem,
    "list": list, "len": len, "bool": bool, "str": str, "repr": repr, "eq": operator.eq, "lt": operator.lt,
    "le": operator.le, "gt": operator.gt, "ge": operator.ge,
}


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_libc().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def prctl(option: int, arg: int, *rest: int) -> None:
    args = [ctypes.c_ulong(a) for a in (arg, *rest, 0, 0, 0)[:4]]
    _check(_libc().prctl(option, *args), f"prctl {option}")


def closed_to_others(path: str) -> str | None:
    """The top-most directory above `path` (or `path` itself) that others may not enter, else None."""
    current = "/"
    for part in [p for p in path.split("/") if p]:
        current = os.path.join(current, part)
        if not os.stat(current).st_mode & 0o001:
            return current
    return None


def expose_prefix(prefix: str) -> None:
    """Make the interpreter's prefix reachable for the sandbox user: a parent directory closed to others (e.g.
    /root) is covered by an empty tmpfs in which the path down to the prefix is recreated and the real prefix
    bind-mounted (mount namespace only; the host is untouched)."""
    blocked = closed_to_others(prefix)
    if blocked is None:
        return
    stage = "/tmp/.grpolab-prefix"
    os.mkdir(stage, 0o755)
    mount(prefix, stage, None, MS_BIND | MS_REC)
    mount("tmpfs", blocked, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    os.makedirs(prefix, 0o755, exist_ok=True)
    mount(stage, prefix, None, MS_MOVE)
    os.rmdir(stage)


def private_mounts(cfg: dict) -> None:
    """A size-limited tmpfs as the working directory (owned by the sandbox user) and over /tmp, /var/tmp,
    /dev/shm; files written there vanish with the mount namespace."""
    size, uid = f"size={int(cfg['disk_mb'])}m", cfg.get("uid")
    owner = f",uid={uid},gid={uid}" if uid is not None else ""
    mount("tmpfs", cfg["workdir"], "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=0700{owner}")
    os.chdir(cfg["workdir"])
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(d):
            mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=1777")
    os.umask(0o022)
    expose_prefix(os.path.realpath(sys.base_prefix))


def setup_sandbox(cfg: dict) -> None:
    """Mounts (as root in a mount namespace), rlimits, the drop to the sandbox uid, non-dumpable, no new privileges."""
    if cfg.get("mounts"):
        private_mounts(cfg)
    for name, (soft, hard) in cfg["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    uid = cfg.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    prctl(PR_SET_DUMPABLE, 0)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    os.umask(0o077)


def deny_network_sockets() -> bool:
    """A seccomp filter: socket(2) and io_uring_setup(2) fail with EACCES, as does any syscall of a foreign ABI
    (x32, i386). False where the machine has no known syscall table."""
    arch = SECCOMP_ARCH.get(os.uname().machine)
    if arch is None:
        return False
    audit, nr_socket, nr_io_uring = arch
    allow, deny = 0x7FFF0000, 0x00050000 | 13  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EACCES
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    program = [(ld, 0, 0, 4), (jeq, 1, 0, audit), (ret, 0, 0, deny), (ld, 0, 0, 0), (jge, 0, 1, 0x40000000),
               (ret, 0, 0, deny), (jeq, 2, 0, nr_socket), (jeq, 1, 0, nr_io_uring), (ret, 0, 0, allow),
               (ret, 0, 0, deny)]

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    filters = (Filter * len(program))(*[Filter(*insn) for insn in program])
    prog = Prog(len(program), filters)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    _check(_libc().prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(prog), 0, 0), "seccomp")
    return True


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


def describe(value: object, handles: list) -> dict:
    """A top-level name of the program: a plain value ({"v"}), or a handle ({"h"}) with the standard-library
    object it claims to be ({"std"}), which the judge may take from its own library instead."""
    try:
        return {"v": encode(value, None)}
    except (OpaqueValue, ValueError, RecursionError):
        pass
    handles.append(value)
    out: dict = {"h": len(handles) - 1}
    if isinstance(value, types.ModuleType):
        name = getattr(value, "__name__", None)
        if type(name) is str:
            out["std"] = {"mod": name}
    else:
        mod, qual = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
        if type(mod) is str and type(qual) is str:
            out["std"] = {"glob": [mod, qual]}
    return out


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


def worker_main(cfg: dict, rfd: int, wfd: int) -> None:
    """The program's process: nothing but its two pipes open, sockets refused, program loaded, then serve."""
    previous = -1
    for fd in sorted({1, 2, rfd, wfd}) + [4096]:  # close everything else: stdin, the result pipe, the judge's ends
        os.closerange(previous + 1, fd)
        previous = fd
    try:
        os.open(os.devnull, os.O_RDONLY)  # fd 0: input() reads EOF
        if cfg.get("seccomp"):
            deny_network_sockets()
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
    names = {k: describe(v, handles) for k, v in list(namespace.items()) if type(k) is str and not k.startswith("__")}
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


def bind(desc: object, conn: Conn) -> object:
    """The judge's binding of one program name: a value, the judge's own standard-library object, or a Remote."""
    if type(desc) is not dict:
        raise ProtocolError("malformed name")
    if "v" in desc:
        return decode(desc["v"], None)
    std = desc.get("std")
    if type(std) is dict:
        mod = std.get("mod") or (std.get("glob") or [""])[0]
        name = (std.get("glob") or ["", ""])[1] if "glob" in std else ""
        top = mod.split(".")[0] if type(mod) is str else ""
        if top not in RISKY_MODULES and not (top == "builtins" and name in RISKY_BUILTINS):
            try:
                return resolve_global(std)
            except Exception:
                pass
    if type(desc.get("h")) is not int:
        raise ProtocolError("malformed name")
    return Remote(desc["h"], conn)


def judge(conn: Conn, tests: dict) -> dict:
    """Run the setup and every case of `tests` against the program behind `conn`; one result per case."""
    cases = tests["cases"]
    codes = [compile(c, f"<test {i}>", "exec") for i, c in enumerate(cases)]
    setup = compile(tests.get("setup") or "", "<test setup>", "exec")
    results: list[dict] = []
    fill = lambda reason, detail: results.extend([{"ok": False, "reason": reason, "detail": detail}] * (len(codes) - len(results)))  # noqa: E731
    try:
        started = conn.reply()
        if type(started) is not dict or not started.get("started"):
            raise RuntimeError(f"the program's process could not be set up: {started}"[:300])
        first = conn.reply()
        if type(first) is dict and type(first.get("load")) is dict:
            load = first["load"]
            fill(str(load.get("reason", "error")), str(load.get("detail", ""))[:300])
            return {"cases": results, "load": load}
        if type(first) is not dict or type(first.get("names")) is not dict:
            raise ProtocolError("malformed load message")
        names = {k: bind(v, conn) for k, v in first["names"].items()}
        handles = {k: v for k, v in names.items() if isinstance(v, Remote)}

        def solution(name: str) -> object:
            if name not in handles:
                raise NameError(f"the program does not define {name!r}")
            return handles[name]

        namespace = {"__name__": "__test__", "__builtins__": builtins, **names, "__solution__": solution}
        try:
            exec(setup, namespace)
        except (Deadline, WorkerGone):
            raise
        except BaseException as exc:
            reason, detail = classify(exc)
            fill(reason, "test setup failed: " + detail)
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
    except Deadline:
        fill("timeout", "the wall-clock limit was reached")
    except WorkerGone as gone:
        fill(gone.reason, _text(gone))
    except ProtocolError as exc:
        fill("error", f"malformed message from the program ({_text(exc)})")
    return {"cases": results}


def _on_alarm(signum, frame):
    raise Deadline()


def run_judge(cfg: dict, start: float) -> dict:
    """Fork the worker, read the tests, judge; the outcome frame (``judge_error`` when the sandbox itself failed)."""
    CPU_LIMIT[0] = float(cfg["cpu_s"])
    sys.set_int_max_str_digits(0)
    to_worker, from_worker = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(to_worker[1])
            os.close(from_worker[0])
            worker_main(cfg, to_worker[0], from_worker[1])
        finally:
            os._exit(0)
    os.close(to_worker[0])
    os.close(from_worker[1])
    tests = read_frame(0)
    os.close(0)
    deadline = start + float(cfg["deadline_s"])
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(0.001, deadline - time.monotonic()))
    try:
        outcome = judge(Conn(from_worker[0], to_worker[1], pid, deadline), tests)
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
    sys.path[:] = [p for p in sys.path if p != os.path.dirname(os.path.abspath(__file__))]
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
