"""The margin a fit must keep: how far the estimate has been below real GPUs for the setup's class, plus the
allocator's fragmentation -- from the evidence, never typed in.

``lib/oomlab/data/margins.json`` is written by ``python -m oomlab.evidence margins``
(:mod:`oomlab.evidence.margins`) from the published real-GPU peaks (``docs/published-measurements.md``): per training
method, the largest amount by which a trusted measurement exceeded oomlab's estimate, as a fraction of the estimate,
with the row that set it.  A test checks the file is current.  Loads no torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Any

from oomlab.core.choices import Method
from oomlab.core.paths import DATA_DIR
from oomlab.core.setup import TrainingSetup

MARGINS_JSON = DATA_DIR / "margins.json"


@dataclass(frozen=True)
class Margin:
    """The headroom a setup class needs: ``fraction`` of the estimated peak, and where it comes from."""

    method: Method
    underestimate: float  # the largest (published / estimate - 1) over the class's trusted rows (0 when none above)
    fragmentation: float  # the allocator's waste beyond what the estimate models, assumed (stated)
    rows: int  # trusted rows of the class
    worst_row: str | None  # the row that set the underestimate
    source: str  # the sentence a report prints

    @property
    def fraction(self) -> float:
        return self.underestimate + self.fragmentation

    def without(self) -> Margin:
        """No margin at all: a fit by the estimate alone ("tight" when the margin is kept)."""
        return Margin(self.method, 0.0, 0.0, self.rows, None, "none")

    def bytes_for(self, peak_bytes: int) -> int:
        return int(peak_bytes * self.fraction)

    @property
    def words(self) -> str:
        return f"{self.fraction:.0%} for {self.method.value}: {self.source}"

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method.value, "fraction": self.fraction, "underestimate": self.underestimate,
                "fragmentation": self.fragmentation, "rows": self.rows, "worst_row": self.worst_row,
                "source": self.source}


@cache
def margins() -> dict[Method, Margin]:
    raw = json.loads(MARGINS_JSON.read_text())
    return {Method(m["method"]): Margin(Method(m["method"]), m["underestimate"], m["fragmentation"], m["rows"],
                                        m["worst_row"], m["source"]) for m in raw["margins"]}


def margin_for(setup: TrainingSetup) -> Margin:
    """The margin of ``setup``'s class (its training method: the published evidence is per method)."""
    return margins()[setup.method]
