"""Every figure of the notebooks and the report, with one palette.  Each takes computed results (or rows rebuilt from
the results JSON) and returns a matplotlib ``Figure`` built without pyplot, so nothing is shown twice; a notebook
displays one by ending a cell with it.  The step's memory over time (:func:`memory_timeline_svg`) is drawn by oomlab
itself as one inline SVG (no script, no font or style fetched), so the explorer updates it in milliseconds and a page
that shows it stays self-contained."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from oomlab.budget.result import BudgetResult, Fit, MemCategory, Phase
from oomlab.budget.snapshot import SNAPSHOT_CATEGORY, AllocatorReplay
from oomlab.budget.timeline import StepTimeline
from oomlab.core.units import GiB, format_size
from oomlab.explanation.snapshot import SnapshotCategory
from oomlab.explanation.snapshot_format import MemorySnapshot
from oomlab.explanation.snapshot_timeline import MemoryTimeline, memory_timeline

# One fixed colour per component, so a component keeps its colour in every figure and every explorer update.
PALETTE: Mapping[MemCategory, str] = {
    MemCategory.WEIGHTS: "#4c72b0", MemCategory.GRADIENTS: "#dd8452", MemCategory.MASTER_WEIGHTS: "#8172b3",
    MemCategory.OPTIMIZER_STATE: "#c44e52", MemCategory.ACTIVATIONS: "#55a868", MemCategory.LOGITS_LOSS: "#937860",
    MemCategory.WORKSPACE: "#da8bc3", MemCategory.OUTSIDE_PYTORCH: "#8c8c8c", MemCategory.ALLOCATOR_OVERHEAD: "#ccb974",
}


@dataclass(frozen=True)
class FitColor:
    """One fit state's colour: a fill for bars, and a darker shade for words on white (legible as text)."""

    fill: str
    text: str


# One colour per fit state (the remedies figure's bars, the explorer's verdict): green fits, amber fits the GPUs but
# not the host RAM, red does not fit the GPUs.
FIT_COLORS: Mapping[Fit, FitColor] = {Fit.FITS: FitColor("#55a868", "#1a7f37"),
                                      Fit.GPU_ONLY: FitColor("#ccb974", "#9a6700"),
                                      Fit.NO: FitColor("#c44e52", "#b42318")}
# The traced timeline's own (finer) categories: mem_tracker's, as oomlab names them.
TRACE_COLORS = {"parameter": "#4c72b0", "gradient": "#dd8452", "optstate": "#c44e52", "activation": "#55a868",
                "temp": "#da8bc3", "buffer": "#64b5cd", "other": "#8c8c8c", "unsharded_param": "#8172b3",
                "unsharded_grad": "#ccb974", "all_gather": "#937860", "reduce_scatter": "#a1c9f4"}


@dataclass(frozen=True)
class BarRow:
    """One stacked bar: per-GPU bytes by component at the peak, against one GPU's capacity."""

    label: str
    components: Mapping[MemCategory, int]
    capacity_bytes: int

    @property
    def total_bytes(self) -> int:
        return sum(self.components.values())

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    @classmethod
    def of(cls, label: str, result: BudgetResult) -> BarRow:
        return cls(label, result.components, result.capacity_bytes)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> BarRow:
        """From a budget's ``to_dict()`` with a ``label`` (the budget notebook's results JSON)."""
        return cls(raw["label"], {MemCategory(k): int(v) for k, v in raw["components"].items()},
                   int(raw["capacity_bytes"]))


