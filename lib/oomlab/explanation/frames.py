"""Read the traceback around an out-of-memory message: frames and the numbered source lines it shows.

Python's own format, IPython's (7 and 8) and rich's boxed one.  Every quantifier is bounded; only the last
:data:`MAX_TRACE_LINES` lines, and the first 1,000 characters of each, are read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from oomlab.explanation.message import MAX_SCAN_CHARS

MAX_TRACE_LINES = 20_000  # traceback lines scanned (the last ones)


@dataclass(frozen=True)
class Frame:
    """One traceback frame: file, line, function, and the source line shown, if any."""

    file: str
    line: int
    function: str
    code: str  # "" when the traceback shows no source for the frame


@dataclass(frozen=True)
class SourceLine:
    """A numbered source line the traceback shows (rich/IPython gutters, or a frame's own line)."""

    file: str  # the frame header above it ("" when none was seen)
    line: int
    code: str
    current: bool  # the gutter marks it as the line executing (❱, -->); frame lines are current


_STD_FRAME = re.compile(r'File\s{1,3}"([^"\n]{0,400})",\s{0,3}line\s{1,3}(\d{1,7}),\s{0,3}in\s{1,3}([\w<>.]{1,200})')
# rich ("module.py:820 in _apply") and IPython 8 ("File ~/…/module.py:1130, in Module._call_impl(…)")
_PY_LINE_IN = re.compile(r"\.py:(\d{1,7}),?\s{1,3}in\s{1,3}([\w<>.]{1,200})")
_IPY7_FRAME = re.compile(r"\.py\s{1,3}in\s{1,3}([\w<>.]{1,200})\(")  # IPython 7: "…/module.py in _apply(self, fn)"
_GUTTER = re.compile(r"[\s│|┃]{0,12}(❱|-{1,3}>|>)?\s{0,6}(\d{1,7})\s{0,6}[│|┃]?\s(.{0,600})")
_BOX = re.compile(r"[│┃]")


def _path_before(line: str, end: int) -> str:
    """The path that ends at ``end`` (a ``.py`` suffix there): the last token before it."""
    head = _BOX.sub(" ", line[:end]).split()
    return (head[-1] if head else "").removeprefix("File") + ".py"


def parse_traceback(text: str | bytes) -> tuple[tuple[Frame, ...], tuple[SourceLine, ...]]:
    """Frames (outermost first) and numbered source lines of the tracebacks in ``text``.

    Understands Python's own format, IPython's (7 and 8) and rich's boxed one.  Only the last
    :data:`MAX_TRACE_LINES` lines, and the first 1,000 characters of each, are read.
    """
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    if not isinstance(text, str):
        return (), ()
    if len(text) > MAX_SCAN_CHARS:
        text = text[-MAX_SCAN_CHARS:]
    frames: list[Frame] = []
    sources: list[SourceLine] = []
    current_file = ""
    pending: tuple[str, int, str] | None = None  # a Python-format frame waiting for its source line
    for raw in text.splitlines()[-MAX_TRACE_LINES:]:
        line = raw[:1000]
        if pending is not None:
            code = line.strip()
            shows_code = bool(code) and not code.startswith(("^", "~", "File ")) and 'File "' not in line
            file, lineno, func = pending
            frames.append(Frame(file, lineno, func, code if shows_code else ""))
            pending = None
            if shows_code:
                sources.append(SourceLine(file, lineno, code, True))
                continue
        m = _STD_FRAME.search(line) if 'File "' in line else None
        if m:
            current_file = m.group(1)
            pending = (current_file, int(m.group(2)), m.group(3).rpartition(".")[2])
            continue
        m = _PY_LINE_IN.search(line) if ".py:" in line else None
        if m:
            current_file = _path_before(line, m.start())
            frames.append(Frame(current_file, int(m.group(1)), m.group(2).rpartition(".")[2], ""))
            continue
        m = _IPY7_FRAME.search(line) if ".py " in line else None
        if m:
            current_file = _path_before(line, m.start())
            frames.append(Frame(current_file, 0, m.group(1).rpartition(".")[2], ""))
            continue
        m = _GUTTER.match(line)
        if m:
            code = _BOX.sub(" ", m.group(3)).strip()
            if code:
                marked = bool(m.group(1))
                sources.append(SourceLine(current_file, int(m.group(2)), code, marked))
                if marked and frames and not frames[-1].code and frames[-1].file == current_file:
                    last = frames[-1]
                    frames[-1] = Frame(last.file, last.line or int(m.group(2)), last.function, code)
    if pending is not None:
        frames.append(Frame(*pending, ""))
    return tuple(frames), tuple(sources)
