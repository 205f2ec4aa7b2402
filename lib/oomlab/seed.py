"""The case oomlab starts from: the seed report's OOM message and its figures.

The report ships as package data (``data/seed-oom-report.txt``, a verbatim copy of the user's post).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from oomlab.paths import SEED_REPORT
from oomlab.units import parse_size

SEED_MODEL = "llama-13b"
SEED_DTYPE = "float16"
SEED_GPU = "t4"
SEED_GPUS = 4

_OLD_FORMAT = re.compile(
    r"Tried to allocate (?P<tried>[\d.]+ \w+) \(GPU (?P<device>\d+); (?P<total>[\d.]+ \w+) total capacity; "
    r"(?P<allocated>[\d.]+ \w+) already allocated; (?P<free>[\d.]+ \w+) free; "
    r"(?P<reserved>[\d.]+ \w+) reserved in total by PyTorch\)"
)


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
    """Parse the seed report's OOM message (the report wraps it over lines; we join them)."""
    text = " ".join(seed_report_text().split())
    start = text.index("OutOfMemoryError: CUDA out of memory.")
    end = text.index("PYTORCH_CUDA_ALLOC_CONF", start) + len("PYTORCH_CUDA_ALLOC_CONF")
    message = text[start + len("OutOfMemoryError: ") : end]
    match = _OLD_FORMAT.search(message)
    if match is None:  # pragma: no cover - the packaged report is fixed
        raise RuntimeError("the packaged seed report no longer holds an OOM message")
    return SeedFigures(
        message=message,
        tried=match["tried"],
        total=match["total"],
        allocated=match["allocated"],
        free=match["free"],
        reserved=match["reserved"],
        device_index=int(match["device"]),
    )
