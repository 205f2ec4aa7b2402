"""An honest account of the seed's reproduction: which figures are inputs, which fitted, which predicted; the whole
range of outside-PyTorch memory that reproduces the message; what that range says about a T4's CUDA context; and which
transformers releases' LLaMA layouts can produce the message at all.

The reproduction has one continuous free parameter, the memory held outside PyTorch on GPU 0, and one discrete one,
the model's module layout (which buffers ``.to()`` moves: it changed across transformers releases). "5 of 5 figures
match" counts inputs and a fit as matches; :func:`honest_reproduction` says what each figure is worth.
:func:`render_honesty` (Markdown) and :meth:`HonestReproduction.to_dict` (plain data, with the tables as rows) are
its displays, for notebook 01 and the report.

Limitations: the walk assumes nothing was allocated by PyTorch on GPU 0 before ``.to()`` (anything that was would
add to both allocated and reserved); the seed's case only (llama-13b in float16 on a T4, the seed's own figures).
"""

from __future__ import annotations

import datetime as dt
import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from oomlab.core.dtypes import load_dtype
from oomlab.core.gpus import load_gpu
from oomlab.core.markdown import markdown_table
from oomlab.core.models import load_model
from oomlab.core.outside import OUTSIDE_MEMORY, TorchEra, outside_memory
from oomlab.core.seed import SEED_DTYPE, SEED_GPU, SEED_GPUS, SEED_MODEL, seed_figures
from oomlab.core.size_ranges import format_interval, printed_interval
from oomlab.core.units import format_size
from oomlab.reproduction.fit import (
    FailurePoint,
    Figure,
    OutsideInterval,
    failure_at,
    failure_points,
    matching_outside,
    seed_text,
)
from oomlab.reproduction.layouts import (
    LaunchPath,
    LlamaLayout,
    ReportContext,
    layout_walk,
    llama_layouts,
    report_context,
    walk_fingerprint,
)
from oomlab.reproduction.outside import seed_outside_bytes
from oomlab.reproduction.walk import unlimited_walk

__all__ = ["ContextReading", "FigureClaim", "FigureRole", "HonestReproduction", "LayoutRow", "figure_rows",
           "honest_reproduction", "layout_rows", "outside_rows", "render_honesty", "render_honesty_record"]

MATCHED = (Figure.TRIED, Figure.ALLOCATED, Figure.RESERVED)  # the figures the outside range is asked to reproduce


class FigureRole(enum.Enum):
    """What a reproduced figure is worth as evidence."""

    INPUT = "input"  # it went into the reproduction: matching it is circular
    FITTED = "fitted"  # a free parameter was chosen so that it matches
    PREDICTED = "predicted"  # it follows once the inputs and the fit are set


@dataclass(frozen=True)
class FigureClaim:
    """One figure of the seed's message: the user's, the reproduction's, and what the match is worth."""

    figure: Figure
    seed: str
    reproduced: str
    role: FigureRole
    why: str


@dataclass(frozen=True)
class ContextReading:
    """A shipped or measured figure for memory outside PyTorch on a T4, set beside the reproducing range."""

    label: str
    low_bytes: int
    high_bytes: int
    overlaps: bool  # does it overlap the reproducing range?
    note: str  # its basis, and whether it is independent of the seed

    @property
    def printed(self) -> str:
        return format_interval((self.low_bytes, self.high_bytes))


@dataclass(frozen=True)
class LayoutRow:
    """One layout under one launch path: can its walk print the seed's three figures, and for which outside bytes."""

    layout: LlamaLayout
    path: LaunchPath
    intervals: tuple[OutsideInterval, ...]
    above: FailurePoint | None  # no interval: the first failure asking the seed's segment after more allocated
    below: FailurePoint | None  # ... and the last one after less
    shortfall_bytes: int | None  # what PyTorch would have had to hold before .to() for ``below`` to print the seed's
    available_at_report: bool  # released on or before the report's date

    @property
    def can_produce(self) -> bool:
        return bool(self.intervals)


