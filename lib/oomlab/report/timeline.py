"""The step's memory over time: one series (:class:`TimelineSeries`, from a budgeted step or any memory snapshot's
trace) and its two drawings -- an inline SVG drawn by oomlab (the explorer, notebook 02: nothing fetched, every text
escaped) and a matplotlib figure (the report, whose pictures are embedded rasters)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from oomlab.budget.result import MemCategory
from oomlab.budget.snapshot import SNAPSHOT_CATEGORY, AllocatorReplay
from oomlab.budget.timeline import StepTimeline
from oomlab.core.units import GiB, format_size
from oomlab.explanation.snapshot import SnapshotCategory
from oomlab.explanation.snapshot_format import MemorySnapshot
from oomlab.explanation.snapshot_timeline import MemoryTimeline, memory_timeline
from oomlab.report.figures import PALETTE

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
