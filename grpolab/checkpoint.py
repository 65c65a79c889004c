"""Atomic checkpoints: HF-format model + trainer state, written to a temporary directory and renamed into place.

    runs/<name>/checkpoints/step-N/   model.safetensors, config.json, tokenizer files, trainer_state.pt

A crash while writing leaves only a `.tmp-step-N-*` directory, which is ignored and cleaned up; the previous
complete checkpoint stays loadable. `keep_last` newest complete checkpoints are kept.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trainer_state.pt"
_STEP = re.compile(r"^step-(\d+)$")


def checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP.match(p.name)) and (p / STATE_FILE).is_file()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = checkpoints(run_dir)
    return found[-1] if found else None


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, state: dict[str, Any], keep_last: int) -> Path:
    """Write step-N atomically (temp dir + rename), then prune to the newest `keep_last`."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"step-{step}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step-{step}-", dir=root))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        torch.save(state, tmp / STATE_FILE)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def load_state(ckpt: Path) -> dict[str, Any]:
    return torch.load(Path(ckpt) / STATE_FILE, weights_only=False)
