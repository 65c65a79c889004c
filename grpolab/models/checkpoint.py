"""Atomic checkpoints: HF-format model + trainer state, written to a temporary directory and renamed into place.

    runs/<name>/checkpoints/step-N/   model.safetensors, config.json, tokenizer files, trainer_state.pt
                                      (LoRA: adapter_model.safetensors + adapter_config.json instead of the model)

Every file is fsync'ed before the rename, so a crash, a kill -9 or a full disk while writing leaves at most a
`.tmp-step-N-*` directory, which `checkpoints()` ignores and `remove_partial()` deletes; the previous complete
checkpoint stays loadable. Only after the new one is in place are older ones pruned to the newest `keep_last`.

trainer_state.pt holds what an exact resume needs besides the weights (grpolab.training.trainer.Trainer.state_dict):
step, optimizer, LR scheduler, every RNG (python, numpy, torch), prompt cursor, fault counters and the byte
length of metrics.jsonl / samples.jsonl at save time.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import GrpolabError
from .lora import save_model

STATE_FILE = "trainer_state.pt"
_STEP = re.compile(r"^step-(\d+)$")
_PARTIAL = (".tmp-step-", ".old-step-")


def checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP.match(p.name)) and (p / STATE_FILE).is_file()]
    return [p for _, p in sorted(found)]


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step-{step}"


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = checkpoints(run_dir)
    return found[-1] if found else None


def remove_partial(run_dir: Path) -> list[Path]:
    """Delete what interrupted writes left behind (.tmp-step-* / .old-step-* directories); returns them."""
    root = Path(run_dir) / "checkpoints"
    stale = [p for p in root.iterdir() if p.name.startswith(_PARTIAL)] if root.is_dir() else []
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return stale


def _fsync_tree(directory: Path) -> None:
    """Flush every file of `directory` and the directory entry itself to disk."""
    for p in directory.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, state: dict[str, Any], keep_last: int,
                    weights: dict[str, torch.Tensor] | None = None) -> Path:
    """Write step-N atomically (temp dir, fsync, rename), then prune to the newest `keep_last`. `weights`: the full
    state dict to write instead of the model's own (a sharded FSDP2 policy's, gathered).

    Any failure (an OSError such as a full disk included) removes the temporary directory and re-raises; the
    checkpoints already in place are untouched.
    """
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    target = checkpoint_path(run_dir, step)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step-{step}-", dir=root))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a checkpoint is as readable as the rest of the run
        if weights is None:
            save_model(model, tmp)  # a LoRA policy saves its adapter only (grpolab.models.lora)
        else:
            save_full_weights(model, weights, tmp)
        tokenizer.save_pretrained(tmp)
        torch.save(state, tmp / STATE_FILE)  # written last: its presence marks a complete checkpoint
        _fsync_tree(tmp)
        if target.exists():  # re-saving a step: move the old copy aside first, never delete before replacing
            aside = Path(tempfile.mkdtemp(prefix=f".old-step-{step}-", dir=root))
            os.replace(target, aside / target.name)
            os.replace(tmp, target)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(tmp, target)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def save_full_weights(model, weights: dict[str, torch.Tensor], directory: Path) -> None:
    """A Hugging Face checkpoint (config.json, generation_config.json, model.safetensors) from a full state dict,
    without touching the (sharded) model's modules; a tied LM head is left to be re-tied on load."""
    from safetensors.torch import save_file

    model.config.save_pretrained(directory)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(directory)
    tied = getattr(model.config, "tie_word_embeddings", False)
    tensors = {k: v.contiguous() for k, v in weights.items() if not (tied and k == "lm_head.weight")}
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})


def load_state(ckpt: Path) -> dict[str, Any]:
    path = Path(ckpt) / STATE_FILE
    try:
        return torch.load(path, weights_only=False)
    except (OSError, RuntimeError, EOFError) as e:
        raise GrpolabError(f"{path}: cannot read the trainer state ({type(e).__name__}: {e})") from None


# ----------------------------------------------------------------------------------------------- RNG states


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # seeds every CUDA device too


def rng_state() -> dict[str, Any]:
    """Every global RNG the loop draws from: python, numpy, torch CPU (and CUDA when present)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
