"""The wire between the sandbox's two processes, the test *judge* and the program *worker* (standard library only):
length-prefixed JSON frames and the value codec. grpolab.sandbox.harness holds the two processes.

Only values cross the boundary: exact built-in types (int, str, list, dict, ..., plus Counter, OrderedDict,
defaultdict and deque) travel as JSON; any other object stays in the worker behind an opaque handle (`Remote`)
that never equals a plain value and cannot be ordered or combined with one. Frames are a 4-byte big-endian length
and a JSON document. Everything either side needs is imported here, before any program runs: the judge imports
nothing of its own while it judges. A reply that cannot be read or rebuilt is a ProtocolError, whatever the reason
(bad JSON, nesting, an integer too large for a float).
"""

from __future__ import annotations

import base64
import builtins
import collections
import json
import math
import os
import select
import signal
import struct
import time

FRAME = struct.Struct(">I")
MAX_FRAME = 32 << 20  # a single message (a returned value, the program) larger than this is refused
MAX_DEPTH = 100  # nesting of a transferred value
BUILTIN_TYPES = {
    t.__name__: t
    for t in (int, float, str, bool, list, tuple, dict, set, frozenset, bytes, bytearray, complex, range, object)
}
CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGFPE}


class Deadline(BaseException):
    """The run's wall-clock budget is spent (raised by a wait of the judge's, or between two test cases)."""


class WorkerGone(Exception):
    """The worker died or closed its pipe; `reason` says how (exit, limit, error)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


class ProtocolError(Exception):
    """A malformed message from the worker."""


class OpaqueValue(TypeError):
    """A test used a program object that is not a plain value as if it were one."""


class RemoteError(Exception):
    """An exception raised by the program in the worker; ``remote_type`` is its class name, ``remote_errno`` the
    errno of an OSError."""

    remote_type = "Exception"
    remote_errno: int | None = None


# ----------------------------------------------------------------------------------------------- frames


def _wait(fd: int, write: bool, deadline: float | None) -> None:
    """Until `fd` is readable (or writable), its other end gone, or `deadline` passed (Deadline). With poll, not
    select: select cannot watch a descriptor numbered 1024 or more, and the result pipe keeps the number it had in
    a trainer holding that many files."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT if write else select.POLLIN)
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise Deadline()
        if poller.poll(None if left is None else math.ceil(left * 1000)):
            return


def read_exact(fd: int, n: int, deadline: float | None = None) -> bytes:
    """n bytes from fd (EOFError when the writer closed first)."""
    chunks, got = [], 0
    while got < n:
        _wait(fd, False, deadline)
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError()
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, deadline: float | None = None) -> object:
    size = FRAME.unpack(read_exact(fd, FRAME.size, deadline))[0]
    if size > MAX_FRAME:
        raise ProtocolError(f"message of {size} bytes exceeds the limit of {MAX_FRAME}")
    data = read_exact(fd, size, deadline)
    try:
        return json.loads(data)
    except Exception as exc:  # ValueError, RecursionError, MemoryError: a malformed message, whatever the cause
        raise ProtocolError(f"malformed message ({type(exc).__name__})") from None


def pack_frame(obj: object) -> bytes:
    """The bytes of one frame: length prefix + compact JSON (non-finite floats are refused: they are tagged).

    >>> pack_frame({"a": 1})
    b'\\x00\\x00\\x00\\x07{"a":1}'
    """
    body = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    return FRAME.pack(len(body)) + body


def write_frame(fd: int, obj: object, deadline: float | None = None) -> None:
    data = memoryview(pack_frame(obj))
    while data:
        _wait(fd, True, deadline)
        data = data[os.write(fd, data[: 1 << 16]) :]


# ----------------------------------------------------------------------------------------------- values

_COLLECTIONS = {"Counter": collections.Counter, "OrderedDict": collections.OrderedDict}


