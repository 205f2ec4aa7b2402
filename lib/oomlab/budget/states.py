"""The model states of a training step as PyTorch keeps them: parameters, gradients, optimizer state and the
optimizer's temporaries -- their totals over the whole model, and (through :mod:`.sharding`) their per-GPU share.
DeepSpeed's (its fp32 master partition, its flat and per-parameter partitions) are :mod:`.deepspeed`'s.

ZeRO (Rajbhandari et al. 2020, sec. 3.1): mixed-precision Adam keeps 16 bytes per parameter (2 half weights +
2 half gradients + 12 fp32 master weights, momentum and variance).  QLoRA (Dettmers et al. 2023, sec. 3): NF4 with
double quantization stores 4.127 bits per parameter.  LoRA (Hu et al. 2021): ``r (in + out)`` adapter parameters
per targeted projection.
"""

from __future__ import annotations

from functools import lru_cache

from oomlab.budget import sharding
from oomlab.budget.result import MemCategory
from oomlab.budget.sharding import Share
from oomlab.core.choices import FSDP1_STRATEGIES, BaseDtype, Method, Optimizer, Precision, Strategy
from oomlab.core.layouts import Family
from oomlab.core.models import ModelSpec
from oomlab.core.setup import TrainingSetup
from oomlab.core.versions import Fact, applies

NF4_DQ_BITS = 4.127  # QLoRA paper: NF4 weights, 64-blocks, fp8 second-level absmax (double quantization)
# bitsandbytes QuantState per quantized weight, besides the 4.127 bits/param (functional.py quantize_4bit, lines
# 936-950): its 16-value NF4 code (fp32), the double-quantization offset (fp32 scalar) and the second level's
# 256-value dynamic code (fp32); loaded through transformers each weight holds its own copies (measured on CPU)
NF4_STATE_TENSOR_BYTES = 4 * 16 + 4 + 4 * 256
ADAM8_BLOCK = 256  # bitsandbytes 8-bit optimizers: one fp32 absmax per block of 256 values
ADAM8_MIN_SIZE = 4096  # bitsandbytes keeps 32-bit state for tensors with fewer elements (min_8bit_size)
MIXED = (Precision.FP16_MIXED, Precision.BF16_MIXED)


# ------------------------------------------------------------------------------------- parameters


def lora_parameters(setup: TrainingSetup) -> int:
    """Adapter parameters: ``r * (in + out)`` per targeted projection per layer (Hu et al. 2021)."""
    return _lora_parameters(setup.model, setup.lora_rank, setup.lora_targets)


@lru_cache(maxsize=1024)
def _lora_parameters(spec: ModelSpec, rank: int, targets: tuple[str, ...]) -> int:
    return spec.lora_parameters(rank, targets)  # every layer's targeted nn.Linear modules (Qwen-MoE's differ)


def trainable_parameters(setup: TrainingSetup) -> int:
    return setup.model.num_parameters if setup.method is Method.FULL else lora_parameters(setup)


def has_experts(setup: TrainingSetup) -> bool:
    """Is the model a mixture of experts (some layer with experts)?"""
    return _has_experts(setup.model)


@lru_cache(maxsize=256)
def _has_experts(spec: ModelSpec) -> bool:
    return any(layout.experts for layout in spec.layer_layouts)


# families whose experts are 3-D parameters in every transformers release (bitsandbytes never quantizes them):
# GraniteMoeParallelExperts.weight (num_experts x out x in, models/granitemoe/modeling_granitemoe.py) and gpt-oss's
# GptOssExperts.gate_up_proj / down_proj (models/gpt_oss/modeling_gpt_oss.py) -- not nn.Linear in 4.x either
EXPERTS_ALWAYS_3D = frozenset({Family.GRANITEMOE, Family.GPT_OSS})


def experts_quantized(setup: TrainingSetup) -> bool:
    """Does bitsandbytes quantize the MoE experts?  Where transformers builds them as nn.Linear modules (4.x:
    Mixtral's ``w1``/``w2``/``w3`` per expert), yes; from 5.0 they are 3-D parameters it leaves in the load dtype
    (:attr:`~oomlab.core.versions.Fact.MOE_EXPERTS_3D`), and Granite MoE's and gpt-oss's are 3-D in every release
    (:data:`EXPERTS_ALWAYS_3D`)."""
    return setup.model.family not in EXPERTS_ALWAYS_3D and not applies(Fact.MOE_EXPERTS_3D, setup.versions)


def adapted_only(setup: TrainingSetup) -> tuple[str, ...] | None:
    """The LoRA targets where QLoRA quantizes only the projections it adapts -- torchtune before 0.3.0, whose
    builders keep every other projection an ``nn.Linear`` in the model's dtype
    (:attr:`~oomlab.core.versions.Fact.TORCHTUNE_FROZEN_NF4`) -- else None (every layer's nn.Linear)."""
    if setup.versions.framework == "torchtune" and not applies(Fact.TORCHTUNE_FROZEN_NF4, setup.versions):
        return tuple(setup.lora_targets)
    return None


