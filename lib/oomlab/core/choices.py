"""The user-facing choices, as enums whose values are the names users type (CLI, notebooks, JSON)."""

from __future__ import annotations

import enum
from typing import Any

from oomlab.core.errors import UnknownNameError


class Choice(enum.Enum):
    """An enum hashed by identity: members are singletons compared by identity, so ``object.__hash__`` agrees with
    ``==``, and it is a C slot where ``Enum.__hash__`` is a Python call (the budget hashes choices tens of times per
    estimate, as dict and cache keys).  Hashes are per process; nothing persists them (cache keys hash values)."""

    __hash__ = object.__hash__


class Strategy(Choice):
    """How the model states are spread over the GPUs -- each member is the launch a user runs.

    - ``single``: one process on one GPU (``python train.py`` / Trainer / ``accelerate launch`` without a
      distributed config): ``model.to(device)``; ``*-mixed`` precisions run under accelerate's ``torch.autocast``.
    - ``ddp``: ``accelerate launch`` / ``torchrun`` with DistributedDataParallel: a full replica per GPU (moved with
      ``model.to(device)``), gradients all-reduced through DDP's buckets; autocast as ``single``.
    - ``fsdp``: accelerate's FSDP as launched by default (``distributed_type: FSDP``, ``fsdp_version`` 1):
      ``FullyShardedDataParallel`` FULL_SHARD, each decoder layer auto-wrapped, ``MixedPrecision(param, reduce,
      buffer = half)``, trainable flat parameters upcast to fp32, and accelerate's autocast around the forward
      (which casts no weight: FSDP hands it half weights) with the outputs converted to fp32.
    - ``fsdp-offload``: ``fsdp`` with ``fsdp_offload_params: true`` (FSDP1 ``CPUOffload(offload_params=True)``):
      sharded parameters, gradients and the optimizer step on the host.
    - ``fsdp2``: accelerate with ``fsdp_version: 2``: ``fully_shard`` per decoder layer, the input embedding, a
      ``[final norm, lm_head]`` group kept unsharded after forward, and the root, with ``MixedPrecisionPolicy(param,
      reduce, output = half)``; trainable parameters upcast to fp32; no autocast.
    - ``fsdp2-offload``: ``fsdp2`` with ``CPUOffloadPolicy``.
    - ``zero1`` / ``zero2`` / ``zero3``: DeepSpeed ZeRO stage 1 / 2 / 3 as ``deepspeed.initialize`` runs them (the
      ``deepspeed`` launcher, or accelerate / the HF Trainer with a DeepSpeed JSON): every parameter cast to the half
      dtype, no autocast, an fp32 master partition; stage 1 partitions the optimizer state, 2 the gradients too, 3 the
      parameters too (built under ``zero.Init``: no full replica is ever moved to a GPU).  ``adamw`` is the JSON's
      ``"optimizer": {"type": "AdamW"}`` (DeepSpeed's FusedAdam, DeepSpeedCPUAdam when offloaded: in place).
    - ``zero2-offload``: ``zero2`` with ``offload_optimizer: {device: cpu}`` (fp32 master, gradients and the
      optimizer step on the host; the half replica stays on the GPU).
    - ``zero3-offload``: ``zero3`` with ``offload_optimizer`` and ``offload_param`` on the cpu.

    DeepSpeed's other knobs (bucket sizes, ``overlap_comm``, the stage-3 thresholds, ``sub_group_size``, optimizer
    offload without parameter offload) are not strategies: they are
    :class:`oomlab.budget.deepspeed_config.DeepSpeedSettings`, whose defaults are what the HF integration fills in for
    ``"auto"``; offload to NVMe is not modelled.
    """

    SINGLE = "single"  # the whole model on one GPU (what the seed did)
    DDP = "ddp"  # a full replica per GPU, gradients all-reduced
    ZERO1 = "zero1"  # optimizer state sharded (ZeRO stage 1)
    ZERO2 = "zero2"  # optimizer state and gradients sharded (ZeRO stage 2)
    FSDP = "fsdp"  # accelerate's default FSDP (FSDP1): parameters, gradients and optimizer state sharded
    FSDP_OFFLOAD = "fsdp-offload"  # FSDP1 with parameters, gradients and optimizer state on the host
    FSDP2 = "fsdp2"  # accelerate's fsdp_version 2 (fully_shard with a MixedPrecisionPolicy)
    FSDP2_OFFLOAD = "fsdp2-offload"  # FSDP2 with CPUOffloadPolicy
    ZERO3 = "zero3"  # DeepSpeed ZeRO stage 3: parameters, gradients and optimizer state partitioned
    ZERO2_OFFLOAD = "zero2-offload"  # ZeRO-2 with the optimizer (fp32 master, gradients, step) on the host
    ZERO3_OFFLOAD = "zero3-offload"  # ZeRO-3 with the optimizer and the parameter partitions on the host

    @property
    def fsdp(self) -> bool:
        """Does FSDP (version 1 or 2) shard the parameters?"""
        return self in FSDP_STRATEGIES

    @property
    def deepspeed(self) -> bool:
        """Is it a DeepSpeed ZeRO launch?"""
        return self in ZERO_STAGES

    @property
    def zero_stage(self) -> int | None:
        """DeepSpeed's ``zero_optimization.stage`` (None when not DeepSpeed)."""
        return ZERO_STAGES.get(self)

    @property
    def offloads(self) -> bool:
        """Are parameters, gradients and the optimizer step on the host?"""
        return self in (Strategy.FSDP_OFFLOAD, Strategy.FSDP2_OFFLOAD, Strategy.ZERO3_OFFLOAD)

    @property
    def offloads_optimizer(self) -> bool:
        """Is the optimizer step (and its state) on the host?"""
        return self.offloads or self is Strategy.ZERO2_OFFLOAD


