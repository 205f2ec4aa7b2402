"""What a budget is made of: the memory categories, the phases of a step, and the per-GPU result."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from oomlab.core.choices import Choice, Method
from oomlab.core.setup import TrainingSetup
from oomlab.core.units import format_size


class MemCategory(Choice):
    """Where a GPU byte goes during a training step."""

    __hash__ = object.__hash__  # members are singletons; Enum's own hash is slow in the hot loop

    WEIGHTS = "weights"  # parameters held on the GPU (the fp32 weights under torch autocast)
    GRADIENTS = "gradients"  # .grad of the trained parameters (sharded where the strategy shards them)
    MASTER_WEIGHTS = "master weights"  # a separate fp32 copy of half weights (DeepSpeed ZeRO-style mixed)
    OPTIMIZER_STATE = "optimizer state"  # Adam moments / SGD momentum / 8-bit states
    ACTIVATIONS = "activations"  # tensors the decoder layers save for backward
    LOGITS_LOSS = "logits and loss"  # the (tokens x vocab) logits, their fp32 copies and gradients
    WORKSPACE = "transient workspace"  # autocast weight copies, FSDP all-gathers, DDP buckets, optimizer temps
    OUTSIDE_PYTORCH = "outside PyTorch"  # CUDA context, cuBLAS/NCCL workspaces: not in memory_allocated
    ALLOCATOR_OVERHEAD = "allocator overhead"  # reserved but not allocated: rounding and fragmentation


class Phase(Choice):
    """The phases of a step whose maximum is the step's peak (budgets, traces and measurements alike)."""

    __hash__ = object.__hash__

    FORWARD = "forward"  # model forward and loss, up to loss.backward()
    BACKWARD = "backward"  # loss.backward(), including recomputation of checkpointed layers
    OPTIMIZER = "optimizer"  # optimizer.step() and zero_grad()


class Source(Choice):
    """Where a figure comes from."""

    ANALYTIC = "analytic"  # oomlab's formulas
    TRACED = "traced"  # PyTorch's MemTracker on fake tensors at full size (CPU)
    MEASURED = "measured"  # real tensors, counted by an allocator
    PUBLISHED = "published"  # a measurement someone published, with its citation


class Fit(Choice):
    """Whether a configuration fits, as every verdict words it (the budget's, the plan's, the figures' colours)."""

    FITS = "fits"  # every GPU, and the host RAM where it is checked
    GPU_ONLY = "fits the GPUs but not the host RAM"  # every GPU holds it; the host RAM does not
    NO = "does not fit"  # a GPU does not hold it

    @classmethod
    def of(cls, fits: bool, gpu_fits: bool = False) -> Fit:
        """FITS when it fits everywhere checked, else GPU_ONLY when the GPUs hold it, else NO."""
        return cls.FITS if fits else cls.GPU_ONLY if gpu_fits else cls.NO


SOURCES = (Source.ANALYTIC.value, Source.TRACED.value)  # what estimate(source=...) can compute

ALLOCATED = (MemCategory.WEIGHTS, MemCategory.GRADIENTS, MemCategory.MASTER_WEIGHTS, MemCategory.OPTIMIZER_STATE,
             MemCategory.ACTIVATIONS, MemCategory.LOGITS_LOSS, MemCategory.WORKSPACE)


@dataclass(frozen=True)
class LoadPeak:
    """What loading the model holds on each GPU where it peaks apart from the step (torchtune < 0.2.0's QLoRA init:
    :mod:`oomlab.budget.nf4_init`); the step then runs in what loading left cached."""

    allocated_peak_bytes: int  # the most live tensors held while loading
    reserved_bytes: int  # the caching allocator's segments after loading (reused by the step, not released)
    need_bytes: int  # the least GPU loading runs on: its allocated peak, unavoidable fragmentation, outside PyTorch
    what: str  # one sentence: the mechanism, the figures, the source

    def to_dict(self) -> dict[str, Any]:
        return {"allocated_peak_bytes": self.allocated_peak_bytes, "reserved_bytes": self.reserved_bytes,
                "need_bytes": self.need_bytes, "what": self.what}