def quantized_parameters(setup: TrainingSetup) -> int:
    """Parameters QLoRA quantizes: the decoder layers' nn.Linear weights (the adapted ones only under torchtune <
    0.3.0: :func:`adapted_only`), and the experts where they are nn.Linear (:func:`experts_quantized`)."""
    return _quantized_parameters(setup.model, experts_quantized(setup), adapted_only(setup))


def _adapted(name: str, targets: tuple[str, ...] | None) -> bool:
    return targets is None or name.rsplit(".", 1)[-1] in targets


@lru_cache(maxsize=256)
def _quantized_parameters(spec: ModelSpec, experts: bool, targets: tuple[str, ...] | None = None) -> int:
    if targets is None:
        return sum(layout.linear_weight_params + (layout.expert_params if experts else 0)
                   for layout in spec.layer_layouts)
    return sum(p.in_features * p.out_features + (layout.expert_params if experts else 0)
               for layout in spec.layer_layouts for name, p in layout.projections.items() if _adapted(name, targets))


def _quantized_matrices(setup: TrainingSetup) -> int:
    """4-bit weights, each with its own quantization state: every layer's (adapted: :func:`adapted_only`) nn.Linear
    modules (3 per expert where the experts are quantized)."""
    spec, targets = setup.model, adapted_only(setup)
    experts = sum(3 * layout.experts for layout in spec.layer_layouts) if experts_quantized(setup) else 0
    return sum(_adapted(name, targets) for layout in spec.layer_layouts for name in layout.projections) + experts


def kbit_upcast(setup: TrainingSetup) -> bool:
    """QLoRA as peft prepares it: ``prepare_model_for_kbit_training`` (what oomlab's train.py, TRL's SFTTrainer and
    the PEFT QLoRA recipes call) casts every fp16/bf16 parameter that is not 4-bit -- the embedding, the norms, the
    LM head -- to fp32 (:attr:`~oomlab.core.versions.Fact.PEFT_KBIT_UPCAST`).

    Budgeted for a mixed precision on one process per replica (``single``, ``ddp``), where accelerate's autocast
    runs the forward over those fp32 weights.  NB: TRL skips the preparation for sharded QLoRA (FSDP, ZeRO-3) and
    DeepSpeed casts every parameter back to half, so the sharded strategies keep half non-quantized weights; pure
    ``fp16``/``bf16`` QLoRA (no autocast) is budgeted without the upcast.  torchtune and litgpt (named in the
    versions) have no peft preparation.
    """
    return (setup.method is Method.QLORA and setup.precision in MIXED
            and setup.strategy in (Strategy.SINGLE, Strategy.DDP) and applies(Fact.PEFT_KBIT_UPCAST, setup.versions))


def fp32_loaded_base(setup: TrainingSetup) -> bool:
    """A frozen base (LoRA's, QLoRA's non-4-bit parameters) kept in the fp32 ``from_pretrained`` loaded it in
    (:attr:`~oomlab.core.choices.BaseDtype.FP32`: transformers 4.x without ``torch_dtype``, TRL's ``ModelConfig``
    default) under a mixed precision: autocast computes in half over it and nothing casts it -- except DeepSpeed,
    which casts every parameter to half in place."""
    return (setup.base_dtype is BaseDtype.FP32 and setup.method is not Method.FULL and setup.precision in MIXED
            and not setup.strategy.deepspeed)


def unquantized_bytes(setup: TrainingSetup) -> int:
    """QLoRA: bytes per element of the parameters left unquantized (fp32 after peft's upcast or as loaded in fp32,
    else half)."""
    return 4 if kbit_upcast(setup) or fp32_loaded_base(setup) else 2


def half_weights(setup: TrainingSetup) -> bool:
    """Are the (base) weights stored in half precision?  (DeepSpeed casts every parameter to half in place.)"""
    if setup.precision in (Precision.FP16, Precision.BF16):
        return True
    return setup.precision in MIXED and (setup.method is not Method.FULL or setup.strategy.deepspeed) \
        and not fp32_loaded_base(setup)


def param_bytes(setup: TrainingSetup) -> int:
    """Bytes per element of the (base) weights as stored."""
    return 2 if half_weights(setup) else 4


def weight_bytes_total(setup: TrainingSetup) -> int:
    """All parameters' bytes on one full replica (before sharding)."""
    n = setup.model.num_parameters
    adapters = 4 * lora_parameters(setup) if setup.method is not Method.FULL else 0  # fp32 adapters (peft)
    if setup.method is Method.QLORA:
        quantized = quantized_parameters(setup)
        packed = round(quantized * NF4_DQ_BITS / 8)
        return packed + unquantized_bytes(setup) * (n - quantized) + adapters
    return param_bytes(setup) * n + adapters


