"""What is being budgeted: one training setup (model, GPUs, strategy, method, precision, ...).

Choices are enums whose values are the names users type; :func:`make_setup` turns user input into a
validated, frozen :class:`TrainingSetup` and refuses invalid combinations with the reason.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from oomlab.errors import InvalidValueError, UnknownNameError
from oomlab.specs import GPUSpec, ModelSpec, load_gpu, load_model


class Strategy(enum.Enum):
    """How the model states are spread over the GPUs."""

    SINGLE = "single"  # the whole model on one GPU (what the seed did)
    DDP = "ddp"  # a full replica per GPU, gradients all-reduced
    ZERO1 = "zero1"  # optimizer state sharded (ZeRO stage 1)
    ZERO2 = "zero2"  # optimizer state and gradients sharded (ZeRO stage 2)
    FSDP = "fsdp"  # parameters, gradients and optimizer state sharded (FSDP full shard / ZeRO-3)
    FSDP_OFFLOAD = "fsdp-offload"  # FSDP with parameters, gradients and optimizer state on the host


class Method(enum.Enum):
    """Which parameters are trained."""

    FULL = "full"  # every parameter
    LORA = "lora"  # frozen base weights plus low-rank adapters (peft)
    QLORA = "qlora"  # LoRA over a 4-bit NF4 base (bitsandbytes), double quantization


class Precision(enum.Enum):
    """Weight storage and compute dtypes."""

    FP32 = "fp32"  # everything float32
    FP16_MIXED = "fp16-mixed"  # fp32 master weights, fp16 autocast compute
    BF16_MIXED = "bf16-mixed"  # fp32 master weights, bf16 autocast compute
    FP16 = "fp16"  # pure half: weights, gradients, optimizer state in fp16
    BF16 = "bf16"  # pure bfloat16

    @property
    def compute_dtype(self) -> str:
        return {"fp32": "float32", "fp16-mixed": "float16", "fp16": "float16"}.get(self.value, "bfloat16")

    @property
    def uses_bf16(self) -> bool:
        return self in (Precision.BF16_MIXED, Precision.BF16)


class Optimizer(enum.Enum):
    """The optimizer and its state."""

    ADAMW = "adamw"  # two fp32 moments per trained parameter
    ADAMW_8BIT = "adamw-8bit"  # bitsandbytes 8-bit AdamW: two 1-byte moments plus block scales
    SGD = "sgd"  # SGD with momentum: one moment


class Attention(enum.Enum):
    """transformers' attention implementation."""

    EAGER = "eager"  # softmax(QK^T)V in PyTorch ops: saves the a x s x s probabilities
    SDPA = "sdpa"  # torch.nn.functional.scaled_dot_product_attention


DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
LORA_TARGET_CHOICES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class TrainingSetup:
    """One training configuration, per optimizer step."""

    model: ModelSpec
    gpu: GPUSpec
    gpus: int  # GPUs per node
    nodes: int
    strategy: Strategy
    method: Method
    precision: Precision
    optimizer: Optimizer
    batch: int  # micro-batch per GPU
    seq: int  # sequence length in tokens
    checkpointing: bool  # activation (gradient) checkpointing of each decoder layer
    attention: Attention
    lora_rank: int
    lora_alpha: int
    lora_targets: tuple[str, ...]

    @property
    def world_size(self) -> int:
        return self.gpus * self.nodes

    def with_(self, **changes: Any) -> TrainingSetup:
        """A copy with some fields changed, validated again."""
        return validate(replace(self, **changes))


def _enum(kind: type[enum.Enum], value: Any, label: str) -> Any:
    if isinstance(value, kind):
        return value
    try:
        return kind(str(value).strip().lower())
    except ValueError as err:
        raise UnknownNameError(label, value, [m.value for m in kind]) from err


def validate(setup: TrainingSetup) -> TrainingSetup:
    """Refuse combinations that cannot run, saying why."""
    for name in ("gpus", "nodes", "batch", "seq"):
        value = getattr(setup, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidValueError(f"invalid {name} {value!r}; must be an integer >= 1")
    if setup.precision.uses_bf16 and not setup.gpu.bf16:
        cc = ".".join(map(str, setup.gpu.compute_capability))
        raise InvalidValueError(
            f"precision {setup.precision.value!r} needs bfloat16, which the {setup.gpu.display_name} "
            f"(compute capability {cc}) lacks; use fp16-mixed or fp32 on this GPU"
        )
    if setup.method is Method.QLORA and setup.precision is Precision.FP32:
        raise InvalidValueError(
            "method 'qlora' computes in half precision over a 4-bit base; precision 'fp32' is not a QLoRA "
            "setup: use fp16-mixed (or bf16-mixed where the GPU has bf16)"
        )
    if setup.method in (Method.LORA, Method.QLORA):
        if setup.lora_rank < 1:
            raise InvalidValueError(f"invalid LoRA rank {setup.lora_rank}; must be >= 1")
        if not setup.lora_targets:
            raise InvalidValueError(f"LoRA needs target modules; choose from {', '.join(LORA_TARGET_CHOICES)}")
        for target in setup.lora_targets:
            if target not in LORA_TARGET_CHOICES:
                raise UnknownNameError("LoRA target module", target, LORA_TARGET_CHOICES)
    if setup.method is Method.QLORA and setup.strategy in (Strategy.FSDP_OFFLOAD,):
        raise InvalidValueError(
            "method 'qlora' with strategy 'fsdp-offload' is not supported (4-bit weights are not offloaded "
            "by FSDP); use fsdp, ddp or single"
        )
    return setup


def make_setup(
    model: str | ModelSpec = "llama-13b",
    gpu: str | GPUSpec = "t4",
    gpus: int = 1,
    nodes: int = 1,
    strategy: str | Strategy = "single",
    method: str | Method = "full",
    precision: str | Precision = "fp16-mixed",
    optimizer: str | Optimizer = "adamw",
    batch: int = 1,
    seq: int = 2048,
    checkpointing: bool = False,
    attention: str | Attention = "sdpa",
    lora_rank: int = 8,
    lora_alpha: int = 16,
    lora_targets: Sequence[str] | str = DEFAULT_LORA_TARGETS,
) -> TrainingSetup:
    """Build and validate a :class:`TrainingSetup` from names (as typed on the CLI) or objects."""
    if isinstance(lora_targets, str):
        lora_targets = tuple(t.strip() for t in lora_targets.split(",") if t.strip())
    return validate(
        TrainingSetup(
            model=model if isinstance(model, ModelSpec) else load_model(model),
            gpu=gpu if isinstance(gpu, GPUSpec) else load_gpu(gpu),
            gpus=gpus,
            nodes=nodes,
            strategy=_enum(Strategy, strategy, "strategy"),
            method=_enum(Method, method, "method"),
            precision=_enum(Precision, precision, "precision"),
            optimizer=_enum(Optimizer, optimizer, "optimizer"),
            batch=batch,
            seq=seq,
            checkpointing=bool(checkpointing),
            attention=_enum(Attention, attention, "attention"),
            lora_rank=lora_rank,
            lora_alpha=lora_alpha,
            lora_targets=tuple(lora_targets),
        )
    )
