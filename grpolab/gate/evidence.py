"""The evidence records the gate judges: plain dicts, written by grpolab.report (evidence.py for one run, sets.py for
a set of runs) and read by the checks here. Nothing in grpolab.gate reads a file or runs a model.

A comparison of trained and base is ``{"diff": {"mean", "ci_low", "ci_high", "n", ...}, "base": {...},
"trained": {...}, "n"}``: trained - base with its 95% interval (grpolab.gate.stats says which keys the rules read).
"""

from __future__ import annotations

from typing import Any, TypedDict


class Evidence(TypedDict, total=False):
    """The held-out evidence of one run or of a set of runs.

    heldout: the training task's held-out comparison (``per_slice`` its slices), None when there is none;
    capability: one comparison per untrained task; safety: the harmful-request probe's summary (``n``,
    ``increase``, ``base`` and ``trained`` compliance rates), None when not run, with ``safety_note`` saying why;
    diversity: the held-out pass@k comparison (``k``, ``samples``, ``temperature``, ``by_uid``), None when not run,
    with ``diversity_note``; release: what `grpolab release` measured (``serving``, ``serving_gguf``, ``rollback``).
    """

    heldout: dict[str, Any] | None
    capability: list[dict[str, Any]]
    safety: dict[str, Any] | None
    safety_note: str
    diversity: dict[str, Any] | None
    diversity_note: str
    release: dict[str, Any] | None
