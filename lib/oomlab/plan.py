"""Remediations: every realistic way to train a model on the given GPUs, budgeted, ranked and explained.

:func:`make_plan` enumerates strategy × method × precision × optimizer × checkpointing (offload is the
``fsdp-offload`` strategy) plus accelerate's ``device_map="auto"`` placement, drops what the hardware cannot run
(with :func:`oomlab.training.make_setup`'s own message), budgets each with :func:`oomlab.budget.estimate_setup`,
searches the largest micro-batch and the longest sequence that fit, estimates throughput, and ranks the remedies
that fit by tokens per second.  :func:`knob_table` starts from the user's configuration and changes one knob,
then two: "the configuration that determines the result".

Throughput (every assumption is in :class:`Assumptions` and printed by :func:`describe_assumptions`):

* FLOPs per token (:func:`flops_per_token`): forward ``2 N`` for the ``N`` parameters that multiply activations
  (Kaplan et al. 2020, sec. 2.1, ``C_forward ≈ 2N + 2 n_layer n_ctx d_attn``), backward twice the forward for
  full fine-tuning (gradients with respect to activations and to weights), and only the activation gradients
  (``2 N``) plus the adapters' own for LoRA's frozen base; activation checkpointing recomputes the decoder
  layers' forward once more (Narayanan et al. 2021, sec. 5.1: ``72 → 96 B s l h^2`` per iteration, i.e. 3 → 4
  forward passes).  Attention scores and values are counted as ``4 s d_attn`` per token per layer forward
  (QK^T and AV, the full square as ``FlopCounterMode`` counts SDPA; a causal kernel skips about half).
* Step time: FLOPs / (the GPU's dense fp16 (or fp32) peak × MFU) + host-link time for offloaded bytes + the
  collectives' bytes over the GPU-to-GPU link + the host optimizer step.  NB: no overlap of communication and
  compute is assumed, so step times are upper bounds.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from oomlab import activations as act
from oomlab import budget
from oomlab.budget import BudgetResult, MemCategory
from oomlab.errors import InvalidValueError
from oomlab.search import largest_true
from oomlab.specs import GPUSpec, ModelSpec, load_gpu, load_model
from oomlab.training import Method, Optimizer, Precision, Strategy, TrainingSetup, make_setup
from oomlab.units import format_size, parse_size

DEFAULT_HOST_RAM = "192GiB"  # NB: assumption -- a 4 x T4 AWS g4dn.12xlarge has 192 GiB of host memory
DEVICE_MAP = "device-map"  # the strategy name of accelerate's device_map="auto" route
MAX_BATCH_SEARCH = 4096  # the micro-batch search stops here
NO_SPLIT = ("LlamaDecoderLayer", "MistralDecoderLayer")  # accelerate keeps a decoder layer on one device


@dataclass(frozen=True)
class Assumptions:
    """What the throughput estimate assumes (printed with every plan)."""

    mfu: float = 0.35  # model FLOPs utilisation of the fp16 tensor-core peak (NB: T4-class, stated not measured)
    host_optimizer_params_per_s: float = 1e9  # CPU AdamW updates per second per node (NB: order of magnitude)
    throughput_batch_cap: int = 8  # throughput is estimated at min(largest micro-batch that fits, this)
    overlap: bool = False  # communication overlapped with compute (False: step times are upper bounds)


def describe_assumptions(gpu: GPUSpec, assumptions: Assumptions) -> list[str]:
    """Every assumption behind the figures, as sentences."""
    return [
        f"GPU: {gpu.display_name}, dense fp16 tensor-core peak {gpu.peak_fp16_flops / 1e12:g} TFLOP/s, "
        f"fp32 peak {gpu.peak_fp32_flops / 1e12:g} TFLOP/s (source: {gpu.sources.get('peak_fp16_flops', 'spec')})",
        f"MFU {assumptions.mfu:.0%} of that peak (assumption for T4-class GPUs; not measured here)",
        "FLOPs per token: forward 2N + 4·s·d_attn per layer, backward 4N (full) or 2N + 4N_adapters (LoRA/QLoRA; "
        "frozen weights need no weight gradients), + the layers' forward again with checkpointing "
        "(Kaplan et al. 2020 sec. 2.1; Narayanan et al. 2021 sec. 5.1); N = parameters that multiply activations "
        "(the decoder layers' projections and the LM head; the embedding is a lookup)",
        f"GPU-to-GPU collectives and host offload over {gpu.host_link} at its theoretical "
        f"{gpu.host_link_bytes_per_s / 1e9:.3f} GB/s per direction (no NVLink; NB: NCCL reaches less)",
        "ring collectives: all-reduce moves 2(n-1)/n of the buffer per GPU, all-gather and reduce-scatter (n-1)/n; "
        "FSDP gathers the weights in forward and again in backward and reduce-scatters the gradients",
        f"offloaded optimizer step on the host at {assumptions.host_optimizer_params_per_s:.0e} parameters/s per "
        "node (NB: order of magnitude of a vectorised CPU Adam)",
        "communication is " + ("overlapped with compute" if assumptions.overlap
                               else "not overlapped with compute: step times are upper bounds"),
        f"tokens/s at the largest micro-batch that fits at the target length, capped at "
        f"{assumptions.throughput_batch_cap}",
        "device_map='auto' runs one GPU at a time (a naive pipeline): n GPUs give one GPU's throughput",
        "QLoRA counted at the same MFU (NB: bitsandbytes dequantizes each 4-bit weight before its matmul, so it "
        "runs slower in practice)",
    ]


# -------------------------------------------------------------------------------------------------- FLOPs


@dataclass(frozen=True)
class Flops:
    """FLOPs per token of one training step, by pass."""

    forward: int
    backward: int
    recompute: int

    @property
    def total(self) -> int:
        return self.forward + self.backward + self.recompute


def matmul_parameters(setup: TrainingSetup) -> int:
    """N: parameters that multiply activations -- every layer's projections and the LM head (Kaplan's N, + head)."""
    spec = setup.model
    return spec.num_hidden_layers * act.layer_matmul_params(setup) + spec.vocab_size * spec.hidden_size


def attention_flops_per_token(setup: TrainingSetup) -> int:
    """Forward QK^T and AV: ``2 · 2 · s · d_attn`` per token per layer (the full square, as FlopCounterMode)."""
    spec = setup.model
    return spec.num_hidden_layers * 4 * setup.seq * spec.num_attention_heads * spec.head_dim


def flops_per_token(setup: TrainingSetup) -> Flops:
    """FLOPs per token: forward 2N (+attention), backward 4N full / 2N + 4N_lora LoRA, + recompute.

    NB: LoRA's first layer computes no input gradient for its frozen q/k/v projections (the embedding output
    needs none), and the LM head computes no weight gradient; both are counted exactly.
    """
    spec = setup.model
    n = matmul_parameters(setup)
    attn = attention_flops_per_token(setup)
    lora = budget.lora_parameters(setup) if setup.method is not Method.FULL else 0
    forward = 2 * n + 2 * lora + attn
    if setup.method is Method.FULL:
        backward = 4 * n + 2 * attn
    else:
        h = spec.hidden_size
        kvd = spec.num_key_value_heads * spec.head_dim
        first_qkv = h * spec.num_attention_heads * spec.head_dim + 2 * h * kvd  # layer 0's q, k, v: no dX
        backward = 2 * (n - first_qkv) + 4 * lora + 2 * attn
    recompute = 0
    if setup.checkpointing:
        recompute = 2 * (n - spec.vocab_size * spec.hidden_size) + 2 * lora + attn
    return Flops(forward, backward, recompute)


# ------------------------------------------------------------------------------------------- throughput


@dataclass(frozen=True)
class StepTime:
    """Seconds of one optimizer step on one GPU, by cause."""

    compute_s: float
    collectives_s: float  # all-reduce / all-gather / reduce-scatter between GPUs
    host_link_s: float  # offloaded weights and gradients over the host link
    host_optimizer_s: float  # the optimizer step on the host (offload)
    tokens: int  # tokens of the whole step (all GPUs that work in parallel)

    @property
    def seconds(self) -> float:
        return self.compute_s + self.collectives_s + self.host_link_s + self.host_optimizer_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def collective_bytes(setup: TrainingSetup) -> int:
    """Bytes each GPU sends per step in the strategy's collectives (ring algorithms)."""
    n = setup.world_size
    if n == 1 or setup.strategy is Strategy.SINGLE:
        return 0
    frac = (n - 1) / n
    grads = budget.grad_bytes_per_param(setup) * budget.trainable_parameters(setup)
    if setup.strategy in (Strategy.DDP, Strategy.ZERO1):
        return round(2 * frac * grads)  # all-reduce (ZeRO-1: reduce-scatter + all-gather, the same volume)
    if setup.strategy is Strategy.ZERO2:
        weights = 2 * budget.trainable_parameters(setup)  # updated half weights all-gathered
        return round(frac * (grads + weights))
    return round(frac * (2 * budget.weight_bytes_total(setup) + grads))  # FSDP: gather fwd + bwd, reduce-scatter


