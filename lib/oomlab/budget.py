"""The analytic training-memory budget: bytes per GPU, component by component, phase by phase.

One optimizer step in steady state (the optimizer state already exists, gradients are set to ``None``
after each step) is split into three phases; the peak is the largest phase total, not a sum of maxima:

* ``forward``: weights, optimizer state, everything saved for backward, the logits and the loss;
* ``backward``: at its start (saved tensors still held, loss gradients appear) or at its end
  (every gradient held, activations freed), whichever is larger;
* ``optimizer``: weights, gradients, optimizer state and the optimizer's temporaries.

Sources of the terms (each in its own function below):
ZeRO (Rajbhandari et al. 2020, sec. 3.1): mixed-precision Adam keeps 16 bytes per parameter (2 half
weights + 2 half gradients + 12 fp32 master weights, momentum and variance), and stages 1/2/3 divide
the optimizer state / + gradients / + weights by the data-parallel degree.  QLoRA (Dettmers et al.
2023, sec. 3): NF4 with double quantization stores 4.127 bits per parameter.  Activations: what
transformers saves, see :mod:`oomlab.activations` (not Korthikanti et al. 2022's GPT formula).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import Any

from oomlab import activations as act
from oomlab.errors import UnknownNameError
from oomlab.specs import ModelSpec
from oomlab.training import DEFAULT_LORA_TARGETS, Method, Optimizer, Precision, Strategy, TrainingSetup, make_setup
from oomlab.units import MiB

NF4_DQ_BITS = 4.127  # QLoRA paper: NF4 weights, 64-blocks, fp8 second-level absmax (double quantization)
# bitsandbytes QuantState per quantized weight, besides the 4.127 bits/param (functional.py quantize_4bit, lines
# 936-950): its 16-value NF4 code (fp32), the double-quantization offset (fp32 scalar) and the second level's
# 256-value dynamic code (fp32); loaded through transformers each weight holds its own copies (measured on CPU)
NF4_STATE_TENSOR_BYTES = 4 * 16 + 4 + 4 * 256
ADAM8_BLOCK = 256  # bitsandbytes 8-bit optimizers: one fp32 absmax per block of 256 values
ADAM8_MIN_SIZE = 4096  # bitsandbytes keeps 32-bit state for tensors with fewer elements (min_8bit_size)
SOURCES = ("analytic", "traced")
ALLOCATOR_FRAGMENTATION = 0.05  # NB: reserved-but-unallocated share of transient memory (assumption)


class MemCategory(enum.Enum):
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


class Phase(enum.Enum):
    """The phases of a step whose maximum is the step's peak."""

    __hash__ = object.__hash__

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


ALLOCATED = (MemCategory.WEIGHTS, MemCategory.GRADIENTS, MemCategory.MASTER_WEIGHTS, MemCategory.OPTIMIZER_STATE,
             MemCategory.ACTIVATIONS, MemCategory.LOGITS_LOSS, MemCategory.WORKSPACE)


@dataclass(frozen=True)
class BudgetResult:
    """Per-GPU memory of one training step."""

    setup: TrainingSetup = field(repr=False)
    source: str  # "analytic" or "traced"
    peak_phase: Phase
    phases: Mapping[Phase, Mapping[MemCategory, int]]  # allocated components per phase
    components: Mapping[MemCategory, int]  # at the peak, with outside-PyTorch and allocator overhead
    host_ram_bytes: int
    capacity_bytes: int
    notes: tuple[str, ...] = ()

    @property
    def allocated_peak_bytes(self) -> int:
        """What ``torch.cuda.max_memory_allocated`` would report."""
        return sum(v for k, v in self.components.items() if k in ALLOCATED)

    @property
    def per_gpu_peak_bytes(self) -> int:
        """What nvidia-smi would show at the peak: allocated + allocator overhead + outside PyTorch."""
        return sum(self.components.values())

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
            "source": self.source,
            "model": s.model.name, "gpu": s.gpu.name, "gpus": s.gpus, "nodes": s.nodes,
            "strategy": s.strategy.value, "method": s.method.value, "precision": s.precision.value,
            "optimizer": s.optimizer.value, "batch": s.batch, "seq": s.seq, "checkpointing": s.checkpointing,
            "attention": s.attention.value, "lora_rank": s.lora_rank, "lora_targets": list(s.lora_targets),
            "per_gpu_peak_bytes": self.per_gpu_peak_bytes, "allocated_peak_bytes": self.allocated_peak_bytes,
            "peak_phase": self.peak_phase.value,
            "components": {k.value: v for k, v in self.components.items()},
            "phases": {p.value: {k.value: v for k, v in comps.items()} for p, comps in self.phases.items()},
            "host_ram_bytes": self.host_ram_bytes, "capacity_bytes": self.capacity_bytes,
            "fits": self.fits, "headroom_bytes": self.headroom_bytes, "notes": list(self.notes),
        }


