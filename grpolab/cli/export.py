"""`grpolab export`: a run's trained model as a directory other tools load (grpolab.models.export.export_model)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .app import app, console


@app.command()
def export(
    run: Annotated[Path, typer.Argument(help="run directory (its newest checkpoint) or a checkpoint directory")],
    out: Annotated[Path, typer.Option("--out", help="directory to write (must not exist or be empty)")],
    merge: Annotated[
        bool, typer.Option("--merge", help="fold a LoRA adapter into the weights: a plain Hugging Face model")
    ] = False,
    dtype: Annotated[
        Optional[str], typer.Option("--dtype", help="float32 or bfloat16 weights (default float32)")
    ] = None,
) -> None:
    """Write a run's model with its tokenizer: a full fine-tuning run as a Hugging Face model; a LoRA run as its
    adapter (peft format), or with --merge as a plain Hugging Face model (AutoModelForCausalLM.from_pretrained)."""
    from ..errors import writable_dir
    from ..evaluation.eval_checks import check_dtype
    from ..models.export import export_model

    if dtype is not None:
        check_dtype(dtype)
    if not out.exists():
        writable_dir(out.parent, "--out")  # the export is written next to it, then renamed into place
    console.print(export_model(str(run), out, merge, dtype), highlight=False, soft_wrap=True)