def host_link_bytes(setup: TrainingSetup) -> int:
    """Bytes each GPU moves over the host link per step: FSDP offload copies its shards in and its grads out."""
    if setup.strategy is not Strategy.FSDP_OFFLOAD:
        return 0
    n = setup.world_size
    shard = -(-budget.weight_bytes_total(setup) // n)
    grads = -(-budget.grad_bytes_per_param(setup) * budget.trainable_parameters(setup) // n)
    return 2 * shard + grads  # NB: FSDP2 CPUOffloadPolicy copies the shard to the GPU in forward and backward


def step_time(setup: TrainingSetup, assumptions: Assumptions, device_map: bool = False) -> StepTime:
    """The step time of ``setup`` (per GPU; one GPU at a time for ``device_map``)."""
    gpu = setup.gpu
    peak = gpu.peak_fp32_flops if setup.precision is Precision.FP32 else (
        gpu.peak_bf16_flops if setup.precision.uses_bf16 and gpu.peak_bf16_flops else gpu.peak_fp16_flops)
    tokens = setup.batch * setup.seq
    compute = tokens * flops_per_token(setup).total / (peak * assumptions.mfu)
    link = gpu.host_link_bytes_per_s
    if device_map:
        # activations (and their gradients) cross each GPU boundary once each way
        crossing = 2 * (setup.gpus - 1) * tokens * setup.model.hidden_size * act.stream_bytes(setup)
        return StepTime(compute, crossing / link, 0.0, 0.0, tokens)
    collectives = collective_bytes(setup) / link
    host = host_link_bytes(setup) / link
    host_opt = 0.0
    if setup.strategy is Strategy.FSDP_OFFLOAD:
        host_opt = budget.trainable_parameters(setup) / setup.nodes / assumptions.host_optimizer_params_per_s
    parallel = 1 if setup.strategy is Strategy.SINGLE else setup.world_size
    if assumptions.overlap:
        compute, collectives, host = max(compute, collectives, host), 0.0, 0.0
    return StepTime(compute, collectives, host, host_opt, parallel * tokens)


# ------------------------------------------------------------------------------------------- device_map


@dataclass(frozen=True)
class GPUPlacement:
    """What accelerate's device_map puts on one device."""

    device: int | str
    modules: tuple[str, ...]
    layers: tuple[int, ...]  # decoder layer indices
    weight_bytes: int  # the placed modules' parameters in the meta model's dtype
    peak_bytes: int  # the training step's peak on this GPU (budget components shared out, + outside PyTorch)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "modules": list(self.modules), "layers": list(self.layers),
                "weight_bytes": self.weight_bytes, "peak_bytes": self.peak_bytes}


@dataclass(frozen=True)
class DeviceMapPlacement:
    """accelerate's ``infer_auto_device_map`` after ``get_balanced_memory``, as ``device_map="auto"`` does."""

    setup: TrainingSetup = field(repr=False, compare=False)
    max_memory: Mapping[int | str, int]  # what accelerate was given (scaled to weight bytes, see place_device_map)
    gpus: tuple[GPUPlacement, ...]
    spilled: tuple[str, ...]  # modules accelerate put on "cpu" or "disk"

    @property
    def per_gpu_peak_bytes(self) -> int:
        return max(g.peak_bytes for g in self.gpus)

    def to_dict(self) -> dict[str, Any]:
        return {"max_memory": {str(k): v for k, v in self.max_memory.items()},
                "gpus": [g.to_dict() for g in self.gpus], "spilled": list(self.spilled)}


@lru_cache(maxsize=16)
def _meta_module_sizes(spec: ModelSpec) -> tuple[Any, dict[str, int]]:
    """The fp16 meta model (transformers, no weights) and accelerate's module sizes for it."""
    from accelerate.utils import compute_module_sizes

    from oomlab.modeling import build_meta_model
    from oomlab.specs import load_dtype

    model = build_meta_model(spec, load_dtype("float16"))
    return model, dict(compute_module_sizes(model, dtype="float16"))


_SIZE_MEMO: dict[tuple, Any] = {}


@contextlib.contextmanager
def _memoised_sizes() -> Iterator[None]:
    """accelerate's ``compute_module_sizes`` and ``find_tied_parameters``, memoised per meta model.

    ``infer_auto_device_map`` recomputes the sizes of the same (cached, never modified) meta model thousands of
    times; the results are the same each time, so they are computed once.
    """
    from unittest import mock

    from accelerate.utils import modeling as acc

    sizes, tied = acc.compute_module_sizes, acc.find_tied_parameters

    def memo_sizes(model: Any, *args: Any, **kwargs: Any) -> Any:
        key = ("sizes", id(model), args, tuple(sorted((k, str(v)) for k, v in kwargs.items())))
        held = _SIZE_MEMO.get(key)
        if held is None or held[0] is not model:  # the model is kept: an id is never reused for another
            held = _SIZE_MEMO[key] = (model, sizes(model, *args, **kwargs))
        return copy.copy(held[1])  # accelerate updates the dict it gets (tied weights): hand out copies

    def memo_tied(model: Any, *args: Any, **kwargs: Any) -> Any:
        key = ("tied", id(model), args, tuple(sorted(kwargs.items())))
        held = _SIZE_MEMO.get(key)
        if held is None or held[0] is not model:
            held = _SIZE_MEMO[key] = (model, tied(model, *args, **kwargs))
        return copy.deepcopy(held[1])

    with mock.patch.object(acc, "compute_module_sizes", memo_sizes), \
            mock.patch.object(acc, "find_tied_parameters", memo_tied):
        yield


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part == "layers" and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


def place_device_map(setup: TrainingSetup, result: BudgetResult | None = None) -> DeviceMapPlacement:
    """Place ``setup``'s model over its GPUs with accelerate's own ``get_balanced_memory`` + ``infer_auto_device_map``.

    accelerate sizes modules by their weights; a training step needs more per weight byte (gradients, optimizer
    state, activations).  Each GPU's memory is therefore given to accelerate in weight bytes: (capacity − outside
    PyTorch − logits and loss) / (the single-GPU budget's bytes per weight byte).  The step's peak per GPU is then
    the single-GPU budget's components shared out: weights, gradients, optimizer state and workspace by the share
    of parameters placed there, activations by the share of decoder layers, logits and loss on the LM head's GPU,
    and the outside-PyTorch memory on each.  NB: the peaks of different GPUs are taken at the single budget's
    peak phase.
    """
    from accelerate.utils import get_balanced_memory, infer_auto_device_map

    single = setup.with_(strategy=Strategy.SINGLE, gpus=1, nodes=1)
    result = budget.estimate_setup(single) if result is None else result
    model, sizes = _meta_module_sizes(setup.model)
    comps = result.components
    outside = comps.get(MemCategory.OUTSIDE_PYTORCH, 0)
    logits = comps.get(MemCategory.LOGITS_LOSS, 0)
    per_weight = (result.per_gpu_peak_bytes - outside - logits) / max(1, sizes[""])
    usable = setup.gpu.total_memory_bytes - outside - logits
    scaled = {i: max(0, int(usable / per_weight)) for i in range(setup.gpus)}
    quiet = logging.getLogger("accelerate.utils.modeling")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # "Device 0 is not available": there is no GPU here, by design
    try:
        with _memoised_sizes():
            balanced = get_balanced_memory(model, max_memory=dict(scaled), no_split_module_classes=list(NO_SPLIT),
                                           dtype="float16")
            balanced = {k: min(int(v), scaled[k]) for k, v in balanced.items() if k in scaled}
            device_map = infer_auto_device_map(model, max_memory={**balanced, "cpu": 1 << 62},
                                               no_split_module_classes=list(NO_SPLIT), dtype="float16")
    finally:
        quiet.setLevel(level)
    layers_total = setup.model.num_hidden_layers
    weights_total = sizes[""]
    lm_device = device_map.get("lm_head", next(reversed(device_map.values())))
    per_device: dict[Any, list[str]] = {}
    for name, device in device_map.items():
        per_device.setdefault(device, []).append(name)
    gpus = []
    for device in range(setup.gpus):
        names = tuple(per_device.get(device, ()))
        wbytes = sum(sizes.get(n, 0) for n in names)
        layers = tuple(sorted(i for i in map(_layer_index, names) if i is not None))
        share_w = wbytes / weights_total
        share_l = len(layers) / layers_total
        peak = outside
        for category, value in comps.items():
            if category is MemCategory.OUTSIDE_PYTORCH:
                continue
            if category is MemCategory.LOGITS_LOSS:
                peak += value if device == lm_device else 0
            elif category is MemCategory.ACTIVATIONS:
                peak += round(value * share_l)
            else:
                peak += round(value * share_w)
        gpus.append(GPUPlacement(device, names, layers, wbytes, peak if names else outside))
    spilled = tuple(n for d, ns in per_device.items() if not isinstance(d, int) for n in ns)
    return DeviceMapPlacement(setup, {**scaled}, tuple(gpus), spilled)


# ----------------------------------------------------------------------------------------------- remedies


@dataclass(frozen=True)
class Remedy:
    """One configuration, budgeted: does it fit, what breaks it, how fast it would train."""

    name: str
    strategy: str  # a Strategy value or "device-map"
    method: str
    precision: str
    optimizer: str
    checkpointing: bool
    offload: str  # "none", or what lives on the host
    fits: bool  # on the GPUs and in host RAM
    reason: str  # why it fits or not, or why it was dropped
    per_gpu_peak_bytes: int | None  # None when dropped
    headroom_bytes: int | None
    host_ram_bytes: int | None
    max_batch: int | None  # largest micro-batch that fits at the target length (None: not even 1)
    max_seq: int | None  # longest sequence at micro-batch 1 that fits, up to the model's context (None: none)
    tokens_per_s: float | None  # None when it does not fit
    config_files: tuple[str, ...] = ()  # files under outputs/configs/ that launch it
    breaking_component: str | None = None  # the largest component at the peak
    caveats: tuple[str, ...] = ()  # what it changes besides memory
    dropped: bool = False  # the hardware or the libraries cannot run it
    step: StepTime | None = field(default=None, compare=False)
    setup: TrainingSetup | None = field(default=None, repr=False, compare=False)

    @property
    def recommendable(self) -> bool:
        """Fits and changes nothing that harms training (pure half AdamW, plain SGD)."""
        return self.fits and not any(c.startswith("!") for c in self.caveats)

    def to_dict(self) -> dict[str, Any]:
        step = None if self.step is None else {
            "compute_s": self.step.compute_s, "collectives_s": self.step.collectives_s,
            "host_link_s": self.step.host_link_s, "host_optimizer_s": self.step.host_optimizer_s,
            "seconds": self.step.seconds, "tokens": self.step.tokens}
        return {"name": self.name, "strategy": self.strategy, "method": self.method, "precision": self.precision,
                "optimizer": self.optimizer, "checkpointing": self.checkpointing, "offload": self.offload,
                "fits": self.fits, "reason": self.reason, "per_gpu_peak_bytes": self.per_gpu_peak_bytes,
                "headroom_bytes": self.headroom_bytes, "host_ram_bytes": self.host_ram_bytes,
                "max_batch": self.max_batch, "max_seq": self.max_seq, "tokens_per_s": self.tokens_per_s,
                "config_files": list(self.config_files), "breaking_component": self.breaking_component,
                "caveats": [c.lstrip("!") for c in self.caveats], "dropped": self.dropped,
                "recommendable": self.recommendable, "step_time": step}


_STRATEGY_NAMES = {Strategy.SINGLE: "one GPU", Strategy.DDP: "DDP", Strategy.ZERO1: "ZeRO-1",
                   Strategy.ZERO2: "ZeRO-2", Strategy.FSDP: "FSDP full shard",
                   Strategy.FSDP_OFFLOAD: "FSDP full shard + CPU offload"}


def remedy_name(strategy: str, method: str, precision: str, optimizer: str, checkpointing: bool,
                lora_rank: int) -> str:
    """A readable name: ``FSDP full shard · LoRA r8 · fp16-mixed · adamw · checkpointing``."""
    s = "device_map='auto'" if strategy == DEVICE_MAP else _STRATEGY_NAMES[Strategy(strategy)]
    m = {"full": "full fine-tuning", "lora": f"LoRA r{lora_rank}", "qlora": f"QLoRA r{lora_rank}"}[method]
    parts = [s, m, precision, optimizer] + (["checkpointing"] if checkpointing else [])
    return " · ".join(parts)


def caveats(setup: TrainingSetup) -> tuple[str, ...]:
    """What a remedy changes besides memory; ``!`` marks what makes it a poor recommendation."""
    out = []
    if setup.method is Method.LORA:
        out.append("trains low-rank adapters, not every weight (Hu et al. 2021)")
    if setup.method is Method.QLORA:
        out.append("trains adapters over a 4-bit NF4 base (Dettmers et al. 2023)")
    if setup.precision in (Precision.FP16, Precision.BF16):
        out.append("!pure half precision, no fp32 master weights: small updates vanish (Micikevicius et al. 2018)")
    if setup.optimizer is Optimizer.SGD:
        out.append("!SGD with momentum instead of AdamW: different, usually worse, LLM fine-tuning")
    if setup.optimizer is Optimizer.ADAMW_8BIT:
        out.append("8-bit optimizer states (Dettmers et al. 2022)")
    if setup.checkpointing:
        out.append("recomputes each layer's forward in backward")
    return tuple(out)


def offload_of(strategy: str) -> str:
    return "cpu: parameters, gradients, optimizer state" if strategy == Strategy.FSDP_OFFLOAD.value else "none"


def config_files_for(strategy: str, method: str) -> tuple[str, ...]:
    """Files :func:`oomlab.configs.write_configs` writes that launch this kind of remedy."""
    from oomlab import configs

    return configs.files_for(strategy, method)


@dataclass(frozen=True)
class _Eval:
    per_gpu_peak_bytes: int
    headroom_bytes: int
    host_ram_bytes: int
    breaking: str
    gpu_fits: bool
    host_fits: bool
    result: BudgetResult
    placement: DeviceMapPlacement | None = None

    @property
    def fits(self) -> bool:
        return self.gpu_fits and self.host_fits


class _Evaluator:
    """Budgets setups (analytic), device_map placements fixed per remedy, with the host RAM limit."""

    def __init__(self, host_ram_bytes: int, outside_bytes: int | None) -> None:
        self.host_ram_bytes = host_ram_bytes
        self.outside_bytes = outside_bytes

    def __call__(self, setup: TrainingSetup, placement: DeviceMapPlacement | None = None,
                 device_map: bool = False) -> _Eval:
        if device_map:
            single = replace(setup, strategy=Strategy.SINGLE)
            result = budget.estimate_setup(single, self.outside_bytes)
            if placement is None:
                placement = place_device_map(setup, result)
                peak = placement.per_gpu_peak_bytes
            else:
                peak = _replace_peak(placement, result)
            host = budget.weight_bytes_total(setup)  # NB: one process loads the model once
            cap = setup.gpu.total_memory_bytes
            gpu_fits = peak <= cap and not placement.spilled
            breaking = result.breaking_component.value
            return _Eval(peak, cap - peak, host, breaking, gpu_fits, host <= self.host_ram_bytes, result, placement)
        result = budget.estimate_setup(setup, self.outside_bytes)
        return _Eval(result.per_gpu_peak_bytes, result.headroom_bytes, result.host_ram_bytes,
                     result.breaking_component.value, result.fits, result.host_ram_bytes <= self.host_ram_bytes,
                     result)


def _replace_peak(placement: DeviceMapPlacement, result: BudgetResult) -> int:
    """The peak of the most loaded GPU for a new single-GPU budget, with the placement kept."""
    comps = result.components
    _, sizes = _meta_module_sizes(placement.setup.model)
    total_w = sizes[""]
    layers_total = placement.setup.model.num_hidden_layers
    last = max((g for g in placement.gpus if g.modules), key=lambda g: "lm_head" in g.modules)
    best = 0
    for g in placement.gpus:
        if not g.modules:
            continue
        peak = 0
        for category, value in comps.items():
            if category is MemCategory.OUTSIDE_PYTORCH:
                peak += value
            elif category is MemCategory.LOGITS_LOSS:
                peak += value if g is last else 0
            elif category is MemCategory.ACTIVATIONS:
                peak += round(value * len(g.layers) / layers_total)
            else:
                peak += round(value * g.weight_bytes / total_w)
        best = max(best, peak)
    return best


def _reason(ev: _Eval, setup: TrainingSetup, host_ram_bytes: int) -> str:
    cap = setup.gpu.total_memory_bytes
    parts = []
    if ev.gpu_fits:
        parts.append(f"fits: {format_size(ev.per_gpu_peak_bytes)} per GPU of {format_size(cap)}, "
                     f"headroom {format_size(ev.headroom_bytes)}")
    elif ev.placement is not None and ev.placement.spilled:
        parts.append(f"device_map spills {len(ev.placement.spilled)} modules to the CPU "
                     f"(accelerate's offload hooks cannot train them)")
    else:
        comp = ev.result.components
        largest = max(comp, key=lambda k: comp[k])
        parts.append(f"GPU: needs {format_size(ev.per_gpu_peak_bytes)} of {format_size(cap)} "
                     f"(short by {format_size(-ev.headroom_bytes)}); largest: {largest.value} "
                     f"{format_size(comp[largest])} in the {ev.result.peak_phase.value} phase")
    if not ev.host_fits:
        parts.append(f"host RAM: needs {format_size(ev.host_ram_bytes)} of {format_size(host_ram_bytes)}")
    return "; ".join(parts)


def evaluate_remedy(setup: TrainingSetup, host_ram_bytes: int, *, device_map: bool = False,
                    assumptions: Assumptions = Assumptions(), outside_bytes: int | None = None,
                    evaluator: _Evaluator | None = None) -> Remedy:
    """Budget ``setup`` (or its device_map route), search its limits and estimate its throughput."""
    ev_fn = evaluator or _Evaluator(host_ram_bytes, outside_bytes)
    ev = ev_fn(setup, device_map=device_map)
    placement = ev.placement

    def fits_batch(b: int) -> bool:
        return ev_fn(replace(setup, batch=b), placement, device_map).fits

    def fits_seq(s: int) -> bool:
        return ev_fn(replace(setup, batch=1, seq=s), placement, device_map).fits

    max_batch = largest_true(fits_batch, 1, MAX_BATCH_SEARCH)
    max_seq = largest_true(fits_seq, 1, setup.model.max_position_embeddings)
    tps, step = None, None
    if ev.fits:
        b = min(max_batch or setup.batch, assumptions.throughput_batch_cap)
        step = step_time(replace(setup, batch=b), assumptions, device_map)
        tps = step.tokens_per_s
    strategy = DEVICE_MAP if device_map else setup.strategy.value
    return Remedy(
        name=remedy_name(strategy, setup.method.value, setup.precision.value, setup.optimizer.value,
                         setup.checkpointing, setup.lora_rank),
        strategy=strategy, method=setup.method.value, precision=setup.precision.value,
        optimizer=setup.optimizer.value, checkpointing=setup.checkpointing, offload=offload_of(strategy),
        fits=ev.fits, reason=_reason(ev, setup, host_ram_bytes), per_gpu_peak_bytes=ev.per_gpu_peak_bytes,
        headroom_bytes=ev.headroom_bytes, host_ram_bytes=ev.host_ram_bytes, max_batch=max_batch, max_seq=max_seq,
        tokens_per_s=tps, config_files=config_files_for(strategy, setup.method.value) if ev.fits else (),
        breaking_component=ev.breaking, caveats=caveats(setup), step=step, setup=setup,
    )


def dropped_remedy(strategy: str, method: str, precision: str, optimizer: str, checkpointing: bool,
                   lora_rank: int, reason: str) -> Remedy:
    return Remedy(name=remedy_name(strategy, method, precision, optimizer, checkpointing, lora_rank),
                  strategy=strategy, method=method, precision=precision, optimizer=optimizer,
                  checkpointing=checkpointing, offload=offload_of(strategy), fits=False, reason=reason,
                  per_gpu_peak_bytes=None, headroom_bytes=None, host_ram_bytes=None, max_batch=None, max_seq=None,
                  tokens_per_s=None, dropped=True)


# --------------------------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class KnobChange:
    """One row of the knob table: the user's configuration with one or two knobs changed."""

    changes: tuple[tuple[str, str], ...]  # (knob, new value)
    per_gpu_peak_bytes: int | None
    host_ram_bytes: int | None
    fits: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"changes": [list(c) for c in self.changes], "per_gpu_peak_bytes": self.per_gpu_peak_bytes,
                "host_ram_bytes": self.host_ram_bytes, "fits": self.fits, "reason": self.reason}


