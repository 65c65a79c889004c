"""The objective card as plain text lines (what `grpolab card` prints): the formula exactly as the manifest stores
it, every choice, and each peer's rows with their verdict and settings."""

from __future__ import annotations

import json
from typing import Any

_SHOWN_FIRST = ("preset", "formula", "formula_latex", "choices", "equivalents")


def _value(x: Any) -> str:
    """A choice's value on one line: strings as they are, the rest as compact JSON."""
    return x if isinstance(x, str) else json.dumps(x, separators=(", ", ": "))


def _peer_lines(peer: str, rows: dict[str, Any]) -> list[str]:
    """One peer: its version and interface, then one line per axis: verdict, settings, the difference or a note."""
    lines = [f"  {peer} ({rows.get('checked_against', '?')}; {rows.get('interface', '?')})"]
    for axis, row in rows.items():
        if not isinstance(row, dict):
            continue
        settings = " ".join(f"{k}={_value(v)}" for k, v in (row.get("settings") or {}).items())
        line = f"    {axis}: {row.get('match', '?')}" + (f"  {settings}" if settings else "")
        for extra in ("difference", "note"):
            if row.get(extra):
                line += f"  ({extra}: {row[extra]})"
        lines.append(line)
    return lines


def card_lines(card: dict[str, Any]) -> list[str]:
    """The card's text, one line per entry; the formula and its LaTeX are each one line, unchanged."""
    lines = [
        f"preset: {card.get('preset', '?')}",
        f"formula: {card.get('formula', '?')}",
        f"latex: {card.get('formula_latex', '?')}",
        "choices:",
    ]
    lines += [f"  {key}: {_value(value)}" for key, value in (card.get("choices") or {}).items()]
    lines += [f"{key}: {_value(value)}" for key, value in card.items() if key not in _SHOWN_FIRST]
    peers = card.get("equivalents") or {}
    if peers:
        lines.append("peer equivalents (exact: the same numbers; nearest: the difference in one phrase):")
        for peer, rows in peers.items():
            lines += _peer_lines(peer, rows)
    return lines
