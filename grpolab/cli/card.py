"""`grpolab card`: the objective card of a run (from its manifest.json) or of a config (built from the config alone:
no model, tokenizer or data is loaded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import GrpolabError
from .app import app, print_plain


def _run_card(manifest_path: Path) -> dict[str, Any]:
    """The objective card a run's manifest.json stores (in today's form: grpolab.card.recorded.upgrade_manifest)."""
    from ..card.recorded import upgrade_manifest

    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):
        raise GrpolabError(
            f"{manifest_path}: no such file; expected a run directory written by `grpolab train` (with manifest.json)"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GrpolabError(f"{manifest_path}: not valid JSON ({e})") from None
    card = upgrade_manifest(manifest).get("objective") if isinstance(manifest, dict) else None
    if not isinstance(card, dict) or "formula" not in card:
        raise GrpolabError(f"{manifest_path}: no objective card in this manifest (expected an 'objective' entry)")
    return card


def _config_card(path: Path, overrides: list[str]) -> dict[str, Any]:
    """The card the config would give a run (precision shown as configured: `auto` is resolved by the trainer)."""
    from ..card import objective_card
    from ..config import load_config

    return objective_card(load_config(path, overrides))


def load_card(source: Path, overrides: list[str]) -> tuple[dict[str, Any], str]:
    """(card, what it is of): a run directory or its manifest.json, else a config YAML."""
    if not source.exists():
        raise GrpolabError(
            f"{source}: no such file or directory; expected a run directory (with manifest.json) or a config YAML"
        )
    manifest = source / "manifest.json" if source.is_dir() else source
    if source.is_dir() or source.suffix == ".json":
        if overrides:
            raise GrpolabError("--set applies to a config YAML; a run's card is the one its manifest stores")
        return _run_card(manifest), f"run {source}"
    return _config_card(source, overrides), f"config {source}" + "".join(f" --set {o}" for o in overrides)


@app.command()
def card(
    source: Annotated[Path, typer.Argument(help="a run directory (its manifest.json) or a config YAML")],
    set_: Annotated[list[str], typer.Option("--set", help="with a config: override a field, --set a.b=value")] = [],
    as_json: Annotated[bool, typer.Option("--json", help="print the card as JSON (as the manifest stores it)")] = False,
) -> None:
    """Print the objective card: the loss as a formula, every choice, and the matching TRL / verl / OpenRLHF settings.
    Of a run: the card its manifest stores. Of a config: the card a run of it would store, built without loading any
    model (the precision is shown as configured; `auto` is resolved when training starts)."""
    found, what = load_card(source, set_)
    if as_json:
        print_plain(json.dumps(found, indent=2))
        return
    from ..card.text import card_lines

    print_plain(f"objective card of the {what}")
    for line in card_lines(found):
        print_plain(line)
