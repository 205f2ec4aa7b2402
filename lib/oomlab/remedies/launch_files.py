"""The contents of the launch files: accelerate configs, a DeepSpeed ZeRO-3 offload JSON, the training script, and
which files launch which kind of remedy.  :mod:`.launch_dir` writes them for a plan, with the exact commands.

The accelerate configs are what ``accelerate config`` would write (and load with accelerate's own
``load_config_from_file``); the DeepSpeed JSON has concrete values (no ``"auto"``), so DeepSpeed's own
``DeepSpeedConfig`` accepts it as is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oomlab.core.choices import Route, Strategy
from oomlab.core.paths import OUTPUTS_DIR

CONFIGS_DIR = OUTPUTS_DIR / "configs"
TRAIN_SCRIPT = "train.py"
LAUNCH_DOC = "LAUNCH.md"
FSDP = "accelerate_fsdp.yaml"
FSDP_OFFLOAD = "accelerate_fsdp_offload.yaml"
DDP = "accelerate_ddp.yaml"
DS_JSON = "deepspeed_zero3_offload.json"
DS_ACCELERATE = "accelerate_deepspeed_zero3_offload.yaml"
ALL_FILES = (FSDP, FSDP_OFFLOAD, DDP, DS_JSON, DS_ACCELERATE, TRAIN_SCRIPT, LAUNCH_DOC)
DECODER_LAYER = {"llama": "LlamaDecoderLayer", "mistral": "MistralDecoderLayer"}


ACCELERATE_CONFIG = {Strategy.FSDP: FSDP, Strategy.FSDP_OFFLOAD: FSDP_OFFLOAD, Strategy.DDP: DDP}


def files_for(route: Route, strategy: Strategy) -> tuple[str, ...]:
    """The files that launch a remedy of this route and strategy (none where no config is written)."""
    common = (TRAIN_SCRIPT, LAUNCH_DOC)
    if route is Route.DEVICE_MAP:
        return ()  # no config written (see LAUNCH.md)
    if strategy is Strategy.FSDP:
        return (FSDP, *common)
    if strategy is Strategy.FSDP_OFFLOAD:
        return (FSDP_OFFLOAD, DS_JSON, DS_ACCELERATE, *common)
    if strategy is Strategy.DDP:
        return (DDP, *common)
    if strategy is Strategy.SINGLE:
        return common
    return ()  # zero1/zero2: no config written (see LAUNCH.md)


@dataclass(frozen=True)
class LaunchSettings:
    """What the configs are written for."""

    num_processes: int = 4
    num_machines: int = 1
    mixed_precision: str = "fp16"  # "fp16" on a T4 (no bf16); "bf16" where the GPU has it
    decoder_layer: str = "LlamaDecoderLayer"
    batch: int = 1  # micro-batch per GPU (DeepSpeed needs a number)


def accelerate_fsdp_config(settings: LaunchSettings, offload: bool) -> dict[str, Any]:
    """accelerate FSDP2 full shard, fp16 mixed precision, decoder layers auto-wrapped, optional CPU offload."""
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "mixed_precision": settings.mixed_precision,
        "num_machines": settings.num_machines,
        "num_processes": settings.num_processes,
        "machine_rank": 0,
        "main_training_function": "main",
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
        "downcast_bf16": "no",
        "fsdp_config": {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": True,  # FSDP2's full shard (ZeRO-3): free gathered weights after forward
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": settings.decoder_layer,
            "fsdp_offload_params": offload,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,  # rank 0 loads the weights; the others get them by broadcast
            "fsdp_activation_checkpointing": False,  # train.py --checkpointing uses transformers' own
        },
    }


def accelerate_ddp_config(settings: LaunchSettings) -> dict[str, Any]:
    return {
        "compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU",
        "mixed_precision": settings.mixed_precision, "num_machines": settings.num_machines,
        "num_processes": settings.num_processes, "machine_rank": 0, "main_training_function": "main",
        "rdzv_backend": "static", "same_network": True, "use_cpu": False, "downcast_bf16": "no", "gpu_ids": "all",
    }


def deepspeed_zero3_offload(settings: LaunchSettings) -> dict[str, Any]:
    """DeepSpeed ZeRO stage 3, parameters and optimizer state offloaded to CPU, fp16 with dynamic loss scaling."""
    world = settings.num_processes * settings.num_machines
    half = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
            "hysteresis": 2, "min_loss_scale": 1}
    return {
        "train_micro_batch_size_per_gpu": settings.batch,
        "gradient_accumulation_steps": 1,
        "train_batch_size": settings.batch * world,
        "gradient_clipping": 1.0,
        "fp16" if settings.mixed_precision == "fp16" else "bf16": half if settings.mixed_precision == "fp16"
        else {"enabled": True},
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "cpu", "pin_memory": True},
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "overlap_comm": True,
            "contiguous_gradients": True,
            "reduce_bucket_size": 50_000_000,
            "stage3_prefetch_bucket_size": 50_000_000,
            "stage3_param_persistence_threshold": 100_000,
            "stage3_gather_16bit_weights_on_model_save": True,
        },
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }


def accelerate_deepspeed_config(settings: LaunchSettings) -> dict[str, Any]:
    return {
        "compute_environment": "LOCAL_MACHINE", "distributed_type": "DEEPSPEED",
        "deepspeed_config": {"deepspeed_config_file": DS_JSON, "zero3_init_flag": True},
        "num_machines": settings.num_machines, "num_processes": settings.num_processes, "machine_rank": 0,
        "main_training_function": "main", "rdzv_backend": "static", "same_network": True, "use_cpu": False,
    }


def launch_doc(commands: list[tuple[str, str]], settings: LaunchSettings) -> str:
    lines = [
        "# Launching the remedies", "",
        "Written by oomlab. Run the commands from this folder on the GPU machine (`pip install torch transformers "
        "accelerate peft bitsandbytes`; `deepspeed` for the DeepSpeed route). `--data FILE.txt` trains on a text "
        "file; without it `train.py` feeds random tokens (a memory and speed check). Each step prints its loss, "
        "tokens/s and `torch.cuda.max_memory_allocated`.", "",
        f"Configs: {settings.num_processes} processes, mixed precision {settings.mixed_precision}, decoder layer "
        f"`{settings.decoder_layer}` wrapped by FSDP.", "",
    ]
    for title, command in commands:
        lines += [f"## {title}", "", "```", command, "```", ""]
    lines += [
        "## DeepSpeed ZeRO-3 with CPU offload (the alternative to FSDP offload)", "",
        "```", f"accelerate launch --config_file {DS_ACCELERATE} {TRAIN_SCRIPT} --method lora --checkpointing "
        f"--seq 2048 --batch 1",
        "```", "",
        "ZeRO-1/2 and `device_map=\"auto\"` have no config here: ZeRO-2 keeps a full half replica per GPU, and "
        "device_map runs one GPU at a time.", "",
    ]
    return "\n".join(lines)
