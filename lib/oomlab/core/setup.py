"""What is being budgeted: one training setup (model, GPUs, strategy, method, precision, ...).

Choices are the enums of :mod:`oomlab.core.choices`; :func:`make_setup` turns user input into a
validated, frozen :class:`TrainingSetup` and refuses invalid combinations with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from oomlab.core.choices import (
    Attention,
    BaseDtype,
    Loss,
    Method,
    Optimizer,
    Precision,
    Reference,
    Strategy,
    Trainer,
    choice,
)
from oomlab.core.defaults import DEFAULT_LORA_TARGETS, DEFAULTS, launch_strategy
from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.gpus import GPUSpec, load_gpu
from oomlab.core.models import ALL_LINEAR, ModelSpec, load_model
from oomlab.core.versions import Versions, installed_versions, versions_from


def lora_targets_for(spec: ModelSpec, targets: tuple[str, ...]) -> tuple[str, ...]:
    """The module names LoRA targets in ``spec``'s model: the family's own, ``all-linear`` as peft defines it (every
    nn.Linear but the output layer), the default as the family's attention projections; an unknown name is refused
    with the model's real ones."""
    names = spec.lora_target_names
    if not targets:
        raise InvalidValueError(f"LoRA needs target modules; {spec.name} has {', '.join(names)} (or {ALL_LINEAR})")
    if ALL_LINEAR in targets:
        return names
    if targets == DEFAULT_LORA_TARGETS and not set(targets) <= set(names):
        return spec.attention_projections
    for target in targets:
        if target not in names:
            raise UnknownNameError("LoRA target module", target, [*names, ALL_LINEAR],
                                   f"the nn.Linear modules of {spec.name}'s {spec.family.value} layers")
    return targets


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
    # the training loop (SFT, DPO, GRPO, ...): what is resident beside the model and how many sequences a forward
    # carries; defaulted so a setup built field by field (a record written before it existed) is the SFT it was
    trainer: Trainer = DEFAULTS.trainer
    reference: Reference = DEFAULTS.reference  # the trainer's reference model: its default, resident or none
    loss: Loss = DEFAULTS.loss  # the causal-LM loss: over materialised logits, Liger's fused kernel, Cut CE
    # saved activations moved to pinned host memory as forward saves them (TRL's activation_offloading)
    offload_activations: bool = DEFAULTS.offload_activations
    # the dtype from_pretrained stored the weights in, for a frozen base: half, or fp32 (transformers 4.x without
    # torch_dtype, TRL's ModelConfig default); full fine-tuning's weights follow the precision
    base_dtype: BaseDtype = DEFAULTS.base_dtype
    # each parameter stepped by its own optimizer inside backward as its gradient completes, the gradient then freed
    # (torchtune's optimizer_in_bwd: True; oomlab.budget.optimizer_in_backward)
    optimizer_in_backward: bool = DEFAULTS.optimizer_in_backward
    # the user's library releases (core.versions): the installed ones where not given
    versions: Versions = field(default_factory=installed_versions)

    @property
    def world_size(self) -> int:
        return self.gpus * self.nodes

    def with_(self, **changes: Any) -> TrainingSetup:
        """A copy with some fields changed (choices by member or by name, as typed), validated again."""
        for name, kind in _CHOICE_FIELDS.items():
            if name in changes:
                changes[name] = choice(kind, changes[name], name)
        if "versions" in changes:
            changes["versions"] = versions_from(changes["versions"])
        return validate(replace(self, **changes))


