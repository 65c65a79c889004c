"""`grpolab bench CONFIG`: trainer-only and end-to-end tokens/s, MFU and peak memory of a config on this machine
(grpolab.training.bench), printed beside published anchors and written as JSON with --out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from ..errors import GrpolabError
from .app import _show_warnings, app, console, print_plain


def say(message: str) -> None:
    """A phase that can take a while, one dim indented line."""
    console.print(f"[dim]  {escape(message)}[/]", highlight=False, soft_wrap=True)
    console.file.flush()


@app.command()
def bench(
    config: Annotated[Path, typer.Argument(help="YAML config: its model, shapes, precision and device are measured")],
    set_: Annotated[list[str], typer.Option("--set", help="override a field: --set train.micro_batch_size=8")] = [],
    steps: Annotated[int, typer.Option("--steps", help="real GRPO steps for end-to-end (the first is warm-up)")] = 2,
    repeats: Annotated[int, typer.Option("--repeats", help="timed trainer-only updates after one warm-up")] = 1,
    out: Annotated[Optional[Path], typer.Option("--out", help="write the measurements as JSON here")] = None,
) -> None:
    """How fast and how much memory: trainer-only and end-to-end tokens/s, MFU, peak memory, beside published
    figures."""
    from ..config import load_config
    from ..training.bench import bench_lines, run_bench

    if steps < 1 or repeats < 1:
        raise GrpolabError(f"--steps and --repeats: expected integers >= 1, got {steps} and {repeats}")
    _show_warnings()
    result = run_bench(load_config(config, set_), steps=steps, repeats=repeats, progress=say)
    result["config"] = str(config)
    for line in bench_lines(result):
        print_plain(line)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        console.print(f"[bold]wrote[/] {out}", highlight=False, soft_wrap=True)
