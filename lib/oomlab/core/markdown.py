"""A GitHub Markdown table, written once for every stage that writes one (the report's HTML tables are
:func:`oomlab.report.tables.html_table`)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence


def markdown_cell(text: object) -> str:
    """``text`` safe inside a table cell: ``|`` escaped, line breaks as spaces."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _line(cells: Iterable[object]) -> str:
    return "|" + "|".join(f" {markdown_cell(c)} " if str(c) else " " for c in cells) + "|"


def markdown_table(header: Sequence[object], rows: Iterable[Sequence[object]], right: Collection[int] = ()) -> str:
    """``header`` and ``rows`` as a Markdown table, every cell escaped; the columns numbered in ``right`` aligned to
    the right (``---:``)."""
    lines = [_line(header), "|" + "".join("---:|" if i in right else "---|" for i in range(len(header)))]
    lines += [_line(row) for row in rows]
    return "\n".join(lines)