@dataclass(frozen=True)
class Plan:
    """Every remedy for one model on one set of GPUs, ranked."""

    model: str
    gpu: str
    gpus: int
    nodes: int
    seq: int
    host_ram_bytes: int
    seed: Remedy  # the user's configuration
    remedies: tuple[Remedy, ...]  # ranked: fitting by tokens/s, then the rest by per-GPU peak
    dropped: tuple[Remedy, ...]  # what the hardware cannot run, with the reason
    knobs: tuple[KnobChange, ...]  # single changes, then the minimal pairs that fit
    device_map: DeviceMapPlacement | None  # the placement of the best device_map remedy (or the seed's)
    assumptions: tuple[str, ...]
    seq_note: str  # how the sequence searches are capped
    lora_rank: int = 8

    @property
    def fitting(self) -> tuple[Remedy, ...]:
        return tuple(r for r in self.remedies if r.fits)

    @property
    def recommended(self) -> Remedy | None:
        """The fastest remedy that fits without a harmful caveat and that oomlab writes launch files for."""
        return next((r for r in self.remedies if r.recommendable and r.config_files), None)

    def to_dict(self) -> dict[str, Any]:
        rec = self.recommended
        return {"model": self.model, "gpu": self.gpu, "gpus": self.gpus, "nodes": self.nodes, "seq": self.seq,
                "host_ram_bytes": self.host_ram_bytes, "seed": self.seed.to_dict(),
                "remedies": [r.to_dict() for r in self.remedies], "dropped": [r.to_dict() for r in self.dropped],
                "knobs": [k.to_dict() for k in self.knobs],
                "device_map": None if self.device_map is None else self.device_map.to_dict(),
                "recommended": None if rec is None else rec.to_dict(), "assumptions": list(self.assumptions),
                "seq_note": self.seq_note, "lora_rank": self.lora_rank}


