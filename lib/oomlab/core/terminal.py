"""What oomlab prints, said in the terminal's encoding: ``×`` as ``x``, ``→`` as ``->`` where the encoding lacks
them (``PYTHONIOENCODING=ascii``, ``LC_ALL=C`` without UTF-8 mode), instead of a UnicodeEncodeError.

:func:`terminal_streams` wraps standard output and error for the duration of a command; a stream that can encode
every character of :data:`ASCII_FALLBACK` is left as it is.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["ASCII_FALLBACK", "terminal_streams"]

# What oomlab prints beyond ASCII, in ASCII; anything else (a user's own text) becomes "?"
ASCII_FALLBACK = str.maketrans({
    "×": "x", "→": "->", "−": "-", "–": "-", "—": "--", "…": "...", "·": "*", "≥": ">=", "≤": "<=", "≈": "~",
    "±": "+/-", "≠": "!=", "µ": "u", "’": "'", "‘": "'", "“": '"', "”": '"', "\u00a0": " ", "│": "|", "┃": "|",
    "─": "-", "╰": "+", "╯": "+", "❱": ">", "◀": "<", "✓": "ok",
})


class _AsciiFallback:
    """A text stream that writes through :data:`ASCII_FALLBACK` to one whose encoding lacks those characters."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(text.translate(ASCII_FALLBACK))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def speaks_oomlab(stream: Any) -> bool:
    """Can ``stream`` encode every character oomlab prints?"""
    try:
        "".join(map(chr, ASCII_FALLBACK)).encode(getattr(stream, "encoding", None) or "utf-8")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


@contextmanager
def terminal_streams() -> Iterator[None]:
    """Within the block, ``sys.stdout`` and ``sys.stderr`` write :data:`ASCII_FALLBACK`'s ASCII where their encoding
    lacks oomlab's characters, and ``?`` for any other character they cannot encode (``errors="replace"``, the last
    resort); both are put back afterwards."""
    saved = sys.stdout, sys.stderr
    for name, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)):
        if stream is not None and not speaks_oomlab(stream):
            if hasattr(stream, "reconfigure"):
                stream.reconfigure(errors="replace")
            setattr(sys, name, _AsciiFallback(stream))
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
