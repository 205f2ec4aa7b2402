"""What the small-scale checks record: one measured figure beside the analytic one (:class:`Check`), a set of them
with when they were measured (:class:`Verification`), and their display rows (:func:`verify_rows`).

The checks themselves are :mod:`oomlab.evidence.checks`; :mod:`oomlab.evidence.checks_cache` keeps their results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oomlab.core.choices import Choice
from oomlab.core.units import format_size

__all__ = ["VERIFY_HEADERS", "Check", "CheckUnit", "Verification", "verify_rows"]


class CheckUnit(Choice):
    """What a check's measured and analytic figures count (its value is what the results JSON records)."""

    BYTES = "bytes"  # memory: shown as torch's format_size prints it
    PARAMETERS = "parameters"  # a parameter count
    FLOPS = "FLOPs"  # floating-point operations of a step
    RATIO = "ratio"  # a dimensionless ratio (FSDP's share of DDP's weights)
    LOSS = "loss"  # a loss value, or a difference of losses


@dataclass(frozen=True)
class Check:
    """One measured figure beside the analytic one."""

    remedy: str  # the mechanism: "FSDP2 fully_shard", "peft LoRA", ...
    quantity: str  # what is compared
    measured: float | None  # None when the mechanism could not run here
    analytic: float | None
    unit: CheckUnit
    note: str = ""
    seconds: float = 0.0

    @property
    def ratio(self) -> float | None:
        if self.measured is None or not self.analytic:
            return None
        return self.measured / self.analytic

    def to_dict(self) -> dict[str, Any]:
        return {"remedy": self.remedy, "quantity": self.quantity, "measured": self.measured,
                "analytic": self.analytic, "unit": self.unit.value, "ratio": self.ratio, "note": self.note,
                "seconds": self.seconds}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Check:
        return cls(raw["remedy"], raw["quantity"], raw["measured"], raw["analytic"], CheckUnit(raw["unit"]),
                   raw.get("note", ""), float(raw.get("seconds", 0.0)))


@dataclass(frozen=True)
class Verification:
    """The checks, when and how they were obtained."""

    checks: tuple[Check, ...]
    measured_at: str  # ISO time of the measurement
    from_cache: bool
    skipped: tuple[str, ...]  # checks not run (and why)

    def to_dict(self) -> dict[str, Any]:
        return {"checks": [c.to_dict() for c in self.checks], "measured_at": self.measured_at,
                "from_cache": self.from_cache, "skipped": list(self.skipped)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Verification:
        return cls(tuple(Check.from_dict(c) for c in raw["checks"]), raw["measured_at"], bool(raw["from_cache"]),
                   tuple(raw.get("skipped", ())))


VERIFY_HEADERS = ("remedy", "quantity", "measured", "analytic", "measured / analytic", "note")


def _shown(value: float | None, unit: CheckUnit) -> str:
    """A figure as the rows show it: sizes as torch prints them, ratios and losses to 3 digits, counts with
    separators."""
    if value is None:
        return "-"
    if unit is CheckUnit.BYTES:
        return format_size(int(value))
    if unit in (CheckUnit.RATIO, CheckUnit.LOSS):
        return f"{value:.3g}"
    return f"{int(value):,}"


def verify_rows(result: Verification) -> list[tuple[Any, ...]]:
    """Display rows (:data:`VERIFY_HEADERS`): sizes as torch prints them, counts with separators."""
    return [(c.remedy, c.quantity, _shown(c.measured, c.unit), _shown(c.analytic, c.unit),
             "-" if c.ratio is None else f"{c.ratio:.3f}", c.note) for c in result.checks]
