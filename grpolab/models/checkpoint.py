"""Atomic checkpoints: HF-format model + trainer state, written to a temporary directory and renamed into place.

    runs/<name>/checkpoints/step-N/   model.safetensors, config.json, tokenizer files, trainer_state.pt
                                      (LoRA: adapter_model.safetensors + adapter_config.json instead of the model)

Every file is fsync'ed before the rename, so a crash, a kill -9 or a full disk while writing leaves at most a
`.tmp-step-N-*` directory, which `checkpoints()` ignores and `remove_partial()` deletes; the previous complete
checkpoint stays loadable. Only after the new one is in place are older ones pruned to the newest `keep_last`.

The best checkpoint by held-out evidence (periodic eval, eval.every_steps) is named by checkpoints/best.json and
never pruned: the step with the highest held-out accuracy, the earlier step on a tie, never judged by training
reward (`is_better`, `select_best`). `RUN:best` names it wherever a model path is read (grpolab.models.load).

trainer_state.pt holds what an exact resume needs besides the weights (grpolab.training.trainer.Trainer.state_dict):
step, optimizer, LR scheduler, every RNG (python, numpy, torch), prompt cursor, fault counters and the byte
length of metrics.jsonl / samples.jsonl at save time.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ..errors import GrpolabError
from .direct_io import fsync_path, save_safetensors, torch_save
from .lora import is_lora, save_model

STATE_FILE = "trainer_state.pt"
BEST_FILE = "best.json"
BEST_METRIC = "eval/accuracy"  # what picks the best checkpoint: held-out accuracy of the periodic greedy eval
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
            fsync_path(p)
    fsync_path(directory)


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, state: dict[str, Any], keep_last: int,
                    weights: dict[str, torch.Tensor] | None = None, direct_io: bool = True) -> Path:
    """Write step-N atomically (temp dir, fsync, rename), then prune to the newest `keep_last`. `weights`: the full
    state dict to write instead of the model's own (a sharded FSDP2 policy's, gathered). `direct_io`: the model's
    safetensors and the trainer state are written past the page cache (grpolab/models/direct_io.py); a LoRA
    adapter is saved by peft as always.

    Any failure (an OSError such as a full disk included) removes the temporary directory and re-raises; the
    checkpoints already in place are untouched.
    """
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    target = checkpoint_path(run_dir, step)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step-{step}-", dir=root))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a checkpoint is as readable as the rest of the run
        if weights is None and (is_lora(model) or not direct_io):
            save_model(model, tmp)  # save_pretrained; LoRA: the adapter only (grpolab.models.lora)
        else:
            save_full_weights(model, model.state_dict() if weights is None else weights, tmp, direct_io)
        tokenizer.save_pretrained(tmp)
        if direct_io:  # written last: its presence marks a complete checkpoint
            torch_save(state, tmp / STATE_FILE)
        else:
            torch.save(state, tmp / STATE_FILE)
        _fsync_tree(tmp)
        if target.exists():  # re-saving a step: move the old copy aside first, never delete before replacing
            aside = Path(tempfile.mkdtemp(prefix=f".old-step-{step}-", dir=root))
            os.replace(target, aside / target.name)
            os.replace(tmp, target)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(tmp, target)
        fsync_path(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune(run_dir, keep_last)
    return target


def prune(run_dir: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` complete checkpoints, never the best one (best.json); returns them."""
    best = best_record(run_dir)
    protected = checkpoint_path(run_dir, best["step"]) if best else None
    old = [p for p in checkpoints(run_dir)[:-keep_last] if p != protected]
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
    return old


# ----------------------------------------------------------------------------------------------- best by held-out


def is_better(value: float, best: float | None) -> bool:
    """Whether a held-out value replaces the best so far: strictly higher (a tie keeps the earlier checkpoint); a NaN
    never does; anything finite beats no best at all.

    >>> is_better(0.5, None), is_better(0.5, 0.5), is_better(0.6, 0.5), is_better(float("nan"), None)
    (True, False, True, False)
    """
    if not math.isfinite(value):
        return False
    return best is None or value > best