def seed_setup(model: str | ModelSpec, gpu: str | GPUSpec, gpus: int, nodes: int = 1, *, seq: int = 2048,
               batch: int = 1, precision: str = "fp16-mixed", optimizer: str = "adamw", checkpointing: bool = False,
               attention: str = "sdpa", lora_rank: int = 8) -> TrainingSetup:
    """The seed's configuration: a full replica per GPU (``model.to('cuda')`` in each process), full fine-tuning."""
    return make_setup(model=model, gpu=gpu, gpus=gpus, nodes=nodes,
                      strategy="ddp" if gpus * nodes > 1 else "single", method="full", precision=precision,
                      optimizer=optimizer, batch=batch, seq=seq, checkpointing=checkpointing, attention=attention,
                      lora_rank=lora_rank)


def _seed_reason(remedy: Remedy, setup: TrainingSetup) -> str:
    """The seed row's reason: the replica alone, as notebook 01 reproduced, then the step."""
    from oomlab.reproduce import seed_outside_bytes, unlimited_walk

    try:
        need = unlimited_walk(setup.model.name, "float16")[-1].reserved_bytes
    except Exception:  # noqa: BLE001 - a model given by path: state the step only
        return remedy.reason
    usable = setup.gpu.total_memory_bytes - seed_outside_bytes()
    where = "fails before training: " if need > usable else ""
    return (f"{where}model.to('cuda') of the fp16 replica reserves {format_size(need)} on each GPU, "
            f"{format_size(usable)} usable (notebook 01); the training step: {remedy.reason}")


