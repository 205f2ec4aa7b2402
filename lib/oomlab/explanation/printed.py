"""A size as torch prints it, and every byte count that prints the same.

The caching allocators print each figure with ``format_size`` (two decimals, KiB/MiB/GiB, binary: the same as
:func:`oomlab.core.units.format_size`), so a printed figure stands for an interval of bytes, not one value:
:func:`printed_size` reads it, inverted exactly by :func:`oomlab.core.size_ranges.printed_interval`.  MPS prints
binary sizes labelled ``KB``/``MB``/``GB`` in single precision (:func:`mps_printed_size`); the CPU allocator an exact
byte count (:func:`exact_size`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from oomlab.core.errors import InvalidValueError
from oomlab.core.size_ranges import printed_interval
from oomlab.core.units import GiB, KiB, MiB, parse_size

__all__ = ["PrintedSize", "exact_size", "interval_sub", "mps_printed_size", "printed_size"]

_MPS_FLOAT_SLACK = Fraction(1, 2**23)  # NB: MPS's format_size casts to float (24-bit mantissa) before dividing

# A retyped CUDA figure in decimal units ("14 GB") means powers of 1000, as oomlab.core.units.parse_size reads it.
_UNIT_BYTES = {"bytes": 1, "byte": 1, "b": 1, "kib": KiB, "mib": MiB, "gib": GiB, "tib": 1024**4,
               "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}
# MPSAllocator.mm's format_size divides by 1024, 1048576 and 1073741824 and prints "KB", "MB", "GB".
_MPS_UNIT_BYTES = {"bytes": 1, "byte": 1, "b": 1, "kib": KiB, "mib": MiB, "gib": GiB, "tib": 1024**4,
                   "kb": KiB, "mb": MiB, "gb": GiB, "tb": 1024**4}


@dataclass(frozen=True)
class PrintedSize:
    """One figure as printed, the bytes it denotes, and every byte count that prints the same."""

    text: str  # as printed, normalised spacing: "14.16 GiB"
    value_bytes: int  # the value the printed decimals denote
    low_bytes: int  # smallest byte count that prints as `text`
    high_bytes: int  # largest byte count that prints as `text`
    canonical: bool  # True when torch's format_size can print exactly this text

    @property
    def interval(self) -> list[int]:
        return [self.low_bytes, self.high_bytes]


def printed_size(number: str, unit_text: str) -> PrintedSize:
    """The interval of byte counts behind a printed ``number unit`` (``"14.16"``, ``"GiB"``).

    For torch's own output (two decimals, binary units) the interval is exact: every integer for which
    :func:`oomlab.core.units.format_size` gives the same text (:func:`~oomlab.core.size_ranges.printed_interval`).
    Other spellings (``"14 GB"``, one decimal, a text format_size never prints) get the interval their printed
    precision allows and ``canonical=False``.
    """
    unit_key = unit_text.lower()
    unit = _UNIT_BYTES[unit_key]
    text = f"{number} {'bytes' if unit == 1 else unit_text}"
    value = parse_size(f"{number}{'' if unit == 1 else unit_key}")
    decimals = len(number.partition(".")[2])
    exact = Fraction(number) * unit
    half = Fraction(unit, 2 * 10**decimals) if decimals or unit > 1 else Fraction(0)
    low, high = max(0, math.ceil(exact - half)), max(0, math.floor(exact + half))
    if unit == 1:
        return PrintedSize(text, value, low, high, decimals == 0 and value <= 1024)
    if unit not in (KiB, MiB, GiB) or decimals != 2:
        return PrintedSize(text, value, low, high, False)
    try:
        low, high = printed_interval(text)
    except InvalidValueError:  # two decimals, but format_size never prints them in this unit ("0.50 KiB")
        return PrintedSize(text, value, low, high, False)
    return PrintedSize(text, min(max(value, low), high), low, high, True)


def mps_printed_size(number: str, unit_text: str) -> PrintedSize:
    """The interval of byte counts behind a figure of an MPS message (``"18.13"``, ``"GB"``: binary units).

    MPSAllocator.mm's ``format_size`` prints ``(float)size / 1073741824.0`` with two decimals and labels it
    ``GB``: the interval is the printed precision's, widened by the float cast's relative error.  Canonical: two
    decimals (or a whole number of bytes up to 1024), as it prints them.
    """
    unit = _MPS_UNIT_BYTES[unit_text.lower()]
    decimals = len(number.partition(".")[2])
    exact = Fraction(number) * unit
    half = Fraction(unit, 2 * 10**decimals) if unit > 1 else Fraction(0)
    slack = exact * _MPS_FLOAT_SLACK if unit > 1 else Fraction(0)
    low, high = max(0, math.ceil(exact - half - slack)), max(0, math.floor(exact + half + slack))
    canonical = decimals == 2 if unit > 1 else decimals == 0 and exact <= 1024
    return PrintedSize(f"{number} {'bytes' if unit == 1 else unit_text}", round(exact), low, high, canonical)


def exact_size(nbytes: int) -> PrintedSize:
    """A figure printed as a plain byte count (the CPU allocator's ``you tried to allocate N bytes``): exact."""
    return PrintedSize(f"{nbytes} bytes", nbytes, nbytes, nbytes, True)


def interval_sub(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """``a − b`` for inclusive intervals: every difference of a value in ``a`` and one in ``b``."""
    return a[0] - b[1], a[1] - b[0]
