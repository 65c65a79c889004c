"""Atomic checkpoints: HF-format model + trainer state, written to a temporary directory and renamed into place.

    runs/<name>/checkpoints/step-N/   model.safetensors, config.json, tokenizer files, trainer_state.pt
                                      (LoRA: adapter_model.safetensors + adapter_config.json instead of the model)

Every file is fsync'ed before the rename, so a crash, a kill -9 or a full disk while writing leaves at most a
`.tmp-step-N-*` directory, which `checkpoints()` ignores and `remove_partial()` deletes; the previous complete
checkpoint stays loadable. Only after the new one is in place are older ones pruned to the newest `keep_last`.
Re-saving a step that exists moves the old copy into `.old-step-N-*/step-N` and then renames the new one into
place; a crash between the two renames leaves no `step-N`, and `remove_partial()` then moves the old copy back
before it deletes anything, so a step once written always has one complete copy.

Each checkpoint's checksums.json records the size and CRC-32 of every file in it (the direct-I/O writer computes
the CRC of the weights and trainer state as it writes them; the small files, and everything written through the
page cache, are read back once). `verify_checkpoint` checks them -- a resume does, before it loads anything
(grpolab.runs) -- and names the first file that is missing, truncated or changed; a checkpoint written before
checksums existed gets a structural check of its safetensors files (header and length). `set_aside` renames a
corrupt checkpoint to `corrupt-step-N` (kept, never pruned, never loaded) when the user asks to resume from the
newest intact one.

The best checkpoint by held-out evidence (periodic eval, eval.every_steps) is named by checkpoints/best.json and
never pruned: the step with the highest held-out accuracy, the earlier step on a tie, never judged by training
reward (`is_better`, `select_best`). `RUN:best` names it wherever a model path is read (grpolab.models.load).

trainer_state.pt holds what an exact resume needs besides the weights (grpolab.training.trainer.Trainer.state_dict):
step, optimizer, LR scheduler, every RNG (python, numpy, torch), prompt cursor, fault counters and the byte
length of metrics.jsonl / samples.jsonl at save time.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ..errors import GrpolabError
from .direct_io import file_crc32, fsync_path, save_safetensors, torch_save
from .lora import is_lora, save_model

STATE_FILE = "trainer_state.pt"
CHECKSUM_FILE = "checksums.json"
CORRUPT_PREFIX = "corrupt-"
BEST_FILE = "best.json"
BEST_METRIC = "eval/accuracy"  # what picks the best checkpoint: held-out accuracy of the periodic greedy eval
_STEP = re.compile(r"^step-(\d+)$")
_PARTIAL = (".tmp-step-", ".old-step-")
_ASIDE = re.compile(r"^\.old-step-(\d+)-")
log = logging.getLogger("grpolab")


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
    """Delete what interrupted writes left behind (.tmp-step-* / .old-step-* directories); returns them. First,
    a re-save that died between its two renames (`.old-step-N-*/step-N` complete, no `step-N`) gets its old copy
    moved back to `step-N`: nothing complete is ever deleted while its step has no other copy."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    for aside in sorted(p for p in root.iterdir() if _ASIDE.match(p.name)):
        restore_aside(aside)
    stale = [p for p in root.iterdir() if p.name.startswith(_PARTIAL)]
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return stale


def restore_aside(aside: Path) -> Path | None:
    """Move `.old-step-N-*/step-N` back to `step-N` when it is complete and `step-N` is not there; returns the
    restored path (None when there was nothing to restore)."""
    inner = aside / f"step-{_ASIDE.match(aside.name).group(1)}"
    target = aside.parent / inner.name
    if not (inner / STATE_FILE).is_file() or target.exists():
        return None
    try:
        os.replace(inner, target)
    except FileNotFoundError:  # another process (a rank of the same run) restored it first
        return None
    fsync_path(aside.parent)
    log.warning("%s: restored from %s, where an interrupted re-save had moved it", target, aside.name)
    return target


