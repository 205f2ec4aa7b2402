"""Byte ranges as torch prints sizes: every byte count that :func:`~oomlab.core.units.format_size` prints as a
given text (its exact inverse), and a range of bytes printed.

A printed figure stands for an interval of bytes, not one value (two decimals in KiB/MiB/GiB); the reproduction
reads the seed's figures back through :func:`printed_interval`, the explanation a message's.
"""

from __future__ import annotations

from collections.abc import Callable

from oomlab.core.errors import InvalidValueError
from oomlab.core.units import format_size

__all__ = ["format_interval", "printed_interval"]

_UNITS = ("bytes", "KiB", "MiB", "GiB")  # format_size's units, smallest first
_TOP = 1 << 80  # the search's upper end: above any size a device or a message holds


def _key(size_bytes: int) -> tuple[int, float]:
    """format_size's text as a sortable key: it grows with the byte count."""
    number, unit = format_size(size_bytes).split()
    return _UNITS.index(unit), float(number)


def _bisect_first(predicate: Callable[[int], bool], top: int) -> int:
    """The first ``n`` in ``[0, top]`` with ``predicate(n)`` (``predicate`` is monotone)."""
    lo, hi = 0, top
    while lo < hi:
        mid = (lo + hi) // 2
        if predicate(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def printed_interval(text: str) -> tuple[int, int]:
    """Every byte count ``format_size`` prints as ``text`` (e.g. ``"40.81 MiB"``), as ``(low, high)`` inclusive.

    Raises :class:`InvalidValueError` for a text that is not ``number unit`` in format_size's units, or one it never
    prints (``"0.50 KiB"``: sizes up to 1024 bytes print in bytes).
    """
    try:
        number, unit = text.split()
        target = (_UNITS.index(unit), float(number))
    except ValueError as err:
        raise InvalidValueError(f"invalid printed size {text!r}; expected e.g. '40.81 MiB' "
                                f"(units: {', '.join(_UNITS)})") from err
    low = _bisect_first(lambda n: _key(n) >= target, _TOP)
    high = _bisect_first(lambda n: _key(n) > target, _TOP) - 1
    if low > high or format_size(low) != text:
        raise InvalidValueError(f"invalid printed size {text!r}: torch's format_size never prints it")
    return low, high


def format_interval(interval: tuple[int, int]) -> str:
    """``(low, high)`` bytes as torch would print its ends, ``"465.81 MiB – 601.81 MiB"``: one size when both ends
    print the same, negative ends (a difference of intervals) as 0."""
    low, high = (format_size(max(end, 0)) for end in interval)
    return low if low == high else f"{low} – {high}"