@dataclass(frozen=True)
class BudgetResult:
    """Per-GPU memory of one training step."""

    setup: TrainingSetup = field(repr=False)
    source: Source
    peak_phase: Phase
    phases: Mapping[Phase, Mapping[MemCategory, int]]  # allocated components per phase
    components: Mapping[MemCategory, int]  # at the peak, with outside-PyTorch and allocator overhead
    host_ram_bytes: int
    capacity_bytes: int
    notes: tuple[str, ...] = ()  # what the figures assume, one sentence each (the outside-PyTorch one among them)
    outside_source: str | None = None  # where the outside-PyTorch figure comes from; None: given by the caller
    load: LoadPeak | None = None  # loading's own peak where it has one apart from the step (else None)

    @property
    def outside_note(self) -> str:
        """The note on the memory outside PyTorch (:func:`outside_note`), as :attr:`notes` holds it."""
        return outside_note(self.components.get(MemCategory.OUTSIDE_PYTORCH, 0), self.outside_source)

    @property
    def parameters(self) -> int:
        """The base model's parameters (tied weights once; MoE: every expert), as the model card counts them."""
        return self.setup.model.num_parameters

    @property
    def trainable_parameters(self) -> int:
        """Parameters with a gradient: all of them (full fine-tuning) or the LoRA adapters' ``r (in + out)`` each."""
        s = self.setup
        return self.parameters if s.method is Method.FULL else s.model.lora_parameters(s.lora_rank, s.lora_targets)

    @property
    def step_allocated_peak_bytes(self) -> int:
        """The step's own allocated peak: the sum of its allocated components."""
        return sum(v for k, v in self.components.items() if k in ALLOCATED)

    @property
    def allocated_peak_bytes(self) -> int:
        """What ``torch.cuda.max_memory_allocated`` would report over the run: the step's, or loading's above it."""
        step = self.step_allocated_peak_bytes
        return step if self.load is None else max(step, self.load.allocated_peak_bytes)

    @property
    def reserved_peak_bytes(self) -> int:
        """What ``torch.cuda.max_memory_reserved`` would report: the step's allocated peak and its allocator overhead,
        or what loading left cached where that is more (the step reuses it)."""
        step = self.step_allocated_peak_bytes + self.components.get(MemCategory.ALLOCATOR_OVERHEAD, 0)
        return step if self.load is None else max(step, self.load.reserved_bytes)

    @property
    def loading_peaks(self) -> bool:
        """Does loading need more of each GPU than the step?"""
        return self.load is not None and self.load.need_bytes > sum(self.components.values())

    @property
    def peak_where(self) -> str:
        """Where the run peaks, in words: ``in the backward phase``, or ``while loading the model``."""
        return "while loading the model" if self.loading_peaks else f"in the {self.peak_phase.value} phase"

    @property
    def per_gpu_peak_bytes(self) -> int:
        """What nvidia-smi would show at the peak: allocated + allocator overhead + outside PyTorch -- the step's, or
        loading's where it needs more (:attr:`load`)."""
        step = sum(self.components.values())
        return step if self.load is None else max(step, self.load.need_bytes)

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.per_gpu_peak_bytes

    @property
    def fits(self) -> bool:
        return self.headroom_bytes >= 0

    @property
    def breaking_component(self) -> MemCategory:
        """The largest component at the peak."""
        return max(self.components, key=lambda k: self.components[k])

    def to_dict(self) -> dict[str, Any]:
        s = self.setup
        return {
            "source": self.source.value,
            "model": s.model.name, "gpu": s.gpu.name, "gpus": s.gpus, "nodes": s.nodes,
            "strategy": s.strategy.value, "method": s.method.value, "precision": s.precision.value,
            "optimizer": s.optimizer.value, "batch": s.batch, "seq": s.seq, "checkpointing": s.checkpointing,
            "attention": s.attention.value, "lora_rank": s.lora_rank, "lora_targets": list(s.lora_targets),
            "trainer": s.trainer.value, "reference": s.reference.value, "loss": s.loss.value,
            "offload_activations": s.offload_activations, "base_dtype": s.base_dtype.value,
            "optimizer_in_backward": s.optimizer_in_backward, "framework": s.versions.framework,
            "parameters": self.parameters, "trainable_parameters": self.trainable_parameters,
            "per_gpu_peak_bytes": self.per_gpu_peak_bytes, "allocated_peak_bytes": self.allocated_peak_bytes,
            "peak_phase": self.peak_phase.value,
            "components": {k.value: v for k, v in self.components.items()},
            "phases": {p.value: {k.value: v for k, v in comps.items()} for p, comps in self.phases.items()},
            "host_ram_bytes": self.host_ram_bytes, "capacity_bytes": self.capacity_bytes,
            "fits": self.fits, "headroom_bytes": self.headroom_bytes, "notes": list(self.notes),
            "outside_pytorch_source": self.outside_source,
            "load": None if self.load is None else self.load.to_dict(),
        }


def outside_figure(outside_bytes: int, source: str | None) -> str:
    """The memory outside PyTorch as the budget states it: the size, and ``(given)`` when the caller gave it."""
    return format_size(outside_bytes) + (" (given)" if source is None else "")


def outside_note(outside_bytes: int, source: str | None) -> str:
    """The budget's note on the memory outside PyTorch: the figure and where it comes from (``source`` None: given)."""
    return f"outside PyTorch: {outside_figure(outside_bytes, source)}" + ("" if source is None else f" -- {source}")
