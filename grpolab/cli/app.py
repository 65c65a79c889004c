"""The Typer application every verb module registers on, and the consoles they print to (no verb module imports
another; grpolab/cli/__init__.py imports them all)."""

from __future__ import annotations

import logging
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

app = typer.Typer(add_completion=False, no_args_is_help=True, help="GRPO post-training with held-out evidence.")
manifest_app = typer.Typer(no_args_is_help=True, help="Inspect run manifests.")
app.add_typer(manifest_app, name="manifest")
baseline_app = typer.Typer(
    no_args_is_help=True, help="Baselines on the same problems and budget: SFT / RFT, best-of-n, DPO, PPO."
)
app.add_typer(baseline_app, name="baseline")
console = Console()
err_console = Console(stderr=True)


def print_plain(text: str, label: str = "") -> None:
    """Print ``text`` to stdout exactly as given, on a terminal, a pipe or a file alike: no markup or emoji codes
    read from it (a formula's ``w_IS[token_mask]`` is text), no wrapping inserted by rich (a line longer than the
    console is the terminal's to wrap; a pipe gets it whole). ``label``: a bold word before it."""
    line = Text.assemble((label, "bold"), " ", text) if label else Text(text)
    console.print(line, soft_wrap=True, highlight=False)


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        console.print(f"grpolab {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="print the package version and exit"),
    ] = False,
) -> None:
    """GRPO post-training with held-out evidence."""


class _WarningLine(logging.Handler):
    """grpolab's warnings (skipped non-finite steps, invalid rewards, ...) as one stderr line each."""

    def emit(self, record: logging.LogRecord) -> None:
        err_console.print(f"[yellow]warning:[/] {record.getMessage()}", highlight=False, soft_wrap=True)


def _show_warnings() -> None:
    logger = logging.getLogger("grpolab")
    if not any(isinstance(h, _WarningLine) for h in logger.handlers):
        handler = _WarningLine(logging.WARNING)
        logger.addHandler(handler)