def select_best(evals: Sequence[tuple[int, float]]) -> tuple[int, float] | None:
    """The (step, value) with the highest held-out value, the earliest on ties, over (step, value) in step order;
    None when no value is finite. Training reward never enters: only held-out values are passed in.

    >>> select_best([(2, 0.4), (4, 0.7), (6, 0.7), (8, 0.5)])
    (4, 0.7)
    """
    best: tuple[int, float] | None = None
    for step, value in evals:
        if is_better(value, best[1] if best else None):
            best = (step, value)
    return best


def best_record(run_dir: Path) -> dict[str, Any] | None:
    """checkpoints/best.json of a run (step, metric, value, interval...), or None when the run has none."""
    path = Path(run_dir) / "checkpoints" / BEST_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        int(record["step"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise GrpolabError(f"{path}: unreadable best-checkpoint record ({type(e).__name__}: {e})") from None
    return record


def write_best(run_dir: Path, record: dict[str, Any]) -> None:
    """Write checkpoints/best.json atomically (temp file, fsync, rename); the checkpoint it names must exist."""
    root = Path(run_dir) / "checkpoints"
    if not (checkpoint_path(run_dir, record["step"]) / STATE_FILE).is_file():
        raise GrpolabError(f"{root}: no complete checkpoint step-{record['step']} to record as the best")
    tmp = root / f".{BEST_FILE}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(record, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / BEST_FILE)
    fsync_path(root)


def best_checkpoint(run_dir: Path) -> Path:
    """The checkpoint best.json names; a clear error when the run kept none (no periodic held-out eval) or it is gone."""
    record = best_record(run_dir)
    if record is None:
        raise GrpolabError(f"{run_dir}:best: the run has no best checkpoint (checkpoints/{BEST_FILE}); it is kept only "
                           f"when training evaluates held-out problems periodically (eval.every_steps > 0)")
    path = checkpoint_path(run_dir, record["step"])
    if not (path / STATE_FILE).is_file():
        raise GrpolabError(f"{run_dir}:best: checkpoints/{BEST_FILE} names step {record['step']}, but {path} is not a "
                           f"complete checkpoint")
    return path


def save_full_weights(model, weights: dict[str, torch.Tensor], directory: Path, direct_io: bool = True) -> None:
    """A Hugging Face checkpoint (config.json, generation_config.json, model.safetensors) from a full state dict,
    without touching the (sharded) model's modules: what `save_pretrained` writes (`hf_weights`; the config with its
    `dtype` and `architectures` set as it sets them), in one file (save_pretrained shards beyond 50 GB)."""
    tensors, path = hf_weights(model, weights), directory / "model.safetensors"
    model.config.dtype = str(model.dtype).removeprefix("torch.")
    model.config.architectures = [type(model).__name__.removeprefix("FSDP")]
    model.config.save_pretrained(directory)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(directory)
    if direct_io:
        save_safetensors(tensors, path, {"format": "pt"})
    else:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata={"format": "pt"})


def hf_weights(model, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors `save_pretrained` would write of `weights`, by transformers' own steps: less the model's
    `_keys_to_ignore_on_save`, tied duplicates removed (by shared storage; a tied LM head by the config, for
    gathered copies that share nothing), and the weight conversions applied at load reverted (the hub's layout)."""
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    ignore = set(getattr(model, "_keys_to_ignore_on_save", None) or ())
    kept = remove_tied_weights_from_state_dict({k: v for k, v in weights.items() if k not in ignore}, model)
    tied = getattr(model.config, "tie_word_embeddings", False)
    return revert_weight_conversion(model, {k: v for k, v in kept.items() if not (tied and k == "lm_head.weight")})


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
