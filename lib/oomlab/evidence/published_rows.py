"""Published measurements as data: what each row of ``lib/oomlab/data/published-measurements.json`` measured (the
counter, the moment, the run's settings and what oomlab does not model of it) and which oomlab figure answers it.

:mod:`oomlab.evidence.published` sets every row beside the estimate and writes the document.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

from oomlab.budget.result import BudgetResult, MemCategory, Phase
from oomlab.core.errors import InvalidValueError
from oomlab.core.paths import DATA_DIR

__all__ = ["PublishedRow", "load_rows", "figure_for", "figure_bytes", "MetricKind", "Moment", "Figure"]

PUBLISHED_JSON = DATA_DIR / "published-measurements.json"


class MetricKind(enum.Enum):
    """Which counter a published figure reads."""

    ALLOCATED = "allocated"  # torch.cuda.max_memory_allocated(): bytes held by live tensors
    RESERVED = "reserved"  # torch.cuda.max_memory_reserved(): the caching allocator's segments
    ACTIVE = "active"  # memory_stats()["active_bytes.all.peak"]: allocated blocks (+ any awaiting a stream) ≈ allocated
    NVIDIA_SMI = "nvidia-smi"  # the device memory nvidia-smi shows: reserved + CUDA context + libraries' own buffers
    UNKNOWN = "unknown"  # the source does not say (the row names the kind it is compared as, and why)


class Moment(enum.Enum):
    """When the published figure was read."""

    PEAK = "peak"  # the maximum over the measured window
    AFTER_OPTIMIZER_STEP = "after-optimizer-step"  # sampled right after optimizer.step(), gradients not yet freed
    AFTER_MODEL_INIT = "after-model-init"  # right after the model was loaded, before any step


class Figure(enum.Enum):
    """The oomlab figure a published one is compared with."""

    ALLOCATED_PEAK = "allocated peak"  # BudgetResult.allocated_peak_bytes
    RESERVED_PEAK = "reserved peak"  # allocated peak + the allocator overhead at the peak
    PER_GPU_PEAK = "per-GPU peak"  # BudgetResult.per_gpu_peak_bytes: reserved + memory outside PyTorch
    MODEL_STATES = "model states"  # weights + gradients + master weights + optimizer state, in the optimizer phase
    AFTER_LOAD = "reserved after loading"  # what loading leaves reserved (BudgetResult.load), else the weights


# Which oomlab figure answers which published counter at which moment.  NB: "active" is compared with the allocated
# peak -- they differ only by blocks freed while another stream still uses them, which a single-stream step lacks.
FIGURES: Mapping[tuple[MetricKind, Moment], Figure] = MappingProxyType({
    (MetricKind.ALLOCATED, Moment.PEAK): Figure.ALLOCATED_PEAK,
    (MetricKind.ACTIVE, Moment.PEAK): Figure.ALLOCATED_PEAK,
    (MetricKind.RESERVED, Moment.PEAK): Figure.RESERVED_PEAK,
    (MetricKind.NVIDIA_SMI, Moment.PEAK): Figure.PER_GPU_PEAK,
    (MetricKind.ALLOCATED, Moment.AFTER_OPTIMIZER_STEP): Figure.MODEL_STATES,
    (MetricKind.RESERVED, Moment.AFTER_MODEL_INIT): Figure.AFTER_LOAD,
})
MODEL_STATE_CATEGORIES = (MemCategory.WEIGHTS, MemCategory.GRADIENTS, MemCategory.MASTER_WEIGHTS,
                          MemCategory.OPTIMIZER_STATE)


def figure_for(kind: MetricKind, moment: Moment = Moment.PEAK) -> Figure:
    """The oomlab figure that matches a published counter read at ``moment``."""
    try:
        return FIGURES[(kind, moment)]
    except KeyError as err:
        known = ", ".join(f"{k.value} at {m.value}" for k, m in FIGURES)
        raise InvalidValueError(f"no oomlab figure for the counter {kind.value!r} read at {moment.value!r}; known: "
                                f"{known} (compare an unknown counter as one of these kinds)") from err


def figure_bytes(result: BudgetResult, figure: Figure) -> int:
    """``figure`` of one budget, in bytes."""
    if figure is Figure.ALLOCATED_PEAK:
        return result.allocated_peak_bytes
    if figure is Figure.RESERVED_PEAK:
        return result.reserved_peak_bytes
    if figure is Figure.PER_GPU_PEAK:
        return result.per_gpu_peak_bytes
    after_step = result.phases[Phase.OPTIMIZER]
    if figure is Figure.MODEL_STATES:
        return sum(after_step.get(c, 0) for c in MODEL_STATE_CATEGORIES)
    if result.load is not None:  # loading has its own peak and leaves its cache (oomlab.budget.nf4_init)
        return result.load.reserved_bytes
    return after_step.get(MemCategory.WEIGHTS, 0)  # else the weights loading placed


class Reliability(enum.Enum):
    """How far the researcher trusts a row (staging/published/README.md, "Which rows to trust")."""

    HIGH = "high"  # exact bytes, exact configs, code and versions
    MEDIUM = "medium"  # exact code, a setting or the length inferred
    MEDIUM_LOW = "medium-low"  # settings inferred from a cumulative description
    LOW = "low"  # settings or the counter assumed
    SUSPECT = "suspect"  # cannot describe the stated run; shown, left out of every statistic


class Length(enum.Enum):
    """How the sequence length of the published run is known."""

    FIXED = "fixed"  # packed or synthetic inputs: every batch has the stated length
    VARIABLE = "variable"  # each batch padded to its longest sample; oomlab takes the stated truncation limit


class Unmodelled(enum.Enum):
    """Something a published run does that oomlab does not model; first-order ones remove or reshape a component."""

    def __new__(cls, key: str, first_order: bool, text: str) -> Unmodelled:
        member = object.__new__(cls)
        member._value_ = key
        member.first_order = first_order
        member.text = text
        return member

    CHUNKED_LOSS = ("chunked-loss", True, "chunked cross-entropy / LM head: no whole (tokens × vocab) logits, fp32 "
                    "copy and gradient, which oomlab counts")
    COMPILE = ("compile", True, "torch.compile: fused kernels save fewer activations than the eager ops oomlab counts")
    ACTIVATION_OFFLOADING = ("activation-offloading", True, "saved activations offloaded to the host")
    PAGED_OPTIMIZER = ("paged-optimizer", True, "bitsandbytes paged optimizer: state in CUDA unified memory, outside "
                       "the torch counters; oomlab counts it on the GPU")
    QUANTIZE_ON_LOAD = ("quantize-on-load", True, "QLoRA quantizing a half checkpoint on the GPU inside the measured "
                        "window (suspected to set the peak); oomlab budgets the steady step")
    DORA = ("dora", True, "DoRA: weight-norm temporaries and magnitude vectors")
    ADAPTER_DTYPE = ("adapter-dtype", False, "LoRA adapters, gradients and AdamW state in bf16 (oomlab: peft's fp32)")
    NF4_NO_DOUBLE_QUANT = ("nf4-no-double-quant", False, "NF4 without double quantization (4.5 bits; oomlab 4.127)")
    TORCHAO_NF4 = ("torchao-nf4", False, "torchao's NF4Tensor, not bitsandbytes (no per-weight QuantState)")
    LM_HEAD_ADAPTER = ("lm-head-adapter", False, "a LoRA adapter on the output head, which oomlab cannot target")
    FLEX_ATTENTION = ("flex-attention", False, "flex_attention with a document mask, modelled as SDPA (same saved "
                      "tensors: q, k, v, output, log-sum-exp)")
    FLASH_ATTENTION = ("flash-attention", False, "flash_attention_2, modelled as SDPA (same saved tensors)")
    TORCHTUNE = ("torchtune", False, "torchtune's own model, loss and recipe code, not transformers + peft")
    LITGPT = ("litgpt", False, "litgpt's own model (fused qkv, LoRA on its slices) and Fabric loop")
    EVAL_IN_WINDOW = ("eval-in-window", False, "validation and generation inside the measured window (below "
                      "training's peak by a rough count)")


class Coverage(enum.Enum):
    """How completely oomlab can express a published run."""

    MODELLED = "modelled"  # every difference left is second-order (framework code, kernels, adapter dtype)
    APPROXIMATED = "approximated"  # the nearest oomlab setup misses a first-order feature (Unmodelled.first_order)
    NOT_ESTIMATED = "not estimated"  # oomlab refuses the setup; the row says why


@dataclass(frozen=True)
class SecondaryMetric:
    """Another figure the same run published (its name as in the published row's ``additional_metrics``)."""

    name: str
    kind: MetricKind
    moment: Moment
    value_bytes: int


@dataclass(frozen=True)
class PublishedRow:
    """One published peak, its citation, and the oomlab setup it maps to."""

    id: str
    source_url: str
    metric_text: str  # what the source measured, in the researcher's words
    value_bytes: int
    reliability: Reliability
    metric_kind: MetricKind
    compared_as: MetricKind  # the kind whose figure it is compared with (metric_kind unless that is UNKNOWN)
    compared_as_because: str | None  # why, for an UNKNOWN counter
    length: Length
    setup_kwargs: Mapping[str, Any]  # keyword arguments of oomlab.budget.estimate
    not_estimated_because: str | None
    unmodelled: tuple[Unmodelled, ...]
    note: str
    secondary: tuple[SecondaryMetric, ...]
    published: Mapping[str, Any]  # the researcher's row, verbatim

    @property
    def coverage(self) -> Coverage:
        if self.not_estimated_because:
            return Coverage.NOT_ESTIMATED
        return Coverage.APPROXIMATED if any(u.first_order for u in self.unmodelled) else Coverage.MODELLED

    @property
    def source(self) -> str:
        """The publication the row comes from: its id's prefix in :data:`SOURCE_PREFIXES`."""
        return next(s for s in SOURCE_PREFIXES if self.id.startswith(s))


SOURCE_PREFIXES = ("peft-metamathqa", "torchtune-readme-flags", "torchtune-readme-llama31", "torchtune-tutorial",
                   "torchtune-pr961", "litgpt-confighub", "peft-docs", "unsloth-readme-hf-fa2",
                   "fms-acceleration")


def _row_from_dict(raw: Mapping[str, Any]) -> PublishedRow:
    pub = raw["published"]
    rid = pub["id"]
    kind = MetricKind(raw["metric_kind"])
    compared = MetricKind(raw.get("compared_as", kind.value))
    if (kind is MetricKind.UNKNOWN) != ("compared_as" in raw) or compared is MetricKind.UNKNOWN:
        raise InvalidValueError(f"published row {rid!r}: an unknown counter needs 'compared_as' (a known kind) and "
                                "'compared_as_because'; a known one takes neither")
    extra = {m["metric"]: m for m in pub.get("additional_metrics") or ()}
    try:
        secondary = tuple(SecondaryMetric(s["metric"], MetricKind(s["kind"]), Moment(s["moment"]),
                                          int(extra[s["metric"]]["value_bytes"])) for s in raw.get("secondary", ()))
    except KeyError as err:
        raise InvalidValueError(f"published row {rid!r}: no additional metric {err.args[0]!r}; known: "
                                f"{', '.join(extra) or 'none'}") from err
    return PublishedRow(
        id=rid, source_url=pub["source_url"], metric_text=pub["metric"], value_bytes=int(pub["value_bytes"]),
        reliability=Reliability(pub["reliability"]), metric_kind=kind, compared_as=compared,
        compared_as_because=raw.get("compared_as_because"), length=Length(raw["length"]),
        setup_kwargs=MappingProxyType(dict(raw["setup"])), not_estimated_because=raw.get("not_estimated_because"),
        unmodelled=tuple(Unmodelled(u) for u in raw["unmodelled"]), note=raw["note"], secondary=secondary,
        published=MappingProxyType(dict(pub)),
    )


@cache
def load_data(path: Path = PUBLISHED_JSON) -> dict[str, Any]:
    """The committed file as read: its ``rows`` and the researcher's ``deltas`` between rows."""
    return json.loads(Path(path).read_text())


def load_rows(path: Path = PUBLISHED_JSON) -> tuple[PublishedRow, ...]:
    """The committed published rows, in the researcher's order."""
    return tuple(_row_from_dict(raw) for raw in load_data(path)["rows"])
