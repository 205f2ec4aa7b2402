"""The case oomlab starts from: the seed report's OOM message and its figures.

The report ships as package data (``data/seed-oom-report.txt``, a verbatim copy of the user's post).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from oomlab.paths import SEED_REPORT
from oomlab.units import parse_size

SEED_MODEL = "llama-13b"
SEED_DTYPE = "float16"
SEED_GPU = "t4"
SEED_GPUS = 4

@dataclass(frozen=True)
class SeedFigures:
    """The figures of the seed's OOM message, as printed (text) and as the bytes they denote."""

    message: str  # the message, joined onto one line
    tried: str
    total: str
    allocated: str
    free: str
    reserved: str
    device_index: int

    @property
    def free_bytes(self) -> int:
        """The printed free figure in bytes (the value the two decimals denote)."""
        return parse_size(self.free)


def seed_report_text() -> str:
    return SEED_REPORT.read_text(encoding="utf-8")


@cache
def seed_figures() -> SeedFigures:
    """Parse the seed report's OOM message with :func:`oomlab.oom_message.parse_oom_message`.

    The report wraps the message over lines; ``message`` is it joined onto one line.
    """
    from oomlab.oom_message import FORMAT_OLD, parse_oom_message

    msg = parse_oom_message(seed_report_text())
    figures = (msg.tried, msg.total, msg.allocated, msg.free, msg.reserved)
    if msg.format != FORMAT_OLD or msg.device_index is None or any(f is None for f in figures):  # pragma: no cover
        raise RuntimeError("the packaged seed report no longer holds a complete torch<=2.0 OOM message")
    tried, total, allocated, free, reserved = (f.text for f in figures)
    return SeedFigures(message=msg.message, tried=tried, total=total, allocated=allocated, free=free,
                       reserved=reserved, device_index=msg.device_index)
