"""The memory budget for readers (notebook 02): tables, narrative and figures from computed results."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from oomlab.budget import ALLOCATED, BudgetResult, MemCategory
from oomlab.units import GiB, format_size

COLORS = {
    MemCategory.WEIGHTS: "#4c72b0", MemCategory.GRADIENTS: "#dd8452", MemCategory.MASTER_WEIGHTS: "#8172b3",
    MemCategory.OPTIMIZER_STATE: "#c44e52", MemCategory.ACTIVATIONS: "#55a868", MemCategory.LOGITS_LOSS: "#937860",
    MemCategory.WORKSPACE: "#da8bc3", MemCategory.OUTSIDE_PYTORCH: "#8c8c8c", MemCategory.ALLOCATOR_OVERHEAD: "#ccb974",
}
TRACE_COLORS = {"parameter": "#4c72b0", "gradient": "#dd8452", "optstate": "#c44e52", "activation": "#55a868",
                "temp": "#da8bc3", "buffer": "#64b5cd", "other": "#8c8c8c", "unsharded_param": "#8172b3",
                "unsharded_grad": "#ccb974", "all_gather": "#937860", "reduce_scatter": "#a1c9f4"}


def plot_budget_bars(results: Sequence[tuple[str, BudgetResult]], title: str = "") -> Any:
    """Stacked bars of per-GPU memory by component for each ``(label, result)``, with each GPU's capacity."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 0.55 * len(results) + 1.8), dpi=110)
    ax = fig.subplots()
    for row, (_label, result) in enumerate(results):
        left = 0.0
        for category in MemCategory:
            value = result.components.get(category, 0) / GiB
            if value <= 0:
                continue
            ax.barh(row, value, left=left, color=COLORS[category],
                    label=category.value if row == 0 or category not in _seen(ax) else None)
            left += value
        ax.plot([result.capacity_bytes / GiB] * 2, [row - 0.42, row + 0.42], color="black", linewidth=2)
        ax.text(left, row, f"  {format_size(result.per_gpu_peak_bytes)}" + ("" if result.fits else "  (does not fit)"),
                va="center", fontsize=7)
    ax.set_yticks(range(len(results)), [label for label, _ in results], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("symlog", linthresh=16)
    ax.set_xlabel("GiB per GPU (log scale above 16 GiB); black tick: the GPU's capacity")
    ax.set_title(title, fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=False))
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def _seen(ax: Any) -> set[MemCategory]:
    labels = set(ax.get_legend_handles_labels()[1])
    return {c for c in MemCategory if c.value in labels}


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
            ax.axvspan(start - 0.5, i - 0.5, color="grey", alpha=0.06 if events[start][1].value != "backward" else 0.14)
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


def component_rows(results: Sequence[tuple[str, BudgetResult]]) -> list[list[str]]:
    """Table rows: setup, each allocated component, per-GPU peak, capacity, fits."""
    rows = []
    for label, r in results:
        rows.append([label, r.peak_phase.value]
                    + [format_size(r.components.get(c, 0)) if r.components.get(c) else "-" for c in ALLOCATED]
                    + [format_size(r.per_gpu_peak_bytes), format_size(r.capacity_bytes), "yes" if r.fits else "no"])
    return rows


COMPONENT_HEADERS = ["setup", "peak phase", *[c.value for c in ALLOCATED], "per-GPU peak", "capacity", "fits"]


# ---------------------------------------------------------------------------------------- tables


def capacity_rows(gpu: Any, gpus: int, outside_bytes: int) -> list[list[str]]:
    """What "N GB total" means: nvidia-smi's MiB, torch's capacity, what PyTorch can use, per GPU and summed."""
    smi = gpu.nvidia_smi_total_mib * 2**20
    usable = gpu.total_memory_bytes - outside_bytes
    return [
        ["nvidia-smi total (MiB, read as 'MB')", f"{gpu.nvidia_smi_total_mib} MiB",
         f"{gpus * gpu.nvidia_smi_total_mib:,} MiB = {gpus * smi / 1e9:.1f} GB"],
        ["torch total capacity", format_size(gpu.total_memory_bytes), format_size(gpus * gpu.total_memory_bytes)],
        ["held outside PyTorch (CUDA context)", format_size(outside_bytes), format_size(gpus * outside_bytes)],
        ["usable by one process's tensors", format_size(usable), format_size(gpus * usable)],
        ["largest model state one process can hold", format_size(usable), format_size(usable) + " (not summed)"],
    ]


CAPACITY_HEADERS = ["", "per GPU", "all GPUs"]


def bytes_per_parameter_rows(model: str = "llama-13b") -> list[list[str]]:
    """Bytes per parameter of the model states for full fine-tuning, by precision and optimizer.

    Computed from the budget's own terms (one GPU, steady state), divided by the parameter count.
    """
    from oomlab.budget import gradients_on_gpu, master_weight_bytes, optimizer_on_gpu, weights_on_gpu
    from oomlab.errors import OomlabError
    from oomlab.training import Optimizer, Precision, make_setup

    rows = []
    for strategy, label in (("single", "PyTorch (autocast)"), ("zero2", "DeepSpeed ZeRO-style")):
        for precision in Precision:
            for optimizer in Optimizer:
                try:
                    s = make_setup(model=model, gpu="h100-80gb", strategy=strategy, precision=precision.value,
                                   optimizer=optimizer.value)
                except OomlabError:
                    continue
                if strategy == "zero2" and precision in (Precision.FP32, Precision.FP16, Precision.BF16):
                    continue
                n = s.model.num_parameters
                terms = [weights_on_gpu(s), gradients_on_gpu(s), master_weight_bytes(s), optimizer_on_gpu(s)]
                rows.append([label, precision.value, optimizer.value] + [f"{t / n:.2f}" for t in terms]
                            + [f"{sum(terms) / n:.2f}"])
    return rows


