"""The `grpolab` command. One module per verb group, each registering on the shared app (grpolab/cli/app.py):
train.py (train), evaluate.py (eval, compare, baseline), report.py (report), export.py (export), release.py (release),
manifest.py (manifest diff, models), score.py (score).

The CLI is a thin layer over the same functions the Python API (grpolab.api) calls; neither imports the other,
and nothing below the CLI imports it (contracts in pyproject.toml).
"""

from __future__ import annotations

import sys

import click

from ..errors import GrpolabError
from ..sandbox.errors import SandboxError
from ..training.faults import TrainingInterrupted
from . import train, evaluate, baseline, report, export, release, manifest, score, rm  # noqa: F401, I001  (register the verbs on `app`, in help order)
from .app import app, console, err_console

__all__ = ["app", "console", "main"]


def main() -> None:
    """Entry point: user errors print one line to stderr and exit 2; usage errors are click's own messages;
    Ctrl-C exits 130 (during training after writing a checkpoint, whose path is printed)."""
    try:
        app(standalone_mode=False)
    except TrainingInterrupted as e:
        err_console.print(str(e), highlight=False, soft_wrap=True)
        sys.exit(130)
    except (GrpolabError, SandboxError) as e:
        err_console.print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        err_console.print("aborted")
        sys.exit(130)
