"""What is being budgeted: one training setup (model, GPUs, strategy, method, precision, ...).

Choices are the enums of :mod:`oomlab.core.choices`; :func:`make_setup` turns user input into a
validated, frozen :class:`TrainingSetup` and refuses invalid combinations with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from oomlab.core.choices import Attention, Method, Optimizer, Precision, Strategy, choice
from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.gpus import GPUSpec, load_gpu
from oomlab.core.models import PROJECTIONS, ModelSpec, load_model

DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
DEFAULT_HOST_RAM = "192GiB"  # NB: assumption -- a 4 x T4 AWS g4dn.12xlarge has 192 GiB of host memory
LORA_TARGET_CHOICES = PROJECTIONS


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
        """A copy with some fields changed (choices by member or by name, as typed), validated again."""
        for name, kind in _CHOICE_FIELDS.items():
            if name in changes:
                changes[name] = choice(kind, changes[name], name)
        return validate(replace(self, **changes))


_CHOICE_FIELDS = {"strategy": Strategy, "method": Method, "precision": Precision, "optimizer": Optimizer,
                  "attention": Attention}


MAX_GPUS_PER_NODE = 72  # an NVL72 rack is the largest single NVLink domain sold; a plan of more answers slowly
MAX_NODES = 1024


def validate(setup: TrainingSetup) -> TrainingSetup:
    """Refuse combinations that cannot run, saying why."""
    for name in ("gpus", "nodes", "batch", "seq"):
        value = getattr(setup, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidValueError(f"invalid {name} {value!r}; must be an integer >= 1")
    for name, ceiling in (("gpus", MAX_GPUS_PER_NODE), ("nodes", MAX_NODES)):
        if getattr(setup, name) > ceiling:
            raise InvalidValueError(f"invalid {name} {getattr(setup, name)}; must be at most {ceiling}")
    if setup.seq > setup.model.max_position_embeddings:
        raise InvalidValueError(
            f"invalid seq {setup.seq}; {setup.model.name} has max_position_embeddings "
            f"{setup.model.max_position_embeddings}: use a sequence length up to that (or a config.json whose "
            "max_position_embeddings allows more)")
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
    if setup.method is Method.QLORA and setup.strategy.offloads:
        raise InvalidValueError(
            f"method 'qlora' with strategy '{setup.strategy.value}' is not supported (4-bit weights are not "
            "offloaded by FSDP); use fsdp, fsdp2, ddp or single"
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
            strategy=choice(Strategy, strategy, "strategy"),
            method=choice(Method, method, "method"),
            precision=choice(Precision, precision, "precision"),
            optimizer=choice(Optimizer, optimizer, "optimizer"),
            batch=batch,
            seq=seq,
            checkpointing=bool(checkpointing),
            attention=choice(Attention, attention, "attention"),
            lora_rank=lora_rank,
            lora_alpha=lora_alpha,
            lora_targets=tuple(lora_targets),
        )
    )
