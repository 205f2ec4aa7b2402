"""The contents of the launch files: one accelerate config per launchable strategy, a DeepSpeed ZeRO-3 offload JSON,
the training script, and which files launch which kind of remedy.  :mod:`.launch_dir` writes them for a plan, with
the exact commands.

Each accelerate config is what ``accelerate config`` would write for that launch (and loads with accelerate's own
``load_config_from_file``); the DeepSpeed JSON has concrete values (no ``"auto"``), so DeepSpeed's own
``DeepSpeedConfig`` accepts it as is.

Which file launches which :class:`~oomlab.core.choices.Strategy`:

- ``accelerate_fsdp.yaml`` → ``fsdp``: FSDP1 ``FullyShardedDataParallel``, FULL_SHARD, decoder layers wrapped;
- ``accelerate_fsdp_offload.yaml`` → ``fsdp-offload``: the same with ``CPUOffload(offload_params=True)``;
- ``accelerate_fsdp2.yaml`` → ``fsdp2``: FSDP2 ``fully_shard`` per decoder layer and the root;
- ``accelerate_fsdp2_offload.yaml`` → ``fsdp2-offload``: the same with ``CPUOffloadPolicy``;
- ``accelerate_ddp.yaml`` → ``ddp``: ``DistributedDataParallel``;
- no config → ``single``: ``accelerate launch --num_processes 1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oomlab.core.choices import Route, Strategy
from oomlab.core.paths import OUTPUTS_DIR

CONFIGS_DIR = OUTPUTS_DIR / "configs"
TRAIN_SCRIPT = "train.py"
LAUNCH_DOC = "LAUNCH.md"
FSDP = "accelerate_fsdp.yaml"  # Strategy.FSDP: accelerate's default FSDP (fsdp_version 1)
FSDP_OFFLOAD = "accelerate_fsdp_offload.yaml"  # Strategy.FSDP_OFFLOAD: FSDP1 with fsdp_offload_params
FSDP2 = "accelerate_fsdp2.yaml"  # Strategy.FSDP2: fsdp_version 2
FSDP2_OFFLOAD = "accelerate_fsdp2_offload.yaml"  # Strategy.FSDP2_OFFLOAD: FSDP2 with fsdp_offload_params
DDP = "accelerate_ddp.yaml"  # Strategy.DDP: MULTI_GPU
DS_JSON = "deepspeed_zero3_offload.json"  # the alternative to FSDP offload: DeepSpeed ZeRO-3, params + optimizer on CPU
DS_ACCELERATE = "accelerate_deepspeed_zero3_offload.yaml"  # the accelerate config that points at DS_JSON
DECODER_LAYER = {"llama": "LlamaDecoderLayer", "mistral": "MistralDecoderLayer"}

# The accelerate config of every launchable strategy; SINGLE has none (``accelerate launch --num_processes 1``),
# ZERO1/ZERO2 have none yet.
ACCELERATE_CONFIG: dict[Strategy, str] = {
    Strategy.FSDP: FSDP, Strategy.FSDP_OFFLOAD: FSDP_OFFLOAD, Strategy.FSDP2: FSDP2,
    Strategy.FSDP2_OFFLOAD: FSDP2_OFFLOAD, Strategy.DDP: DDP,
}
ALL_FILES = (*ACCELERATE_CONFIG.values(), DS_JSON, DS_ACCELERATE, TRAIN_SCRIPT, LAUNCH_DOC)


def files_for(route: Route, strategy: Strategy) -> tuple[str, ...]:
    """The files that launch a remedy of this route and strategy (none where no config is written).

    An offloading FSDP remedy also gets the DeepSpeed ZeRO-3 offload files, its alternative.
    """
    common = (TRAIN_SCRIPT, LAUNCH_DOC)
    if route is Route.DEVICE_MAP:
        return ()  # no config written (see LAUNCH.md)
    if strategy is Strategy.SINGLE:
        return common
    config = ACCELERATE_CONFIG.get(strategy)
    if config is None:
        return ()  # zero1/zero2: no config written (see LAUNCH.md)
    alternative = (DS_JSON, DS_ACCELERATE) if strategy.offloads else ()
    return (config, *alternative, *common)


@dataclass(frozen=True)
class LaunchSettings:
    """What the configs are written for."""

    num_processes: int = 4
    num_machines: int = 1
    mixed_precision: str = "fp16"  # accelerate's name: "fp16" on a T4 (no bf16), "bf16" where the GPU has it, "no"
    decoder_layer: str = "LlamaDecoderLayer"
    batch: int = 1  # micro-batch per GPU (DeepSpeed needs a number)


def _launch_common(settings: LaunchSettings, distributed_type: str) -> dict[str, Any]:
    """The keys ``accelerate config`` writes for every local multi-process launch."""
    return {
        "compute_environment": "LOCAL_MACHINE", "distributed_type": distributed_type,
        "mixed_precision": settings.mixed_precision, "num_machines": settings.num_machines,
        "num_processes": settings.num_processes, "machine_rank": 0, "main_training_function": "main",
        "rdzv_backend": "static", "same_network": True, "use_cpu": False, "downcast_bf16": "no",
    }


def accelerate_fsdp_config(settings: LaunchSettings, offload: bool) -> dict[str, Any]:
    """``fsdp`` / ``fsdp-offload``: FSDP1, what ``accelerate config`` writes with its defaults.

    FULL_SHARD, BACKWARD_PRE prefetch, no forward prefetch, ``use_orig_params``, the decoder layers auto-wrapped,
    rank 0 loading the weights (``cpu_ram_efficient_loading``, which needs ``sync_module_states``: accelerate's
    launcher refuses the one without the other, accelerate/utils/launch.py ``prepare_multi_gpu_env``).
    """
    return {**_launch_common(settings, "FSDP"), "fsdp_config": {
        "fsdp_version": 1,
        "fsdp_reshard_after_forward": "FULL_SHARD",  # FSDP1's sharding strategy (ZeRO-3)
        "fsdp_offload_params": offload,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": settings.decoder_layer,
        "fsdp_backward_prefetch": "BACKWARD_PRE",
        "fsdp_state_dict_type": "FULL_STATE_DICT",
        "fsdp_forward_prefetch": False,
        "fsdp_use_orig_params": True,  # the parameters the optimizer was built on stay the model's
        "fsdp_cpu_ram_efficient_loading": True,  # rank 0 loads the weights; FSDP broadcasts them unit by unit
        "fsdp_sync_module_states": True,
        "fsdp_activation_checkpointing": False,  # train.py --checkpointing uses transformers' own
    }}


def accelerate_fsdp2_config(settings: LaunchSettings, offload: bool) -> dict[str, Any]:
    """``fsdp2`` / ``fsdp2-offload``: FSDP2 (``fully_shard``), resharded after forward, decoder layers wrapped."""
    return {**_launch_common(settings, "FSDP"), "fsdp_config": {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": True,  # FSDP2's full shard (ZeRO-3): free gathered weights after forward
        "fsdp_offload_params": offload,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": settings.decoder_layer,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_cpu_ram_efficient_loading": True,  # rank 0 loads the weights; the others get them by broadcast
        "fsdp_activation_checkpointing": False,  # train.py --checkpointing uses transformers' own
    }}


def accelerate_ddp_config(settings: LaunchSettings) -> dict[str, Any]:
    """``ddp``: one full replica per GPU (MULTI_GPU)."""
    return {**_launch_common(settings, "MULTI_GPU"), "gpu_ids": "all"}


def accelerate_config(strategy: Strategy, settings: LaunchSettings) -> dict[str, Any]:
    """The accelerate config written to ``ACCELERATE_CONFIG[strategy]``."""
    if strategy is Strategy.DDP:
        return accelerate_ddp_config(settings)
    if strategy in (Strategy.FSDP, Strategy.FSDP_OFFLOAD):
        return accelerate_fsdp_config(settings, offload=strategy.offloads)
    if strategy in (Strategy.FSDP2, Strategy.FSDP2_OFFLOAD):
        return accelerate_fsdp2_config(settings, offload=strategy.offloads)
    raise ValueError(f"strategy {strategy.value!r} has no accelerate config; those with one: "
                     f"{', '.join(s.value for s in ACCELERATE_CONFIG)}")


def deepspeed_zero3_offload(settings: LaunchSettings) -> dict[str, Any]:
    """DeepSpeed ZeRO stage 3, parameters and optimizer state offloaded to CPU, half precision as the settings say
    (fp16 with dynamic loss scaling, or bf16).

    ``train.py`` hands DeepSpeed its own torch optimizer (the one oomlab budgeted); DeepSpeed refuses a client
    optimizer under optimizer offload unless ``zero_force_ds_cpu_optimizer`` is false
    (deepspeed/runtime/engine.py:2342-2346 in DeepSpeed 0.19, ``_configure_optimizer``), so it is: the offloaded
    step runs that torch optimizer on the host.
    """
    world = settings.num_processes * settings.num_machines
    precision: dict[str, Any] = {}
    if settings.mixed_precision == "fp16":
        precision = {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                              "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}}
    elif settings.mixed_precision == "bf16":
        precision = {"bf16": {"enabled": True}}
    return {
        "train_micro_batch_size_per_gpu": settings.batch,
        "gradient_accumulation_steps": 1,
        "train_batch_size": settings.batch * world,
        "gradient_clipping": 1.0,
        **precision,
        "zero_force_ds_cpu_optimizer": False,
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
    """The accelerate config of the DeepSpeed route: ZeRO-3 from :data:`DS_JSON`, ``zero.Init`` while loading."""
    return {
        "compute_environment": "LOCAL_MACHINE", "distributed_type": "DEEPSPEED",
        "deepspeed_config": {"deepspeed_config_file": DS_JSON, "zero3_init_flag": True},
        "num_machines": settings.num_machines, "num_processes": settings.num_processes, "machine_rank": 0,
        "main_training_function": "main", "rdzv_backend": "static", "same_network": True, "use_cpu": False,
    }


CONFIG_ROWS = (
    (FSDP, Strategy.FSDP, "FSDP1 (`fsdp_version: 1`, accelerate's default): FullyShardedDataParallel FULL_SHARD, "
     "each decoder layer its own unit, accelerate's autocast around the forward (with mixed precision)"),
    (FSDP_OFFLOAD, Strategy.FSDP_OFFLOAD, "the same, sharded parameters, gradients and optimizer step on the host"),
    (FSDP2, Strategy.FSDP2, "FSDP2 (`fsdp_version: 2`): `fully_shard` per decoder layer and the root, "
     "MixedPrecisionPolicy, no autocast"),
    (FSDP2_OFFLOAD, Strategy.FSDP2_OFFLOAD, "the same with CPUOffloadPolicy"),
    (DDP, Strategy.DDP, "DistributedDataParallel: a full replica per GPU"),
)


def launch_doc(commands: list[tuple[str, str]], settings: LaunchSettings, *, model_id: str = "PATH/TO/MODEL",
               seq: int = 2048) -> str:
    """LAUNCH.md: the configs, what each launches, and the exact commands of the chosen remedies."""
    machines = "1 machine" if settings.num_machines == 1 else f"{settings.num_machines} machines"
    lines = [
        "# Launching the remedies", "",
        "Written by oomlab. Run the commands from this folder on the GPU machine (`pip install torch transformers "
        "accelerate peft bitsandbytes`; `deepspeed` for the DeepSpeed route). `--data FILE.txt` trains on a text "
        "file; without it `train.py` feeds random tokens (a memory and speed check). After the first step "
        "`train.py` prints what accelerate prepared (distributed type, wrapped model class, whether the forward runs "
        "under accelerate's autocast); each step prints its loss, tokens/s and `torch.cuda.max_memory_allocated`.", "",
        f"Configs: {settings.num_processes} processes per machine on {machines}, mixed precision "
        f"{settings.mixed_precision} (each command below sets its own with `--mixed_precision`), FSDP wraps each "
        f"`{settings.decoder_layer}`.", "",
        "| config | strategy | what accelerate builds |", "|---|---|---|",
        *(f"| `{name}` | `{strategy.value}` | {what} |" for name, strategy, what in CONFIG_ROWS),
        "| (none: `--num_processes 1`) | `single` | the model on one GPU |", "",
    ]
    for title, command in commands:
        lines += [f"## {title}", "", "```", command, "```", ""]
    lines += [
        "## DeepSpeed ZeRO-3 with CPU offload (the alternative to FSDP offload)", "",
        "```", f"accelerate launch --config_file {DS_ACCELERATE} {TRAIN_SCRIPT} --model {model_id} --method lora "
        f"--checkpointing --seq {seq} --batch {settings.batch}",
        "```", "",
        "ZeRO-1/2 remedies have no config here. `device_map=\"auto\"` remedies have none either: they run as one "
        "process that puts whole layers on successive GPUs (one GPU busy at a time), which `train.py` does not do.",
        "",
    ]
    return "\n".join(lines)
