"""Which names the tests get, decided on the trainer's side from the tests alone (docs/code.md, "How a pass is
decided"). Nothing the program says about itself enters into it.

The judge runs the tests in a namespace of its own: builtins, ``__solution__``, and

- **program names**: the problem's entry points, plus every name the setup and the cases read as a global
  without binding it themselves that is neither a builtin nor an allowed module (an MBPP test calling
  ``max_chain_length`` and ``Pair``). A program's helper named like a builtin (``max``, ``range``) is never
  seen by the tests unless the problem names it as an entry point;
- **modules**: the standard-library modules of ALLOWED_MODULES that the tests read without importing them (a
  test using ``math.isclose``), bound to the judge's own imports.
"""

from __future__ import annotations

import builtins
import functools
import symtable

ALLOWED_MODULES = frozenset(
    {
        "math",
        "cmath",
        "re",
        "string",
        "collections",
        "itertools",
        "functools",
        "operator",
        "heapq",
        "bisect",
        "statistics",
        "fractions",
        "decimal",
        "copy",
        "sys",
        "typing",
        "datetime",
        "random",
    }
)
BUILTIN_NAMES = frozenset(dir(builtins)) | {"__solution__"}


def global_names(source: str) -> tuple[set[str], set[str]]:
    """(names read, names bound) as globals of `source`, counting what nested scopes read or bind as globals.

    >>> [sorted(s) for s in global_names("for i in range(3):\\n    assert f(i) == g\\ndef c(x):\\n    assert x(1) == h")]
    [['f', 'g', 'h', 'i', 'range'], ['c', 'i']]
    """
    reads: set[str] = set()
    binds: set[str] = set()
    tables = [symtable.symtable(source, "<test>", "exec")]
    while tables:
        table = tables.pop()
        top = table.get_type() == "module"
        for sym in table.get_symbols():
            if top or sym.is_global():
                if sym.is_referenced():
                    reads.add(sym.get_name())
                if sym.is_assigned() or sym.is_imported():
                    binds.add(sym.get_name())
        tables.extend(table.get_children())
    return reads, binds


@functools.lru_cache(maxsize=4096)
def bound_names(setup: str, cases: tuple[str, ...], entry_points: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """(program names, modules) the judge binds for these tests (rules in the module docstring). Tests that do
    not compile bind only the entry points (the judge then reports them broken).

    >>> bound_names("", ("assert abs(f(2)) == 4", "assert math.isclose(g(1), 1.0)"))
    (['f', 'g'], ['math'])
    >>> bound_names("", ("assert sum([1, 2]) == 3",), ("sum",))
    (['sum'], [])
    """
    reads: set[str] = set()
    binds: set[str] = set()
    try:
        for source in (setup, *cases):
            r, b = global_names(source)
            reads |= r
            binds |= b
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return sorted(entry_points), []
    free = reads - binds - set(entry_points)
    names = set(entry_points) | {n for n in free if n not in BUILTIN_NAMES and n not in ALLOWED_MODULES}
    return sorted(names), sorted(free & ALLOWED_MODULES)
