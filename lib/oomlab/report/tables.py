"""Display helpers for notebooks and reports: HTML tables with every cell escaped."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any


def html_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], caption: str | None = None) -> str:
    """An HTML ``<table>``; every header and cell is escaped (user text cannot inject markup)."""
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape('' if c is None else str(c))}</td>" for c in row) + "</tr>"
        for row in rows
    )
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f'<table class="oomlab">{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def show_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], caption: str | None = None) -> Any:
    """``html_table`` wrapped for display in a notebook."""
    from IPython.display import HTML

    return HTML(html_table(headers, rows, caption))