def nf4_state_fixed_bytes(setup: TrainingSetup) -> int:
    """QLoRA: the per-weight constants of bitsandbytes' quantization states (codes and offset), zero otherwise.

    NB: 1,092 bytes per quantized matrix -- about 240 KiB for a 7B model, but 0.3 % of a tiny one.
    """
    if setup.method is not Method.QLORA:
        return 0
    return NF4_STATE_TENSOR_BYTES * _quantized_matrices(setup)


def grad_bytes_per_param(setup: TrainingSetup) -> int:
    """Gradients have their parameter's dtype (fp32 adapters, fp32 weights under autocast)."""
    if setup.method is Method.FULL and half_weights(setup):
        return 2
    return 4


def gradient_bytes_total(setup: TrainingSetup) -> int:
    return grad_bytes_per_param(setup) * trainable_parameters(setup)


def optimizer_state_bytes_total(setup: TrainingSetup) -> int:
    """Optimizer state of every trained parameter, unsharded, as torch's optimizers keep it (like the parameter;
    DeepSpeed's fp32 partitions are :mod:`oomlab.budget.deepspeed`'s)."""
    p = trainable_parameters(setup)
    state_dtype = grad_bytes_per_param(setup)
    if setup.optimizer.adam:
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
    dims = spec.projection_shapes
    small = sum(setup.lora_rank * n for t in setup.lora_targets for n in dims[t]
                if setup.lora_rank * n < ADAM8_MIN_SIZE)
    return spec.num_hidden_layers * small


# ------------------------------------------------------------------------------------------ per GPU


def weights_on_gpu(setup: TrainingSetup) -> int:
    """Persistent weights per GPU."""
    total = weight_bytes_total(setup) + nf4_state_fixed_bytes(setup)
    return sharding.per_gpu(setup, MemCategory.WEIGHTS, total)


def gradients_on_gpu(setup: TrainingSetup) -> int:
    return sharding.per_gpu(setup, MemCategory.GRADIENTS, gradient_bytes_total(setup))


def optimizer_on_gpu(setup: TrainingSetup) -> int:
    return sharding.per_gpu(setup, MemCategory.OPTIMIZER_STATE, optimizer_state_bytes_total(setup))


def host_bytes_total(setup: TrainingSetup) -> int:
    """The offloaded model states, unsharded: every category :mod:`.sharding` keeps on the host."""
    totals = {MemCategory.WEIGHTS: weight_bytes_total(setup) + nf4_state_fixed_bytes(setup),
              MemCategory.GRADIENTS: gradient_bytes_total(setup),
              MemCategory.OPTIMIZER_STATE: optimizer_state_bytes_total(setup)}
    return sum(total for category, total in totals.items() if sharding.share(setup, category) is Share.HOST)


def optimizer_temp_bytes(setup: TrainingSetup) -> int:
    """Temporaries of torch's optimizer step (DeepSpeed's, with its alignment and sub-groups, are
    :mod:`oomlab.budget.deepspeed`'s).

    torch's foreach AdamW: ``exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)``, one state-sized
    temporary.  torch's fused AdamW (``fused=True``, what Trainer's default ``adamw_torch_fused`` builds) updates every
    tensor in one kernel and keeps no temporary.
    NB: SGD and the 8-bit optimizer update in place; offloaded states step on the host.
    """
    if setup.optimizer not in (Optimizer.ADAMW, Optimizer.ADAMW_HF) \
            or sharding.share(setup, MemCategory.OPTIMIZER_STATE) is Share.HOST:
        return 0
    if setup.optimizer is Optimizer.ADAMW_HF:
        return largest_state_tensor_bytes(setup)
    return optimizer_on_gpu(setup) // 2


def largest_state_tensor_bytes(setup: TrainingSetup) -> int:
    """One moment of the largest tensor the optimizer steps: what a loop over the parameters (transformers'
    ``AdamW.step``: ``denom = exp_avg_sq.sqrt().add_(eps)``, transformers 4.31 optimization.py) holds at once.

    The tensors are the trained parameters as the optimizer sees them: the embedding, the head or a projection
    (full fine-tuning), an adapter matrix (LoRA); FSDP1's flat parameters (a decoder layer's or the root's, sharded);
    FSDP2's per-parameter shards.  NB: DeepSpeed steps one flat partition (:mod:`.deepspeed`).
    """
    spec = setup.model
    moment = 2 if setup.method is Method.FULL and half_weights(setup) else 4
    if setup.method is Method.FULL:
        largest = max(spec.embedding_params, spec.lm_head_params, *(i * o for i, o in spec.projection_shapes.values()))
    else:
        dims = spec.projection_shapes
        largest = max(setup.lora_rank * max(dims[t]) for t in setup.lora_targets)
    if setup.strategy in FSDP1_STRATEGIES:
        unit = max(spec.layer_matmul_params, spec.embedding_params + spec.lm_head_params)
        largest = (unit if setup.method is Method.FULL else largest) // setup.world_size
    elif setup.strategy.fsdp:
        largest //= setup.world_size
    return moment * largest
