"""Every figure of the notebooks and the report, with one palette.  Each takes computed results (or rows rebuilt from
the results JSON) and returns a matplotlib ``Figure`` built without pyplot, so nothing is shown twice; a notebook
displays one by ending a cell with it.  The step's memory over time (:func:`memory_timeline_svg`) is drawn by oomlab
itself as one inline SVG (no script, no font or style fetched), so the explorer updates it in milliseconds and a page
that shows it stays self-contained."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oomlab.budget.result import BudgetResult, Fit, MemCategory, Phase
from oomlab.core.units import GiB, format_size

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
    load_bytes: int | None = None  # loading's own need where it has one (BudgetResult.load), else None

    @property
    def step_bytes(self) -> int:
        return sum(self.components.values())

    @property
    def total_bytes(self) -> int:
        """The per-GPU peak: the step's, or loading's where it needs more."""
        return max(self.step_bytes, self.load_bytes or 0)

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    @classmethod
    def of(cls, label: str, result: BudgetResult) -> BarRow:
        return cls(label, result.components, result.capacity_bytes,
                   None if result.load is None else result.load.need_bytes)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> BarRow:
        """From a budget's ``to_dict()`` with a ``label`` (the budget notebook's results JSON)."""
        load = raw.get("load")
        return cls(raw["label"], {MemCategory(k): int(v) for k, v in raw["components"].items()},
                   int(raw["capacity_bytes"]), None if load is None else int(load["need_bytes"]))


def plot_budget_bars(rows: Sequence[BarRow], title: str = "") -> Any:
    """Stacked bars of per-GPU memory by component for each row, with each GPU's capacity as a black tick."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 0.55 * len(rows) + 1.8), dpi=110)
    ax = fig.subplots()
    drawn: set[MemCategory | str] = set()
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
        if row.total_bytes > row.step_bytes:  # loading needs more than the step: an outline to its figure
            ax.barh(index, (row.total_bytes - row.step_bytes) / GiB, left=left, fill=False, hatch="//",
                    edgecolor="#444444", linewidth=0.8, label=None if "load" in drawn else "loading (init)")
            drawn.add("load")
            left = row.total_bytes / GiB
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