BYTES_PER_PARAMETER_HEADERS = ["framework", "precision", "optimizer", "weights", "gradients", "master weights",
                               "optimizer state", "total B/param"]


def seed_variants(model: str, gpu: str, gpus: int, precision: str, optimizer: str, batch: int, seq: int,
                  checkpointing: bool, attention: str, lora_rank: int) -> list[tuple[str, dict[str, Any]]]:
    """The user's configuration and its usual variants, as ``estimate`` keyword arguments."""
    base = {"model": model, "gpu": gpu, "gpus": gpus, "precision": precision, "optimizer": optimizer,
            "batch": batch, "seq": seq, "checkpointing": checkpointing, "attention": attention,
            "lora_rank": lora_rank}
    ddp = "ddp" if gpus > 1 else "single"
    return [
        (f"as configured: full fine-tune, a replica per GPU ({ddp})", {**base, "strategy": ddp, "method": "full"}),
        (f"FSDP full shard over {gpus} GPUs", {**base, "strategy": "fsdp", "method": "full"}),
        (f"FSDP over {gpus} + checkpointing", {**base, "strategy": "fsdp", "method": "full", "checkpointing": True}),
        (f"FSDP + CPU offload over {gpus}", {**base, "strategy": "fsdp-offload", "method": "full",
                                              "checkpointing": True}),
        ("LoRA, a replica per GPU", {**base, "strategy": ddp, "method": "lora"}),
        ("LoRA + checkpointing, replica", {**base, "strategy": ddp, "method": "lora", "checkpointing": True}),
        ("QLoRA + checkpointing, replica", {**base, "strategy": ddp, "method": "qlora", "checkpointing": True}),
        (f"LoRA + checkpointing, FSDP over {gpus}", {**base, "strategy": "fsdp", "method": "lora",
                                                     "checkpointing": True}),
    ]


def budget_variants(variants: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, BudgetResult]]:
    """Analytic budgets of the variants that are valid on this hardware."""
    from oomlab.budget import estimate
    from oomlab.errors import OomlabError

    out = []
    for label, kwargs in variants:
        try:
            out.append((label, estimate(**kwargs)))
        except OomlabError:
            continue
    return out


def agreement_rows(committed: dict[str, Any]) -> list[list[str]]:
    return [[r["setup"], format_size(r["analytic_peak_bytes"]), format_size(r["traced_peak_bytes"]),
             f"{r['ratio']:.4f}", f"{r['analytic_phase']} / {r['traced_phase']}"] for r in committed["rows"]]


AGREEMENT_HEADERS = ["setup", "analytic", "traced", "ratio", "phase (analytic / traced)"]


def summarize(results: list[tuple[str, BudgetResult]], gpus: int) -> str:
    """Markdown: what the configured setup needs, what breaks it, and which variants fit."""
    label, seed = results[0]
    gpu = seed.setup.gpu
    breaking = seed.breaking_component
    fitting = [(lbl, r) for lbl, r in results if r.fits]
    lines = [
        f"**As configured** ({label}) one training step needs {format_size(seed.per_gpu_peak_bytes)} on each "
        f"{gpu.display_name} of {format_size(seed.capacity_bytes)}: "
        + ("it fits." if seed.fits else
           f"it does not fit, short by {format_size(-seed.headroom_bytes)}; the largest component is "
           f"{breaking.value} ({format_size(seed.components[breaking])}) and the peak falls in the "
           f"{seed.peak_phase.value} phase."),
        f"The {gpus} GPUs do not pool their memory: each process holds what the strategy puts on it, so the "
        f"question is always per GPU.",
    ]
    if fitting:
        best = min(fitting, key=lambda lr: lr[1].per_gpu_peak_bytes)
        lines.append(
            f"{len(fitting)} of the {len(results)} variants fit; the leanest is *{best[0]}* at "
            f"{format_size(best[1].per_gpu_peak_bytes)} per GPU ({format_size(best[1].headroom_bytes)} to spare)."
        )
    else:
        lines.append("None of these variants fits this GPU; see the remediations notebook for the rest.")
    return "\n\n".join(lines)


SMALL_LIVE_CASES = ("full fp16-mixed AdamW", "LoRA r8 fp16-mixed AdamW, checkpointing",
                    "QLoRA r8 bf16-mixed AdamW (NF4, double quant)")
SMALL_HEADERS = ["tiny setup (trained for real on CPU)", "analytic", "measured", "ratio", "peak phase"]


def small_scale_rows(labels: Sequence[str] = SMALL_LIVE_CASES) -> list[list[str]]:
    """Measure a few tiny setups for real now (seconds each) and set the analytic figure beside each."""
    from oomlab.agreement_small import SMALL_CASES, compare_small

    rows = []
    for case in (c for c in SMALL_CASES if c.label in labels):
        r = compare_small(case)
        rows.append([case.label, f"{r.analytic_peak_bytes:,} B", f"{r.measured_peak_bytes:,} B", f"{r.ratio:.4f}",
                     r.analytic_peak_phase.value])
    return rows
