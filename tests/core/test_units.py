"""format_size matches torch's c10 format_size; parse_size reads what it prints."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomlab.core.errors import InvalidValueError
from oomlab.core.units import GiB, KiB, MiB, format_size, parse_size


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 bytes"),
        (1, "1 bytes"),
        (1024, "1024 bytes"),  # boundary: "size <= 1024" stays in bytes
        (1025, "1.00 KiB"),
        (1536, "1.50 KiB"),
        (MiB, "1024.00 KiB"),  # boundary: exactly 1 MiB prints in KiB
        (MiB + 1, "1.00 MiB"),
        (141557760, "135.00 MiB"),  # the seed's 5120 x 13824 fp16 projection
        (142606336, "136.00 MiB"),  # ... and the 2 MiB-rounded segment torch asked for
        (GiB, "1024.00 MiB"),  # boundary: exactly 1 GiB prints in MiB
        (GiB + 1, "1.00 GiB"),
        (15835398144, "14.75 GiB"),  # a T4's total capacity
        (int(40.81 * MiB), "40.81 MiB"),
        (5 * KiB + 5, "5.00 KiB"),
        (int(14.155 * GiB) + 1, "14.16 GiB"),  # rounds half up above the midpoint
    ],
)
def test_format_size_table(size: int, text: str) -> None:
    """Each boundary prints as torch prints it."""
    assert format_size(size) == text


@given(st.integers(min_value=1025, max_value=1 << 50))
def test_parse_size_inverts_format_size_within_printed_precision(size: int) -> None:
    """Parsing a formatted size lands within half a unit of the last printed digit."""
    text = format_size(size)
    unit = {"KiB": KiB, "MiB": MiB, "GiB": GiB}[text.split()[1]]
    assert abs(parse_size(text) - size) <= 0.005 * unit + 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [("192GiB", 192 * GiB), ("40.81 MiB", round(40.81 * MiB)), ("1024 bytes", 1024), ("7", 7), ("1.5 GB", 1.5e9)],
)
def test_parse_size_units(text: str, expected: int) -> None:
    """Binary and decimal units are both understood."""
    assert parse_size(text) == expected


def test_parse_size_rejects_unknown_unit() -> None:
    """An unknown unit names itself and the accepted ones."""
    with pytest.raises(InvalidValueError, match=r"unknown size unit 'furlong' in '3 furlong'; known: b, byte"):
        parse_size("3 furlong")


def test_parse_size_rejects_negative() -> None:
    """Negative sizes are refused."""
    with pytest.raises(InvalidValueError, match="sizes must be >= 0"):
        parse_size(-1)
