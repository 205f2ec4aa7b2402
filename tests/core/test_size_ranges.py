"""oomlab.core.size_ranges: every byte count format_size prints as a text, and a byte range printed."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomlab.core.errors import InvalidValueError
from oomlab.core.size_ranges import format_interval, printed_interval
from oomlab.core.units import GiB, MiB, format_size


@pytest.mark.parametrize("text, low, high", [
    ("40.81 MiB", 42_787_144, 42_797_629),  # the seed's free figure
    ("14.16 GiB", 15_198_815_519, 15_209_552_936),
    ("1024 bytes", 1024, 1024),  # the largest size printed in bytes
    ("1.00 KiB", 1025, 1029),  # the smallest printed in KiB
    # 2**64 bytes less a little (a request computed from an unsigned underflow, seen in a real message): exact
    # where float rounding makes nudging towards the ends fail
    ("17179869183.95 GiB", 18_446_744_073_650_496_513, 18_446_744_073_661_234_175),
])
def test_printed_interval(text: str, low: int, high: int) -> None:
    """Every byte count torch's format_size prints as the text, and no other."""
    assert printed_interval(text) == (low, high)
    assert format_size(low) == format_size(high) == text
    assert format_size(low - 1) != text and format_size(high + 1) != text


@given(st.integers(0, 2**62))
def test_printed_interval_inverts_format_size(value: int) -> None:
    """The interval read back from format_size(v) holds v, and its ends print as v does."""
    low, high = printed_interval(format_size(value))
    assert low <= value <= high and format_size(low) == format_size(high) == format_size(value)


@pytest.mark.parametrize("text, message", [
    ("40.81MiB", "invalid printed size '40.81MiB'; expected e.g. '40.81 MiB' (units: bytes, KiB, MiB, GiB)"),
    ("0.50 KiB", "invalid printed size '0.50 KiB': torch's format_size never prints it"),
])
def test_printed_interval_refuses(text: str, message: str) -> None:
    """Text torch never prints is refused, naming it."""
    with pytest.raises(InvalidValueError) as err:
        printed_interval(text)
    assert str(err.value) == message


@pytest.mark.parametrize("interval, text", [
    ((465 * MiB, 601 * MiB), "465.00 MiB – 601.00 MiB"),  # the one spacing: an en dash between spaces
    ((4 * GiB, 4 * GiB + 1), "4.00 GiB"),  # both ends print the same: one size
    ((-MiB, 10 * MiB), "0 bytes – 10.00 MiB"),  # a negative end (a difference of intervals) prints as 0
])
def test_format_interval(interval: tuple[int, int], text: str) -> None:
    """A byte range as torch would print its ends."""
    assert format_interval(interval) == text
