"""Tools an environment exposes: the call syntax and its parser, the safe calculator, and the killable worker
process tools run in.

Call syntax (one per model turn; docs/agents.md): ``<tool>name(argument text)</tool>``. The first call in a turn
is run; a ``<tool>`` without a well-formed ``name(...)</tool>``, or an unknown name, is a *malformed* call, answered
with an error observation (the episode goes on). A tool signals a mistake of the model (bad expression) by raising
``ToolError``: also an error observation. Any other exception, a return that is not text or a number, or running
past the time limit is a bug of the tool: the episode is invalid with the reason.

Tools run in a separate worker process (forked once, reused), so a tool that hangs is killed (SIGKILL) at its
time limit and the next call gets a fresh worker -- a thread could only be abandoned, still spinning.
"""

from __future__ import annotations

import ast
import math
import multiprocessing
import operator
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable

TOOL_CALL = re.compile(r"<tool>(.*?)</tool>", re.DOTALL)
CALL_BODY = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\((.*)\)\s*$", re.DOTALL)
MAX_OBSERVATION_CHARS = 1000  # a longer tool result is cut (and says so)


class ToolError(Exception):
    """Raised by a tool for a mistake of the caller (the model): answered with an error observation."""


class ToolFailure(Exception):
    """A tool raised something else, returned garbage, or ran past its time limit: the episode is invalid."""


@dataclass(frozen=True)
class Tool:
    """name: what the model writes; description: one line shown to the model; fn(argument: str) -> str | number."""

    name: str
    description: str
    fn: Callable[[str], Any]


@dataclass(frozen=True)
class ToolCall:
    """A parsed call: name and argument, or error (why it is malformed) with name/argument None."""

    name: str | None
    argument: str | None
    error: str | None = None


def parse_tool_call(text: str, known: set[str] | frozenset[str]) -> ToolCall | None:
    """The first tool call in a model turn; None when the turn has no ``<tool>`` at all (it is an action for the
    environment).

    >>> parse_tool_call("<tool>calculator(2+3)</tool>", {"calculator"})
    ToolCall(name='calculator', argument='2+3', error=None)
    >>> parse_tool_call("so <tool>calc 2+3</tool>", {"calculator"}).error
    "malformed tool call 'calc 2+3': expected <tool>name(argument)</tool>"
    >>> parse_tool_call("the answer is 5", {"calculator"}) is None
    True
    """
    if "<tool>" not in text:
        return None
    match = TOOL_CALL.search(text)
    if match is None:
        return ToolCall(None, None, "malformed tool call: <tool> without </tool>")
    body = CALL_BODY.match(match.group(1))
    if body is None:
        return ToolCall(
            None, None, f"malformed tool call {match.group(1)[:60]!r}: expected <tool>name(argument)</tool>"
        )
    name, argument = body.group(1), body.group(2).strip()
    if name not in known:
        return ToolCall(None, None, f"unknown tool {name!r}; available: {', '.join(sorted(known))}")
    return ToolCall(name, argument)


def tool_instructions(tools: list[Tool]) -> str:
    """The lines appended to the first observation that tell the model how to call the tools."""
    lines = [
        "You can use these tools. To call one, write <tool>name(argument)</tool> and stop; the result comes back "
        "in the next message."
    ]
    lines += [f"- {t.name}: {t.description}" for t in tools]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ calculator

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_MAGNITUDE = 1e15


def _eval_node(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval_node(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 1e6):
            raise ToolError("exponent too large")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ToolError("division by zero")
        value = _BINARY[type(node.op)](left, right)
        if isinstance(value, complex) or abs(value) > MAX_MAGNITUDE:
            raise ToolError("result out of range")
        return value
    raise ToolError(f"not allowed in an expression: {type(node).__name__}")


def calculate(expression: str) -> str:
    """The safe calculator: numbers, + - * / // % ** and parentheses, parsed with ``ast`` (never ``eval``);
    anything else raises ToolError. Whole results print without a decimal point.

    >>> calculate("23 * 17 - 5"), calculate("7 / 2"), calculate("(1+2)**3")
    ('386', '3.5', '27')
    >>> calculate("__import__('os')")
    Traceback (most recent call last):
    grpolab.agents.tools.ToolError: not allowed in an expression: Call
    """
    text = expression.strip().replace("×", "*").replace("÷", "/")
    if len(text) > 200:
        raise ToolError("expression longer than 200 characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ToolError(f"cannot parse {text[:60]!r}") from None
    value = _eval_node(tree.body)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ToolError("result out of range")
        return str(int(value)) if value.is_integer() else f"{value:.6g}"
    return str(value)


CALCULATOR = Tool(
    "calculator",
    "calculator(expression) evaluates an arithmetic expression with + - * / and "
    "parentheses, e.g. <tool>calculator(12*(3+4))</tool>",
    calculate,
)


# ------------------------------------------------------------------------------------------------ worker process

_TABLE: dict[str, Callable[[str], Any]] = {}  # tool key -> function; a worker knows the keys present when forked


def _serve(conn) -> None:
    """The worker: (key, argument) in, (kind, text) out; kind ok | tool_error | failure."""
    while True:
        try:
            key, argument = conn.recv()
        except EOFError:
            return
        try:
            value = _TABLE[key](argument)
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                out = ("failure", f"returned {type(value).__name__}, expected text or a number")
            else:
                out = ("ok", str(value))
        except ToolError as exc:
            out = ("tool_error", str(exc))
        except BaseException as exc:  # noqa: BLE001 -- reported to the episode, which becomes invalid
            out = ("failure", f"{type(exc).__name__}: {exc}")
        conn.send(out)


class ToolWorker:
    """One forked worker process running tool calls one at a time; killed and replaced when a call runs past its
    time limit or when a tool was registered after it was forked."""

    def __init__(self) -> None:
        self.process = None
        self.conn = None
        self.known: set[str] = set()
        self.lock = threading.Lock()

    def _start(self) -> None:
        ctx = multiprocessing.get_context("fork")
        parent, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child,), daemon=True, name="grpolab-tools")
        self.process.start()
        child.close()
        self.conn, self.known = parent, set(_TABLE)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.join()
            self.conn.close()
        self.process = self.conn = None

    def call(self, key: str, argument: str, limit_s: float) -> str:
        """The tool's text; ToolError for a mistake of the model, ToolFailure for a bug or a time-out."""
        with self.lock:
            if self.process is None or not self.process.is_alive() or key not in self.known:
                self.kill()
                self._start()
            self.conn.send((key, argument))
            if not self.conn.poll(limit_s):
                self.kill()
                raise ToolFailure(f"exceeded its time limit of {limit_s:g} s (killed)")
            try:
                kind, text = self.conn.recv()
            except EOFError:
                self.kill()
                raise ToolFailure("the tool process died") from None
        if kind == "tool_error":
            raise ToolError(text)
        if kind == "failure":
            raise ToolFailure(text)
        return text if len(text) <= MAX_OBSERVATION_CHARS else text[:MAX_OBSERVATION_CHARS] + " ... (cut)"


WORKER = ToolWorker()


def register_tool(owner: str, tool: Tool) -> str:
    """The worker key of `owner`'s tool (registered once; a new key makes the next call fork a fresh worker)."""
    key = f"{owner}:{tool.name}"
    if _TABLE.get(key) is not tool.fn:
        _TABLE[key] = tool.fn
        WORKER.known.discard(key)  # a worker forked before holds another function under this key
    return key
