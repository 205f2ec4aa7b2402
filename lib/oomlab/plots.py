"""Figures for the notebooks. Each takes computed results and returns a matplotlib ``Figure``.

Figures are built without pyplot, so nothing is shown twice; a notebook displays one by ending a cell
with it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from oomlab.units import GiB, format_size


def plot_apply_walks(
    walks: Sequence[tuple[str, Sequence[Any]]],
    capacity_bytes: int,
    outside_bytes: int,
    title: str = "Module._apply: memory on GPU 0 while model.to('cuda') copies each tensor",
    other_limits: Sequence[tuple[str, int]] = (),
) -> Any:
    """Cumulative allocated and reserved bytes along each ``_apply`` walk, with the GPU's limits.

    ``walks`` is ``[(label, steps)]`` where ``steps`` are :class:`~oomlab.apply_walk.WalkStep` of an
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
    """One heat map per remedy (:class:`oomlab.plan.FitMap`): per-GPU peak as a share of the GPU's capacity.

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