def plot_budget_bars(rows: Sequence[BarRow], title: str = "") -> Any:
    """Stacked bars of per-GPU memory by component for each row, with each GPU's capacity as a black tick."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 0.55 * len(rows) + 1.8), dpi=110)
    ax = fig.subplots()
    drawn: set[MemCategory] = set()
    for index, row in enumerate(rows):
        left = 0.0
        for category in MemCategory:
            value = row.components.get(category, 0) / GiB
            if value <= 0:
                continue
            ax.barh(index, value, left=left, color=PALETTE[category],
                    label=None if category in drawn else category.value)
            drawn.add(category)
            left += value
        ax.plot([row.capacity_bytes / GiB] * 2, [index - 0.42, index + 0.42], color="black", linewidth=2)
        ax.text(left, index, f"  {format_size(row.total_bytes)}" + ("" if row.fits else f"  ({Fit.NO.value})"),
                va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), [row.label for row in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("symlog", linthresh=16)
    ax.set_xlabel("GiB per GPU (log scale above 16 GiB); black tick: the GPU's capacity")
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_trace_timeline(trace: Any, title: str = "") -> Any:
    """Memory over one traced step, categories stacked, phases shaded, the peak marked."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.2), dpi=110)
    ax = fig.subplots()
    events = trace.timeline
    categories = [c for c in TRACE_COLORS if any(snap.get(c, 0) for _, _, snap in events)]
    xs = list(range(len(events)))
    stacks = [[snap.get(c, 0) / GiB for _, _, snap in events] for c in categories]
    ax.stackplot(xs, stacks, labels=categories, colors=[TRACE_COLORS[c] for c in categories], alpha=0.9)
    totals = [sum(snap.values()) / GiB for _, _, snap in events]
    peak = max(range(len(events)), key=lambda i: totals[i])
    ax.plot([peak], [totals[peak]], marker="v", color="black", markersize=9)
    ax.annotate(f"peak {format_size(trace.peak_bytes)}\nin {trace.peak_phase.value}", (peak, totals[peak]),
                xytext=(-10, 10), textcoords="offset points", ha="right", fontsize=8)
    start = 0
    for i in range(1, len(events) + 1):
        if i == len(events) or events[i][1] is not events[start][1]:
            ax.axvspan(start - 0.5, i - 0.5, color="grey", alpha=0.14 if events[start][1] is Phase.BACKWARD else 0.06)
            ax.text((start + i) / 2, max(totals) * 1.02, events[start][1].value, ha="center", fontsize=8)
            start = i
    ax.set_xlim(-0.5, len(events) - 0.5)
    ax.set_ylim(0, max(totals) * 1.12)
    ax.set_xlabel("events of one training step (module hooks, in order)")
    ax.set_ylabel("GiB allocated")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    return fig


