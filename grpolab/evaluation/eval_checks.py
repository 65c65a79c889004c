"""Checks of an evaluation's settings and models before any model is evaluated, shared by `grpolab eval` and
grpolab.evaluate_models: a bad number, an unknown dtype or a model without a chat template is one error naming the
option, raised before the first (possibly long) evaluation instead of after it.

``prefix`` is how the caller spells its options: ``"--"`` and dashes for the command (``--max-new-tokens``), ``""``
and underscores for the Python API (``max_new_tokens``).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from ..errors import ConfigError

DTYPE_NAMES = ("float32", "bfloat16")  # grpolab.models.load.DTYPES: what a model is loaded and decoded in


def option_name(name: str, prefix: str) -> str:
    """'max_new_tokens' -> '--max-new-tokens' (command) or 'max_new_tokens' (Python API).

    >>> option_name("max_new_tokens", "--"), option_name("max_new_tokens", "")
    ('--max-new-tokens', 'max_new_tokens')
    """
    return f"--{name.replace('_', '-')}" if prefix == "--" else name


def check_dtype(dtype: str, name: str = "dtype", prefix: str = "--") -> str:
    """`dtype` when it is one grpolab loads models in (DTYPE_NAMES); else a ConfigError listing them."""
    if dtype not in DTYPE_NAMES:
        raise ConfigError(f"{option_name(name, prefix)}: expected one of {', '.join(DTYPE_NAMES)}, got {dtype!r}")
    return dtype


_RULES: dict[str, tuple[Callable[[float], bool], str]] = {
    "limit": (lambda v: v >= 0, "an integer >= 0 (0 = all problems)"),
    "max_new_tokens": (lambda v: v >= 1, "an integer >= 1"),
    "batch_size": (lambda v: v >= 1, "an integer >= 1"),
    "samples": (lambda v: v >= 0, "an integer >= 0 (0 = greedy only)"),
    "n": (lambda v: v >= 1, "an integer >= 1"),
    "temperature": (lambda v: math.isfinite(v) and v > 0, "a finite number > 0"),
    "top_p": (lambda v: 0 < v <= 1, "a number in (0, 1]"),
}


def check_eval_settings(prefix: str = "--", **values: float) -> None:
    """Each given setting (limit, max_new_tokens, batch_size, samples, n, temperature, top_p) in its range, e.g.
    ``--limit: expected an integer >= 0 (0 = all problems), got -3``; unknown names are a programming error."""
    for name, value in values.items():
        ok, expected = _RULES[name]
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or (expected.startswith("an integer") and not isinstance(value, int))
            or not ok(value)
        ):
            raise ConfigError(f"{option_name(name, prefix)}: expected {expected}, got {value!r}")


def check_models_loadable(models: Sequence[str]) -> list[str]:
    """Resolve every model and load its tokenizer (a missing directory, a run without a checkpoint, a tokenizer
    without a chat template: one GrpolabError naming it) before any model is evaluated; the resolved paths."""
    from ..models.load import load_tokenizer, resolve_model_path

    paths = [resolve_model_path(name) for name in models]
    for path in paths:
        load_tokenizer(path)
    return paths
