"""`grpolab train`: one run, a resume, or one run per seed; progress on a terminal, one line per step elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..errors import GrpolabError
from .app import _show_warnings, app, console


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
    nproc: Annotated[int, typer.Option("--nproc", help="data-parallel processes on this machine: launches torchrun "
                                                      "--nproc-per-node N -m grpolab train ...")] = 1,
) -> None:
    """Train with GRPO and write a run directory (manifest, metrics, samples, checkpoints)."""
    from ..config import load_config
    from ..runs import resume_run, start_run

    if nproc != 1:
        raise typer.Exit(launch_torchrun(nproc))
    console.quiet = int(os.environ.get("RANK", "0")) != 0  # under torchrun, rank 0 speaks for the run
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


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """The torchrun command that runs this `grpolab train` (argv without --nproc) in nproc processes.

    >>> torchrun_command(2, ["grpolab", "train", "c.yaml", "--nproc", "2", "--set", "train.steps=3"])[2:]
    ['torch.distributed.run', '--standalone', '--nproc-per-node=2', '-m', 'grpolab', 'train', 'c.yaml', '--set', 'train.steps=3']
    """
    args, skip = [], False
    for a in argv[1:]:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            args.append(a)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "grpolab", *args]


def launch_torchrun(nproc: int) -> int:
    """Run this command under torchrun in nproc processes; their exit code."""
    if nproc < 1:
        raise GrpolabError(f"--nproc: expected an integer >= 1, got {nproc}")
    cmd = torchrun_command(nproc, sys.argv)
    console.print(f"[bold]launch[/] {' '.join(cmd[1:])}", highlight=False, soft_wrap=True)
    return subprocess.run(cmd).returncode


def _parse_seeds(text: str) -> list[int]:
    """'1,2,3' -> [1, 2, 3]; anything else is a clear error."""
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise GrpolabError(f"--seeds: expected comma-separated integers like 1,2,3, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise GrpolabError(f"--seeds: expected distinct integers like 1,2,3, got {text!r}")
    return seeds


def step_line(step: int, total: int, m: dict[str, float], held_out: float | None) -> str:
    """The progress of one step as one line (reward, held-out accuracy when measured, step time).

    >>> step_line(3, 30, {"reward/mean": 0.5, "time/step_s": 9.25}, 0.625)
    'step 3/30  reward 0.500  held-out 0.625  9.2s/step'
    """
    text = f"step {step}/{total}  reward {m['reward/mean']:.3f}"
    if held_out is not None:
        text += f"  held-out {held_out:.3f}"
    return text + f"  {m['time/step_s']:.1f}s/step"


def _fit(trainer) -> None:
    """Train `trainer` to its configured steps: a live progress bar on a terminal; one plain line per step when
    stdout is a file or a pipe (CI, nohup, a log), so a long run is never silent."""
    from ..card import objective_card

    cfg, run_dir = trainer.cfg, trainer.run_dir
    console.print(f"[bold]data[/] {_data_line(trainer.data_summary)}", highlight=False)
    console.print(f"[bold]objective[/] {objective_card(cfg)['formula']}")
    if trainer.step >= cfg.train.steps:
        console.print(f"already finished: step {trainer.step} of train.steps = {cfg.train.steps}; nothing to do")
        return

    def line(step: int, m: dict[str, float]) -> str:
        return step_line(step, cfg.train.steps, m, trainer.last_eval.accuracy if trainer.last_eval else None)

    def plain(step: int, m: dict[str, float]) -> None:
        console.print(line(step, m), highlight=False, soft_wrap=True)
        console.file.flush()  # a log file or a pipe is block-buffered: each line must reach it when it is printed

    if not console.is_terminal:
        trainer.fit(plain)
    else:
        with _progress() as progress:
            task = progress.add_task("train", total=cfg.train.steps, completed=trainer.step, info="")
            trainer.fit(lambda step, m: progress.update(task, completed=step, info=line(step, m).split("  ", 1)[1]))
    console.print(f"[green]done[/] checkpoints in {run_dir / 'checkpoints'}", highlight=False, soft_wrap=True)


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