def plot_apply_walks(
    walks: Sequence[tuple[str, Sequence[Any]]],
    capacity_bytes: int,
    outside_bytes: int,
    title: str = "Module._apply: memory on GPU 0 while model.to('cuda') copies each tensor",
    other_limits: Sequence[tuple[str, int]] = (),
) -> Any:
    """Cumulative allocated and reserved bytes along each ``_apply`` walk, with the GPU's limits.

    ``walks`` is ``[(label, steps)]`` where ``steps`` are :class:`~oomlab.reproduction.walk.WalkStep` of an
    unlimited walk; the point where reserved memory would pass the usable memory is marked.
    ``other_limits`` adds ``(label, bytes)`` lines, e.g. the usable memory of a bigger GPU.
    """
    from matplotlib.figure import Figure

    usable = capacity_bytes - outside_bytes
    fig = Figure(figsize=(9, 4.8), dpi=110)  # not pyplot: no global state, shown only when displayed
    ax = fig.subplots()
    for k, (label, steps) in enumerate(walks):
        if not steps:
            continue
        total_params = steps[-1].moved_parameters or 1
        x = [0.0] + [100.0 * s.moved_parameters / total_params for s in steps]
        reserved = [0.0] + [s.reserved_bytes / GiB for s in steps]
        allocated = [0.0] + [s.allocated_bytes / GiB for s in steps]
        (line,) = ax.plot(x, reserved, label=f"{label}: reserved", linewidth=2)
        ax.plot(x, allocated, linestyle="--", color=line.get_color(), label=f"{label}: allocated", linewidth=1)
        failing = next(
            (i for i, s in enumerate(steps) if s.reserved_bytes > usable),
            None,
        )
        if failing is not None:
            before = steps[failing - 1] if failing else None
            fx = x[failing]  # the last point that fitted (x has a leading 0)
            fy = (before.reserved_bytes if before else 0) / GiB
            ax.plot([fx], [fy], marker="X", markersize=12, color=line.get_color(), linestyle="none")
            ax.annotate(
                f"OOM copying {steps[failing].name}\n(needs {format_size(steps[failing].tried_bytes)}, "
                f"{fx:.0f}% moved)",
                xy=(fx, fy), xytext=(12, -40 - 36 * k), textcoords="offset points", fontsize=8,
                color=line.get_color(), bbox={"boxstyle": "round", "fc": "white", "alpha": 0.85},
            )
    ax.axhline(capacity_bytes / GiB, color="black", linewidth=1.2,
               label=f"total capacity {format_size(capacity_bytes)}")
    ax.axhline(usable / GiB, color="crimson", linewidth=1.2, linestyle=":",
               label=f"usable by PyTorch {format_size(usable)} (capacity - {format_size(outside_bytes)} outside)")
    for label, limit_bytes in other_limits:
        ax.axhline(limit_bytes / GiB, color="seagreen", linewidth=1.2, linestyle="-.", label=label)
    ax.set_xlabel("parameters moved to the GPU (%)")
    ax.set_ylabel("GiB on GPU 0")
    ax.set_title(title, fontsize=10)
    ax.set_xlim(0, 100)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def plot_fit_maps(maps: Sequence[Any], title: str = "Per-GPU peak over micro-batch × sequence length") -> Any:
    """One heat map per remedy (:class:`oomlab.remedies.fit_map.FitMap`): per-GPU peak as a share of the GPU's capacity.

    Each cell shows the peak in GiB; cells that fit are marked with a check, those that do not are hatched grey.
    """
    import numpy as np
    from matplotlib.figure import Figure

    n = max(1, len(maps))
    fig = Figure(figsize=(4.2 * n, 3.8), dpi=110)
    axes = fig.subplots(1, n, squeeze=False)[0]
    image = None
    for ax, fm in zip(axes, maps, strict=False):
        share = np.array(fm.peak_bytes, dtype=float) / fm.capacity_bytes
        image = ax.imshow(np.minimum(share, 2.0), cmap="RdYlGn_r", vmin=0.0, vmax=2.0, origin="lower",
                          aspect="auto")
        for i, _ in enumerate(fm.batches):
            for j, _ in enumerate(fm.seqs):
                label = f"{fm.peak_bytes[i][j] / GiB:.1f}" + ("\n✓" if fm.fits[i][j] else "")
                ax.text(j, i, label, ha="center", va="center", fontsize=6.5,
                        color="black" if fm.fits[i][j] else "white")
        ax.set_xticks(range(len(fm.seqs)), [str(s) for s in fm.seqs], fontsize=7)
        ax.set_yticks(range(len(fm.batches)), [str(b) for b in fm.batches], fontsize=7)
        ax.set_xlabel("sequence length (tokens)", fontsize=8)
        ax.set_ylabel("micro-batch per GPU", fontsize=8)
        ax.set_title(fm.name.replace(" · ", "\n", 2), fontsize=7.5)
    if image is not None:
        bar = fig.colorbar(image, ax=list(axes), shrink=0.85)
        bar.set_label("per-GPU peak / capacity (GiB in cells; ✓ fits)", fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.subplots_adjust(top=0.78, wspace=0.35)
    return fig


@dataclass(frozen=True)
class RemedyBar:
    """One remedy in the remedies figure: its per-GPU peak against one GPU's capacity."""

    label: str  # "1 · DDP · QLoRA r8 · …", "as configured · …"
    per_gpu_peak_bytes: int
    capacity_bytes: int
    fits: bool  # on the GPUs and in host RAM (a remedy can fit the GPU but not the host)
    chosen: bool = False  # the recommended fix

    @property
    def gpu_fits(self) -> bool:
        return self.per_gpu_peak_bytes <= self.capacity_bytes


def plot_remedies(bars: Sequence[RemedyBar], title: str = "The ranked remedies: per-GPU peak against capacity") -> Any:
    """One horizontal bar per remedy (ranked order, top first): its per-GPU peak against the GPU's capacity (a black
    line); green where it fits, amber where the GPU fits but host RAM does not, red where the GPU does not.  The axis
    is linear up to twice the capacity; a longer bar is cut there with an arrow and its value.  The recommended fix is
    outlined and named."""
    import textwrap

    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    fig = Figure(figsize=(10, 0.5 * len(bars) + 1.9), dpi=110)
    ax = fig.subplots()
    capacity = max((bar.capacity_bytes for bar in bars), default=GiB) / GiB
    limit = 2.0 * capacity
    for index, bar in enumerate(bars):
        fit = Fit.of(bar.fits, bar.gpu_fits)
        value = bar.per_gpu_peak_bytes / GiB
        shown = min(value, limit * 0.97)
        ax.barh(index, shown, color=FIT_COLORS[fit].fill, height=0.7,
                edgecolor="black" if bar.chosen else "none", linewidth=2 if bar.chosen else 0)
        note = format_size(bar.per_gpu_peak_bytes) + ("  ◀ recommended" if bar.chosen else "")
        if value > shown:  # cut: the value inside the bar, an arrow at the cut
            ax.annotate("", xy=(limit, index), xytext=(limit * 0.9, index),
                        arrowprops={"arrowstyle": "->", "color": "black"})
            ax.text(limit * 0.88, index, f"{note} ", va="center", ha="right", fontsize=7.5, color="white",
                    fontweight="bold")
        else:
            ax.text(shown, index, f"  {note}", va="center", fontsize=7.5, fontweight="bold" if bar.chosen else "normal")
    ax.axvline(capacity, color="black", linewidth=1.5)
    ax.text(capacity, -0.75, f" capacity {format_size(round(capacity * GiB))}", fontsize=7.5, va="center")
    labels = ["\n".join(textwrap.wrap(bar.label, 58)[:2]) for bar in bars]
    ax.set_yticks(range(len(bars)), labels, fontsize=7)
    for tick, bar in zip(ax.get_yticklabels(), bars, strict=True):
        if bar.chosen:
            tick.set_fontweight("bold")
    ax.set_ylim(len(bars) - 0.5, -1.2)
    ax.set_xlim(0, limit)
    ax.set_xlabel("GiB per GPU (bars longer than twice the capacity are cut, their value written in them)", fontsize=8)
    legend = {Fit.FITS: Fit.FITS.value, Fit.GPU_ONLY: "GPU fits, host RAM does not", Fit.NO: "does not fit the GPU"}
    fig.legend(handles=[Patch(color=FIT_COLORS[fit].fill, label=label) for fit, label in legend.items()],
               fontsize=7.5, loc="lower center", ncol=3, frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


@dataclass(frozen=True)
class CostPoint:
    """One hardware row that fits, priced: cost per million training tokens against tokens per second."""

    label: str  # "8 × a100-80gb"
    usd_per_million_tokens: float
    tokens_per_s: float
    on_front: bool  # on the pareto front (no other row is both cheaper per token and faster)


def plot_pareto(points: Sequence[CostPoint], title: str = "Which GPUs would it fit: cost against speed") -> Any:
    """Every priced hardware row that fits as a point (log-log): list-price $ per million training tokens against
    estimated tokens/s; the pareto front joined and labelled GPU × count, the other points grey."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.6), dpi=110)
    ax = fig.subplots()
    rest = [p for p in points if not p.on_front]
    front = sorted((p for p in points if p.on_front), key=lambda p: p.usd_per_million_tokens)
    if rest:
        ax.scatter([p.tokens_per_s for p in rest], [p.usd_per_million_tokens for p in rest], s=14, color="#8c8c8c",
                   alpha=0.6, label="fits, dominated")
    if front:
        ax.plot([p.tokens_per_s for p in front], [p.usd_per_million_tokens for p in front], "-o", color="#4c72b0",
                markersize=5, label="pareto front")
        for p in front:
            ax.annotate(p.label, (p.tokens_per_s, p.usd_per_million_tokens), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
    if points:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.legend(fontsize=7, loc="upper right")
    ax.set_xlabel("estimated training tokens/s (all GPUs)", fontsize=8)
    ax.set_ylabel("$ per million training tokens (dated list price)", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------ the step's memory over time

# a snapshot's categories in the budget's colours (each drawn as the budget category it stands for)
SNAPSHOT_COLORS: Mapping[SnapshotCategory, str] = {
    **{s: PALETTE[m] for m, s in reversed(list(SNAPSHOT_CATEGORY.items()))},
    SnapshotCategory.UNATTRIBUTED: "#bab0ab"}


@dataclass(frozen=True)
class TimelineSeries:
    """The step's memory over time as :func:`memory_timeline_svg` draws it: live bytes by category after each event."""

    points: Sequence[Mapping[str, int]]  # category name -> live bytes, after each allocation or free
    colors: Mapping[str, str]  # category name -> fill, in stacking order (bottom first)
    phases: Sequence[tuple[str, int, int]]  # (phase, first point, last point + 1)
    capacity_bytes: int | None  # the GPU's (None: not known, no line)
    available_bytes: int | None  # the capacity less the memory outside PyTorch (None: not known)
    oom_point: int | None  # the point after which the allocation failed (None: it fits)
    oom_size_bytes: int | None
    source: str  # what the figure is drawn from

    @property
    def peak_bytes(self) -> int:
        return max((sum(p.values()) for p in self.points), default=0)

    @classmethod
    def of_step(cls, timeline: StepTimeline, replay: AllocatorReplay | None = None) -> TimelineSeries:
        """A budgeted step (:func:`~oomlab.budget.timeline.step_timeline`), with the OOM where the allocator model
        gives up (``replay``; drawn whole past it: the step as budgeted)."""
        r = timeline.result
        outside = r.components.get(MemCategory.OUTSIDE_PYTORCH, 0)
        points = [{c.value: b for c, b in p.items()} for p in timeline.live_after]
        phases = [("between steps" if p is None else p.value, a, b) for p, a, b in timeline.phase_spans()]
        oom = None if replay is None or replay.oom_event is None else replay.oom_event - 1
        return cls(points, {c.value: PALETTE[c] for c in MemCategory}, phases, r.capacity_bytes,
                   r.capacity_bytes - outside, oom, None if replay is None else replay.oom_size_bytes,
                   f"oomlab's {r.source.value} budget, each phase's figures in order; the OOM: its allocator model")

    @classmethod
    def of_snapshot(cls, timeline: MemoryTimeline, capacity_bytes: int | None = None,
                    available_bytes: int | None = None, source: str = "a torch memory snapshot") -> TimelineSeries:
        """A snapshot's trace (:func:`~oomlab.explanation.snapshot_timeline.memory_timeline`)."""
        points = [{c.value: b for c, b in p.items()} for p in timeline.points]
        return cls(points, {c.value: color for c, color in SNAPSHOT_COLORS.items()}, timeline.phases, capacity_bytes,
                   available_bytes, timeline.oom_point, timeline.oom_size_bytes, source)


def _ticks(top: int, count: int = 4) -> list[int]:
    """``count`` round tick values up to ``top`` (multiples of a power of two in GiB, MiB or bytes)."""
    step = 1
    while step * count < top:
        step *= 2
    return [step * i for i in range(1, count + 1) if step * i <= top]


def memory_timeline_svg(series: TimelineSeries, title: str = "", width: int = 760, height: int = 300) -> str:
    """The step's memory over time as one inline SVG: categories stacked, phases banded and named, the capacity (and
    what PyTorch may use of it) as lines, the OOM as a red mark; every text escaped."""
    left, right, top, bottom = 70, 150, 28, 34
    plot_w, plot_h = width - left - right, height - top - bottom
    n = max(len(series.points), 1)
    ymax = max(series.peak_bytes, series.capacity_bytes or 0, 1) * 1.06

    def x(i: float) -> float:
        return left + plot_w * i / n

    def y(b: float) -> float:
        return top + plot_h * (1 - b / ymax)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" role="img" font-family="sans-serif" font-size="10">',
           f"<title>{escape(title or 'memory over one training step')}</title>"]
    for k, (phase, a, b) in enumerate(series.phases):
        out.append(f'<rect x="{x(a):.1f}" y="{top}" width="{x(b) - x(a):.1f}" height="{plot_h}" '
                   f'fill="{"#eeeeee" if k % 2 else "#f7f7f7"}"/>')
        if x(b) - x(a) >= 5.5 * len(phase):  # a band too narrow for its name stays unnamed (its colour band shows)
            out.append(f'<text x="{(x(a) + x(b)) / 2:.1f}" y="{top - 4}" text-anchor="middle">{escape(phase)}</text>')
    drawn = [c for c in series.colors if any(p.get(c, 0) for p in series.points)]
    base = [0] * len(series.points)
    def steps(values: list[int]) -> list[str]:
        """The corners of a step line over the points (one corner pair where the value changes)."""
        corners = [f"{x(0):.1f},{y(values[0]):.1f}"]
        for i in range(1, len(values)):
            if values[i] != values[i - 1]:
                corners += [f"{x(i):.1f},{y(values[i - 1]):.1f}", f"{x(i):.1f},{y(values[i]):.1f}"]
        return corners + [f"{x(len(values)):.1f},{y(values[-1]):.1f}"]

    for c in drawn:
        upper = [base[i] + p.get(c, 0) for i, p in enumerate(series.points)]
        out.append(f'<polygon points="{" ".join(steps(upper) + steps(base)[::-1])}" fill="{series.colors[c]}" '
                   'stroke="none"/>')
        base = upper
    for value, label, dash in ((series.capacity_bytes, "capacity", "6,3"),
                               (series.available_bytes, "for PyTorch", "2,2")):
        if value is not None and (label == "capacity" or value != series.capacity_bytes):
            out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
                       f'stroke="black" stroke-dasharray="{dash}"/>')
            below = 12 if label != "capacity" else 0  # under its line: the capacity's label sits on the line above
            out.append(f'<text x="{left + plot_w + 4}" y="{y(value) + 3 + below:.1f}">{escape(label)} '
                       f"{escape(format_size(value))}</text>")
    if series.oom_point is not None and series.points:
        i = max(series.oom_point, 0)
        at = sum(series.points[i].values())
        asked = "" if series.oom_size_bytes is None else f" asking {format_size(series.oom_size_bytes)}"
        out.append(f'<circle cx="{x(i + 1):.1f}" cy="{y(at):.1f}" r="5" fill="#b42318"/>')
        out.append(f'<text x="{x(i + 1) + 7:.1f}" y="{y(at) - 6:.1f}" fill="#b42318">'
                   f"{escape('out of memory' + asked)}</text>")
    for t in _ticks(int(ymax)):
        out.append(f'<line x1="{left - 4}" x2="{left}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="black"/>')
        out.append(f'<text x="{left - 6}" y="{y(t) + 3:.1f}" text-anchor="end">{escape(format_size(t))}</text>')
    out.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + plot_h}" stroke="black"/>')
    out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}" stroke="black"/>')
    out.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 18}" text-anchor="middle">allocations and frees of '
               f"one step, in order (peak {escape(format_size(series.peak_bytes))})</text>")
    out.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 5}" text-anchor="middle" fill="#555">source: '
               f"{escape(series.source)}</text>")
    low_lines = series.capacity_bytes is not None and y(series.capacity_bytes) > top + plot_h / 2
    for k, c in enumerate(reversed(drawn)):  # the legend in stacking order, on the right, away from the lines' labels
        ly = top + 30 + 14 * k if low_lines else top + plot_h - 14 * (len(drawn) - k)
        out.append(f'<rect x="{left + plot_w + 4}" y="{ly}" width="10" height="10" fill="{series.colors[c]}"/>')
        out.append(f'<text x="{left + plot_w + 18}" y="{ly + 9}">{escape(c)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def snapshot_series(snapshot: MemorySnapshot, capacity_bytes: int | None = None, outside_bytes: int | None = None,
                    device: int = 0) -> TimelineSeries:
    """A snapshot's trace over time -- the pipeline's own (``results/step-snapshot.pickle``,
    budget.snapshot.STEP_SNAPSHOT_NAME) or a user's -- against the GPU's capacity and what PyTorch may use of it (the
    capacity less ``outside_bytes``) where they are known."""
    available = None if capacity_bytes is None or outside_bytes is None else capacity_bytes - outside_bytes
    source = ("oomlab's simulated snapshot: " + snapshot.simulated_by if snapshot.simulated_by
              else "a torch memory snapshot's trace")
    return TimelineSeries.of_snapshot(memory_timeline(snapshot, device), capacity_bytes, available, source)