_CHOICE_FIELDS = {"strategy": Strategy, "method": Method, "precision": Precision, "optimizer": Optimizer,
                  "attention": Attention, "trainer": Trainer, "reference": Reference,
                  "loss": Loss, "base_dtype": BaseDtype}


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
    allowed = setup.model.attention_implementations()
    if setup.attention.value not in allowed:  # NB: as transformers picks for the family (Gemma-2: eager; no SDPA)
        setup = replace(setup, attention=Attention(allowed[0]))
    if setup.precision.uses_bf16 and not setup.gpu.bf16:
        cc = ".".join(map(str, setup.gpu.compute_capability))
        raise InvalidValueError(
            f"precision {setup.precision.value!r} needs bfloat16, which the {setup.gpu.display_name} "
            f"(compute capability {cc}) lacks; use fp16-mixed or fp32 on this GPU"
        )
    if setup.base_dtype is BaseDtype.FP32 and setup.precision in (Precision.FP16, Precision.BF16):
        raise InvalidValueError(
            f"base dtype 'float32' with precision {setup.precision.value!r}: pure half precision stores every weight "
            f"in half; a model loaded in float32 and trained under autocast is "
            f"{'bf16' if setup.precision is Precision.BF16 else 'fp16'}-mixed (base dtypes: "
            f"{', '.join(m.value for m in BaseDtype)})")
    if setup.method is Method.QLORA and setup.precision is Precision.FP32:
        raise InvalidValueError(
            "method 'qlora' computes in half precision over a 4-bit base; precision 'fp32' is not a QLoRA "
            "setup: use fp16-mixed (or bf16-mixed where the GPU has bf16)"
        )
    # Checked whatever the method: the plan builds its LoRA remedies from this rank.
    if not isinstance(setup.lora_rank, bool) and isinstance(setup.lora_rank, int) \
            and setup.lora_rank > setup.model.hidden_size:
        raise InvalidValueError(
            f"invalid LoRA rank {setup.lora_rank}; {setup.model.name} has hidden size {setup.model.hidden_size}: "
            f"use a rank from 1 to {setup.model.hidden_size} (a larger rank adds more parameters than the full "
            "weight matrix it adapts)")
    if setup.method in (Method.LORA, Method.QLORA):
        if setup.lora_rank < 1:
            raise InvalidValueError(f"invalid LoRA rank {setup.lora_rank}; must be >= 1")
        targets = lora_targets_for(setup.model, setup.lora_targets)
        if targets != setup.lora_targets:
            setup = replace(setup, lora_targets=targets)
    if setup.strategy.deepspeed:
        _validate_deepspeed(setup)
    if setup.offload_activations and setup.strategy.fsdp:
        raise InvalidValueError(
            f"activation offloading with strategy {setup.strategy.value!r} is not budgeted (FSDP's per-layer phases "
            "assume the saved activations on the GPU); use single, ddp or a zero* strategy")
    if setup.method is Method.QLORA and setup.strategy.offloads:
        raise InvalidValueError(
            f"method 'qlora' with strategy '{setup.strategy.value}' is not supported (4-bit weights are not "
            "offloaded by FSDP); use fsdp, fsdp2, ddp or single"
        )
    if setup.optimizer_in_backward:
        _validate_optimizer_in_backward(setup)
    if setup.method is Method.QLORA and setup.versions.framework == "torchtune" \
            and (setup.versions.release("torchtune") or (0,)) < TORCHTUNE_CHUNKING:
        _validate_torchtune_0_1_qlora(setup)
    return setup


TORCHTUNE_CHUNKING = (0, 2, 0)  # the first torchtune release whose QLoRA runs on a chunking torchao (0.3.1)
# torchtune's *_distributed recipes shard with FSDP2 (training.shard_model, fully_shard) from 0.3.0; FSDP1 before
TORCHTUNE_FSDP2 = (0, 3, 0)
TORCHTUNE_PRECISIONS = (Precision.BF16, Precision.FP32)  # its recipes' dtype: bf16 (pure) or fp32; fp16 refused


def torchtune_strategies(setup: TrainingSetup) -> tuple[Strategy, ...]:
    """The strategies torchtune's recipes run at the setup's release: one device, or FSDP (2 from 0.3.0) with or
    without CPU offload."""
    if (setup.versions.release("torchtune") or (0,)) >= TORCHTUNE_FSDP2:
        return Strategy.SINGLE, Strategy.FSDP2, Strategy.FSDP2_OFFLOAD
    return Strategy.SINGLE, Strategy.FSDP, Strategy.FSDP_OFFLOAD


def _validate_torchtune_0_1_qlora(setup: TrainingSetup) -> None:
    """What torchtune < 0.2.0's QLoRA runs, and what oomlab recorded of it (:mod:`oomlab.budget.nf4_init`): one GPU
    (v0.1.0 ships only ``*_qlora_single_device`` configs; ``lora_finetune_distributed`` has no NF4 path), bf16 (the
    recipe refuses fp16, recipes/lora_finetune_single_device.py :100-105; torchao 0.1's quantization is recorded on
    bf16 weights), dense models (no MoE builder)."""
    if setup.world_size > 1:
        raise InvalidValueError(
            f"torchtune < 0.2.0 runs QLoRA on one GPU only ({setup.world_size} asked): its QLoRA configs are "
            "*_qlora_single_device and lora_finetune_distributed has no NF4 path; use gpus 1, or torchtune >= 0.2.0")
    if not setup.precision.uses_bf16:
        raise InvalidValueError(
            f"precision {setup.precision.value!r} with torchtune < 0.2.0 QLoRA: its recipe refuses fp16, and oomlab "
            "recorded torchao 0.1's quantization of bf16 weights only; use bf16 (torchtune's dtype=bf16) on a GPU "
            "with bfloat16")
    if any(layout.experts for layout in setup.model.layer_layouts):
        raise InvalidValueError(
            f"{setup.model.name} is a mixture of experts: torchtune < 0.2.0 has no QLoRA builder for one; use "
            "torchtune >= 0.2.0 or the transformers path (no --versions torchtune)")