FSDP_STRATEGIES = frozenset({Strategy.FSDP, Strategy.FSDP_OFFLOAD, Strategy.FSDP2, Strategy.FSDP2_OFFLOAD})
FSDP1_STRATEGIES = frozenset({Strategy.FSDP, Strategy.FSDP_OFFLOAD})
ZERO_STAGES = {Strategy.ZERO1: 1, Strategy.ZERO2: 2, Strategy.ZERO3: 3, Strategy.ZERO2_OFFLOAD: 2,
               Strategy.ZERO3_OFFLOAD: 3}


class Method(Choice):
    """Which parameters are trained."""

    FULL = "full"  # every parameter
    LORA = "lora"  # frozen base weights plus low-rank adapters (peft)
    QLORA = "qlora"  # LoRA over a 4-bit NF4 base (bitsandbytes), double quantization


class Precision(Choice):
    """Weight storage and compute dtypes."""

    FP32 = "fp32"  # everything float32
    FP16_MIXED = "fp16-mixed"  # fp32 trained weights, fp16 compute (autocast, an FSDP policy or DeepSpeed's fp16)
    BF16_MIXED = "bf16-mixed"  # fp32 trained weights, bf16 compute (likewise)
    FP16 = "fp16"  # pure half: weights, gradients, optimizer state in fp16
    BF16 = "bf16"  # pure bfloat16

    @property
    def compute_dtype(self) -> str:
        return {"fp32": "float32", "fp16-mixed": "float16", "fp16": "float16"}.get(self.value, "bfloat16")

    @property
    def uses_bf16(self) -> bool:
        return self in (Precision.BF16_MIXED, Precision.BF16)


class Optimizer(Choice):
    """The optimizer and its state (the HF Trainer's default on torch >= 2.8 is ``adamw-fused``)."""

    ADAMW = "adamw"  # torch.optim.AdamW as constructed by hand: foreach on CUDA (one state-sized sqrt temporary)
    ADAMW_FUSED = "adamw-fused"  # AdamW(fused=True), the Trainer's default optim="adamw_torch_fused": no temporary
    # transformers' own AdamW (optim="adamw_hf", the Trainer's default before 4.32; removed in 5): a Python loop over
    # the parameters, one parameter-sized temporary (denom = exp_avg_sq.sqrt())
    ADAMW_HF = "adamw-hf"
    ADAMW_8BIT = "adamw-8bit"  # bitsandbytes 8-bit AdamW: two 1-byte moments plus block scales
    SGD = "sgd"  # SGD with momentum: one moment

    @property
    def adam(self) -> bool:
        """Two full-precision moments per trained parameter (torch's AdamW, foreach or fused)?"""
        return self in (Optimizer.ADAMW, Optimizer.ADAMW_FUSED, Optimizer.ADAMW_HF)

    @property
    def remedy(self) -> bool:
        """Would a plan offer it?  Not transformers' own AdamW: deprecated, gone from transformers 5 (a user's run may
        still have it: the configured row keeps what the launch says)."""
        return self is not Optimizer.ADAMW_HF


