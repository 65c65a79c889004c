"""`grpolab train`: one run, a resume, or one run per seed; progress on a terminal, one line per step elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..errors import GrpolabError, writable_dir
from ..training.progress_lines import step_line, trainer_step_line  # noqa: F401  (step_line: part of this module's interface)
from .app import _show_warnings, app, console, print_plain


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]step"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
    )


@app.command()
def train(
    config: Annotated[Optional[Path], typer.Argument(help="YAML config (defaults when omitted)")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="override a field: --set train.steps=50")] = [],
    resume: Annotated[
        Optional[Path],
        typer.Option("--resume", help="continue RUN_DIR from its last complete checkpoint (config from its manifest)"),
    ] = None,
    allow_changes: Annotated[
        bool, typer.Option("--allow-changes", help="with --resume: accept (and record) differences from the manifest")
    ] = False,
    seeds: Annotated[
        Optional[str], typer.Option("--seeds", help="repeat the run once per seed, e.g. 1,2,3 (one run directory each)")
    ] = None,
    nproc: Annotated[
        int,
        typer.Option(
            "--nproc",
            help="data-parallel processes on this machine: launches torchrun --nproc-per-node N -m grpolab train ...",
        ),
    ] = 1,
    from_intact: Annotated[
        bool,
        typer.Option(
            "--from-intact",
            help="with --resume: when the newest checkpoint is "
            "corrupt, resume from the newest intact one; the corrupt one is kept, "
            "renamed checkpoints/corrupt-step-N",
        ),
    ] = False,
) -> None:
    """Train with GRPO and write a run directory (manifest, metrics, samples, checkpoints)."""
    from ..config import load_config
    from ..runs import start_run

    if nproc != 1:
        raise typer.Exit(launch_torchrun(nproc))
    console.quiet = int(os.environ.get("RANK", "0")) != 0  # under torchrun, rank 0 speaks for the run
    _show_warnings()
    if resume is not None:
        if config is not None:
            raise GrpolabError(
                "--resume RUN_DIR reads its config from RUN_DIR/manifest.json; pass no config file "
                "(change fields with --set ... --allow-changes)"
            )
        if seeds is not None:
            raise GrpolabError(
                "--seeds starts one new run per seed and cannot be combined with --resume RUN_DIR; "
                "resume each seed's run directory with its own `grpolab train --resume RUN_DIR`"
            )
        _resume(resume, set_, allow_changes, from_intact)
        return
    for flag, given in (("--allow-changes", allow_changes), ("--from-intact", from_intact)):
        if given:
            raise GrpolabError(f"{flag} only applies with --resume RUN_DIR")
    if seeds is None:
        cfg = load_config(config, set_)
        writable_dir(cfg.run.output_dir, "run.output_dir")
        trainer, _ = start_run(cfg, progress=show_progress)
        console.print(f"[bold]run[/] {trainer.run_dir}", highlight=False, soft_wrap=True)
        _fit(trainer)
        return
    seed_list = _parse_seeds(seeds)
    base = load_config(config, set_)
    writable_dir(base.run.output_dir, "run.output_dir")
    name = (
        base.run.name or f"{base.task.name.replace(':', '-')}-{base.algorithm.preset}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    run_dirs = []
    for seed in seed_list:
        trainer, _ = start_run(
            load_config(config, [*set_, f"train.seed={seed}", f"run.name={name}-seed{seed}"]), progress=show_progress
        )
        console.print(f"[bold]run[/] {trainer.run_dir} (seed {seed})", highlight=False, soft_wrap=True)
        _fit(trainer)
        run_dirs.append(str(trainer.run_dir))
    for line in seeds_next_steps(base, run_dirs, name):
        console.print(line, highlight=False, soft_wrap=True, markup=False)


def show_progress(message: str) -> None:
    """A phase of the run that can take a while (grpolab.training.trainer.Progress: loading the model, the first
    step's sampling, a held-out eval, a checkpoint write), one dim indented line (told apart from the step lines),
    flushed at once into a log or a pipe."""
    console.print(f"[dim]  {escape(message)}[/]", highlight=False, soft_wrap=True)
    console.file.flush()


def _resume(run_dir: Path, set_: list[str], allow_changes: bool, from_intact: bool) -> None:
    """`grpolab train --resume RUN_DIR`: its directory writable, then the run continued from its newest (intact)
    checkpoint."""
    from ..runs import resume_run

    if run_dir.is_dir():
        writable_dir(run_dir, "--resume")
    trainer, ckpt = resume_run(run_dir, set_, allow_changes, progress=show_progress, from_intact=from_intact)
    console.print(
        f"[bold]resume[/] {run_dir} from " + (f"{ckpt.name}" if ckpt else "step 0 (no checkpoint yet)"),
        highlight=False,
        soft_wrap=True,
    )
    _fit(trainer)


def seeds_next_steps(cfg, run_dirs: list[str], name: str) -> list[str]:
    """What to run after `train --seeds`: with a periodic held-out eval, `grpolab compare` of the run directories
    (their last periodic evals side by side, a seed group with mean and spread); without one, compare has nothing
    to read, so first `grpolab eval` of the base model and every seed's run on the run's held-out task (which
    prints the set's mean gain over runs and problems) into one JSON, then `grpolab compare` of it."""
    import shlex

    if cfg.eval.every_steps > 0:
        return [f"compare the seeds: grpolab compare {' '.join(map(shlex.quote, run_dirs))}"]
    options = [
        a
        for k, v in cfg.task.options.items()
        for a in ("--task-option", f"{k}={v if isinstance(v, str) else json.dumps(v)}")
    ]
    out = str(Path(cfg.run.output_dir) / f"{name}-seeds-eval.json")
    tokens = cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
    evaluate = [
        "grpolab",
        "eval",
        cfg.model.name,
        *run_dirs,
        "--task",
        cfg.task.name,
        *options,
        "--split",
        cfg.eval.split,
        "--max-new-tokens",
        str(tokens),
        "--out",
        out,
    ]
    return [
        f"evaluate the seeds against the base model: {shlex.join(evaluate)}",
        f"then compare them: grpolab compare {shlex.quote(out)}",
    ]


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
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "grpolab",
        *args,
    ]


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


def _fit(trainer) -> None:
    """Train `trainer` to its configured steps: a live progress bar on a terminal; one plain line per step when
    stdout is a file or a pipe (CI, nohup, a log), so a long run is never silent."""
    from ..card import objective_card

    cfg, run_dir = trainer.cfg, trainer.run_dir
    console.print(f"[bold]data[/] {_data_line(trainer.data_summary)}", highlight=False)
    print_plain(objective_card(cfg)["formula"], label="objective")  # as the manifest stores it, never wrapped
    if trainer.step >= cfg.train.steps:
        console.print(f"already finished: step {trainer.step} of train.steps = {cfg.train.steps}; nothing to do")
        return

    def line(step: int, m: dict[str, float]) -> str:
        return trainer_step_line(trainer, step, m)

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