@dataclass(frozen=True)
class HonestReproduction:
    """The seed's reproduction, figure by figure, with its free parameters laid open."""

    model: str
    dtype: str
    gpu: str
    capacity_bytes: int
    installed_layout: str | None  # the layout of the installed transformers (None: not in the data)
    failure_points: int  # copies of the walk that can fail on this GPU (one per new segment)
    intervals: tuple[OutsideInterval, ...]  # outside bytes reproducing tried, allocated and reserved
    free_intervals: tuple[OutsideInterval, ...]  # ... and free too
    derived_outside_bytes: int  # what the reproduction uses (from the free figure)
    figures: tuple[FigureClaim, ...]
    context: tuple[ContextReading, ...]
    context_finding: str
    layouts: tuple[LayoutRow, ...]
    layout_finding: str
    report: ReportContext

    @property
    def counts(self) -> dict[FigureRole, int]:
        return {role: sum(c.role is role for c in self.figures) for role in FigureRole}

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the results JSON: the figures, the ranges, the findings and every table as rows."""
        def interval(i: OutsideInterval) -> dict[str, Any]:
            return {"low_bytes": i.low_bytes, "high_bytes": i.high_bytes, "printed": i.printed,
                    "failing": [p.name for p in i.points]}

        return {
            "case": {"model": self.model, "dtype": self.dtype, "gpu": self.gpu, "capacity_bytes": self.capacity_bytes},
            "installed_layout": self.installed_layout,
            "failure_points": self.failure_points,
            "outside_intervals": [interval(i) for i in self.intervals],
            "outside_intervals_with_free": [interval(i) for i in self.free_intervals],
            "derived_outside_bytes": self.derived_outside_bytes,
            "figures": [{"figure": c.figure.value, "seed": c.seed, "reproduced": c.reproduced, "role": c.role.value,
                         "why": c.why} for c in self.figures],
            "counts": {role.value: n for role, n in self.counts.items()},
            "context_finding": self.context_finding,
            "layouts": [{"layout": r.layout.id, "transformers": r.layout.transformers, "path": r.path.value,
                         "can_produce": r.can_produce, "available_at_report": r.available_at_report,
                         "outside_intervals": [interval(i) for i in r.intervals]} for r in self.layouts],
            "layout_finding": self.layout_finding,
            "tables": {name: {"headers": list(headers), "rows": [list(row) for row in rows]}
                       for name, (headers, rows) in (("figures", figure_rows(self)), ("outside", outside_rows(self)),
                                                     ("layouts", layout_rows(self)))},
        }


# ------------------------------------------------------------------------------------------- compute


def _installed_layout() -> str | None:
    print_ = walk_fingerprint(unlimited_walk(SEED_MODEL, SEED_DTYPE))
    for layout in llama_layouts():
        if layout.fingerprints and layout.fingerprints[LaunchPath.TO] == print_:
            return layout.id
    return None


def _classify(points: tuple[FailurePoint, ...], derived: int, intervals: tuple[OutsideInterval, ...],
              free_intervals: tuple[OutsideInterval, ...]) -> tuple[FigureClaim, ...]:
    figures = seed_figures()
    at = failure_at(points, derived)
    if at is None:  # pragma: no cover - the derived value comes from a matching point
        raise RuntimeError("the derived outside memory makes model.to('cuda') succeed")
    alone = {f: matching_outside(points, figures, (f,)) for f in MATCHED}
    fit = alone[Figure.RESERVED]

    def implied_by_fit(figure: Figure) -> bool:
        return all(any(i.low_bytes <= f.low_bytes and f.high_bytes <= i.high_bytes for i in alone[figure])
                   for f in fit)

    width = sum(i.width_bytes for i in intervals)
    free_width = sum(i.width_bytes for i in free_intervals)
    n_tried = sum(p.printed(Figure.TRIED) == figures.tried for p in points)
    gap = at.reserved_bytes - at.allocated_bytes
    roles = {f: FigureRole.PREDICTED if implied_by_fit(f) else FigureRole.FITTED for f in (Figure.TRIED,
                                                                                           Figure.ALLOCATED)}
    why = {
        Figure.TOTAL: ("the T4 spec's capacity (specs/gpus/t4.json), picked among the driver-dependent T4 "
                       f"capacities because it prints as {figures.total}; it matches by choice"),
        Figure.FREE: (f"the outside memory is derived from it (total - reserved - free = {format_size(derived)}"
                      f"); of the {format_size(width)} of outside memory that reproduce the other figures, only "
                      f"{free_width:,} bytes print {figures.free} free, so it matches by construction"),
        Figure.RESERVED: (f"it picks the failure point. Of the {len(points)} copies that can fail on this "
                          f"GPU (one per new segment), only {at.name} comes after {figures.reserved} reserved; "
                          f"choosing the outside memory ({' or '.join(i.printed for i in fit)}) is choosing this copy"),
        Figure.ALLOCATED: (
            f"wherever reserved prints {figures.reserved}, the walk holds "
            f"{format_size(at.allocated_bytes)} allocated ({format_size(gap)} cached below reserved), printed "
            f"{at.printed(Figure.ALLOCATED)}: a check of the allocator model's rounding and splitting, not an "
            "independent fact (a .to() walk frees nothing, so allocated stays close to reserved)"
            if roles[Figure.ALLOCATED] is FigureRole.PREDICTED else
            "no outside memory that prints the seed's reserved also prints its allocated"),
        Figure.TRIED: (
            f"the copy at that point is {at.name}, whose segment is {at.printed(Figure.TRIED)}; "
            f"{n_tried} of the {len(points)} failure points ({n_tried / len(points):.0%}) ask for {figures.tried}: "
            "a real check, but one a wrong failure point would often pass"
            if roles[Figure.TRIED] is FigureRole.PREDICTED else
            "no outside memory that prints the seed's reserved also prints its request"),
    }
    role_of = {Figure.TOTAL: FigureRole.INPUT, Figure.FREE: FigureRole.INPUT, Figure.RESERVED: FigureRole.FITTED,
               **roles}
    return tuple(FigureClaim(f, seed_text(figures, f), at.printed(f, derived), role_of[f], why[f])
                 for f in (Figure.TRIED, Figure.TOTAL, Figure.ALLOCATED, Figure.FREE, Figure.RESERVED))


@cache
def _outside_data() -> dict[str, Any]:
    return json.loads(OUTSIDE_MEMORY.read_text(encoding="utf-8"))


def _context(intervals: tuple[OutsideInterval, ...]) -> tuple[tuple[ContextReading, ...], str]:
    """The reproducing range beside the shipped T4 figures of :mod:`oomlab.core.outside`."""
    gpu = load_gpu(SEED_GPU)
    low, high = intervals[0].low_bytes, intervals[-1].high_bytes
    defaults = _outside_data()["recommended_defaults"]

    def reading(label: str, lo: int, hi: int, note: str) -> ContextReading:
        return ContextReading(label, lo, hi, lo <= high and hi >= low, note)

    old_t4 = defaults["era_old_torch_le_2_0"]["per_gpu"][SEED_GPU]
    new_t4 = defaults["era_new_torch_ge_2_1"]["per_gpu"][SEED_GPU]
    lazy = [r for r in _outside_data()["derived_from_oom_messages"]
            if r["gpu_generation"] == "Turing" and r["message_format"].startswith("new")
            and r["usable_for_context_estimate"]]
    lazy_low = min(r["derived_outside_bytes_low"] for r in lazy)
    lazy_high = max(r["derived_outside_bytes_high"] for r in lazy)
    old = outside_memory(gpu, 1, TorchEra.OLD)
    with_nccl = outside_memory(gpu, SEED_GPUS, TorchEra.OLD)
    circular = " (derived from this very message: not independent)" if "seed" in old_t4["basis"] else ""
    readings = (
        reading("shipped T4 context, torch <= 2.0", old.context_bytes, old.context_bytes, old_t4["basis"] + circular),
        reading("shipped T4 range, torch <= 2.0", *old_t4["range_bytes"], old_t4["basis"] + circular),
        reading("shipped T4 range, torch >= 2.1 (lazy loading)", *new_t4["range_bytes"], new_t4["basis"]),
        reading(f"measured T4 contexts under lazy loading ({len(lazy)} OOM messages)", lazy_low, lazy_high,
                "total - free - reserved of torch >= 2.1 T4 messages, one process each (print rounding included)"),
        reading(f"shipped torch <= 2.0 context + NCCL for {SEED_GPUS} GPUs over PCIe", with_nccl.total_bytes,
                with_nccl.total_bytes, with_nccl.source),
    )
    counts = [n for n in range(1, 65) if n * lazy_low <= high and n * lazy_high >= low]
    many = (f"{counts[0]}–{counts[-1]}" if len(counts) > 1 else str(counts[0])) if counts else "no whole number of"
    per_rank = (f", as if each of the {SEED_GPUS} ranks of the launch had created one on GPU 0"
                if SEED_GPUS in counts else "")
    span = "; ".join(i.printed for i in intervals)
    finding = (
        f"Everything held outside PyTorch on GPU 0 when the copy failed came to {span}: any value in it reproduces "
        f"the three figures, and the free figure alone narrows it to {format_size(seed_outside_bytes())}. That is "
        f"{'above' if lazy_high < low else 'not above'} every lazy-loading T4 context measured "
        f"({format_interval((lazy_low, lazy_high))}) and "
        f"{'above' if new_t4['range_bytes'][1] < low else 'within'} the shipped torch >= 2.1 range, so it is either "
        f"one context without lazy module loading (as the shipped torch <= 2.0 figures assume), or {many} "
        f"lazy-loading contexts{per_rank} (torch >= 1.13 loads lazily by default on CUDA >= 11.7, pytorch#86509, "
        "so torch 2.0 can be either). "
        f"The shipped torch <= 2.0 T4 figure ({format_size(old.context_bytes)}) lies inside, "
        f"but it {'was derived from this message' if circular else 'is independent'}; with a PCIe NCCL communicator "
        f"added ({format_size(with_nccl.total_bytes)}) it "
        + ("exceeds the range: no NCCL buffers were on GPU 0 yet (torch 2.0 creates a communicator at the first "
           "collective, and DeepSpeed v0.9.5 broadcasts the weights only after this .to(): engine.py L1048, L1084), "
           "or the context was smaller than shipped." if with_nccl.total_bytes > high
           else "fits the range: NCCL buffers may have been there.")
    )
    return readings, finding


def _layout_rows(capacity: int, day: dt.date) -> tuple[LayoutRow, ...]:
    figures = seed_figures()
    target_low, target_high = printed_interval(figures.allocated)
    rows = []
    for layout in llama_layouts():
        for path in LaunchPath:
            points = failure_points(layout_walk(SEED_MODEL, SEED_DTYPE, layout.id, path), capacity)
            intervals = matching_outside(points, figures, MATCHED)
            above = below = None
            if not intervals:
                same = [p for p in points if p.printed(Figure.TRIED) == figures.tried]
                above = min((p for p in same if p.allocated_bytes > target_high), key=lambda p: p.allocated_bytes,
                            default=None)
                below = max((p for p in same if p.allocated_bytes < target_low), key=lambda p: p.allocated_bytes,
                            default=None)
            shortfall = None if below is None else target_low - below.allocated_bytes
            rows.append(LayoutRow(layout, path, intervals, above, below, shortfall, layout.available_on(day)))
    return tuple(rows)


def _cache_bytes(layout: LlamaLayout, path: LaunchPath) -> int:
    return layout.cache_bytes_per_layer(load_model(SEED_MODEL), load_dtype(SEED_DTYPE), path)


def _layout_finding(rows: tuple[LayoutRow, ...], report: ReportContext) -> str:
    figures = seed_figures()
    producing = [lay for lay in llama_layouts() if any(r.can_produce for r in rows if r.layout is lay)]
    blocked = [lay for lay in llama_layouts() if lay not in producing]
    both_paths = all(any(r.can_produce for r in rows if r.layout is lay and r.path is p)
                     for lay in producing for p in LaunchPath)
    blocked_rows = [r for r in rows if r.layout in blocked]
    caches = sorted({_cache_bytes(r.layout, r.path) for r in blocked_rows})
    above = sorted({(r.above.printed(Figure.ALLOCATED), r.above.printed(Figure.RESERVED)) for r in blocked_rows
                    if r.above is not None})
    shortfalls = [r.shortfall_bytes for r in blocked_rows if r.shortfall_bytes is not None]
    below_names = sorted({r.below.name for r in blocked_rows if r.below is not None})
    released = sorted((lay for lay in producing if lay.released), key=lambda lay: lay.first_release_date)
    in_time = [lay for lay in released if lay.available_on(report.opened)]
    by_caches = (all(not lay.moves_rotary_caches for lay in producing)
                 and all(lay.moves_rotary_caches for lay in blocked))
    text = (
        ("Only layouts whose decoder layers move no cos/sin caches" if by_caches else "These layouts")
        + f" can print the seed's {figures.tried} request "
        f"after {figures.allocated} allocated and {figures.reserved} reserved"
        f"{' (under either launch path)' if both_paths else ''}: "
        + "; ".join(f"{lay.id} ({lay.transformers})" for lay in producing) + ". "
    )
    if blocked:
        text += (
            f"The layouts {', '.join(lay.transformers for lay in blocked)} register a cos and a sin cache in every "
            f"layer, which .to() moves ({' or '.join(format_size(c) for c in caches)} a layer); with them no outside "
            f"memory gives the three figures: the {figures.tried} request that follows reserved near "
            f"{figures.reserved} comes after " + " or ".join(f"{a} allocated and {r} reserved" for a, r in above)
            + ", and memory held before .to() could only raise that. An earlier request would match only if PyTorch "
            f"already held at least {format_size(min(shortfalls))} on GPU 0 before .to() (failing at "
            f"{' or '.join(below_names)}), which nothing in the report suggests. "
            if shortfalls and above else "")
    if released:
        first = released[0]
        out = "none was" if not in_time else ", ".join(lay.first_release for lay in in_time) + " only"
        text += (f"The first release that can is {first.first_release} ({first.first_release_date}); {out} out on "
                 f"{report.opened}, when the report was opened ({report.report_url}), a date its torch <= 2.0 "
                 "wording fits. ")
    text += (
        "So the user's LLaMA moved no per-layer rotary caches to the GPU: it was not built as any transformers release "
        "of that time builds it (assuming oomlab's allocator model and the 13B config), but by code like "
        "transformers' main branch before #22234 (March 2023, never released) or another LLaMA implementation. "
        f"Open-Assistant's own pin ({report.pin.rsplit('@', 1)[-1][:12]}) is a candidate whose layout could not be "
        f"read here: {report.pin_note}."
    )
    return text


@cache
def honest_reproduction() -> HonestReproduction:
    """The seed's reproduction laid open: roles of the figures, the outside range, the T4 context, the layouts."""
    gpu = load_gpu(SEED_GPU)
    figures = seed_figures()
    points = failure_points(unlimited_walk(SEED_MODEL, SEED_DTYPE), gpu.total_memory_bytes)
    intervals = matching_outside(points, figures, MATCHED)
    free_intervals = matching_outside(points, figures, tuple(Figure))
    derived = seed_outside_bytes()
    context, context_finding = _context(intervals)
    report = report_context()
    rows = _layout_rows(gpu.total_memory_bytes, report.opened)
    return HonestReproduction(
        model=SEED_MODEL, dtype=SEED_DTYPE, gpu=SEED_GPU, capacity_bytes=gpu.total_memory_bytes,
        installed_layout=_installed_layout(), failure_points=len(points), intervals=intervals,
        free_intervals=free_intervals, derived_outside_bytes=derived,
        figures=_classify(points, derived, intervals, free_intervals), context=context,
        context_finding=context_finding, layouts=rows, layout_finding=_layout_finding(rows, report), report=report)