KNOB_VALUES: dict[str, tuple[Any, ...]] = {
    "strategy": ("single", "zero1", "zero2", "fsdp", "fsdp-offload", DEVICE_MAP),
    "method": ("lora", "qlora"),
    "precision": ("fp32", "fp16", "bf16-mixed", "bf16"),
    "optimizer": ("adamw-8bit", "sgd"),
    "checkpointing": (True,),
    "seq": (1024, 512),
}


def _knob_setup(base: TrainingSetup, changes: Sequence[tuple[str, Any]]) -> tuple[TrainingSetup, bool]:
    kwargs: dict[str, Any] = {"model": base.model, "gpu": base.gpu, "gpus": base.gpus, "nodes": base.nodes,
                              "strategy": base.strategy, "method": base.method, "precision": base.precision,
                              "optimizer": base.optimizer, "batch": base.batch, "seq": base.seq,
                              "checkpointing": base.checkpointing, "attention": base.attention,
                              "lora_rank": base.lora_rank, "lora_alpha": base.lora_alpha,
                              "lora_targets": base.lora_targets}
    device_map = False
    for knob, value in changes:
        if knob == "strategy" and value == DEVICE_MAP:
            device_map, value = True, "single"
        kwargs[knob] = value
    return make_setup(**kwargs), device_map


