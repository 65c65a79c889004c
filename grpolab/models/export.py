"""Export a run's model: a full model as a Hugging Face directory; a LoRA checkpoint as its adapter (peft format) or
merged into a plain model (grpolab export)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..errors import GrpolabError
from .load import DTYPES, adapter_base, load_causal_lm, load_merged, load_tokenizer, resolve_model_path
from .lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, is_adapter_dir


def export_model(source: str, out: Path, merge: bool, dtype: str | None = None) -> str:
    """Write the model of `source` (a run directory: its newest checkpoint; or a checkpoint / model directory) to
    `out`, atomically, with its tokenizer; returns one line saying what was written.

    A LoRA checkpoint becomes a plain Hugging Face model with --merge, else a copy of the adapter (peft format,
    loadable with PeftModel.from_pretrained on its base); a full model is written as it is (nothing to merge).
    dtype: float32 (default) | bfloat16 for the written weights (not for an unmerged adapter, copied as trained)."""
    if dtype is not None and dtype not in DTYPES:
        raise GrpolabError(f"--dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GrpolabError(f"--out: {out} already exists and is not empty; choose another directory")
    path = Path(resolve_model_path(str(source)))
    adapter = is_adapter_dir(path)
    if adapter and not merge and dtype is not None:
        raise GrpolabError("--dtype applies to a merged model; an adapter is copied as it was trained (add --merge)")
    tokenizer = load_tokenizer(str(path))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        os.chmod(tmp, 0o755)
        if adapter and not merge:
            for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
                shutil.copy2(path / name, tmp / name)
            what = f"the LoRA adapter of {path} (base: {adapter_base(path)})"
        else:
            if adapter:
                model, what = load_merged(path, dtype or "float32"), f"{path} merged into a plain model"
            else:
                model = load_causal_lm(str(path), dtype or "float32")
                what = f"the full model {path}" + (" (nothing to merge: not a LoRA checkpoint)" if merge else "")
            model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return f"wrote {what} to {out}"
