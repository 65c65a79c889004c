"""grpolab: GRPO post-training with explicit algorithm identity and held-out evidence.

The Python API (grpolab.api, docs/api.md) is importable from here: ``load_config``, ``train``, ``evaluate_models``,
``compare``, ``release_report``, ``batched`` (declare a batched reward), ``Problem`` and the result types. Each name
is imported on first use, so ``import grpolab`` (and the `grpolab` command) stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> module it comes from (imported on first use)
_LAZY = {
    "load_config": "grpolab.api",
    "train": "grpolab.api",
    "evaluate_models": "grpolab.api",
    "compare": "grpolab.api",
    "release_report": "grpolab.api",
    "TrainResult": "grpolab.api",
    "EvalReport": "grpolab.api",
    "Comparison": "grpolab.api",
    "Report": "grpolab.api",
    "batched": "grpolab.rewards.user",
    "Problem": "grpolab.tasks.base",
    "ConfigError": "grpolab.errors",
    "DataError": "grpolab.errors",
    "GrpolabError": "grpolab.errors",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = ["__version__", *_LAZY]