def knob_table(base: TrainingSetup, host_ram_bytes: int, outside_bytes: int | None = None,
               evaluator: _Evaluator | None = None) -> tuple[KnobChange, ...]:
    """Single-knob changes of ``base``, then every pair that fits although neither of its changes fits alone."""
    ev_fn = evaluator or _Evaluator(host_ram_bytes, outside_bytes)
    singles = [(k, v) for k, values in KNOB_VALUES.items() for v in values if _current(base, k) != v]

    def row(changes: tuple[tuple[str, Any], ...]) -> KnobChange:
        shown = tuple((k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in changes)
        try:
            setup, device_map = _knob_setup(base, changes)
        except InvalidValueError as err:
            return KnobChange(shown, None, None, False, f"dropped: {err}")
        ev = ev_fn(setup, device_map=device_map)
        return KnobChange(shown, ev.per_gpu_peak_bytes, ev.host_ram_bytes, ev.fits, _reason(ev, setup, host_ram_bytes))

    rows = [row(((k, v),)) for k, v in singles]
    fitting_single = {r.changes[0] for r in rows if r.fits}
    pairs = []
    for (k1, v1), (k2, v2) in itertools.combinations(singles, 2):
        if k1 == k2:
            continue
        shown = ((k1, str(v1).lower() if isinstance(v1, bool) else str(v1)),
                 (k2, str(v2).lower() if isinstance(v2, bool) else str(v2)))
        if shown[0] in fitting_single or shown[1] in fitting_single:
            continue  # not minimal: one change alone already fits
        r = row(((k1, v1), (k2, v2)))
        if r.fits:
            pairs.append(r)
    pairs.sort(key=lambda r: r.per_gpu_peak_bytes or 0)
    return tuple(rows + pairs)


def _current(setup: TrainingSetup, knob: str) -> Any:
    value = getattr(setup, knob)
    return getattr(value, "value", value)


def _rank_key(r: Remedy) -> tuple:
    """Fitting first, sound before caveated, faster first (to 3 significant figures: the estimate is no finer);
    ties to plain AdamW (8-bit states save little on adapters and add a dependency), then the smaller peak."""
    tps = float(f"{r.tokens_per_s:.3g}") if r.tokens_per_s else 0.0
    return (not r.fits, not r.recommendable, -tps, r.optimizer != Optimizer.ADAMW.value, r.per_gpu_peak_bytes or 0)


def make_plan(
    model: str | ModelSpec = "llama-13b",
    gpu: str | GPUSpec = "t4",
    gpus: int = 4,
    nodes: int = 1,
    host_ram: str | int = DEFAULT_HOST_RAM,
    seq: int = 2048,
    *,
    batch: int = 1,
    precision: str = "fp16-mixed",
    optimizer: str = "adamw",
    checkpointing: bool = False,
    attention: str = "sdpa",
    lora_rank: int = 8,
    assumptions: Assumptions = Assumptions(),
    outside_bytes: int | None = None,
) -> Plan:
    """Every remedy for training ``model`` on ``nodes`` × ``gpus`` × ``gpu``, budgeted and ranked.

    The user's configuration (``seed_setup``: a full replica per GPU, full fine-tuning with the given precision,
    optimizer, micro-batch and checkpointing) is the seed row and the knob table's baseline.
    """
    host_ram_bytes = parse_size(host_ram)
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    gpu_spec = gpu if isinstance(gpu, GPUSpec) else load_gpu(gpu)
    if seq > spec.max_position_embeddings:
        raise InvalidValueError(f"invalid seq {seq}; {spec.name} has max_position_embeddings "
                                f"{spec.max_position_embeddings}: use a sequence length up to that")
    base = seed_setup(spec, gpu_spec, gpus, nodes, seq=seq, batch=batch, precision=precision, optimizer=optimizer,
                      checkpointing=checkpointing, attention=attention, lora_rank=lora_rank)
    evaluator = _Evaluator(host_ram_bytes, outside_bytes)
    seed = evaluate_remedy(base, host_ram_bytes, assumptions=assumptions, evaluator=evaluator)
    seed = replace(seed, reason=_seed_reason(seed, base), name="the seed's configuration: " + seed.name)
    remedies, dropped = [], []
    grid = itertools.product([*(s.value for s in Strategy), DEVICE_MAP], [m.value for m in Method],
                             [p.value for p in Precision], [o.value for o in Optimizer], (False, True))
    for strategy, method, prec, opt, ckpt in grid:
        device_map = strategy == DEVICE_MAP
        if device_map and gpus * nodes > gpus:
            continue  # device_map places within one node
        try:
            setup = make_setup(model=spec, gpu=gpu_spec, gpus=gpus, nodes=nodes,
                               strategy="single" if device_map else strategy, method=method, precision=prec,
                               optimizer=opt, batch=batch, seq=seq, checkpointing=ckpt, attention=attention,
                               lora_rank=lora_rank)
        except InvalidValueError as err:
            dropped.append(dropped_remedy(strategy, method, prec, opt, ckpt, lora_rank, f"dropped: {err}"))
            continue
        remedies.append(evaluate_remedy(setup, host_ram_bytes, device_map=device_map, assumptions=assumptions,
                                        evaluator=evaluator))
    remedies.sort(key=_rank_key)
    knobs = knob_table(base, host_ram_bytes, evaluator=evaluator)
    dm = next((r for r in remedies if r.strategy == DEVICE_MAP and r.recommendable), None)
    dm = dm or next((r for r in remedies if r.strategy == DEVICE_MAP), None)
    placement = None if dm is None or dm.setup is None else place_device_map(dm.setup)
    seq_note = (f"sequence searches stop at {spec.name}'s max_position_embeddings = {spec.max_position_embeddings} "
                f"(RoPE was trained to that length); micro-batch searches at {MAX_BATCH_SEARCH}")
    return Plan(model=spec.name, gpu=gpu_spec.name, gpus=gpus, nodes=nodes, seq=seq, host_ram_bytes=host_ram_bytes,
                seed=seed, remedies=tuple(remedies), dropped=tuple(dropped), knobs=knobs, device_map=placement,
                assumptions=tuple(describe_assumptions(gpu_spec, assumptions))
                + (f"host RAM {format_size(host_ram_bytes)} per node (assumption unless given)",),
                seq_note=seq_note, lora_rank=lora_rank)


def distinct_top(plan: Plan, n: int = 3) -> tuple[Remedy, ...]:
    """The best recommendable remedy of each (strategy, method), best first, ``n`` of them."""
    seen, out = set(), []
    for r in plan.remedies:
        if r.recommendable and (r.strategy, r.method) not in seen and r.config_files:
            seen.add((r.strategy, r.method))
            out.append(r)
    return tuple(out[:n])


# -------------------------------------------------------------------------------------------------- fit map


@dataclass(frozen=True)
class FitMap:
    """Per-GPU peak of one remedy over micro-batch × sequence length."""

    name: str
    batches: tuple[int, ...]
    seqs: tuple[int, ...]
    peak_bytes: tuple[tuple[int, ...], ...]  # [batch index][seq index]
    fits: tuple[tuple[bool, ...], ...]
    capacity_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "batches": list(self.batches), "seqs": list(self.seqs),
                "peak_bytes": [list(r) for r in self.peak_bytes], "fits": [list(r) for r in self.fits],
                "capacity_bytes": self.capacity_bytes}


