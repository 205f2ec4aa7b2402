"""What each kind of launch file and flag means to oomlab: the keys and flags it models, and the names users type
mapped to oomlab's choices.  Everything else a file or command holds is listed as not modelled."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable

from oomlab.core.choices import Optimizer, Precision
from oomlab.launch.memory_flags import KEYS as MEMORY_FLAG_KEYS
from oomlab.launch.origin import OriginKind, Unmodelled
from oomlab.remedies.deepspeed_configs import ACCELERATE_MIXED_PRECISION

TRANSFORMERS = "transformers 5.24"  # the installed releases whose defaults fill what the user left out
ACCELERATE = "accelerate 1.15"
DEEPSPEED = "deepspeed 0.19.8"
PEFT = "peft 0.21"

# DeepSpeed JSON keys that enter the budget (oomlab.budget.deepspeed_config reads them)
DEEPSPEED_KEYS = frozenset({
    "fp16.enabled", "bf16.enabled", "optimizer.type", "train_micro_batch_size_per_gpu", "data_types.grad_accum_dtype",
    "train_batch_size", "gradient_accumulation_steps",  # the batch arithmetic (oomlab.launch.batch)
    *(f"zero_optimization.{k}" for k in (
        "stage", "offload_optimizer.device", "offload_param.device", "reduce_bucket_size", "allgather_bucket_size",
        "overlap_comm", "contiguous_gradients", "stage3_max_live_parameters", "stage3_max_reuse_distance",
        "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold", "sub_group_size")),
})

# TrainingArguments (and TRL SFTConfig / ModelConfig) names, as JSON keys or as --flags of a transformers-style script
BATCH_KEYS = ("per_device_train_batch_size", "micro_batch_size")  # the second: axolotl's, alpaca-lora's finetune.py
ACCUMULATION_KEYS = ("gradient_accumulation_steps",)  # read for a DeepSpeed JSON's batch arithmetic
SEQ_KEYS = ("max_seq_length", "max_length", "model_max_length", "block_size", "max_seq_len", "seq_length",
            "cutoff_len", "sequence_len", "seq_len", "context_length")  # cutoff_len: LLaMA-Factory's, alpaca-lora's
# a script that truncates the prompt and the answer apart (LLaMA-Factory before 0.5, ChatGLM-Tuning): their sum
SOURCE_TARGET_KEYS = ("max_source_length", "max_target_length")
CHECKPOINTING_KEYS = ("gradient_checkpointing", "activation_checkpointing")  # the second: 5.x's new name
OPTIM_KEYS = ("optim",)
DEEPSPEED_ARG_KEYS = ("deepspeed",)
FSDP_KEYS = ("fsdp",)
FSDP_CONFIG_KEYS = ("fsdp_config",)
ATTENTION_KEYS = ("attn_implementation",)
DTYPE_KEYS = ("torch_dtype", "dtype")
MODEL_KEYS = ("model_name_or_path", "model_name", "model_id", "base_model")
PEFT_KEYS = ("use_peft",)
LORA_RANK_KEYS = ("lora_r", "lora_rank")
LORA_ALPHA_KEYS = ("lora_alpha",)
LORA_TARGET_KEYS = ("lora_target_modules",)
QUANT_4BIT_KEYS = ("load_in_4bit",)
QUANT_8BIT_KEYS = ("load_in_8bit",)
TRAINING_KEYS = frozenset({"fp16", "bf16", *BATCH_KEYS, *SEQ_KEYS, *CHECKPOINTING_KEYS, *OPTIM_KEYS,
                           *DEEPSPEED_ARG_KEYS, *FSDP_KEYS, *FSDP_CONFIG_KEYS, *ATTENTION_KEYS, *DTYPE_KEYS,
                           *MODEL_KEYS, *PEFT_KEYS, *LORA_RANK_KEYS, *LORA_ALPHA_KEYS, *LORA_TARGET_KEYS,
                           *QUANT_4BIT_KEYS, *QUANT_8BIT_KEYS, *SOURCE_TARGET_KEYS,
                           "gradient_accumulation_steps",
                           *MEMORY_FLAG_KEYS})  # the loss kernel, refused and listed settings (launch.memory_flags)

# transformers' --optim names (training_args.py OptimizerNames) -> oomlab's optimizer
OPTIM_NAMES: dict[str, Optimizer] = {
    "adamw_torch_fused": Optimizer.ADAMW_FUSED, "adamw_torch": Optimizer.ADAMW,
    "adamw_hf": Optimizer.ADAMW_HF,  # transformers' own AdamW (removed in 5.x): a loop over the parameters
    "adamw_bnb_8bit": Optimizer.ADAMW_8BIT, "adamw_8bit": Optimizer.ADAMW_8BIT,
    "paged_adamw_8bit": Optimizer.ADAMW_8BIT, "sgd": Optimizer.SGD,
    # NB: bitsandbytes' paged 32-bit AdamW keeps two fp32 moments as adamw; paging moves them to the host only under
    # memory pressure, so they are budgeted resident (axolotl's examples/llama-3/qlora.yml uses it)
    "paged_adamw_32bit": Optimizer.ADAMW, "adamw_bnb_32bit": Optimizer.ADAMW,
}

# accelerate config (``accelerate config`` YAML) keys that enter the setup
ACCELERATE_KEYS = frozenset({
    "distributed_type", "num_processes", "num_machines", "mixed_precision", "gpu_ids",
    "deepspeed_config.deepspeed_config_file", "deepspeed_config.zero_stage", "deepspeed_config.zero3_init_flag",
    "deepspeed_config.offload_optimizer_device", "deepspeed_config.offload_param_device",
    "deepspeed_config.gradient_accumulation_steps", "fsdp_config.fsdp_version", "fsdp_config.fsdp_offload_params",
    "fsdp_config.fsdp_activation_checkpointing", "fsdp_config.fsdp_sharding_strategy",
    "fsdp_config.fsdp_reshard_after_forward",
})
# keys every ``accelerate config`` writes that change nothing in memory (listed as such, not as unknown)
ACCELERATE_HARMLESS = frozenset({
    "compute_environment", "machine_rank", "main_training_function", "rdzv_backend", "same_network", "tpu_env",
    "tpu_use_cluster", "tpu_use_sudo", "use_cpu", "downcast_bf16", "main_process_ip", "main_process_port",
    "debug", "enable_cpu_affinity",
})
# accelerate's mixed_precision -> oomlab's precision: the inverse of what oomlab writes for each precision
ACCELERATE_MIXED: dict[str, Precision] = {name: p for p, name in ACCELERATE_MIXED_PRECISION.items()}

# peft adapter_config.json keys that enter the setup
ADAPTER_KEYS = frozenset({"peft_type", "r", "lora_alpha", "target_modules"})
# quantization_config keys that enter the setup
QUANT_KEYS = frozenset({"load_in_4bit", "load_in_8bit", "quant_method", "bnb_4bit_quant_type",
                        "bnb_4bit_use_double_quant"})

# launcher options that enter the setup, by launcher value
LAUNCHER_OPTIONS = {
    "torchrun": {"--nproc_per_node", "--nproc-per-node", "--nnodes"},
    "accelerate launch": {"--config_file", "--num_processes", "--num_machines", "--multi_gpu", "--use_deepspeed",
                          "--use_fsdp", "--mixed_precision", "--deepspeed_config_file", "--zero_stage",
                          "--zero3_init_flag", "--offload_optimizer_device", "--offload_param_device",
                          "--fsdp_version", "--fsdp_offload_params", "--gpu_ids"},
    "deepspeed": {"--num_gpus", "--num_accelerators", "--num_nodes", "--num_node", "--hostfile", "-H", "--include"},
    "python": set(), "llamafactory-cli": set(), "axolotl": set(), "trl": {"--num_processes"},
    "tune run": {"--nproc_per_node", "--nproc-per-node", "--nnodes"},
}


class MemoryEffect(enum.IntEnum):
    """How much a key oomlab did not read could change GPU memory; the replies list unread keys in this order."""

    BATCH = 0  # the micro-batch (or what multiplies into it): activations scale with it
    SEQUENCE = 1  # the sequence length, packing: activations (and attention's s x s) scale with it
    METHOD = 2  # full fine-tuning, an adapter, a trainer with reference / reward models: which states exist
    PRECISION = 3  # the dtype of weights, activations and optimizer states
    WORLD = 4  # processes and nodes: every sharded figure divides by the world size
    SHARDING = 5  # ZeRO stages, FSDP, offload, buckets: which states each GPU holds
    QUANTIZATION = 6  # a 4- or 8-bit base
    CHECKPOINTING = 7  # activation recomputation
    ATTENTION = 8  # the attention kernel (whether s x s probabilities are saved)
    OPTIMIZER = 9  # the optimizer's states per parameter
    OTHER = 10  # not known to oomlab either way
    HARMLESS = 11  # logging, saving, evaluation cadence, output paths, schedules: no GPU memory


# the first pattern (in MemoryEffect order) found in a key's name decides; names are lower case, "-" as "_"
_EFFECT_PATTERNS: tuple[tuple[MemoryEffect, re.Pattern[str]], ...] = tuple(
    (effect, re.compile(pattern)) for effect, pattern in (
        (MemoryEffect.BATCH, r"batch|accumulation"),
        (MemoryEffect.SEQUENCE, r"seq|length|_len\b|^len\b|cutoff|block_size|context|packing|max_tokens"),
        (MemoryEffect.METHOD, r"lora|peft|adapter|finetuning_type|freeze|target_modules|dora|modules_to_save|"
                              r"ref_model|reward|value_model|dpo|orpo|kto|grpo|ppo|num_generations|trainer"),
        (MemoryEffect.PRECISION, r"fp16|bf16|fp32|fp8|dtype|precision|half|\bamp\b"),
        (MemoryEffect.WORLD, r"nproc|nnodes|num_nodes?\b|num_gpus|num_accelerators|num_processes|num_machines|"
                             r"world_size|hostfile|^h$|^include$|^exclude$|gpu_ids|slurm"),
        (MemoryEffect.SHARDING, r"zero|offload|fsdp|deepspeed|stage3|bucket|shard|tensor_parallel|tp_size|"
                                r"pipeline|sub_group"),
        (MemoryEffect.QUANTIZATION, r"quant|4bit|8bit|bnb|nf4|gptq|awq"),
        (MemoryEffect.CHECKPOINTING, r"checkpointing|recompute|use_reentrant"),
        (MemoryEffect.ATTENTION, r"attn|attention"),
        (MemoryEffect.OPTIMIZER, r"^optim\b|^optim_|^optimizer(\.type)?$|galore|paged"),
        (MemoryEffect.HARMLESS, r"log|report_to|save|eval|output_dir|seed|hub|run_name|wandb|tensorboard|print|"
                                r"wall_clock|resume|overwrite|do_train|do_predict|epoch|max_steps|learning_rate|"
                                r"(^|\.)lr$|warmup|scheduler|weight_decay|beta|eps(ilon)?$|grad_norm|clipping|"
                                r"master_port|master_addr|rdzv|profiler|dataloader|num_workers|tqdm|"
                                r"remove_unused_columns|label_names|compute_environment|machine_rank|debug|plot"),
    ))


def memory_effect(name: str) -> MemoryEffect:
    """The effect on memory a key or flag named ``name`` (``--per_device_eval_batch_size``,
    ``zero_optimization.offload_param.pin_memory``, ``logging_steps``) could have."""
    text = name.strip().lstrip("-").lower().replace("-", "_")
    return next((effect for effect, pattern in _EFFECT_PATTERNS if pattern.search(text)), MemoryEffect.OTHER)


def unmodelled_effect(item: Unmodelled) -> MemoryEffect:
    """A key read but not modelled, by its name (a file's key, a flag's name); a key said to change nothing is
    harmless whatever its name."""
    if item.why == "does not change GPU memory":
        return MemoryEffect.HARMLESS
    origin = item.origin
    name = origin.key if origin.kind is OriginKind.FILE else (origin.where.split() or [""])[0]
    return memory_effect(name.split("=")[0])


def ranked(items: Iterable[Unmodelled]) -> tuple[Unmodelled, ...]:
    """``items`` with those that could change memory most first (read order kept within one effect)."""
    return tuple(sorted(items, key=unmodelled_effect))