def encode(v: object, handle_of, depth: int = 0) -> object:
    """A value as JSON: exact built-in types by value (tagged where JSON is ambiguous), anything else through
    ``handle_of(v)`` (the worker's handle table; the judge refuses).

    >>> encode((1, [2.5, "x"], {None: True}), None)
    {'t': [1, [2.5, 'x'], {'d': [[None, True]]}]}
    >>> encode(float("nan"), None), encode(int, None)
    ({'f': 'nan'}, {'type': 'int'})
    """
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t, d = type(v), depth + 1
    if v is None or t is bool or t is int or t is str:
        return v
    if t is float:
        return v if math.isfinite(v) else {"f": repr(v)}
    if t is list:
        return [encode(x, handle_of, d) for x in v]
    if t in (tuple, set, frozenset):
        return {{tuple: "t", set: "s", frozenset: "fs"}[t]: [encode(x, handle_of, d) for x in v]}
    if t is dict or t in _COLLECTIONS.values():
        tag = "d" if t is dict else t.__name__
        return {tag: [[encode(k, handle_of, d), encode(x, handle_of, d)] for k, x in v.items()]}
    if t is collections.defaultdict and (
        v.default_factory is None or BUILTIN_TYPES.get(getattr(v.default_factory, "__name__", "")) is v.default_factory
    ):
        factory = None if v.default_factory is None else v.default_factory.__name__
        return {"defaultdict": [factory, [[encode(k, handle_of, d), encode(x, handle_of, d)] for k, x in v.items()]]}
    if t is collections.deque:
        return {"deque": [[encode(x, handle_of, d) for x in v], v.maxlen]}
    if t in (bytes, bytearray):
        return {"b" if t is bytes else "ba": base64.b64encode(v).decode()}
    if t is complex:
        return {"c": [encode(v.real, None), encode(v.imag, None)]}
    if t is range:
        return {"r": [v.start, v.stop, v.step]}
    if t is type and BUILTIN_TYPES.get(v.__name__) is v:
        return {"type": v.__name__}
    if handle_of is None:
        raise OpaqueValue(f"a {t.__name__} object cannot be passed to or from the program")
    return handle_of(v)


def _pairs(x: object, resolve, depth: int) -> list[tuple[object, object]]:
    if type(x) is not list or any(type(p) is not list or len(p) != 2 for p in x):
        raise ProtocolError("malformed mapping")
    return [(decode(k, resolve, depth), decode(v, resolve, depth)) for k, v in x]


def decode(x: object, resolve, depth: int = 0) -> object:
    """The value a JSON encoding stands for; ``resolve(handle_id)`` gives the object behind a handle.

    >>> decode({"t": [1, {"s": [2]}, {"f": "-inf"}]}, None)
    (1, {2}, -inf)
    """
    if depth > MAX_DEPTH:
        raise ProtocolError("value nested too deeply")
    t, d = type(x), depth + 1
    if x is None or t in (bool, int, float, str):
        return x
    if t is list:
        return [decode(v, resolve, d) for v in x]
    if t is not dict or len(x) != 1:
        raise ProtocolError("malformed value")
    ((tag, v),) = x.items()
    try:
        return _decode_tag(tag, v, resolve, d)
    except ProtocolError:
        raise
    except Exception as exc:  # TypeError, OverflowError, RecursionError, ...: the sender's value is malformed
        raise ProtocolError(f"malformed {str(tag)[:20]!r} value ({type(exc).__name__})") from None