# ------------------------------------------------------------------------------------------- display


def figure_rows(h: HonestReproduction) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The figure-by-figure table: headers and rows."""
    return (("figure", "user's message", "reproduced", "role", "why"),
            [(c.figure.value, c.seed, c.reproduced, c.role.value, c.why) for c in h.figures])


def outside_rows(h: HonestReproduction) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The outside-memory table: the reproducing ranges, the derived value, and the T4 figures beside them."""
    def span(intervals: tuple[OutsideInterval, ...]) -> tuple[str, str]:
        return ("; ".join(i.printed for i in intervals) or "none",
                "; ".join(f"{i.low_bytes:,} – {i.high_bytes:,}" for i in intervals) or "-")

    rows = [("reproduces tried, allocated and reserved", *span(h.intervals), "the reproduction's free parameter"),
            ("... and free too", *span(h.free_intervals), "the free figure pins it to a few KiB"),
            ("used by the reproduction (from the free figure)", format_size(h.derived_outside_bytes),
             f"{h.derived_outside_bytes:,}", "total - reserved - free")]
    rows += [(c.label, c.printed, f"{c.low_bytes:,}" + ("" if c.low_bytes == c.high_bytes else f" – {c.high_bytes:,}"),
              ("overlaps" if c.overlaps else "outside") + " the range; " + c.note) for c in h.context]
    return ("memory outside PyTorch on GPU 0", "as printed", "bytes", "note"), rows