def snapshot_timeline_svg(snapshot: MemorySnapshot, capacity_bytes: int | None = None,
                          outside_bytes: int | None = None, title: str = "", device: int = 0) -> str:
    """:func:`snapshot_series` as :func:`memory_timeline_svg` draws it (the explorer, notebook 02)."""
    return memory_timeline_svg(snapshot_series(snapshot, capacity_bytes, outside_bytes, device), title)


def plot_memory_timeline(series: TimelineSeries, title: str = "") -> Any:
    """:class:`TimelineSeries` as a matplotlib figure (the report's pictures are embedded rasters): the categories
    stacked, the phases shaded and named, the capacity and what PyTorch may use of it, the OOM point."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.2), dpi=110)
    ax = fig.subplots()
    drawn = [c for c in series.colors if any(p.get(c, 0) for p in series.points)]
    xs = list(range(len(series.points)))
    ax.stackplot(xs, [[p.get(c, 0) / GiB for p in series.points] for c in drawn], labels=drawn,
                 colors=[series.colors[c] for c in drawn], alpha=0.9)
    top = max([series.peak_bytes, series.capacity_bytes or 0]) / GiB * 1.12 or 1
    for k, (phase, first, last) in enumerate(series.phases):
        ax.axvspan(first - 0.5, last - 0.5, color="grey", alpha=0.12 if k % 2 else 0.04)
        ax.text((first + last) / 2, top * 0.97, phase, ha="center", va="top", fontsize=7)
    for value, label, style in ((series.capacity_bytes, "capacity", "-"),
                                (series.available_bytes, "what PyTorch may use", "--")):
        if value is not None:
            ax.axhline(value / GiB, color="black", linestyle=style, linewidth=1, label=f"{label} {format_size(value)}")
    if series.oom_point is not None:
        at = sum(series.points[series.oom_point].values()) / GiB
        asked = "" if series.oom_size_bytes is None else f": {format_size(series.oom_size_bytes)} asked"
        ax.plot([series.oom_point], [at], marker="o", color="#b42318")
        ax.annotate("out of memory" + asked, (series.oom_point, at), xytext=(6, 6), textcoords="offset points",
                    color="#b42318", fontsize=8)
    ax.set_xlim(-0.5, max(len(xs) - 0.5, 0.5))
    ax.set_ylim(0, top)
    ax.set_xlabel(f"allocations and frees of one step, in order (peak {format_size(series.peak_bytes)}); "
                  f"source: {series.source}", fontsize=8)
    ax.set_ylabel("GiB allocated")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    return fig
