"""User text in Markdown, and a GitHub Markdown table, written once for every stage that writes Markdown (the
report's HTML tables are :func:`oomlab.report.tables.html_table`).

Text a user supplied (a path, a command, a config key or value) goes into Markdown only through :func:`md_text`
(inline text: every ASCII punctuation character backslash-escaped, so ``[x](javascript:…)``, ``<img …>``, ``*``,
backticks and a backslash before a backtick all read as the characters they are), :func:`md_code` (a code span whose
fence is longer than any run of backticks inside) or :func:`md_code_block` (a fenced block, likewise).  CommonMark
(and so GitHub and nbconvert's mistune) renders each as exactly the user's characters.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence

# What can start markup inside a line (CommonMark, GFM's tables and strikethrough, nbconvert's $ math); a link or an
# image needs its "[", so "(", ")", "!", ":" and "/" stay as they are and a path or a name reads unchanged.
_INLINE = re.compile(r"([\\`*_\[\]<>&|~$])")
_BLOCK_START = re.compile(r"^(\s*)(?:([#>+=-])|(\d+)([.)]))")  # a heading, quote, list or rule at a paragraph start
_BACKTICKS = re.compile(r"`+")
_LINE_BREAK = re.compile(r"[\r\n\u2028\u2029]+")


def md_text(value: object) -> str:
    """``value`` as literal inline Markdown: every character that could start markup backslash-escaped (CommonMark
    lets any ASCII punctuation be), line breaks as spaces; a shipped name or a plain path reads unchanged."""
    text = _INLINE.sub(r"\\\1", _LINE_BREAK.sub(" ", str(value)))
    return _BLOCK_START.sub(lambda m: m.group(1) + (f"\\{m.group(2)}" if m.group(2) else f"{m.group(3)}\\{m.group(4)}"),
                            text, count=1)


def _fence(text: str, least: int) -> str:
    longest = max((len(run) for run in _BACKTICKS.findall(text)), default=0)
    return "`" * max(least, longest + 1)


def md_code(value: object) -> str:
    """``value`` as one inline code span (line breaks as spaces), fenced so that no backtick inside can close it."""
    text = _LINE_BREAK.sub(" ", str(value))
    fence = _fence(text, 1)
    pad = " " if text.startswith(("`", " ")) or text.endswith(("`", " ")) or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_code_block(text: str, language: str = "") -> str:
    """``text`` as a fenced code block, fenced longer than any run of backticks it holds."""
    fence = _fence(text, 3)
    return f"{fence}{language}\n{text.rstrip(chr(10))}\n{fence}"


def markdown_cell(text: object) -> str:
    """``text`` safe inside a table cell: ``|`` escaped, line breaks as spaces (oomlab's own Markdown; a user's
    text is passed through :func:`md_text` or :func:`md_code` first)."""
    return _LINE_BREAK.sub(" ", _PIPE_OR_ESCAPE.sub(_escape_pipe, str(text)))


_PIPE_OR_ESCAPE = re.compile(r"\\.|\|")  # an escape pair is kept as it is (md_text's "\\|"), a bare pipe escaped


def _escape_pipe(match: re.Match[str]) -> str:
    return "\\|" if match.group(0) == "|" else match.group(0)


def _line(cells: Iterable[object]) -> str:
    return "|" + "|".join(f" {markdown_cell(c)} " if str(c) else " " for c in cells) + "|"


def markdown_table(header: Sequence[object], rows: Iterable[Sequence[object]], right: Collection[int] = ()) -> str:
    """``header`` and ``rows`` as a Markdown table, every cell escaped; the columns numbered in ``right`` aligned to
    the right (``---:``)."""
    lines = [_line(header), "|" + "".join("---:|" if i in right else "---|" for i in range(len(header)))]
    lines += [_line(row) for row in rows]
    return "\n".join(lines)
