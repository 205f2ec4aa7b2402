"""A user's snapshot beside the budget of the same setup, category by category, with what differs.

The snapshot's live bytes by category (:func:`oomlab.explanation.snapshot.explain_snapshot`, at its OOM or its peak)
are set against the budget's allocated bytes at the phase the snapshot's moment belongs to -- the phase its frames
show (a ``torch/optim`` or optimizer-state allocation at the moment: the optimizer; a gradient or a backward
temporary: backward; else forward) -- each budget category mapped to what a stack can tell
(:data:`~oomlab.budget.snapshot.SNAPSHOT_CATEGORY`).  A difference over :data:`NOTABLE_FRACTION` of the larger figure
and over :data:`NOTABLE_BYTES` is named with its likeliest cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oomlab.budget.result import ALLOCATED, BudgetResult, Phase
from oomlab.budget.snapshot import SNAPSHOT_CATEGORY
from oomlab.core.units import MiB, format_signed_size, format_size
from oomlab.explanation.snapshot import SnapshotCategory, SnapshotExplanation

__all__ = ["NOTABLE_BYTES", "NOTABLE_FRACTION", "CategoryRow", "SnapshotComparison", "compare_snapshot",
           "render_comparison"]

NOTABLE_FRACTION = 0.10  # a difference under 10 % of the larger figure is within the budget's own approximations
NOTABLE_BYTES = 256 * MiB  # and one under 256 MiB is too (the allocator's rounding, small buffers)

# Why a category can hold more than budgeted (snapshot > budget) or less (snapshot < budget)
_MORE = {
    SnapshotCategory.WEIGHTS: "a second copy of the model (an fp32 copy beside a half one, a reference or EMA "
                              "model), or a larger model or wider dtype than the setup",
    SnapshotCategory.GRADIENTS: "gradients of parameters the setup freezes, or gradients kept across steps "
                                "(zero_grad(set_to_none=False), accumulation)",
    SnapshotCategory.OPTIMIZER_STATE: "a different optimizer (Adam's two moments where SGD was budgeted) or state in "
                                      "fp32 over more parameters",
    SnapshotCategory.ACTIVATIONS: "a longer sequence or larger micro-batch than the setup, or checkpointing off",
    SnapshotCategory.LOGITS: "more tokens or a larger vocabulary than the setup, or logits kept (output_logits, "
                             "a metric holding them)",
    SnapshotCategory.TEMPORARIES: "a foreach optimizer step or an unfused kernel the setup does not run",
    SnapshotCategory.UNATTRIBUTED: "allocations no frame rule recognises (record the history with "
                                   "stacks='all' to see them)",
}
_LESS = {
    SnapshotCategory.WEIGHTS: "sharded or quantized weights, or a smaller model than the setup",
    SnapshotCategory.GRADIENTS: "the OOM came before backward had produced every gradient",
    SnapshotCategory.OPTIMIZER_STATE: "the first step (state is created lazily by optimizer.step()), or a "
                                      "sharded / 8-bit / offloaded optimizer",
    SnapshotCategory.ACTIVATIONS: "the OOM came part-way through the forward, or shorter sequences / checkpointing",
    SnapshotCategory.LOGITS: "the OOM came before the LM head, or a chunked loss",
    SnapshotCategory.TEMPORARIES: "a fused optimizer, or the OOM came before the temporaries",
    SnapshotCategory.UNATTRIBUTED: "",
}


@dataclass(frozen=True)
class CategoryRow:
    """One category: the snapshot's live bytes, the budget's, and why they differ where they do."""

    category: SnapshotCategory
    snapshot_bytes: int
    budget_bytes: int
    note: str  # empty: they agree within the budget's approximations

    @property
    def difference_bytes(self) -> int:
        return self.snapshot_bytes - self.budget_bytes


@dataclass(frozen=True)
class SnapshotComparison:
    """The snapshot's moment beside the budget's phase."""

    phase: Phase
    rows: tuple[CategoryRow, ...]
    budget: BudgetResult

    @property
    def snapshot_bytes(self) -> int:
        return sum(r.snapshot_bytes for r in self.rows)

    @property
    def budget_bytes(self) -> int:
        return sum(r.budget_bytes for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase.value, "budget_source": self.budget.source.value,
                "rows": [{"category": r.category.value, "snapshot_bytes": r.snapshot_bytes,
                          "budget_bytes": r.budget_bytes, "difference_bytes": r.difference_bytes, "note": r.note}
                         for r in self.rows]}


def snapshot_phase(explanation: SnapshotExplanation) -> Phase:
    """The step phase of the snapshot's moment, from what is live (see the module docstring)."""
    live = explanation.categories
    if live.get(SnapshotCategory.OPTIMIZER_STATE) and any(
            t.category is SnapshotCategory.TEMPORARIES and any("torch/optim/" in f.filename for f in t.frames)
            for t in explanation.live):
        return Phase.OPTIMIZER
    if live.get(SnapshotCategory.GRADIENTS) or live.get(SnapshotCategory.TEMPORARIES):
        return Phase.BACKWARD
    return Phase.FORWARD


def budget_categories(result: BudgetResult, phase: Phase) -> dict[SnapshotCategory, int]:
    """The budget's allocated bytes at ``phase``, by the categories a snapshot can tell."""
    out: dict[SnapshotCategory, int] = {}
    for c, b in result.phases.get(phase, {}).items():
        if c in ALLOCATED and b:
            key = SNAPSHOT_CATEGORY[c]
            out[key] = out.get(key, 0) + b
    return out


def compare_snapshot(explanation: SnapshotExplanation, result: BudgetResult, phase: Phase | None = None) -> \
        SnapshotComparison:
    """The snapshot beside the budget at ``phase`` (None: :func:`snapshot_phase`), category by category."""
    phase = phase or snapshot_phase(explanation)
    budget = budget_categories(result, phase)
    rows = []
    for c in SnapshotCategory:
        seen, want = explanation.categories.get(c, 0), budget.get(c, 0)
        if not seen and not want:
            continue
        gap = seen - want
        notable = abs(gap) > NOTABLE_BYTES and abs(gap) > NOTABLE_FRACTION * max(seen, want)
        note = "" if not notable else (_MORE if gap > 0 else _LESS)[c]
        rows.append(CategoryRow(c, seen, want, note))
    return SnapshotComparison(phase, tuple(rows), result)


def render_comparison(comparison: SnapshotComparison) -> str:
    """The comparison as a text table, with what differs under it."""
    lines = [f"Beside the {comparison.budget.source.value} budget of the same setup at its {comparison.phase.value} "
             "phase:", f"  {'category':<16} {'snapshot':>12} {'budget':>12} {'difference':>12}"]
    for r in comparison.rows:
        lines.append(f"  {r.category.value:<16} {format_size(r.snapshot_bytes):>12} {format_size(r.budget_bytes):>12} "
                     f"{format_signed_size(r.difference_bytes):>12}")
    lines.append(f"  {'total':<16} {format_size(comparison.snapshot_bytes):>12} "
                 f"{format_size(comparison.budget_bytes):>12} "
                 f"{format_signed_size(comparison.snapshot_bytes - comparison.budget_bytes):>12}")
    notes = [f"  {r.category.value}: {'more' if r.difference_bytes > 0 else 'less'} than budgeted -- {r.note}"
             for r in comparison.rows if r.note]
    return "\n".join(lines + (["", "What differs:"] + notes if notes else ["", "Every category agrees within "
                                                                             "the budget's approximations."])) + "\n"