def _decode_tag(tag: str, v: object, resolve, d: int) -> object:
    items = (lambda: [decode(e, resolve, d) for e in v]) if type(v) is list else None
    if tag == "f" and v in ("nan", "inf", "-inf"):
        return float(v)
    if tag == "t" and items:
        return tuple(items())
    if tag in ("s", "fs") and items:
        return rebuild_set(items(), set if tag == "s" else frozenset)
    if tag == "d":
        return dict(_pairs(v, resolve, d))
    if tag in _COLLECTIONS:
        return _COLLECTIONS[tag](dict(_pairs(v, resolve, d)))
    if tag == "defaultdict" and type(v) is list and len(v) == 2:
        factory = None if v[0] is None else BUILTIN_TYPES[v[0]]
        return collections.defaultdict(factory, _pairs(v[1], resolve, d))
    if tag == "deque" and type(v) is list and len(v) == 2 and type(v[0]) is list:
        return collections.deque([decode(e, resolve, d) for e in v[0]], v[1])
    if tag in ("b", "ba") and type(v) is str:
        raw = base64.b64decode(v.encode(), validate=True)
        return raw if tag == "b" else bytearray(raw)
    if tag == "c" and type(v) is list and len(v) == 2:
        return complex(decode(v[0], None, d), decode(v[1], None, d))
    if tag == "r" and type(v) is list and len(v) == 3 and all(type(e) is int for e in v):
        return range(*v)
    if tag == "type":
        return BUILTIN_TYPES[v]
    if tag == "h" and resolve is not None and type(v) is int:
        return resolve(v)
    raise ProtocolError(f"unknown tag {tag!r}")


def rebuild_set(items: list, kind: type) -> object:
    """A set (or frozenset) of `items` that iterates in the order they were sent, where one of the usual ways of
    building a set gives that order (a set's order depends on how it was built: a literal ``{12, 13, 14, 15, 16}``
    iterates 16 first, ``set([12, ..., 16])`` does not). Code that depends on a set's order then sees the same
    order on both sides of the wire.

    >>> list(rebuild_set([16, 12, 13, 14, 15], set))
    [16, 12, 13, 14, 15]
    """
    first = None
    for make in (
        lambda: kind(items),
        lambda: kind(set(items)),
        lambda: kind(set(set(items))),
        lambda: kind(frozenset(items)),
    ):
        candidate = make()
        if list(candidate) == items:
            return candidate
        first = first if first is not None else candidate
    return first


# ----------------------------------------------------------------------------------------------- judge side


class Remote:
    """An object that stays in the worker. Calls, attributes, len/bool/str and iteration go there; it never
    equals a plain value and cannot be ordered or combined with one (that would show the worker an expected
    value). Two handles compare in the worker."""

    __slots__ = ("_rid", "_conn")

    def __init__(self, rid: int, conn: "Conn"):
        object.__setattr__(self, "_rid", rid)
        object.__setattr__(self, "_conn", conn)

    def _ask(self, op: str, *args, **kwargs):
        return self._conn.request(op, self._rid, *args, **kwargs)

    def __call__(self, *args, **kwargs):
        return self._ask("call", *args, **kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name)

    def __setattr__(self, name: str, value) -> None:
        self._ask("setattr", name, value)

    def __getitem__(self, key):
        return self._ask("getitem", key)

    def __iter__(self):
        return iter(self._ask("list"))

    def __contains__(self, item) -> bool:
        return item in self._ask("list")

    def __len__(self) -> int:
        return _exact(self._ask("len"), int)

    def __bool__(self) -> bool:
        return _exact(self._ask("bool"), bool)

    def __str__(self) -> str:
        return _exact(self._ask("str"), str)

    def __repr__(self) -> str:
        return _exact(self._ask("repr"), str)

    def __hash__(self) -> int:
        return hash(("remote", self._rid))

    def __eq__(self, other):
        return self._ask("eq", other) if isinstance(other, Remote) else False

    def __ne__(self, other):
        return not self.__eq__(other)

    def _order(self, op: str, other):
        if not isinstance(other, Remote):
            raise OpaqueValue("a value the program returned is not a plain value (int, str, list, ...)")
        return self._ask(op, other)

    __lt__ = lambda s, o: s._order("lt", o)  # noqa: E731
    __le__ = lambda s, o: s._order("le", o)  # noqa: E731
    __gt__ = lambda s, o: s._order("gt", o)  # noqa: E731
    __ge__ = lambda s, o: s._order("ge", o)  # noqa: E731


def _exact(value, kind):
    if type(value) is not kind:
        raise OpaqueValue(f"expected {kind.__name__} from the program, got a non-plain value")
    return value


_REMOTE_CLASSES: dict[str, type] = {}


