"""The evidence for readers (notebook 02): the committed agreement matrix as rows, and a few tiny setups measured
for real now beside their analytic figure.  Text and rows only; :mod:`oomlab.budget.display` shows the budget."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from oomlab.core.units import format_size
from oomlab.evidence.agreement import NotTraced
from oomlab.evidence.small_scale import SMALL_CASES, compare_small


def agreement_rows(committed: dict[str, Any]) -> list[list[str]]:
    """The committed matrix (:func:`oomlab.evidence.agreement.load_committed`), one row per traced setup."""
    rows = []
    for r in committed["rows"]:
        name, delta = r["worst_component"]
        rows.append([r["setup"], format_size(r["analytic_peak_bytes"]), format_size(r["traced_peak_bytes"]),
                     f"{r['ratio']:.4f}", f"{r['analytic_phase']} / {r['traced_phase']}", f"{name} {delta:+.2%}"])
    return rows

AGREEMENT_HEADERS = ["setup", "analytic", "traced", "ratio", "phase (analytic / traced)",
                     "worst component (of the peak)"]


def analytic_only_rows(committed: dict[str, Any]) -> list[list[str]]:
    """The setups the tracer cannot run, each with its analytic peak and why it is not traced."""
    return [[r["setup"], format_size(r["analytic_peak_bytes"]), r["analytic_phase"], NotTraced[r["reason"]].value]
            for r in committed["analytic_only"]]

ANALYTIC_ONLY_HEADERS = ["setup", "analytic", "phase", "why not traced"]


SMALL_LIVE_CASES = ("full fp16-mixed AdamW", "LoRA r8 fp16-mixed AdamW, checkpointing",
                    "QLoRA r8 bf16-mixed AdamW (NF4, double quant)")

SMALL_HEADERS = ["tiny setup (trained for real on CPU)", "analytic", "measured", "ratio", "peak phase"]


def small_scale_measurements(labels: Sequence[str] = SMALL_LIVE_CASES) -> list[dict[str, Any]]:
    """Measure a few tiny setups for real now (seconds each) and set the analytic figure beside each: one record
    each, numbers and names only (what the results JSON holds; :func:`small_scale_rows` shows them)."""
    records = []
    for case in (c for c in SMALL_CASES if c.label in labels):
        r = compare_small(case)
        records.append({"setup": case.label, "analytic_peak_bytes": r.analytic_peak_bytes,
                        "measured_peak_bytes": r.measured_peak_bytes, "ratio": r.ratio,
                        "peak_phase": r.analytic_peak_phase.value})
    return records


def small_scale_rows(records: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """The measurements as :data:`SMALL_HEADERS`' table rows."""
    return [[r["setup"], f"{r['analytic_peak_bytes']:,} B", f"{r['measured_peak_bytes']:,} B", f"{r['ratio']:.4f}",
             r["peak_phase"]] for r in records]