def fit_map(remedy: Remedy, host_ram_bytes: int, batches: Iterable[int] = (1, 2, 4, 8, 16, 32),
            seqs: Iterable[int] | None = None, outside_bytes: int | None = None) -> FitMap:
    """The remedy's per-GPU peak and fit at every (micro-batch, sequence length) of the grid."""
    if remedy.setup is None:
        raise InvalidValueError(f"remedy {remedy.name!r} was dropped ({remedy.reason}); it has no fit map")
    setup = remedy.setup
    if seqs is None:
        top = setup.model.max_position_embeddings
        seqs = tuple(s for s in (128, 256, 512, 1024, 2048, 4096, 8192) if s <= top)
    batches, seqs = tuple(batches), tuple(seqs)
    ev_fn = _Evaluator(host_ram_bytes, outside_bytes)
    device_map = remedy.strategy == DEVICE_MAP
    placement = ev_fn(setup, device_map=device_map).placement
    peaks, fits = [], []
    for b in batches:
        evs = [ev_fn(replace(setup, batch=b, seq=s), placement, device_map) for s in seqs]
        peaks.append(tuple(e.per_gpu_peak_bytes for e in evs))
        fits.append(tuple(e.fits for e in evs))
    return FitMap(remedy.name, batches, seqs, tuple(peaks), tuple(fits), setup.gpu.total_memory_bytes)


# ------------------------------------------------------------------------------------------------ display


def _size(value: int | None) -> str:
    if value is None:
        return "-"
    return format_size(value) if value >= 0 else "-" + format_size(-value)


