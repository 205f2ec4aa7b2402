"""terminal_streams: oomlab's characters in ASCII where the terminal's encoding lacks them, '?' for the rest."""

from __future__ import annotations

import io
import sys

import pytest

from oomlab.core.terminal import ASCII_FALLBACK, speaks_oomlab, terminal_streams


def ascii_stream() -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(), encoding="ascii")


def test_ascii_stream_gets_ascii(monkeypatch) -> None:
    """An ASCII stdout prints x, ->, -, ..., and '?' for a user's own character; it is put back afterwards."""
    stream = ascii_stream()
    monkeypatch.setattr(sys, "stdout", stream)
    with terminal_streams():
        print("4 × t4 → 8.00 GiB – 9 … ≥ 1 · é")
        sys.stdout.flush()
    assert sys.stdout is stream
    assert stream.buffer.getvalue() == b"4 x t4 -> 8.00 GiB - 9 ... >= 1 * ?\n"


def test_utf8_stream_untouched(monkeypatch) -> None:
    """A stream that can say everything is left as it is."""
    stream = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", stream)
    with terminal_streams():
        assert sys.stdout is stream
        print("4 × t4")
        sys.stdout.flush()
    assert stream.buffer.getvalue() == "4 × t4\n".encode()


@pytest.mark.parametrize(("encoding", "speaks"), [("utf-8", True), ("ascii", False), ("latin-1", False),
                                                  ("cp1252", False)])
def test_speaks_oomlab(encoding: str, speaks: bool) -> None:
    """Only an encoding of every character in the table is left alone (cp1252 has × and … but not →)."""
    assert speaks_oomlab(io.TextIOWrapper(io.BytesIO(), encoding=encoding)) is speaks


def test_table_is_ascii() -> None:
    """Every replacement is pure ASCII."""
    assert all(text.isascii() for text in ASCII_FALLBACK.values())