class Trainer(Choice):
    """Which training loop runs the step: what is resident beside the trained model, and how many sequences a
    micro-batch's forward carries (the budget of each: :mod:`oomlab.budget.trainers`).

    - ``sft``: transformers' Trainer / TRL's SFTTrainer: one model, ``batch`` sequences.
    - ``dpo``: TRL's DPOTrainer (and IPO, its ``loss_type="ipo"``): a frozen reference model (none with
      ``precompute_ref_log_probs``; with LoRA, the adapter-disabled base), chosen and rejected concatenated.
    - ``orpo``: TRL's ORPOTrainer: no reference model, chosen and rejected concatenated.
    - ``kto``: TRL's KTOTrainer: a frozen reference model, unpaired examples (plus a mismatched KL batch).
    - ``grpo``: TRL's GRPOTrainer: the policy generates ``num_generations`` completions per prompt; a reference model
      unless ``beta=0``.
    - ``ppo``: TRL's PPOTrainer: policy, reference, reward and value models, with generation.
    - ``reward``: TRL's RewardTrainer: a sequence-classification model scoring chosen and rejected (2 × batch).
    """

    SFT = "sft"  # supervised fine-tuning: the model alone
    DPO = "dpo"  # direct preference optimization (IPO too): reference model, chosen + rejected
    ORPO = "orpo"  # odds-ratio preference optimization: no reference model, chosen + rejected
    KTO = "kto"  # Kahneman-Tversky optimization: reference model, unpaired examples
    GRPO = "grpo"  # group relative policy optimization: generation, reference unless beta=0
    PPO = "ppo"  # proximal policy optimization: policy, reference, reward and value models, generation
    REWARD = "reward"  # reward modelling: chosen and rejected scored by one model

    @property
    def preference(self) -> bool:
        """Does a micro-batch's forward carry chosen and rejected sequences concatenated (2 × batch)?"""
        return self in (Trainer.DPO, Trainer.ORPO, Trainer.REWARD)

    @property
    def generates(self) -> bool:
        """Does the step generate completions (a KV cache) before the training forward?"""
        return self in (Trainer.GRPO, Trainer.PPO)


class Reference(Choice):
    """Whether the trainer's frozen reference model is in GPU memory while training (what
    :class:`Trainer` does by default, or the user's setting that changes it).

    - ``default``: as the trainer's config defaults it (TRL 1.16: DPO and KTO keep one, GRPO's ``beta=0.0`` none,
      PPO one; SFT, ORPO and reward modelling have none).
    - ``resident``: a reference model throughout (GRPO with ``beta > 0``).
    - ``none``: no reference during training: DPO / KTO ``precompute_ref_log_probs=True`` (one extra pass over the
      data before training computes the reference log-probabilities), GRPO ``beta=0.0``.
    """

    DEFAULT = "default"  # the trainer's own default
    RESIDENT = "resident"  # a frozen reference model held all step
    NONE = "none"  # precomputed reference log-probabilities, or no KL term


class Attention(Choice):
    """transformers' attention implementation."""

    EAGER = "eager"  # softmax(QK^T)V in PyTorch ops: saves the a x s x s probabilities
    SDPA = "sdpa"  # torch.nn.functional.scaled_dot_product_attention


