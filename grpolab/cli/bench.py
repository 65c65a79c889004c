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
    estimate: Annotated[
        Optional[str], typer.Option("--estimate", help="no measurement: estimate for a named GPU (H100, A100, ...)")
    ] = None,
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", help="with --estimate: prompt length")] = 256,
) -> None:
    """How fast and how much memory: trainer-only and end-to-end tokens/s, MFU, peak memory, beside published
    figures; or, with --estimate GPU, the step time and memory a GPU's spec sheet predicts (nothing is run)."""
    from ..config import load_config

    if steps < 1 or repeats < 1:
        raise GrpolabError(f"--steps and --repeats: expected integers >= 1, got {steps} and {repeats}")
    _show_warnings()
    cfg = load_config(config, set_)
    if estimate is not None:
        result, lines = estimate_for(cfg, estimate, prompt_tokens)
    else:
        from ..training.bench import bench_lines, run_bench

        result = run_bench(cfg, steps=steps, repeats=repeats, progress=say)
        lines = bench_lines(result)
    result["config"] = str(config)
    for line in lines:
        print_plain(line)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        console.print(f"[bold]wrote[/] {out}", highlight=False, soft_wrap=True)


def estimate_for(cfg, gpu: str, prompt_tokens: int) -> tuple[dict, list[str]]:
    """grpolab.training.estimate for cfg's model (its config.json only: no weights load) on the named GPU."""
    from transformers import AutoConfig

    from ..models.load import resolve_model_path
    from ..training.estimate import estimate, estimate_lines, gpu_spec, model_sizes, run_shape

    if prompt_tokens < 1:
        raise GrpolabError(f"--prompt-tokens: expected an integer >= 1, got {prompt_tokens}")
    try:
        spec = gpu_spec(gpu)
    except ValueError as e:
        raise GrpolabError(f"--estimate: {e}") from None
    try:
        model_config = AutoConfig.from_pretrained(resolve_model_path(cfg.model.name))
    except (OSError, ValueError) as e:
        raise GrpolabError(f"model.name {cfg.model.name!r}: cannot read its config.json ({e})") from None
    shape, params, d_kv = model_sizes(model_config)
    result = estimate(shape, params, d_kv, run_shape(cfg, prompt_tokens), spec)
    result.update(model=cfg.model.name, parameters=params, prompt_tokens=prompt_tokens)
    return result, estimate_lines(result)
