"""The memory budget for readers (notebook 02, the CLI): text, tables and narrative from computed results.

Figures are drawn by :mod:`oomlab.report.figures`; this module returns text and rows only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from oomlab.budget.analytic import versions_notes
from oomlab.budget.estimator import estimate_setup
from oomlab.budget.inventory import model_states
from oomlab.budget.loss_kernels import loss_note
from oomlab.budget.result import ALLOCATED, BudgetResult, Fit
from oomlab.budget.trainers import trainer_terms
from oomlab.core.choices import Method, Optimizer, Precision, Strategy, Trainer
from oomlab.core.defaults import DEFAULTS, launch_strategy
from oomlab.core.errors import OomlabError
from oomlab.core.setup import TrainingSetup, make_setup
from oomlab.core.units import format_size
from oomlab.core.words import agree, count


def render_budget(result: BudgetResult) -> str:
    """A plain-text table of the budget, torch-style sizes."""
    s = result.setup
    lines = [
        f"{s.model.name} on {s.world_size} x {s.gpu.name} ({format_size(result.capacity_bytes)} each): "
        f"{s.strategy.value}, {s.method.value}, {s.precision.value}, {s.optimizer.value}, micro-batch {s.batch}, "
        f"seq {s.seq}, checkpointing {'on' if s.checkpointing else 'off'}, {s.attention.value}"
        + ("" if s.trainer is Trainer.SFT else f", trainer {s.trainer.value}")
        + (f", loss {s.loss.value}" if s.loss.fused else "")
        + (", activations offloaded" if s.offload_activations else "")
        + (", optimizer stepped in backward" if s.optimizer_in_backward else "")
        + (f", base loaded in {s.base_dtype.value}" if s.base_dtype is not DEFAULTS.base_dtype
           and s.method is not Method.FULL else "")
        + f" [{result.source.value}]",
        ("peak while loading the model; the step's own peak" if result.loading_peaks else "peak")
        + f" in the {result.peak_phase.value} phase:",
    ]
    for category, value in sorted(result.components.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {category.value:<22} {format_size(value):>12}")
    if result.load is not None:  # loading's own peak (oomlab.budget.nf4_init), its mechanism and source in a note
        lines.append(f"  {'loading needs':<22} {format_size(result.load.need_bytes):>12}  (allocated peak "
                     f"{format_size(result.load.allocated_peak_bytes)}, then "
                     f"{format_size(result.load.reserved_bytes)} reserved)")
    lines += [
        f"  {'allocated peak':<22} {format_size(result.allocated_peak_bytes):>12}  (torch.cuda.max_memory_allocated)",
        f"  {'per-GPU peak':<22} {format_size(result.per_gpu_peak_bytes):>12}  (nvidia-smi)",
        f"  {'capacity':<22} {format_size(result.capacity_bytes):>12}",
        ("fits, headroom " if result.fits else "DOES NOT FIT, short by ")
        + format_size(abs(result.headroom_bytes)),
        f"host RAM needed: {format_size(result.host_ram_bytes)}",
        *versions_notes(s),  # the releases assumed (given or installed) and what they change here
    ]
    if result.load is not None:
        lines.append(result.load.what)
    if s.loss.fused:  # the kernel that replaces the logits, with its source (oomlab.budget.loss_kernels)
        lines.append(loss_note(s))
    if s.trainer is not Trainer.SFT:  # the trainer's own terms, each with its source (oomlab.budget.trainers)
        lines += [f"  {line}" for line in trainer_terms(s).lines]
    return "\n".join(lines)


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
        ["held outside PyTorch (CUDA context, NCCL)", format_size(outside_bytes), format_size(gpus * outside_bytes)],
        ["usable by one process's tensors", format_size(usable), format_size(gpus * usable)],
        ["largest model state one process can hold", format_size(usable), format_size(usable) + " (not summed)"],
    ]

CAPACITY_HEADERS = ["", "per GPU", "all GPUs"]


def bytes_per_parameter_rows(model: str = "llama-13b") -> list[list[str]]:
    """Bytes per parameter of the model states for full fine-tuning, by precision and optimizer.

    Computed from the budget's own terms (one GPU, steady state), divided by the parameter count.
    """
    rows = []
    for strategy, label in (("single", "PyTorch (autocast)"), ("zero2", "DeepSpeed ZeRO-style")):
        for precision in Precision:
            for optimizer in Optimizer:
                try:
                    s = make_setup(gpus=1, model=model, gpu="h100-80gb", strategy=strategy, precision=precision.value,
                                   optimizer=optimizer.value)
                except OomlabError:
                    continue
                if strategy == "zero2" and precision in (Precision.FP32, Precision.FP16, Precision.BF16):
                    continue
                n = s.model.num_parameters
                m = model_states(s)  # what estimate() holds (DeepSpeed's: its flat partition's layout)
                terms = [m.weights, m.gradients, m.master_weights, m.optimizer_state]
                rows.append([label, precision.value, optimizer.value] + [f"{t / n:.2f}" for t in terms]
                            + [f"{sum(terms) / n:.2f}"])
    return rows

BYTES_PER_PARAMETER_HEADERS = ["framework", "precision", "optimizer", "weights", "gradients", "master weights",
                               "optimizer state", "total B/param"]


CONFIGURED = "as configured"  # how the budget's rows and sentences mark the configuration as given


def configured_words(strategy: str, method: str, lora_rank: int, checkpointing: bool, world_size: int) -> str:
    """The configuration as given, as the variants name it: ``full fine-tune, a replica per GPU (ddp)`` when it is the
    plain replica, else its method and strategy (``LoRA r8, ddp, checkpointing``)."""
    ddp = launch_strategy(Strategy.DDP, world_size).value
    if (strategy, method) == (ddp, "full"):
        return f"full fine-tune, a replica per GPU ({ddp})"
    trains = {"full": "full fine-tune", "lora": f"LoRA r{lora_rank}", "qlora": f"QLoRA r{lora_rank}"}.get(method,
                                                                                                        method)
    return f"{trains}, {strategy}" + (", checkpointing" if checkpointing else "")


def configured_variants(setup: TrainingSetup) -> list[tuple[str, TrainingSetup]]:
    """The configuration as given, first, and its usual variants, each a typed setup (those the hardware or the
    libraries refuse are left out); on one GPU no sharded variant (FSDP over one GPU is the single-GPU run).  Each
    label names the variant alone: :func:`budget_variants` marks the first one "as configured"."""
    gpus, world = setup.gpus, setup.world_size
    ddp = launch_strategy(Strategy.DDP, world)  # a replica per GPU, one process on one GPU
    changes = [
        (f"full fine-tune, a replica per GPU ({ddp.value})", {"strategy": ddp, "method": "full"}),
        (f"accelerate FSDP (FSDP1) full shard over {count(gpus, 'GPU')}", {"strategy": "fsdp", "method": "full"}),
        (f"accelerate FSDP (FSDP1) over {gpus} + checkpointing",
         {"strategy": "fsdp", "method": "full", "checkpointing": True}),
        (f"accelerate FSDP2 over {gpus} + checkpointing",
         {"strategy": "fsdp2", "method": "full", "checkpointing": True}),
        (f"accelerate FSDP (FSDP1) + CPU offload over {gpus}",
         {"strategy": "fsdp-offload", "method": "full", "checkpointing": True}),
        ("LoRA, a replica per GPU", {"strategy": ddp, "method": "lora"}),
        ("LoRA + checkpointing, replica", {"strategy": ddp, "method": "lora", "checkpointing": True}),
        ("QLoRA + checkpointing, replica", {"strategy": ddp, "method": "qlora", "checkpointing": True}),
        (f"LoRA + checkpointing, accelerate FSDP (FSDP1) over {gpus}",
         {"strategy": "fsdp", "method": "lora", "checkpointing": True}),
    ]
    base = setup.with_(strategy=launch_strategy(setup.strategy, world))
    variants = [(configured_words(base.strategy.value, base.method.value, base.lora_rank, base.checkpointing, world),
                 base)]
    for label, change in changes:
        if world == 1 and change["strategy"] in ("fsdp", "fsdp2"):
            continue  # sharding over one GPU: the single-GPU run again (its offload variant stays)
        try:
            variant = setup.with_(**change)
        except OomlabError:
            continue
        if variant != base:  # the configured one once
            variants.append((label, variant))
    return variants


def budget_variants(variants: list[tuple[str, TrainingSetup]]) -> list[tuple[str, BudgetResult]]:
    """Analytic budgets of the variants, labelled for display: the first (:func:`configured_variants`'
    configuration as given) as ``as configured: <its label>``."""
    return [(f"{CONFIGURED}: {label}" if index == 0 else label, estimate_setup(setup))
            for index, (label, setup) in enumerate(variants)]


def training_words(strategy: str, method: str, precision: str, optimizer: str, batch: int, seq: int) -> str:
    """A training configuration in words: ``ddp, full fine-tuning, fp16-mixed, adamw, micro-batch 1 × 2048 tokens``."""
    return f"{strategy}, {method} fine-tuning, {precision}, {optimizer}, micro-batch {batch} × {seq} tokens"


def configured_sentence(training: str, per_gpu_peak_bytes: int, headroom_bytes: int, fits: bool, gpus: int) -> str:
    """The configured budget's answer in one sentence (the report's): what one step needs per GPU, and whether it
    fits (``training``: :func:`training_words`, escaped where it must be)."""
    return (f"Training as configured ({training}) needs {format_size(per_gpu_peak_bytes)} per GPU and "
            f"{Fit.of(fits).value} ({format_size(abs(headroom_bytes))} {'to spare' if fits else 'short'})"
            + (f"; the {gpus} GPUs do not pool their memory." if gpus > 1 else "."))


def summarize(results: list[tuple[str, BudgetResult]], gpus: int) -> str:
    """Markdown: what the configured setup needs, what breaks it, and which variants fit."""
    configured = results[0][1]
    s, gpu = configured.setup, configured.setup.gpu
    given = configured_words(s.strategy.value, s.method.value, s.lora_rank, s.checkpointing, s.world_size)
    breaking = configured.breaking_component
    fitting = [(lbl, r) for lbl, r in results if r.fits]
    lines = [
        f"**{CONFIGURED.capitalize()}** ({given}) one training step needs "
        f"{format_size(configured.per_gpu_peak_bytes)} on each {gpu.display_name} of "
        f"{format_size(configured.capacity_bytes)}: "
        + (f"it {Fit.FITS.value}." if configured.fits else
           f"it {Fit.NO.value}, short by {format_size(-configured.headroom_bytes)}; the largest component is "
           f"{breaking.value} ({format_size(configured.components[breaking])}) and the peak falls "
           f"{configured.peak_where}."),
        (f"The {gpus} GPUs do not pool their memory: each process holds what the strategy puts on it, so the "
         "question is always per GPU." if gpus > 1 else "One GPU: the question is whether one GPU holds the step."),
    ]
    if fitting:
        best = min(fitting, key=lambda lr: lr[1].per_gpu_peak_bytes)
        lines.append(
            f"{len(fitting)} of the {count(len(results), 'variant')} {agree(len(fitting), 'fits')}; the leanest is "
            f"*{best[0]}* at "
            f"{format_size(best[1].per_gpu_peak_bytes)} per GPU ({format_size(best[1].headroom_bytes)} to spare)."
        )
    else:
        lines.append("None of these variants fits this GPU; see the remediations notebook for the rest.")
    return "\n\n".join(lines)
