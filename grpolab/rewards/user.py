"""Reward functions of the user's own: named in the config next to the built-ins, or passed to grpolab.train.

    reward:
      functions: {brevity: "my_rewards.py:brevity", judge: "mypkg.rewards:judge"}
      weights:   {correct: 1.0, brevity: 0.2}

A reference is ``path/to/file.py:function`` (a path relative to the working directory) or ``package.module:function``
(importable). The function is called as ``fn(completion: str, problem: Problem) -> float | None``: ``problem`` carries
the prompt's question, gold answer, slice and uid. ``None`` means "no valid reward" (the sample is invalid, never 0).
``grpolab.train(cfg, rewards={"brevity": fn})`` takes Python callables directly, with the same rules; they too
need a weight in ``reward.weights``.

Batched functions: a function decorated with ``@grpolab.batched`` (which sets ``fn.grpolab_batched = True``) is
called once per batch as ``fn(completions: list[str], problems: list[Problem]) -> list[float | None]``, with
``problems[i]`` the problem of ``completions[i]`` -- for a reward that is cheaper many at a time (a judge model, a
request to a service). The time limit (``reward.time_limit_s``) applies to the whole call: a call that runs over
makes every sample of the batch invalid, with the reason. A return that is not a list (or tuple) of one value per
completion makes every sample of the batch invalid ("returned 3 results for 4 completions"); a value that is not a
number makes its own sample invalid, never 0.

Every function is resolved and its signature checked when the run is built, before any model is loaded, so a typo
is one line naming the field; ``probe`` then calls it once on the first training problem, and a function that
returns something other than a number or None is refused there too. The source of each function is hashed into
the manifest (``manifest diff`` shows an edited reward): the whole file for a reference, the function's own source
(``inspect.getsource``) for a Python callable."""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any, Callable

from ..errors import ConfigError

REWARD_SIGNATURE = "fn(completion: str, problem: Problem) -> float | None"
BATCHED_SIGNATURE = "fn(completions: list[str], problems: list[Problem]) -> list[float | None]"
BATCHED_ATTRIBUTE = "grpolab_batched"


def batched(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Declare a reward function batched: it is called as fn(completions, problems) -> list (module docstring).

    >>> @batched
    ... def lengths(completions, problems):
    ...     return [float(len(c)) for c in completions]
    >>> is_batched(lengths), lengths(["ab", "c"], [None, None])
    (True, [2.0, 1.0])
    """
    setattr(fn, BATCHED_ATTRIBUTE, True)
    return fn


def is_batched(fn: Any) -> bool:
    """Whether `fn` was declared batched (its ``grpolab_batched`` attribute is True)."""
    return getattr(fn, BATCHED_ATTRIBUTE, False) is True


def _split_reference(field: str, ref: Any) -> tuple[str, str]:
    if not isinstance(ref, str) or ":" not in ref:
        raise ConfigError(f"{field}: expected 'path/to/file.py:function' or 'package.module:function', got {ref!r}")
    where, _, fn_name = ref.rpartition(":")
    if not where or not fn_name.isidentifier():
        raise ConfigError(f"{field}: expected 'path/to/file.py:function' or 'package.module:function', got {ref!r}")
    return where, fn_name


def _load_module(field: str, where: str):
    """The module of a reference: a .py file loaded under a private name, or an importable module."""
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise ConfigError(f"{field}: file not found: {where}")
        name = "grpolab_user_reward_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # the user's file: report where it broke, in one line
            raise ConfigError(f"{field}: importing {where} failed ({type(e).__name__}: {e})") from None
        sys.modules[name] = module
        return module
    try:
        return importlib.import_module(where)
    except Exception as e:
        raise ConfigError(f"{field}: cannot import module {where!r} ({type(e).__name__}: {e})") from None


def load_reward_function(field: str, ref: Any) -> Callable[..., Any]:
    """The function a reference names; ConfigError naming `field` for anything wrong."""
    where, fn_name = _split_reference(field, ref)
    module = _load_module(field, where)
    fn = getattr(module, fn_name, None)
    if fn is None:
        known = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
        raise ConfigError(
            f"{field}: {where} has no function {fn_name!r}; functions there: {', '.join(known) or 'none'}"
        )
    return check_reward_callable(field, fn, f"{where}:{fn_name}")


def check_reward_callable(field: str, fn: Any, label: str) -> Callable[..., Any]:
    """`fn` itself when it can be called as a reward (batched or not); else ConfigError naming `field`."""
    if not callable(fn):
        raise ConfigError(f"{field}: {label} is not callable (got {type(fn).__name__}); expected {REWARD_SIGNATURE}")
    args, expected = (([], []), BATCHED_SIGNATURE) if is_batched(fn) else (("completion", object()), REWARD_SIGNATURE)
    try:
        inspect.signature(fn).bind(*args)
    except TypeError:
        raise ConfigError(f"{field}: {label}{inspect.signature(fn)} cannot be called as {expected}") from None
    except ValueError:  # builtins without a signature: trust them
        pass
    return fn


def callable_label(fn: Any) -> str:
    """'module:qualname' of a Python callable (its class's for a callable object).

    >>> callable_label(is_batched)
    'grpolab.rewards.user:is_batched'
    """
    target = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}"


def callable_source_hash(fn: Any) -> str | None:
    """sha256 of a Python callable's own source (``inspect.getsource``; its class's for a callable object), or
    None when Python has no source for it (a builtin, a function typed at the interactive prompt). A
    ``functools.partial`` hashes its function's source and the repr of its bound arguments."""
    extra = ""
    if isinstance(fn, functools.partial):
        fn, extra = fn.func, repr((fn.args, sorted(fn.keywords.items())))
    target = inspect.unwrap(fn) if inspect.isroutine(fn) else type(fn)
    try:
        return hashlib.sha256((inspect.getsource(target) + extra).encode()).hexdigest()
    except (OSError, TypeError):
        return None


def source_hashes(functions: dict[str, str]) -> dict[str, str | None]:
    """{name: sha256 of the source file of each referenced function} (None when it cannot be found or read).

    The file is located without running it (a module reference through its import spec)."""
    out: dict[str, str | None] = {}
    for name, ref in sorted(functions.items()):
        where = str(ref).rpartition(":")[0]
        try:
            origin = where if where.endswith(".py") else importlib.util.find_spec(where).origin
            out[name] = hashlib.sha256(Path(origin).read_bytes()).hexdigest()
        except (OSError, ImportError, AttributeError, TypeError, ValueError):
            out[name] = None
    return out
