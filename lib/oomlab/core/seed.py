"""The case oomlab starts from: the seed report and the figures of its OOM message.

The report ships as package data (``data/seed-oom-report.txt``, a verbatim copy of the user's post); its
message's figures ship beside it as ``data/seed-figures.json`` (read here without the parser, so every stage may
use them; ``tests/explanation/test_message.py`` checks that the parser reads exactly these figures from the report).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache

from oomlab.core.paths import SEED_FIGURES, SEED_REPORT
from oomlab.core.units import parse_size

SEED_MODEL = "llama-13b"
SEED_DTYPE = "float16"
SEED_GPU = "t4"
SEED_GPUS = 4
# Memory outside PyTorch on the seed's GPU 0, derived from the seed's own figures (total capacity - reserved - free,
# the reserved figure at the point of llama-13b's unlimited walk in float16 where the message's figures print exactly):
# 561.00 MiB.  Shipped as data so the analytic estimate needs no torch; derived by
# :func:`oomlab.reproduction.walk.derive_seed_outside_bytes`, and tests/reproduction/test_outside.py re-derives it.
SEED_OUTSIDE_BYTES = 588_253_757


def is_seed_case(model: str, dtype: str, gpu: str, gpus: int | None = None) -> bool:
    """Is this the seed report's case: llama-13b in float16 on a T4 (and, where the caller knows it, on 4 of them)?"""
    return (str(model), str(dtype), str(gpu)) == (SEED_MODEL, SEED_DTYPE, SEED_GPU) and gpus in (None, SEED_GPUS)


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
    """The seed message's figures (``data/seed-figures.json``)."""
    return SeedFigures(**json.loads(SEED_FIGURES.read_text(encoding="utf-8")))
