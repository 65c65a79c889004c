"""The `grpolab report` command (release gate)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .app import app, console

SAFETY_PROMPTS_HELP = (
    'JSONL of harmful requests for the safety probe, one {"prompt": ...} a line (optional id, category); default: '
    "the 30 shipped with grpolab, too few to show non-inferiority at 0.05"
)
WAIVE_HELP = (
    "accept a harm dimension without shown non-inferiority: capability, capability:TASK, pass_at_k, safety; recorded "
    "in the report and named in the verdict; repeatable"
)


@app.command()
def report(
    run_dirs: Annotated[
        list[Path],
        typer.Argument(
            help="run directory (manifest.json, metrics.jsonl, eval/*.json), RUN:best to judge its best checkpoint by held-out accuracy; several: the seeds of one recipe, judged as a set"
        ),
    ],
    baseline: Annotated[
        list[str], typer.Option("--baseline", help="'base', an eval JSON, or another run directory; repeatable")
    ] = [],
    threshold: Annotated[
        list[str], typer.Option("--threshold", help="override a check threshold: NAME=VALUE; repeatable")
    ] = [],
    skip_safety: Annotated[
        bool,
        typer.Option("--skip-safety", help="do not run the harmful-request probe (the check WARNs 'not measured')"),
    ] = False,
    safety_max_new_tokens: int = 64,
    safety_prompts: Annotated[Optional[Path], typer.Option(help=SAFETY_PROMPTS_HELP)] = None,
    capability_task: Annotated[
        str, typer.Option(help="evaluate base and trained model on this untrained task, e.g. gsm8k")
    ] = "",
    capability_n: Annotated[int, typer.Option(help="problems for --capability-task")] = 50,
    capability_option: Annotated[
        list[str], typer.Option("--capability-option", help="task option KEY=VALUE, e.g. path=data/gsm8k")
    ] = [],
    capability_max_new_tokens: int = 256,
    skip_diversity: Annotated[
        bool,
        typer.Option(
            "--skip-diversity", help="do not sample held-out pass@k of base and trained model (the check is then N/A)"
        ),
    ] = False,
    diversity_n: Annotated[int, typer.Option(help="held-out problems for the pass@k diversity check")] = 64,
    diversity_samples: Annotated[
        int, typer.Option(help="samples per problem at the training temperature (n >= k = 8)")
    ] = 8,
    out: Annotated[
        Optional[Path], typer.Option(help="directory for the report of a set of runs (default RUNS/<name>-set)")
    ] = None,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16, for the models this command runs")] = "float32",
    strict: Annotated[bool, typer.Option("--strict", help="exit 1 unless the verdict is 'ship' (for CI)")] = False,
    waive: Annotated[list[str], typer.Option("--waive", help=WAIVE_HELP)] = [],
) -> None:
    """Release gate: checks (reward hacking, learning signal, drift, regressions, diversity, uncertainty) -> report.html +
    report.md. Several run directories (seeds of one recipe): every interval over runs and problems, one verdict."""
    from ..config import parse_option
    from ..evaluation.eval_checks import check_dtype
    from ..gate.thresholds import parse_thresholds
    from ..report import ReportOptions, build_report
    from ..report.diversity import DiversitySettings

    check_dtype(dtype)
    check_report_outputs(run_dirs, out)
    opts = ReportOptions(
        baselines=list(baseline),
        thresholds=parse_thresholds(threshold),
        skip_safety=skip_safety,
        safety_max_new_tokens=safety_max_new_tokens,
        safety_prompts=safety_prompts,
        dtype=dtype,
        capability_task=capability_task or None,
        capability_n=capability_n,
        capability_options=dict(parse_option(o) for o in capability_option),
        capability_max_new_tokens=capability_max_new_tokens,
        skip_diversity=skip_diversity,
        diversity=DiversitySettings(n_problems=diversity_n, samples=diversity_samples),
        out=out,
        waived=tuple(waive),
    )
    result = build_report(run_dirs, opts, log=lambda s: console.print(f"[dim]{s}[/]"))
    print_result(result)
    if strict and result["verdict"][0] != "ship":
        sys.exit(1)


def print_result(result: dict) -> None:
    """Each check on a line, the verdict, the FAIL rules' family-wise error rate, the files written."""
    colour = {"PASS": "green", "WARN": "yellow", "FAIL": "red", "N/A": "dim"}
    for c in result["checks"]:
        console.print(f"[{colour[c.status]}]{c.status:4}[/] {c.name:22} {c.reason}", highlight=False, soft_wrap=True)
    label, why = result["verdict"]
    style = {"ship": "bold green", "don't ship": "bold red"}.get(label, "bold yellow")
    console.print(f"[{style}]verdict: {label}[/] — {why}", highlight=False, soft_wrap=True)
    console.print(f"[dim]{result['family']}[/]", highlight=False, soft_wrap=True)
    console.print(f"wrote {result['paths']['html']} and {result['paths']['md']}")


def check_report_outputs(run_dirs: list[Path], out: Optional[Path]) -> None:
    """Where the report will be written accepts files, before any model runs: one run's report.html / report.md go
    into its directory; a set's into ``--out`` (else a new directory beside the runs). A missing run directory is
    left to build_report's own error."""
    from ..errors import writable_dir

    runs = [Path(str(run).removesuffix(":best")) for run in run_dirs]
    if len(runs) > 1 and out is not None:
        writable_dir(out, "--out")
    elif runs and runs[0].is_dir():
        writable_dir(runs[0] if len(runs) == 1 else runs[0].parent, f"report {runs[0]}")
