"""One set of defaults for every entry point, and the one rule for the launch a world size implies.

``oomlab.estimate()``, ``python -m oomlab budget`` / ``plan`` / ``check``, the pipeline's parameters and the
explorer's controls all start from :data:`DEFAULTS`: the seed's case (llama-13b in float16 on 4 × T4, a replica per
GPU, full fine-tuning at 1 × 2048 tokens).  Called with nothing, each of them answers for the same run.

:func:`launch_strategy` is the rule every entry point applies to the strategy it was given: none given means
:attr:`SetupDefaults.strategy` (a replica per GPU), and a replica per GPU over one process is that one process
(``ddp`` on one GPU is ``single``: accelerate's ``distributed_type`` is ``NO`` for one process, and the budget of a
one-rank DDP is the one GPU's).
"""

from __future__ import annotations

from dataclasses import dataclass

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
from oomlab.core.seed import SEED_DTYPE, SEED_GPU, SEED_GPUS, SEED_MODEL

__all__ = ["DEFAULTS", "DEFAULT_LORA_ALPHA", "DEFAULT_LORA_TARGETS", "SetupDefaults", "launch_strategy"]

# LLaMA's names for the attention projections; in a family that names them otherwise (GPT-NeoX's query_key_value and
# dense, Phi-3's qkv_proj and o_proj, ...) the default means that family's attention projections
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
DEFAULT_LORA_ALPHA = 16  # scales the adapter's update, changes no memory (peft's LoraConfig default is 8)


@dataclass(frozen=True)
class SetupDefaults:
    """What every entry point assumes for what the user did not give."""

    model: str = SEED_MODEL
    dtype: str = SEED_DTYPE  # the storage dtype from_pretrained loads
    gpu: str = SEED_GPU
    gpus: int = SEED_GPUS  # GPUs per node
    nodes: int = 1
    strategy: Strategy = Strategy.DDP  # a replica per GPU, as the seed ran (one process on one GPU: launch_strategy)
    method: Method = Method.FULL
    precision: Precision = Precision.FP16_MIXED
    optimizer: Optimizer = Optimizer.ADAMW
    batch: int = 1  # micro-batch per GPU
    seq: int = 2048  # tokens per sequence
    checkpointing: bool = False
    attention: Attention = Attention.SDPA
    lora_rank: int = 8
    lora_alpha: int = DEFAULT_LORA_ALPHA
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS
    trainer: Trainer = Trainer.SFT  # the training loop: supervised fine-tuning (transformers' Trainer / SFTTrainer)
    reference: Reference = Reference.DEFAULT  # the trainer's reference model as its config defaults it
    loss: Loss = Loss.STANDARD  # transformers' loss over materialised logits (no Liger, no Cut Cross-Entropy)
    offload_activations: bool = False  # saved activations kept on the GPU (TRL's activation_offloading off)
    base_dtype: BaseDtype = BaseDtype.HALF  # LoRA's frozen base stored in the precision's half dtype, as loaded
    optimizer_in_backward: bool = False  # one optimizer.step() after backward (not torchtune's optimizer_in_bwd)


DEFAULTS = SetupDefaults()


def launch_strategy(strategy: str | Strategy | None, world_size: int) -> Strategy:
    """The strategy a run over ``world_size`` processes launches: ``strategy`` as given (a name is checked), none
    given the default (:attr:`SetupDefaults.strategy`), and ``ddp`` over one process ``single``."""
    given = DEFAULTS.strategy if strategy is None else choice(Strategy, strategy, "strategy")
    return Strategy.SINGLE if given is Strategy.DDP and world_size == 1 else given
