"""Byte units and torch-style formatting. Sizes are ``int`` bytes inside oomlab; text only at the edge."""

from __future__ import annotations

import re

from oomlab.core.errors import InvalidValueError
from oomlab.core.user_input import MAX_INT_DIGITS, shown

KiB = 1024
MiB = 1024**2
GiB = 1024**3


def ceil_div(numerator: int, denominator: int) -> int:
    """``ceil(numerator / denominator)`` in integers (a shard of ``numerator`` bytes over ``denominator`` ranks)."""
    return -(-numerator // denominator)


_UNITS = {"b": 1, "bytes": 1, "byte": 1, "kib": KiB, "mib": MiB, "gib": GiB, "tib": 1024**4,
          "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}


def format_size(size_bytes: int) -> str:
    """Format bytes exactly as PyTorch's ``c10::CachingAllocator::format_size`` does.

    Boundaries are inclusive on the smaller unit: 1024 bytes prints as ``"1024 bytes"``,
    1 MiB as ``"1024.00 KiB"``, 1 GiB as ``"1024.00 MiB"`` (``size <= 1024`` etc. in the C++).
    ``std::fixed`` with precision 2 rounds the binary double correctly, like Python's ``.2f``.
    """
    size_bytes = int(size_bytes)
    if size_bytes <= 1024:
        return f"{size_bytes} bytes"
    if size_bytes <= MiB:
        return f"{size_bytes / 1024.0:.2f} KiB"
    if size_bytes <= GiB:
        return f"{size_bytes / 1048576.0:.2f} MiB"
    return f"{size_bytes / 1073741824.0:.2f} GiB"


def format_signed_size(size_bytes: int | None) -> str:
    """:func:`format_size` for display: ``"-"`` for no value, a minus sign before a negative size (a shortfall)."""
    if size_bytes is None:
        return "-"
    return format_size(size_bytes) if size_bytes >= 0 else "−" + format_size(-size_bytes)


_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*$")
MAX_SIZE_DIGITS = MAX_INT_DIGITS  # digits before (and after) the point: 10**30 bytes is beyond any machine


def parse_size(text: str | int) -> int:
    """Parse ``"192GiB"``, ``"40.81 MiB"``, ``"1024 bytes"`` or a plain integer into bytes.

    Binary units (KiB/MiB/GiB/TiB) are powers of 1024; decimal ones (KB/MB/GB/TB) powers of 1000.  A number of more
    than :data:`MAX_SIZE_DIGITS` digits on either side of the point is refused (400 nines overflowed a float).
    """
    if isinstance(text, bool):
        raise InvalidValueError(f"invalid size {text!r}; expected a number of bytes or e.g. '192GiB'")
    if isinstance(text, int):
        if text < 0:
            raise InvalidValueError(f"invalid size {shown(text)}; sizes must be >= 0")
        return text
    match = _SIZE_RE.match(str(text))
    if not match:
        raise InvalidValueError(
            f"invalid size {shown(text)}; expected a number with an optional unit "
            f"({', '.join(sorted(_UNITS))}), e.g. '192GiB'"
        )
    number, unit = match.groups()
    whole, _, fraction = number.partition(".")
    if max(len(whole.lstrip("0")), len(fraction)) > MAX_SIZE_DIGITS:
        raise InvalidValueError(f"invalid size {shown(text)}: a number of at most {MAX_SIZE_DIGITS} digits (before "
                                "and after the point) is accepted, e.g. '192GiB'")
    unit = unit.lower() or "b"
    if unit not in _UNITS:
        raise InvalidValueError(f"unknown size unit {shown(unit)} in {shown(text)}; known: {', '.join(sorted(_UNITS))}")
    return round(float(number) * _UNITS[unit])


MIN_HOST_RAM = GiB  # a host smaller than this cannot hold a training process: a bare number is a missing unit
MAX_HOST_RAM = 2**50  # 1 PiB: no machine has more memory (the largest hosts hold tens of TiB)


def check_host_ram(value: int, what: str = "host RAM", text: object = None) -> int:
    """``value`` bytes if within [:data:`MIN_HOST_RAM`, :data:`MAX_HOST_RAM`], else a refusal naming ``text``."""
    shown_text = shown(value if text is None else text)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidValueError(f"invalid {what} {shown_text}: expected a size such as '192GiB'")
    if value < MIN_HOST_RAM:
        raise InvalidValueError(f"invalid {what} {shown_text} ({format_size(value)}): must be at least "
                                f"{format_size(MIN_HOST_RAM)}, e.g. '192GiB'")
    if value > MAX_HOST_RAM:
        raise InvalidValueError(f"invalid {what} {shown_text} ({format_size(value)}): must be at most "
                                f"{format_size(MAX_HOST_RAM)} (1 PiB), e.g. '192GiB'")
    return value


def parse_memory_size(text: str | int, what: str = "host RAM") -> int:
    """A memory size that must carry its unit (``"192GiB"``, ``"512 GB"``): a bare number, as a string or an
    integer (a YAML ``192``), is refused, as is anything under :data:`MIN_HOST_RAM` or over :data:`MAX_HOST_RAM`,
    naming the value."""
    if isinstance(text, bool) or (isinstance(text, int | float)) or str(text).strip().lstrip("+-").replace(
            ".", "", 1).isdigit():
        raise InvalidValueError(f"invalid {what} {shown(text)}: give it with a unit, e.g. '192GiB' or '512GB' "
                                "(a bare number would be bytes)")
    stripped = str(text).strip()
    if stripped.startswith("-"):
        raise InvalidValueError(f"invalid {what} {shown(text)}: must be a positive size such as '192GiB'")
    return check_host_ram(parse_size(stripped), what, text)