def remote_exception(name: object, message: object) -> RemoteError:
    """An exception standing for one the program raised: a RemoteError that is also the built-in exception class
    of that name (so a test's ``except ValueError`` still works). StopIteration and StopAsyncIteration become
    RuntimeErrors, as inside a generator (PEP 479): raised from a call in ``map``/``filter`` they would end the test's
    iteration silently and let ``all(map(f, ...))`` pass."""
    name = name if type(name) is str else "Exception"
    cls = _REMOTE_CLASSES.get(name)
    if cls is None:
        base = RuntimeError if name in ("StopIteration", "StopAsyncIteration") else getattr(builtins, name, None)
        bases = (RemoteError,)
        if isinstance(base, type) and issubclass(base, Exception) and base is not Exception:
            bases = (RemoteError, base)
        try:
            cls = type(f"Remote{name}", bases, {"remote_type": name})
        except TypeError:
            cls = type(f"Remote{name}", (RemoteError,), {"remote_type": name})
        _REMOTE_CLASSES[name] = cls
    exc = cls(str(message)[:300] if type(message) is str else "")
    return exc


class Conn:
    """The judge's end of the request pipes to the worker."""

    def __init__(self, rfd: int, wfd: int, pid: int, deadline: float):
        self.rfd, self.wfd, self.pid, self.deadline = rfd, wfd, pid, deadline
        self.gone: WorkerGone | None = None

    def reply(self) -> object:
        if self.gone:
            raise self.gone
        try:
            return read_frame(self.rfd, self.deadline)
        except (EOFError, OSError):
            self.gone = worker_gone(self.pid)
            raise self.gone from None

    def request(self, op: str, rid: int, *args, **kwargs):
        if self.gone:
            raise self.gone
        msg = {
            "op": op,
            "h": rid,
            "a": [encode(a, _handle_id) for a in args],
            "k": {k: encode(v, _handle_id) for k, v in kwargs.items()},
        }
        try:
            write_frame(self.wfd, msg, self.deadline)
        except OSError:
            self.gone = worker_gone(self.pid)
            raise self.gone from None
        out = self.reply()
        if type(out) is not dict:
            raise ProtocolError("malformed reply")
        if "err" in out:
            err = out["err"] if type(out["err"]) is list and len(out["err"]) == 2 else ["Exception", ""]
            exc = remote_exception(*err)
            exc.remote_errno = out.get("errno") if type(out.get("errno")) is int else None
            raise exc
        if "ok" not in out:
            raise ProtocolError("malformed reply")
        return decode(out["ok"], lambda rid: Remote(rid, self))


def _handle_id(v: object) -> object:
    if isinstance(v, Remote):
        return {"h": object.__getattribute__(v, "_rid")}
    raise OpaqueValue(f"a {type(v).__name__} object cannot be passed to the program")


def worker_gone(pid: int) -> WorkerGone:
    """Why the worker is gone, from its exit status and CPU time (reaped here). A worker that merely closed its
    pipe and still runs is left for the end of the run (it has another uid: the judge cannot kill it; the PID
    namespace, or the runner, does)."""
    for _ in range(20):
        try:
            got, status, usage = os.wait4(pid, os.WNOHANG)
        except ChildProcessError:
            return WorkerGone("exit", "the program's process is gone")
        if got:
            break
        time.sleep(0.01)
    else:
        return WorkerGone("exit", "the program closed its connection to the tests")
    if os.WIFEXITED(status):
        return WorkerGone("exit", f"the program exited (status {os.WEXITSTATUS(status)}) before its tests finished")
    sig = os.WTERMSIG(status)
    if sig in (signal.SIGXCPU, signal.SIGXFSZ):
        return WorkerGone("limit", f"the program hit a limit ({signal.Signals(sig).name})")
    if sig == signal.SIGKILL and usage.ru_utime + usage.ru_stime >= CPU_LIMIT[0] > 0:
        return WorkerGone("limit", "the program hit its CPU-time limit")
    if sig in CRASH_SIGNALS:
        return WorkerGone("error", f"the program crashed ({signal.Signals(sig).name})")
    return WorkerGone("exit", f"the program was killed ({signal.Signals(sig).name})")


CPU_LIMIT = [0.0]