def _tps(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


REMEDY_HEADERS = ("#", "remedy", "fits", "per-GPU peak", "headroom", "host RAM", "max micro-batch",
                  "max seq (batch 1)", "tokens/s", "why")


def remedy_rows(plan: Plan, top: int = 15) -> list[tuple[Any, ...]]:
    """The seed row, then the ``top`` ranked remedies, as display rows."""
    rows = []
    for i, r in enumerate([plan.seed, *plan.remedies[:top]]):
        rows.append(("seed" if i == 0 else i, r.name, "yes" if r.fits else "no", _size(r.per_gpu_peak_bytes),
                     _size(r.headroom_bytes), _size(r.host_ram_bytes), r.max_batch or "-", r.max_seq or "-",
                     _tps(r.tokens_per_s), r.reason))
    return rows


KNOB_HEADERS = ("knob", "value", "per-GPU peak", "host RAM", "fits", "why")


def knob_rows(plan: Plan) -> list[tuple[Any, ...]]:
    return [(" + ".join(k for k, _ in row.changes), " + ".join(v for _, v in row.changes),
             _size(row.per_gpu_peak_bytes), _size(row.host_ram_bytes), "yes" if row.fits else "no", row.reason)
            for row in plan.knobs]


PLACEMENT_HEADERS = ("GPU", "decoder layers", "other modules", "fp16 weights", "training peak")


def placement_rows(placement: DeviceMapPlacement) -> list[tuple[Any, ...]]:
    rows = []
    for g in placement.gpus:
        layers = f"{g.layers[0]}–{g.layers[-1]} ({len(g.layers)})" if g.layers else "none"
        others = ", ".join(m for m in g.modules if _layer_index(m) is None) or "-"
        rows.append((g.device, layers, others, format_size(g.weight_bytes), format_size(g.peak_bytes)))
    return rows


def render_plan(plan: Plan, top: int = 15) -> str:
    """Plain text for the CLI: the seed, the ranked remedies, the knob table, the assumptions."""
    lines = [f"{plan.model} on {plan.nodes * plan.gpus} x {plan.gpu}, seq {plan.seq}, host RAM "
             f"{format_size(plan.host_ram_bytes)}: {len(plan.fitting)} of {len(plan.remedies)} remedies fit "
             f"({len(plan.dropped)} dropped)", ""]
    for row in remedy_rows(plan, top):
        idx, name, fits, peak, head, host, mb, ms, tps, why = row
        lines.append(f"{idx!s:>4}  {name}")
        lines.append(f"      fits {fits}; per-GPU peak {peak}; headroom {head}; host RAM {host}; max micro-batch "
                     f"{mb}; max seq {ms}; tokens/s {tps}")
        lines.append(f"      {why}")
    lines += ["", "the configuration that determines the result (the seed with one or two knobs changed):"]
    for knob, value, peak, _host, fits, why in knob_rows(plan):
        lines.append(f"  {knob:<26} {value:<26} {peak:>12}  {fits:<3}  {why}")
    rec = plan.recommended
    lines += ["", f"recommended: {rec.name if rec else 'none fits'}"]
    if rec and rec.config_files:
        lines.append("  launch files: " + ", ".join(rec.config_files) + " (python -m oomlab plan --write-configs)")
    lines += ["", "dropped:"] + [f"  {r.name}: {r.reason}" for r in plan.dropped[:5]]
    if len(plan.dropped) > 5:
        lines.append(f"  ... and {len(plan.dropped) - 5} more with the same reasons")
    lines += ["", "assumptions:"] + [f"  - {a}" for a in plan.assumptions] + [f"  - {plan.seq_note}"]
    return "\n".join(lines)


def summarize(plan: Plan) -> str:
    """The answer in plain words (Markdown), every figure from the plan."""
    seed, rec = plan.seed, plan.recommended
    gpu = load_gpu(plan.gpu)
    lines = [
        f"**The user's configuration does not fit.** {seed.reason}." if not seed.fits else
        f"**The user's configuration fits**: {seed.reason}.",
        f"Of {len(plan.remedies)} configurations budgeted ({len(plan.dropped)} more dropped because the "
        f"{gpu.display_name} or the libraries cannot run them, e.g. bf16), {len(plan.fitting)} fit on "
        f"{plan.nodes * plan.gpus} × {gpu.display_name} with {format_size(plan.host_ram_bytes)} of host RAM.",
    ]
    full = [r for r in plan.fitting if r.method == "full"]
    sound_full = [r for r in full if r.recommendable]
    if not sound_full:
        closest = min((r for r in plan.remedies if r.method == "full" and not any(
            c.startswith("!") for c in r.caveats)), key=lambda r: r.per_gpu_peak_bytes or 0, default=None)
        if closest is not None:
            lines.append(f"**Full fine-tuning does not fit** with fp32 master weights and AdamW: the closest, "
                         f"{closest.name}, {closest.reason}." + (
                             f" {len(full)} full fine-tuning variants fit only by dropping master weights or AdamW."
                             if full else ""))
    if rec is not None:
        lines.append(
            f"**Recommended: {rec.name}.** {rec.reason}; host RAM {format_size(rec.host_ram_bytes or 0)}; up to "
            f"micro-batch {rec.max_batch} at {plan.seq} tokens, or {rec.max_seq} tokens at micro-batch 1; about "
            f"{rec.tokens_per_s:,.0f} tokens/s under the stated assumptions. It "
            + "; it ".join(c.lstrip("!") for c in rec.caveats) + ".")
    knobs_fit = [k for k in plan.knobs if k.fits and len(k.changes) == 1]
    if knobs_fit:
        lines.append("Single changes to the user's configuration that make it fit: " + "; ".join(
            f"{k.changes[0][0]} → {k.changes[0][1]} ({_size(k.per_gpu_peak_bytes)} per GPU)" for k in knobs_fit)
            + ".")
    else:
        pairs = [k for k in plan.knobs if k.fits]
        lines.append("No single change to the user's configuration makes it fit; "
                     + (f"{len(pairs)} pairs do, e.g. " + "; ".join(
                         " + ".join(f"{a} → {b}" for a, b in k.changes) + f" ({_size(k.per_gpu_peak_bytes)})"
                         for k in pairs[:4]) + "." if pairs else "no pair does either."))
    dm = plan.device_map
    if dm is not None:
        lines.append(f"accelerate's `device_map=\"auto\"` splits the layers over {len(dm.gpus)} GPUs (most loaded: "
                     f"{format_size(dm.per_gpu_peak_bytes)}), but runs them one at a time: {len(dm.gpus)} GPUs "
                     f"train at one GPU's speed.")
    return "\n\n".join(lines)
