"""The user-facing choices, as enums whose values are the names users type (CLI, notebooks, JSON)."""

from __future__ import annotations

import enum
from typing import Any

from oomlab.core.errors import UnknownNameError


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


class Route(enum.Enum):
    """How one training run lays the model out over the GPUs of a node."""

    PROCESS_PER_GPU = "process-per-gpu"  # a process per GPU (torchrun / accelerate launch); the strategy decides
    DEVICE_MAP = "device-map"  # one process; accelerate's device_map="auto" puts whole layers on successive GPUs


class Device(enum.Enum):
    """Where the reproduction runs ``model.to("cuda")``."""

    AUTO = "auto"  # cuda when available, else simulated
    SIMULATED = "simulated"  # the caching-allocator model on fake CUDA tensors (no GPU needed)
    CUDA = "cuda"  # a real CUDA device, capped to the chosen GPU's capacity


class MessageFormat(enum.Enum):
    """The two wordings of PyTorch's CUDA out-of-memory message."""

    OLD = "torch<=2.0"  # "(GPU 0; X total capacity; Y already allocated; Z free; W reserved in total by PyTorch)"
    NEW = "torch>=2.1"  # "GPU 0 has a total capacity of X of which Z is free. ..."


# Short names without "=": papermill cannot read a parameters-cell default that contains "=".
MESSAGE_FORMAT_ALIASES = {"old": MessageFormat.OLD, "new": MessageFormat.NEW}
MESSAGE_FORMAT_NAMES = (*(f.value for f in MessageFormat), *MESSAGE_FORMAT_ALIASES)


def message_format(name: str | MessageFormat) -> MessageFormat:
    """The format named ``name``: ``"old"`` or ``"torch<=2.0"`` → OLD, ``"new"`` or ``"torch>=2.1"`` → NEW."""
    if isinstance(name, MessageFormat):
        return name
    key = str(name).strip()
    if key in MESSAGE_FORMAT_ALIASES:
        return MESSAGE_FORMAT_ALIASES[key]
    try:
        return MessageFormat(key)
    except ValueError as err:
        raise UnknownNameError("message format", name, MESSAGE_FORMAT_NAMES) from err


def choice(kind: type[enum.Enum], value: Any, label: str) -> Any:
    """The member of ``kind`` named by ``value`` (a member or its value as typed), or an error listing them."""
    if isinstance(value, kind):
        return value
    try:
        return kind(str(value).strip().lower())
    except ValueError as err:
        raise UnknownNameError(label, value, [m.value for m in kind]) from err
