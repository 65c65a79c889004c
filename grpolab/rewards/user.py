"""Reward functions of the user's own, named in the config next to the built-ins:

    reward:
      functions: {brevity: "my_rewards.py:brevity", judge: "mypkg.rewards:judge"}
      weights:   {correct: 1.0, brevity: 0.2}

A reference is ``path/to/file.py:function`` (a path relative to the working directory) or ``package.module:function``
(importable). The function is called as ``fn(completion: str, problem: Problem) -> float | None``: ``problem`` carries
the prompt's question, gold answer, slice and uid. ``None`` means "no valid reward" (the sample is invalid, never 0).

Every reference is resolved and its signature checked when the run is built, before any model is loaded, so a typo
is one line naming the field. The source file of each function is hashed into the manifest (``manifest diff`` shows
an edited reward).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any, Callable

from ..errors import ConfigError

REWARD_SIGNATURE = "fn(completion: str, problem: Problem) -> float | None"


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
        raise ConfigError(f"{field}: {where} has no function {fn_name!r}; functions there: {', '.join(known) or 'none'}")
    if not callable(fn):
        raise ConfigError(f"{field}: {where}:{fn_name} is not callable")
    try:
        inspect.signature(fn).bind("completion", object())
    except TypeError:
        raise ConfigError(f"{field}: {where}:{fn_name}{inspect.signature(fn)} cannot be called as "
                          f"{REWARD_SIGNATURE}") from None
    except ValueError:  # builtins without a signature: trust them
        pass
    return fn


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
