"""oomlab.explanation.printed: a size as torch (or MPS, or the CPU allocator) prints it, and the bytes behind it."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomlab.core.size_ranges import format_interval
from oomlab.core.units import GiB, KiB, MiB, format_size
from oomlab.explanation.printed import exact_size, interval_sub, mps_printed_size, printed_size


@pytest.mark.parametrize(
    ("number", "unit", "low", "high"),
    [
        ("0", "bytes", 0, 0),
        ("1024", "bytes", 1024, 1024),  # format_size's boundaries are inclusive below: 1024 stays in bytes
        ("1.00", "KiB", 1025, 1029),  # 1025 bytes is the first KiB figure
        ("1024.00", "KiB", 1048571, MiB),  # 1 MiB itself prints as 1024.00 KiB
        ("1.00", "MiB", MiB + 1, MiB + 5242),
        ("1024.00", "MiB", GiB - 5242, GiB),  # 1 GiB itself prints as 1024.00 MiB
        ("1.12", "KiB", 1142, 1152),  # 1152/1024 = 1.125 exactly: .2f rounds the tie to even, so 1152 is in
        ("136.00", "MiB", 136 * MiB - 5242, 136 * MiB + 5242),
        ("14.16", "GiB", 15198815519, 15209552936),
    ],
)
def test_printed_size_interval(number: str, unit: str, low: int, high: int) -> None:
    """A printed figure stands for exactly the byte counts torch's format_size prints that way."""
    size = printed_size(number, unit)
    assert (size.low_bytes, size.high_bytes, size.canonical) == (low, high, True)


def test_retyped_figure_is_not_canonical() -> None:
    """'2000.00 MiB' (torch would print GiB) and '14 GB' are flagged, with their precision's interval."""
    assert printed_size("2000.00", "MiB").canonical is False
    size = printed_size("14", "GB")
    assert (size.canonical, size.low_bytes, size.high_bytes) == (False, 13_500_000_000, 14_500_000_000)


@pytest.mark.parametrize(
    ("number", "unit", "value", "low", "high"),
    [
        ("1.5", "KB", 1_500, 1_450, 1_550),  # one decimal: ± 0.05 KB = ± 50 bytes
        ("12", "MB", 12_000_000, 11_500_000, 12_500_000),  # no decimals: ± 0.5 MB
        ("12.50", "MB", 12_500_000, 12_495_000, 12_505_000),  # two decimals: ± 5,000 bytes
        ("2", "GB", 2_000_000_000, 1_500_000_000, 2_500_000_000),
        ("1.25", "TB", 1_250_000_000_000, 1_245_000_000_000, 1_255_000_000_000),
    ],
)
def test_retyped_decimal_units_are_powers_of_1000(number: str, unit: str, value: int, low: int, high: int) -> None:
    """A retyped CUDA figure in KB/MB/GB/TB is decimal (1000-based), value and interval alike, and not canonical."""
    size = printed_size(number, unit)
    assert (size.value_bytes, size.low_bytes, size.high_bytes, size.canonical) == (value, low, high, False)


@pytest.mark.parametrize(
    ("number", "unit", "value"),
    [
        ("256", "bytes", 256),
        ("3.95", "MB", round(3.95 * MiB)),  # MPSAllocator.mm's "MB" is 1048576 bytes
        ("18.13", "GB", round(18.13 * GiB)),
        ("292.50", "MiB", round(292.5 * MiB)),  # newer releases print the binary names
        ("640.00", "KB", 640 * KiB),
    ],
)
def test_mps_units_are_binary(number: str, unit: str, value: int) -> None:
    """In an MPS message KB/MB/GB are 1024-based (its format_size divides by 1024, 1048576, 1073741824)."""
    size = mps_printed_size(number, unit)
    assert size.value_bytes == value and size.low_bytes <= value <= size.high_bytes and size.canonical


def _mps_format_size(nbytes: int) -> str:
    """MPSAllocator.mm's format_size: the size cast to float, divided in double, two decimals, KB/MB/GB."""
    as_float = struct.unpack("f", struct.pack("f", float(nbytes)))[0]
    if nbytes <= 1024:
        return f"{nbytes} bytes"
    for limit, div, unit in ((MiB, 1024.0, "KB"), (GiB, 1048576.0, "MB"), (2**64, 1073741824.0, "GB")):
        if nbytes <= limit:
            return f"{as_float / div:.2f} {unit}"
    raise AssertionError(nbytes)


@pytest.mark.parametrize(
    ("nbytes", "printed"),
    [
        (10_742_786_949, "10.01 GB"),  # 10.004999… GiB in double, but the float cast rounds it up to print 10.01
        (10_753_524_367, "10.02 GB"),
    ],
)
def test_mps_float_cast_is_allowed_for(nbytes: int, printed: str) -> None:
    """A byte count that MPS's single-precision cast prints one hundredth up still lies in the interval read back."""
    assert _mps_format_size(nbytes) == printed
    size = mps_printed_size(*printed.split())
    assert size.low_bytes <= nbytes <= size.high_bytes


def _byte_counts(top: int) -> st.SearchStrategy[int]:
    """Byte counts from 0 up to ``top``, spread over every unit a size is printed in."""
    return st.one_of(st.integers(0, 4096), st.integers(1024, 2 * MiB), st.integers(MiB, 2 * GiB),
                     st.integers(GiB, top))


@given(_byte_counts(2**40))
def test_mps_printed_size_holds_the_bytes(value: int) -> None:
    """Whatever MPS prints for a byte count (float-rounded), the interval read back holds that byte count."""
    number, unit = _mps_format_size(value).split()
    size = mps_printed_size(number, unit)
    assert size.low_bytes <= value <= size.high_bytes


@given(_byte_counts(2**45))
def test_printed_size_inverts_format_size(value: int) -> None:
    """format_size(v) parsed back gives the tightest interval holding v: its ends print the same, neighbours not."""
    number, unit = format_size(value).split()
    size = printed_size(number, unit)
    assert size.canonical and size.low_bytes <= value <= size.high_bytes
    assert format_size(size.low_bytes) == format_size(size.high_bytes) == format_size(value)
    assert size.low_bytes == 0 or format_size(size.low_bytes - 1) != format_size(value)
    assert format_size(size.high_bytes + 1) != format_size(value)


def test_exact_size_is_one_byte_count() -> None:
    """The CPU allocator's 'N bytes' is exact: a one-value interval, as printed."""
    size = exact_size(132426121216)
    assert (size.text, size.low_bytes, size.high_bytes, size.canonical) == (
        "132426121216 bytes", 132426121216, 132426121216, True)


@pytest.mark.parametrize(
    ("a", "b", "difference", "printed"),
    [
        ((10 * MiB, 12 * MiB), (MiB, 2 * MiB), (8 * MiB, 11 * MiB), "8.00 MiB – 11.00 MiB"),
        ((MiB, MiB), (2 * MiB, 2 * MiB), (-MiB, -MiB), "0 bytes"),  # negative ends print as 0
        ((5 * GiB, 5 * GiB), (GiB, GiB), (4 * GiB, 4 * GiB), "4.00 GiB"),  # both ends print the same: one size
    ],
)
def test_interval_sub_and_format(a: tuple, b: tuple, difference: tuple, printed: str) -> None:
    """a − b holds every difference of their members; the display prints one size when both ends agree."""
    assert interval_sub(a, b) == difference and format_interval(difference) == printed