class Loss(Choice):
    """How the causal-LM loss is computed from the last hidden states (the budget of each:
    :mod:`oomlab.budget.loss_kernels`).

    - ``standard``: transformers' ``lm_head`` then ``ForCausalLMLoss``: the (tokens × vocab) logits, their fp32
      copy, the saved log-softmax and the logits' gradients.
    - ``liger-flce``: Liger-Kernel's ``LigerFusedLinearCrossEntropyLoss`` (TrainingArguments ``use_liger_kernel``,
      LLaMA-Factory ``enable_liger_kernel``, axolotl's LigerPlugin with ``liger_fused_linear_cross_entropy``): the
      head and the loss fused over chunks of rows, the gradients computed in forward; no (tokens × vocab) logits.
    - ``cce``: Apple's Cut Cross-Entropy (axolotl ``cut_cross_entropy``): the log-sum-exp and its gradient computed
      blockwise in SRAM; no (tokens × vocab) tensor at all.
    - ``chunked``: torchtune's ``CEWithChunkedOutputLoss`` (config ``loss._component_:
      torchtune.modules.loss.CEWithChunkedOutputLoss``, which sets the model's ``num_output_chunks``, 8) with
      ``compile: False``: the head runs per chunk of positions and each chunk is upcast and cross-entropied eagerly;
      the half logits of every chunk live to the end of the loss, every chunk's fp32 log-softmax through backward.
    - ``chunked-compiled``: the same with ``compile: True`` (torchtune's ``training.compile_loss`` compiles
      ``compute_cross_entropy`` per chunk): each chunk keeps only its half logits and two fp32 numbers per row.
    - ``chunked-no-upcast``: litgpt's ``model(..., lm_head_chunk_size=128)`` with ``chunked_cross_entropy`` (its
      ``finetune`` scripts): the head per 128 positions, ``cross_entropy`` per chunk in the logits' dtype (fp32 only
      under autocast), the logits held by the loop through backward.
    - ``chunked-loss-compiled``: axolotl's ``chunked_cross_entropy: true``: transformers' head makes the whole
      logits, the loss is compiled per chunk (8, ``chunked_cross_entropy_num_chunks``) over views of them.
    """

    STANDARD = "standard"  # lm_head + torch cross_entropy: the logits materialised
    LIGER_FLCE = "liger-flce"  # Liger's fused linear cross-entropy: a chunk of rows × vocab at a time
    CCE = "cce"  # Cut Cross-Entropy: blockwise, no logits
    CHUNKED = "chunked"  # torchtune CEWithChunkedOutputLoss, eager: fp32 log-softmax of every chunk saved
    CHUNKED_COMPILED = "chunked-compiled"  # torchtune CEWithChunkedOutputLoss + compile: half chunks saved
    CHUNKED_NO_UPCAST = "chunked-no-upcast"  # litgpt lm_head_chunk_size + chunked_cross_entropy, logits' dtype
    CHUNKED_LOSS_COMPILED = "chunked-loss-compiled"  # axolotl chunked_cross_entropy: whole head, compiled loss chunks

    @property
    def fused(self) -> bool:
        """Is the loss computed by other code than transformers' (its terms: :mod:`oomlab.budget.loss_kernels`)?"""
        return self is not Loss.STANDARD

    @property
    def chunked(self) -> bool:
        """Does the loss run over chunks of positions with plain torch ops (the logits still exist, chunk by chunk)?"""
        return self in (Loss.CHUNKED, Loss.CHUNKED_COMPILED, Loss.CHUNKED_NO_UPCAST, Loss.CHUNKED_LOSS_COMPILED)


class BaseDtype(Choice):
    """The dtype LoRA's frozen base weights are stored in, as ``from_pretrained`` loaded them (full fine-tuning's
    weights follow :class:`Precision`).

    - ``half``: the precision's half dtype (``torch_dtype=torch.bfloat16`` / ``float16``, or transformers 5's
      ``dtype="auto"`` over a half checkpoint): 2 bytes per frozen parameter.
    - ``float32``: loaded in fp32 -- transformers 4.x without ``torch_dtype``, TRL's ``ModelConfig`` ``dtype``
      ``float32``: 4 bytes per frozen parameter; under autocast each frozen projection's half copy is made per op
      and kept for the input gradient, and the fp32 embedding and norms make the residual stream fp32.
    """

    HALF = "half"  # the precision's half dtype
    FP32 = "float32"  # from_pretrained's fp32 default (transformers 4.x without torch_dtype)


class Route(Choice):
    """How one training run lays the model out over the GPUs of a node."""

    PROCESS_PER_GPU = "process-per-gpu"  # a process per GPU (torchrun / accelerate launch); the strategy decides
    DEVICE_MAP = "device-map"  # one process; accelerate's device_map="auto" puts whole layers on successive GPUs


class Device(Choice):
    """Where the reproduction runs ``model.to("cuda")``."""

    AUTO = "auto"  # cuda when available, else simulated
    SIMULATED = "simulated"  # the caching-allocator model on fake CUDA tensors (no GPU needed)
    CUDA = "cuda"  # a real CUDA device, capped to the chosen GPU's capacity


class MessageFormat(Choice):
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


def plain(value: Any) -> Any:
    """``value`` as output writes it (JSON, tables): a choice (any enum member) as its name, anything else as is."""
    return value.value if isinstance(value, enum.Enum) else value