# ------------------------------------------------------------------------------------- parameters


def lora_parameters(setup: TrainingSetup) -> int:
    """Adapter parameters: ``r * (in + out)`` per targeted projection per layer (Hu et al. 2021)."""
    return _lora_parameters(setup.model, setup.lora_rank, setup.lora_targets)


@lru_cache(maxsize=1024)
def _lora_parameters(spec: ModelSpec, rank: int, targets: tuple[str, ...]) -> int:
    h, i = spec.hidden_size, spec.intermediate_size
    qd = spec.num_attention_heads * spec.head_dim
    kvd = spec.num_key_value_heads * spec.head_dim
    dims = {"q_proj": (h, qd), "k_proj": (h, kvd), "v_proj": (h, kvd), "o_proj": (qd, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    per_layer = sum(rank * sum(dims[t]) for t in targets)
    return spec.num_hidden_layers * per_layer


def trainable_parameters(setup: TrainingSetup) -> int:
    return setup.model.num_parameters if setup.method is Method.FULL else lora_parameters(setup)


def matmul_parameters(setup: TrainingSetup) -> int:
    """Parameters of the decoder layers' projection matrices (what QLoRA quantizes)."""
    return setup.model.num_hidden_layers * act.layer_matmul_params(setup)


def _half_weights(setup: TrainingSetup) -> bool:
    """Are the (base) weights stored in half precision?"""
    if setup.precision in (Precision.FP16, Precision.BF16):
        return True
    mixed = setup.precision in (Precision.FP16_MIXED, Precision.BF16_MIXED)
    deepspeed = setup.strategy in (Strategy.ZERO1, Strategy.ZERO2)
    return mixed and (setup.method is not Method.FULL or deepspeed)


def weight_bytes_total(setup: TrainingSetup) -> int:
    """All parameters' bytes on one full replica (before sharding)."""
    n = setup.model.num_parameters
    adapters = 4 * lora_parameters(setup) if setup.method is not Method.FULL else 0  # fp32 adapters (peft)
    if setup.method is Method.QLORA:
        quantized = matmul_parameters(setup)
        packed = round(quantized * NF4_DQ_BITS / 8)
        return packed + 2 * (n - quantized) + adapters
    return (2 if _half_weights(setup) else 4) * n + adapters


def nf4_state_fixed_bytes(setup: TrainingSetup) -> int:
    """QLoRA: the per-weight constants of bitsandbytes' quantization states (codes and offset), zero otherwise.

    NB: 1,092 bytes per quantized matrix -- about 240 KiB for a 7B model, but 0.3 % of a tiny one.
    """
    if setup.method is not Method.QLORA:
        return 0
    return NF4_STATE_TENSOR_BYTES * 7 * setup.model.num_hidden_layers


def shards(setup: TrainingSetup) -> int:
    return setup.world_size


def weights_on_gpu(setup: TrainingSetup) -> int:
    """Persistent weights per GPU."""
    total = weight_bytes_total(setup) + nf4_state_fixed_bytes(setup)
    if setup.strategy is Strategy.FSDP:
        return -(-total // shards(setup))
    if setup.strategy is Strategy.FSDP_OFFLOAD:
        return 0
    return total


def grad_bytes_per_param(setup: TrainingSetup) -> int:
    """Gradients have their parameter's dtype (fp32 adapters, fp32 weights under autocast)."""
    if setup.method is Method.FULL and _half_weights(setup):
        return 2
    return 4


def gradients_on_gpu(setup: TrainingSetup) -> int:
    total = grad_bytes_per_param(setup) * trainable_parameters(setup)
    if setup.strategy in (Strategy.ZERO2, Strategy.FSDP):
        return -(-total // shards(setup))
    if setup.strategy is Strategy.FSDP_OFFLOAD:
        return 0
    return total


def master_weight_bytes(setup: TrainingSetup) -> int:
    """DeepSpeed-style mixed precision keeps fp32 master weights beside the half ones (ZeRO: 4 B/param)."""
    deepspeed = setup.strategy in (Strategy.ZERO1, Strategy.ZERO2)
    mixed = setup.precision in (Precision.FP16_MIXED, Precision.BF16_MIXED)
    if not (deepspeed and mixed and setup.method is Method.FULL):
        return 0
    return -(-4 * trainable_parameters(setup) // shards(setup))


def optimizer_state_bytes_total(setup: TrainingSetup) -> int:
    """Optimizer state of every trained parameter, unsharded."""
    p = trainable_parameters(setup)
    state_dtype = grad_bytes_per_param(setup) if setup.strategy not in (Strategy.ZERO1, Strategy.ZERO2) else 4
    if setup.optimizer is Optimizer.ADAMW:
        return 2 * state_dtype * p  # exp_avg, exp_avg_sq like the parameter
    if setup.optimizer is Optimizer.SGD:
        return state_dtype * p  # momentum_buffer
    # bitsandbytes AdamW8bit: two uint8 states + one fp32 absmax per 256 values each; small tensors 32-bit
    small = _small_tensor_parameters(setup)
    return round(2 * (p - small) * (1 + 4 / ADAM8_BLOCK)) + 8 * small


def _small_tensor_parameters(setup: TrainingSetup) -> int:
    """Trained parameters in tensors under bitsandbytes' min_8bit_size (kept in 32-bit state)."""
    spec = setup.model
    if setup.method is Method.FULL:
        return (2 * spec.num_hidden_layers + 1) * spec.hidden_size  # the RMSNorm weights
    small = 0
    h, i = spec.hidden_size, spec.intermediate_size
    qd = spec.num_attention_heads * spec.head_dim
    kvd = spec.num_key_value_heads * spec.head_dim
    dims = {"q_proj": (h, qd), "k_proj": (h, kvd), "v_proj": (h, kvd), "o_proj": (qd, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    for t in setup.lora_targets:
        for n in dims[t]:
            if setup.lora_rank * n < ADAM8_MIN_SIZE:
                small += setup.lora_rank * n
    return spec.num_hidden_layers * small


def optimizer_on_gpu(setup: TrainingSetup) -> int:
    total = optimizer_state_bytes_total(setup)
    if setup.strategy in (Strategy.ZERO1, Strategy.ZERO2, Strategy.FSDP):
        return -(-total // shards(setup))
    if setup.strategy is Strategy.FSDP_OFFLOAD:
        return 0
    return total


def optimizer_temp_bytes(setup: TrainingSetup) -> int:
    """Temporaries of the optimizer step.

    torch's foreach AdamW: ``exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)``, one state-sized
    temporary.  DeepSpeed ZeRO-1/2: the fp32 copy of this rank's gradient partition that its (fused)
    optimizer steps with (``single_grad_partition``, 4 bytes per parameter / data-parallel degree).
    NB: SGD and the 8-bit optimizer update in place; offloaded states step on the host.
    """
    if setup.strategy in (Strategy.ZERO1, Strategy.ZERO2):
        return -(-4 * trainable_parameters(setup) // shards(setup))
    if setup.optimizer is not Optimizer.ADAMW or setup.strategy is Strategy.FSDP_OFFLOAD:
        return 0
    return optimizer_on_gpu(setup) // 2


# ------------------------------------------------------------------------------------ workspaces


def ddp_bucket_bytes(setup: TrainingSetup) -> int:
    """DDP's reducer keeps flat gradient buckets as large as the gradients (gradient_as_bucket_view=False)."""
    if setup.strategy is not Strategy.DDP or setup.world_size == 1:
        return 0
    return grad_bytes_per_param(setup) * trainable_parameters(setup)


def _param_bytes(setup: TrainingSetup) -> int:
    return 2 if _half_weights(setup) else 4


def fsdp_root_bytes(setup: TrainingSetup) -> int:
    """FSDP2 keeps the root module's parameters (embedding, final norm, LM head) unsharded all step."""
    if setup.strategy not in (Strategy.FSDP, Strategy.FSDP_OFFLOAD):
        return 0
    spec = setup.model
    head = 0 if spec.tie_word_embeddings else spec.vocab_size * spec.hidden_size
    return _param_bytes(setup) * (spec.vocab_size * spec.hidden_size + head + spec.hidden_size)


def fsdp_layer_bytes(setup: TrainingSetup) -> int:
    """One decoder layer's unsharded parameters (the size of each all-gather / reduce-scatter buffer)."""
    if setup.strategy not in (Strategy.FSDP, Strategy.FSDP_OFFLOAD):
        return 0
    spec = setup.model
    return _param_bytes(setup) * (act.layer_matmul_params(setup) + 2 * spec.hidden_size)


def fsdp_gather_bytes(setup: TrainingSetup, where: str) -> int:
    """FSDP2 workspace: the unsharded root plus per-layer all-gather / reduce-scatter buffers.

    ``where``: "forward" (trained layers: the current all-gather and the next one prefetched; frozen
    LoRA bases: one), "backward-start" (the last layer gathered again) or "backward" (a layer's backward
    with trained weights: it unsharded, the next prefetched, its reduce-scatter buffer and its unsharded
    gradients).  NB: buffer counts read off FSDP2 traces (FSDPMemTracker); see tests/test_agreement.py.
    """
    layer = fsdp_layer_bytes(setup)
    if not layer:
        return 0
    trained = setup.method is Method.FULL
    # NB: at the end of forward and the start of backward the traces hold two layer buffers (the last
    # gathered and the next) except for frozen, non-checkpointed layers, where only the last remains.
    held = 2 if trained or setup.checkpointing else 1
    if where == "forward":
        return fsdp_root_bytes(setup) + held * layer
    if where == "backward-start" or not trained:
        return fsdp_root_bytes(setup) + (held if not trained else 1) * layer
    grads = layer * grad_bytes_per_param(setup) // _param_bytes(setup)
    return fsdp_root_bytes(setup) + 3 * layer + grads


def logits_bytes(setup: TrainingSetup) -> dict[str, int]:
    """The (tokens x vocab) tensors of the LM head and the loss (transformers' ForCausalLMLoss)."""
    tv = act.tokens(setup) * setup.model.vocab_size
    c = 4 if setup.precision is Precision.FP32 else 2
    return {
        "logits": c * tv,  # lm_head output, held by the model output
        "fp32 copy": 0 if c == 4 else 4 * tv,  # logits.float() inside the loss
        "log_softmax": 4 * tv,  # saved by cross_entropy for backward
        "grad": 4 * tv,  # d loss / d log_softmax and d log_softmax / d logits, one at a time
    }


# ---------------------------------------------------------------------------------------- phases


_STATES: dict[tuple, tuple[int, ...]] = {}


def _model_state_terms(setup: TrainingSetup) -> tuple[int, ...]:
    """Terms that do not depend on micro-batch or length, memoised (searches vary only those)."""
    key = (setup.model, setup.method._value_, setup.precision._value_, setup.strategy._value_,
           setup.optimizer._value_, setup.world_size, setup.lora_rank, setup.lora_targets, setup.checkpointing)
    terms = _STATES.get(key)
    if terms is None:
        terms = _STATES[key] = (
            weights_on_gpu(setup), gradients_on_gpu(setup), master_weight_bytes(setup), optimizer_on_gpu(setup),
            ddp_bucket_bytes(setup), fsdp_gather_bytes(setup, "forward"), fsdp_gather_bytes(setup, "backward"),
            fsdp_gather_bytes(setup, "backward-start"), optimizer_temp_bytes(setup),
        )
    return terms


def _phases(setup: TrainingSetup) -> dict[Phase, dict[MemCategory, int]]:
    w, g, m, o, buckets, gather_fw, gather, gather_start, opt_temp = _model_state_terms(setup)
    saved = act.saved_activation_bytes(setup)
    loss_saved = act.tokens(setup) * (4 * setup.model.vocab_size + act.INDEX)
    layer_acts = saved - loss_saved
    copies = act.autocast_copy_bytes(setup)
    # autocast's cache holds every weight's half copy until the outermost autocast exits (end of
    # forward), checkpointed or not
    cache = act.autocast_cache_bytes(setup)
    lg = logits_bytes(setup)
    states = {MemCategory.WEIGHTS: w, MemCategory.MASTER_WEIGHTS: m, MemCategory.OPTIMIZER_STATE: o}
    forward = {
        **states,
        MemCategory.ACTIVATIONS: layer_acts,
        MemCategory.LOGITS_LOSS: lg["logits"] + lg["fp32 copy"] + lg["log_softmax"],
        MemCategory.WORKSPACE: max(copies, cache) + buckets + gather_fw,
    }
    candidates = [
        {  # start: the loss gradients, every saved tensor still held
            **states,
            MemCategory.ACTIVATIONS: layer_acts,
            MemCategory.LOGITS_LOSS: lg["log_softmax"] + 2 * lg["grad"],
            MemCategory.WORKSPACE: copies + buckets + gather_start,
        },
        {  # a trained layer's backward under FSDP: its buffers, activations not yet freed
            **states,
            MemCategory.ACTIVATIONS: layer_acts,
            MemCategory.WORKSPACE: copies + buckets + gather,
        },
        {  # end: every gradient held, activations freed
            **states, MemCategory.GRADIENTS: g, MemCategory.WORKSPACE: buckets + gather,
        },
    ]
    if setup.checkpointing:
        candidates += _recompute_candidates(setup, states, layer_acts, g, buckets + gather)
    backward = max(candidates, key=lambda d: sum(d.values()))
    optimizer = {
        **states, MemCategory.GRADIENTS: g, MemCategory.WORKSPACE: buckets + opt_temp,
    }
    return {Phase.FORWARD: forward, Phase.BACKWARD: backward, Phase.OPTIMIZER: optimizer}


def recompute_gradient_bytes(setup: TrainingSetup) -> int:
    """Gradient temporaries inside a recomputed layer's backward (measured at small scale).

    The gradients of the SwiGLU product, the SiLU output and up (``3 i``) and the incoming hidden-state
    gradient (``h``), in the compute dtype, per token.
    """
    c = 4 if setup.precision is Precision.FP32 else 2
    spec = setup.model
    return act.tokens(setup) * c * (3 * spec.intermediate_size + spec.hidden_size)


def _recompute_candidates(setup: TrainingSetup, states: dict[MemCategory, int], layer_acts: int, g: int,
                          workspace: int) -> list[dict[MemCategory, int]]:
    """Backward with checkpointing peaks inside a recomputed layer: its whole inventory again, its
    gradient temporaries, and the gradients produced so far.

    Checked at the top layer: every layer input still held, few gradients yet.
    """
    layer = act.layer_activation_bytes(setup)
    fixed = act.layer_fixed_bytes(setup) + recompute_gradient_bytes(setup) + workspace
    # by then the head, the final norm and the loss have run their backward: only the layers' inputs remain
    inputs = setup.model.num_hidden_layers * act.checkpoint_layer_bytes(setup) + act.rope_bytes(setup)
    trained = g if setup.method is not Method.FULL else 0  # LoRA: adapter gradients (small) held throughout
    # NB: full fine-tuning's gradients grow as the layers go by while their inputs are freed; the
    # end-of-backward candidate covers the bottom of that range.
    return [{**states, MemCategory.ACTIVATIONS: inputs + layer, MemCategory.GRADIENTS: trained,
             MemCategory.WORKSPACE: fixed}]


def host_ram_bytes(setup: TrainingSetup) -> int:
    """Host memory per node: offloaded states, plus one copy of the weights per process while loading.

    NB: loading assumes each process materialises its replica once on the host (transformers'
    from_pretrained); FSDP/ZeRO-3 loaders that load on rank 0 only need less.
    """
    per_process_load = weight_bytes_total(setup)
    offloaded = 0
    if setup.strategy is Strategy.FSDP_OFFLOAD:
        p = trainable_parameters(setup)
        offloaded = (weight_bytes_total(setup) + grad_bytes_per_param(setup) * p
                     + optimizer_state_bytes_total(setup)) // setup.nodes
    return setup.gpus * per_process_load + offloaded


def estimate_setup(setup: TrainingSetup, outside_bytes: int | None = None) -> BudgetResult:
    """The analytic budget of one validated setup."""
    from oomlab.reproduce import seed_outside_bytes

    phases = _phases(setup)
    peak_phase = max(phases, key=lambda p: sum(phases[p].values()))
    at_peak = {k: v for k, v in phases[peak_phase].items() if v}
    persistent = weights_on_gpu(setup) + optimizer_on_gpu(setup) + master_weight_bytes(setup)
    transient = sum(at_peak.values()) - persistent
    outside = seed_outside_bytes() if outside_bytes is None else outside_bytes
    components = dict(at_peak)
    components[MemCategory.ALLOCATOR_OVERHEAD] = round(ALLOCATOR_FRAGMENTATION * transient) + 2 * MiB
    components[MemCategory.OUTSIDE_PYTORCH] = outside
    notes = (
        "steady-state step: optimizer state exists from the previous step; gradients set to None after it",
        f"outside PyTorch: {outside} bytes (CUDA context; default derived from the seed's T4 message)",
        f"allocator overhead: {ALLOCATOR_FRAGMENTATION:.0%} of transient bytes + 2 MiB (assumption)",
    )
    return BudgetResult(
        setup=setup, source="analytic", peak_phase=peak_phase,
        phases=MappingProxyType({p: MappingProxyType(c) for p, c in phases.items()}),
        components=MappingProxyType(components), host_ram_bytes=host_ram_bytes(setup),
        capacity_bytes=setup.gpu.total_memory_bytes, notes=notes,
    )


def estimate(
    model: str = "llama-13b",
    gpu: str = "t4",
    gpus: int = 1,
    nodes: int = 1,
    strategy: str = "single",
    method: str = "full",
    precision: str = "fp16-mixed",
    optimizer: str = "adamw",
    batch: int = 1,
    seq: int = 2048,
    checkpointing: bool = False,
    attention: str = "sdpa",
    lora_rank: int = 8,
    lora_alpha: int = 16,
    lora_targets: Sequence[str] | str = DEFAULT_LORA_TARGETS,
    source: str = "analytic",
    outside_bytes: int | None = None,
) -> BudgetResult:
    """Per-GPU memory of one training step of ``model`` on ``gpus`` × ``gpu`` (see :func:`make_setup`)."""
    if source not in SOURCES:
        raise UnknownNameError("source", source, SOURCES)
    setup = make_setup(model=model, gpu=gpu, gpus=gpus, nodes=nodes, strategy=strategy, method=method,
                       precision=precision, optimizer=optimizer, batch=batch, seq=seq, checkpointing=checkpointing,
                       attention=attention, lora_rank=lora_rank, lora_alpha=lora_alpha, lora_targets=lora_targets)
    if source == "analytic":
        return estimate_setup(setup, outside_bytes)
    from oomlab.trace import traced_budget

    return traced_budget(setup, outside_bytes)


def render_budget(result: BudgetResult) -> str:
    """A plain-text table of the budget, torch-style sizes."""
    from oomlab.units import format_size

    s = result.setup
    lines = [
        f"{s.model.name} on {s.world_size} x {s.gpu.name} ({format_size(result.capacity_bytes)} each): "
        f"{s.strategy.value}, {s.method.value}, {s.precision.value}, {s.optimizer.value}, micro-batch {s.batch}, "
        f"seq {s.seq}, checkpointing {'on' if s.checkpointing else 'off'}, {s.attention.value} "
        f"[{result.source}]",
        f"peak in the {result.peak_phase.value} phase:",
    ]
    for category, value in sorted(result.components.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {category.value:<22} {format_size(value):>12}")
    lines += [
        f"  {'allocated peak':<22} {format_size(result.allocated_peak_bytes):>12}  (torch.cuda.max_memory_allocated)",
        f"  {'per-GPU peak':<22} {format_size(result.per_gpu_peak_bytes):>12}  (nvidia-smi)",
        f"  {'capacity':<22} {format_size(result.capacity_bytes):>12}",
        ("fits, headroom " if result.fits else "DOES NOT FIT, short by ")
        + format_size(abs(result.headroom_bytes)),
        f"host RAM needed: {format_size(result.host_ram_bytes)}",
    ]
    return "\n".join(lines)