def _validate_optimizer_in_backward(setup: TrainingSetup) -> None:
    """What the optimizer stepped inside backward is budgeted for: one process (torchtune's
    ``full_finetune_single_device`` recipe) running the SFT step.  NB: torchtune also refuses it with
    ``gradient_accumulation_steps > 1`` and with ``clip_grad_norm`` (recipes/full_finetune_single_device.py :146-157
    @v0.4.0); a setup is one micro-batch per optimizer step and clips nothing, so neither can be asked here."""
    if setup.strategy is not Strategy.SINGLE:
        raise InvalidValueError(
            f"optimizer in backward with strategy {setup.strategy.value!r} is not budgeted (a DDP hook would step "
            "before the gradients are reduced; FSDP's and DeepSpeed's per-parameter steps are not modelled); use "
            f"strategy 'single' (strategies: {', '.join(s.value for s in Strategy)}), or step after backward")
    if setup.trainer is not Trainer.SFT:
        raise InvalidValueError(
            f"optimizer in backward with trainer {setup.trainer.value!r} is not budgeted (the step in backward is "
            f"budgeted for the SFT step only); use trainer 'sft' (trainers: {', '.join(t.value for t in Trainer)}), "
            "or step after backward")


def _validate_deepspeed(setup: TrainingSetup) -> None:
    """What DeepSpeed cannot run, or oomlab does not budget, under a ZeRO strategy."""
    name = setup.strategy.value
    if setup.precision in (Precision.FP16, Precision.BF16):
        mixed = "bf16-mixed" if setup.precision is Precision.BF16 else "fp16-mixed"
        raise InvalidValueError(
            f"precision {setup.precision.value!r} with strategy {name!r}: DeepSpeed's fp16/bf16 always keep an fp32 "
            f"master partition (no pure half optimizer states); that is precision {mixed!r}"
        )
    if setup.method is Method.QLORA and setup.strategy.zero_stage == 3:
        raise InvalidValueError(
            f"method 'qlora' with strategy {name!r} is not budgeted (ZeRO-3 partitions bitsandbytes' 4-bit weights "
            "stored in bnb_4bit_quant_storage containers, which oomlab does not model); use zero1, zero2, fsdp or fsdp2"
        )
    if setup.optimizer is Optimizer.ADAMW_8BIT and setup.strategy.offloads_optimizer:
        raise InvalidValueError(
            f"optimizer 'adamw-8bit' with strategy {name!r}: an offloaded DeepSpeed step runs DeepSpeedCPUAdam with "
            "fp32 states; use adamw (or a strategy without offload)"
        )


def make_setup(
    model: str | ModelSpec = DEFAULTS.model,
    gpu: str | GPUSpec = DEFAULTS.gpu,
    gpus: int = DEFAULTS.gpus,
    nodes: int = DEFAULTS.nodes,
    strategy: str | Strategy | None = None,
    method: str | Method = DEFAULTS.method,
    precision: str | Precision = DEFAULTS.precision,
    optimizer: str | Optimizer = DEFAULTS.optimizer,
    batch: int = DEFAULTS.batch,
    seq: int = DEFAULTS.seq,
    checkpointing: bool = DEFAULTS.checkpointing,
    attention: str | Attention = DEFAULTS.attention,
    lora_rank: int = DEFAULTS.lora_rank,
    lora_alpha: int = DEFAULTS.lora_alpha,
    lora_targets: Sequence[str] | str = DEFAULTS.lora_targets,
    trainer: str | Trainer = DEFAULTS.trainer,
    reference: str | Reference = DEFAULTS.reference,
    loss: str | Loss = DEFAULTS.loss,
    offload_activations: bool = DEFAULTS.offload_activations,
    base_dtype: str | BaseDtype = DEFAULTS.base_dtype,
    versions: Versions | Mapping[str, str] | str | None = None,
    optimizer_in_backward: bool = DEFAULTS.optimizer_in_backward,
) -> TrainingSetup:
    """Build and validate a :class:`TrainingSetup` from names (as typed on the CLI) or objects; what is not given is
    :data:`~oomlab.core.defaults.DEFAULTS`', and the strategy follows :func:`~oomlab.core.defaults.launch_strategy`
    (none: a replica per GPU; ``ddp`` over one GPU in all is ``single``); ``versions``: the user's library releases
    (:func:`~oomlab.core.versions.versions_from`: pins, a pip freeze file or a mapping; none: the installed ones);
    ``optimizer_in_backward``: each parameter stepped inside backward (torchtune's ``optimizer_in_bwd``), one process
    and the SFT step only."""
    if isinstance(lora_targets, str):
        lora_targets = tuple(t.strip() for t in lora_targets.split(",") if t.strip())
    return validate(
        TrainingSetup(
            model=model if isinstance(model, ModelSpec) else load_model(model),
            gpu=gpu if isinstance(gpu, GPUSpec) else load_gpu(gpu),
            gpus=gpus,
            nodes=nodes,
            strategy=launch_strategy(strategy, gpus * nodes if isinstance(gpus, int) and isinstance(nodes, int)
                                     else 0),
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
            trainer=choice(Trainer, trainer, "trainer"),
            reference=choice(Reference, reference, "reference"),
            loss=choice(Loss, loss, "loss"),
            offload_activations=bool(offload_activations),
            base_dtype=choice(BaseDtype, base_dtype, "base dtype"),
            versions=versions_from(versions),
            optimizer_in_backward=bool(optimizer_in_backward),
        )
    )
