"""Held-out integrity: an evaluation set must not share problems with the training set of the model evaluated.

Rules:
- A problem's identity is ``sha256(normalise_problem_text(question))[:16]`` (grpolab.manifest.problem_hashes):
  case and whitespace do not make a training problem "new".
- The training set of a model is read from the ``train_problem_hashes`` of the first of these files found in
  the model's directory or up to two levels above it (a checkpoint lives in ``<run>/checkpoints/step-N``):
  ``manifest.json`` (a GRPO run) or ``baseline_manifest.json`` (an SFT/RFT baseline, grpolab.baselines.sft_bon).
  The model name as given (e.g. a run directory) is searched before its resolved checkpoint path.
- A model with no such file (a hub id, the base model) has no recorded training set: nothing to check,
  and the result says so (``checked: false``) rather than claiming it is held out.
- Any overlap raises GrpolabError naming the count and one example; there is no override.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import GrpolabError
from ..manifest import normalise_problem_text, sha256_bytes
from ..tasks.base import Problem

MANIFEST_NAMES = ("manifest.json", "baseline_manifest.json")


def problem_hash(problem: Problem) -> str:
    """The 16-hex-digit identity of one problem (same rule as manifest.problem_hashes)."""
    return sha256_bytes(normalise_problem_text(problem.question).encode())[:16]


def find_manifest(*locations: str | Path | None) -> tuple[Path, dict[str, Any]] | None:
    """(file, parsed JSON) of the first run/baseline manifest in or up to two levels above a location."""
    for loc in locations:
        if loc is None or not Path(loc).exists():
            continue
        d = Path(loc).resolve()
        for candidate in (d, d.parent, d.parent.parent):
            for name in MANIFEST_NAMES:
                f = candidate / name
                if f.is_file():
                    try:
                        return f, json.loads(f.read_text(encoding="utf-8"))
                    except (OSError, json.JSONDecodeError) as e:
                        raise GrpolabError(f"{f}: unreadable manifest ({e})") from None
    return None


def overlapping(problems: list[Problem], train_hashes: list[str] | set[str]) -> list[Problem]:
    """The problems whose hash is in ``train_hashes``, in evaluation order."""
    train = set(train_hashes)
    return [p for p in problems if problem_hash(p) in train]


def check_held_out(model: str, path: str | None, problems: list[Problem]) -> dict[str, Any]:
    """Raise GrpolabError if ``problems`` overlap the training set recorded for ``model``; else describe the check.

    Returns ``{"checked": bool, "manifest": str | None, "train_problems": int, "overlap": 0, "note": str}``.
    """
    found = find_manifest(model, path)
    if found is None:
        return {
            "checked": False,
            "manifest": None,
            "train_problems": 0,
            "overlap": 0,
            "note": "no run or baseline manifest: the training set of this model is unknown",
        }
    file, manifest = found
    hashes = manifest.get("train_problem_hashes")
    if hashes is None:
        return {
            "checked": False,
            "manifest": str(file),
            "train_problems": 0,
            "overlap": 0,
            "note": "the manifest records no train_problem_hashes",
        }
    bad = overlapping(problems, hashes)
    if bad:
        ex = bad[0]
        raise GrpolabError(
            f"{model}: {len(bad)} of {len(problems)} evaluation problems overlap the training set recorded in "
            f"{file} (e.g. {ex.uid}: {ex.question[:80]!r}); evaluate on a held-out split"
        )
    return {
        "checked": True,
        "manifest": str(file),
        "train_problems": len(hashes),
        "overlap": 0,
        "note": "no evaluation problem is in the training set",
    }