def _path_cell(r: LayoutRow) -> str:
    if r.can_produce:
        return f"yes: {'; '.join(i.printed for i in r.intervals)} (fails at {r.intervals[0].points[0].name})"
    if r.above is None:
        return "no"
    return (f"no: {r.above.printed(Figure.TRIED)} after {r.above.printed(Figure.ALLOCATED)} allocated, "
            f"{r.above.printed(Figure.RESERVED)} reserved ({r.above.name})")


def layout_rows(h: HonestReproduction) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The layout table: one row per layout, one column per launch path."""
    rows = []
    for lay in llama_layouts():
        cells = {r.path: r for r in h.layouts if r.layout is lay}
        released = (f"{lay.first_release} ({lay.first_release_date})" if lay.released
                    else "none: git main before v4.28.0")
        rows.append((lay.transformers, released, "yes" if lay.available_on(h.report.opened) else "no",
                     lay.rotary_summary, *(_path_cell(cells[p]) for p in LaunchPath)))
    return (("transformers", "first release", f"released by {h.report.opened}", "rotary buffers .to() moves",
             *(f"prints the seed's 3 figures ({p.value})" for p in LaunchPath)), rows)


def render_honesty(h: HonestReproduction) -> str:
    """The whole account as Markdown: the figures, the outside range, the layouts, and the two findings."""
    return render_honesty_record(h.to_dict())


def render_honesty_record(record: Mapping[str, Any]) -> str:
    """:func:`render_honesty` from the plain data of :meth:`HonestReproduction.to_dict` (the results JSON): the one
    renderer of the account, for notebook 01 and the report."""
    counts = record["counts"]
    layout = record["installed_layout"]
    installed = (f"the installed transformers' layout ({layout})" if layout
                 else "the installed transformers' layout (not one of the shipped layouts)")

    def table(name: str) -> str:
        return markdown_table(record["tables"][name]["headers"], [tuple(row) for row in record["tables"][name]["rows"]])

    return "\n\n".join([
        f"**What the five matching figures are worth.** {counts[FigureRole.INPUT.value]} are inputs, "
        f"{counts[FigureRole.FITTED.value]} is fitted and {counts[FigureRole.PREDICTED.value]} are predicted, with "
        f"{installed}; the layout is itself a choice (below).",
        table("figures"),
        f"**Memory outside PyTorch.** {record['context_finding']}",
        table("outside"),
        f"**The module layout across transformers releases.** {record['layout_finding']}",
        table("layouts"),
    ])
