"""The `grpolab` command. One module per verb group, each registering on the shared app (grpolab/cli/app.py):
train.py (train), evaluate.py (eval, compare, baseline best-of-n / sft), baseline.py (baseline ppo / dpo / agent-sft),
report.py (report), export.py (export), release.py (release), manifest.py (manifest diff, models), score.py (score),
rm.py (rm train), card.py (card), bench.py (bench).

The CLI is a thin layer over the same functions the Python API (grpolab.api) calls; neither imports the other,
and nothing below the CLI imports it (contracts in pyproject.toml).
"""

from __future__ import annotations

import re
import sys

import click
import typer
from rich.markup import escape

from ..errors import GrpolabError
from ..sandbox.errors import SandboxError
from ..training.faults import TrainingInterrupted
from . import baseline, bench, card, evaluate, export, manifest, release, report, rm, score, train  # noqa: F401, I001  (register the verbs on `app`, in help order)
from .app import app, console, err_console

# typer >= 0.20 ships its own copy of click (typer._click): its exceptions are not click's, so both are caught
USAGE_ERRORS: tuple[type[Exception], ...] = (
    click.ClickException,
    getattr(typer, "TyperException", click.ClickException),
)
ABORTS: tuple[type[BaseException], ...] = (click.exceptions.Abort, typer.Abort)

__all__ = ["app", "console", "main"]


def main() -> None:
    """Entry point: user errors print one line to stderr and exit 2; a usage error (unknown option, missing or
    malformed argument) is typer's usage line plus one `error:` line, exit 2; Ctrl-C exits 130 (during training after
    writing a checkpoint, whose path is printed)."""
    try:
        code = app(standalone_mode=False)
    except TrainingInterrupted as e:
        err_console.print(str(e), highlight=False, soft_wrap=True)
        sys.exit(130)
    except (GrpolabError, SandboxError) as e:
        err_console.print(f"[red]error:[/] {escape(named_as_given(str(e)))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except USAGE_ERRORS as e:
        sys.exit(show_usage_error(e))
    except ABORTS:
        err_console.print("aborted")
        sys.exit(130)
    if isinstance(code, int) and code:  # typer.Exit(n) and Ctrl-C (Exit(130)) come back as the return value here
        sys.exit(code)


def named_as_given(message: str, argv: list[str] | None = None) -> str:
    """A task's error names its option as the config field task.options.X; a command given `--task-option X=...`
    (eval, score, the baselines, rm train) reads it as `--task-option X`, what the user typed."""
    if "--task-option" not in (sys.argv if argv is None else argv):
        return message
    return re.sub(r"\btask\.options\.(\w+)", r"--task-option \1", message)


def show_usage_error(e: Exception) -> int:
    """Print a usage error as the command's usage line (when known) and one `error:` line; its exit code (2 for a
    usage error). A bare `grpolab` / `grpolab manifest` prints the help, as before."""
    if type(e).__name__ == "NoArgsIsHelpError":
        e.show()  # type: ignore[attr-defined]
        return int(getattr(e, "exit_code", 2))
    ctx = getattr(e, "ctx", None)
    if ctx is not None:
        err_console.print(ctx.get_usage().strip(), highlight=False, soft_wrap=True, markup=False)
    message = " ".join(e.format_message().split())  # type: ignore[attr-defined]
    err_console.print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return int(getattr(e, "exit_code", 2))
