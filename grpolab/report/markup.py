"""HTML building blocks of the report (escaped text, numbers, tables, preformatted samples), shared by the page
renderer (render.py) and the sections of individual checks (reward_model.py)."""

from __future__ import annotations

import html
from typing import Any, Iterable, Sequence


def esc(x: Any) -> str:
    """HTML-escaped text with '://' defused.

    >>> esc('<a href="http://x">')
    '&lt;a href=&quot;http&#58;//x&quot;&gt;'
    """
    return html.escape(str(x)).replace("://", "&#58;//")


def fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return "—" if x is None else str(x)


def table(head: Sequence[str], rows: Iterable[Sequence[Any]], raw: bool = False) -> str:
    """An HTML table; cells are escaped unless raw=True (for cells already rendered)."""
    cell = (lambda c: str(c)) if raw else (lambda c: esc(fmt(c)))
    body = "".join("<tr>" + "".join(f"<td>{cell(c)}</td>" for c in r) + "</tr>" for r in rows)
    return "<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + f"</tr>{body}</table>"


def pre(text: str, limit: int = 600) -> str:
    text = text if len(text) <= limit else text[:limit] + " …[cut]"
    return f"<pre>{esc(text)}</pre>"