def _fsync_tree(directory: Path) -> None:
    """Flush every file of `directory` and the directory entry itself to disk."""
    for p in directory.rglob("*"):
        if p.is_file():
            fsync_path(p)
    fsync_path(directory)


def save_checkpoint(
    run_dir: Path,
    step: int,
    model,
    tokenizer,
    state: dict[str, Any],
    keep_last: int,
    weights: dict[str, torch.Tensor] | None = None,
    direct_io: bool = True,
) -> Path:
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
        written: dict[str, tuple[int, int]] = {}  # (size, CRC-32) of the files the direct-I/O writer wrote
        written_weights = None
        if weights is None and (is_lora(model) or not direct_io):
            save_model(model, tmp)  # save_pretrained; LoRA: the adapter only (grpolab.models.lora)
        else:
            written_weights = save_full_weights(
                model, model.state_dict() if weights is None else weights, tmp, direct_io
            )
        tokenizer.save_pretrained(tmp)
        if direct_io:  # written last: its presence marks a complete checkpoint
            if written_weights is not None:
                written["model.safetensors"] = written_weights
            written[STATE_FILE] = torch_save(state, tmp / STATE_FILE)
        else:
            torch.save(state, tmp / STATE_FILE)
        write_checksums(tmp, written)
        _fsync_tree(tmp)
        if target.exists():
            _replace_existing(tmp, target)
        else:
            os.replace(tmp, target)
        fsync_path(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune(run_dir, keep_last)
    return target


def _replace_existing(tmp: Path, target: Path) -> None:
    """Put the complete `tmp` in place of the existing complete `target`: the old copy is moved aside first (never
    deleted before the new one is in place), and put back if the second rename fails. A crash between the two
    renames leaves `.old-step-N-*/step-N`, which `remove_partial` restores."""
    aside = Path(tempfile.mkdtemp(prefix=f".old-{target.name}-", dir=target.parent))
    try:
        os.replace(target, aside / target.name)
    except BaseException:
        shutil.rmtree(aside, ignore_errors=True)
        raise
    try:
        os.replace(tmp, target)
    except BaseException:
        os.replace(aside / target.name, target)
        shutil.rmtree(aside, ignore_errors=True)
        raise
    fsync_path(target.parent)  # the new copy's entry is on disk before the old copy goes
    shutil.rmtree(aside, ignore_errors=True)


def prune(run_dir: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` complete checkpoints, never the best one (best.json); returns them."""
    best = best_record(run_dir)
    protected = checkpoint_path(run_dir, best["step"]) if best else None
    old = [p for p in checkpoints(run_dir)[:-keep_last] if p != protected]
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
    return old


# ----------------------------------------------------------------------------------------------- integrity


def write_checksums(directory: Path, written: dict[str, tuple[int, int]]) -> None:
    """checksums.json of a checkpoint directory: {"algorithm": "crc32", "files": {relative path: {"size",
    "crc32"}}} for every file in it; `written` gives the (size, CRC-32) the writer computed, the others are read."""
    files = {}
    for path in sorted(p for p in Path(directory).rglob("*") if p.is_file() and p.name != CHECKSUM_FILE):
        rel = path.relative_to(directory).as_posix()
        size, crc = written.get(rel) or file_crc32(path)
        files[rel] = {"size": size, "crc32": f"{crc:08x}"}
    with open(Path(directory) / CHECKSUM_FILE, "w", encoding="utf-8") as f:
        f.write(json.dumps({"algorithm": "crc32", "files": files}, indent=1) + "\n")
        f.flush()
        os.fsync(f.fileno())


def verify_checkpoint(ckpt: Path) -> str | None:
    """None when the checkpoint is intact, else why not, naming the file: one that is missing, has another size
    than was written (truncated) or another CRC-32 (changed bytes) than checksums.json records. A checkpoint
    without checksums.json (written before they existed) gets `check_safetensors` on its safetensors files."""
    ckpt = Path(ckpt)
    if not (ckpt / STATE_FILE).is_file():
        return f"{STATE_FILE} is missing"
    record_path = ckpt / CHECKSUM_FILE
    if not record_path.is_file():
        for path in sorted(ckpt.glob("*.safetensors")):
            if (problem := check_safetensors(path)) is not None:
                return f"{path.name}: {problem}"
        return None
    try:
        files = json.loads(record_path.read_text(encoding="utf-8"))["files"]
        expected = {name: (int(e["size"]), int(e["crc32"], 16)) for name, e in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"{CHECKSUM_FILE} is unreadable ({type(e).__name__}: {e})"
    for name, (size, crc) in expected.items():
        path = ckpt / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} is {path.stat().st_size} bytes, not the {size} written: truncated or extended"
        found = file_crc32(path)[1]
        if found != crc:
            return f"{name} has CRC-32 {found:08x}, not the {crc:08x} recorded at save: its bytes changed"
    return None


def check_safetensors(path: Path) -> str | None:
    """None when a safetensors file's layout is whole -- an 8-byte little-endian header length, a JSON header,
    and exactly as many data bytes as the header's largest end offset -- else what is wrong."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                return f"header length {n} exceeds the file's {size} bytes: truncated or damaged"
            header = json.loads(f.read(n))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (struct.error, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        return f"unreadable header ({type(e).__name__}: {e})"
    if size != 8 + n + end:
        return f"{size} bytes, not the {8 + n + end} its header describes: truncated or extended"
    return None


def newest_intact(run_dir: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(the newest complete checkpoint that verifies or None, [(each newer corrupt checkpoint, why)] newest first)."""
    corrupt: list[tuple[Path, str]] = []
    for path in reversed(checkpoints(run_dir)):
        problem = verify_checkpoint(path)
        if problem is None:
            return path, corrupt
        corrupt.append((path, problem))
    return None, corrupt


def set_aside(ckpt: Path) -> Path:
    """Rename a corrupt checkpoint step-N to corrupt-step-N (corrupt-step-N.2... when taken): kept for inspection,
    never loaded (`checkpoints` lists step-N only), never pruned, never deleted by `remove_partial`."""
    ckpt = Path(ckpt)
    target, k = ckpt.with_name(CORRUPT_PREFIX + ckpt.name), 1
    while target.exists():
        k += 1
        target = ckpt.with_name(f"{CORRUPT_PREFIX}{ckpt.name}.{k}")
    os.replace(ckpt, target)
    fsync_path(ckpt.parent)
    return target


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
        raise GrpolabError(
            f"{run_dir}:best: the run has no best checkpoint (checkpoints/{BEST_FILE}); it is kept only "
            f"when training evaluates held-out problems periodically (eval.every_steps > 0)"
        )
    path = checkpoint_path(run_dir, record["step"])
    if not (path / STATE_FILE).is_file():
        raise GrpolabError(
            f"{run_dir}:best: checkpoints/{BEST_FILE} names step {record['step']}, but {path} is not a "
            f"complete checkpoint"
        )
    return path


def save_full_weights(
    model, weights: dict[str, torch.Tensor], directory: Path, direct_io: bool = True
) -> tuple[int, int] | None:
    """A Hugging Face checkpoint (config.json, generation_config.json, model.safetensors) from a full state dict,
    without touching the (sharded) model's modules: what `save_pretrained` writes (`hf_weights`; the config with its
    `dtype` and `architectures` set as it sets them), in one file (save_pretrained shards beyond 50 GB). Returns
    model.safetensors' (size, CRC-32) when the direct-I/O writer wrote it, else None."""
    tensors, path = hf_weights(model, weights), directory / "model.safetensors"
    model.config.dtype = str(model.dtype).removeprefix("torch.")
    model.config.architectures = [type(model).__name__.removeprefix("FSDP")]
    model.config.save_pretrained(directory)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(directory)
    if direct_io:
        return save_safetensors(tensors, path, {"format": "pt"})
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata={"format": "pt"})
    return None


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
