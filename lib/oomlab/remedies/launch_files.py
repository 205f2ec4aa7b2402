"""The contents of the launch files: one accelerate config per launchable strategy, a DeepSpeed JSON and the accelerate
config that uses it per DeepSpeed ZeRO remedy (:mod:`.deepspeed_configs`), the training script, and which files launch
which remedy.  :mod:`.launch_writer` writes them for a plan, with the exact commands.

Each accelerate config is what ``accelerate config`` would write for that launch (and loads with accelerate's own
``load_config_from_file``); each DeepSpeed JSON has concrete values (no ``"auto"``), so DeepSpeed's own
``DeepSpeedConfig`` accepts it as is.  FSDP wraps the model family's own decoder layer, read off the transformers
model class (:func:`decoder_layer_class`).

Which file launches which :class:`~oomlab.core.choices.Strategy`:

- ``accelerate_fsdp.yaml`` → ``fsdp``: FSDP1 ``FullyShardedDataParallel``, FULL_SHARD, decoder layers wrapped;
- ``accelerate_fsdp_offload.yaml`` → ``fsdp-offload``: the same with ``CPUOffload(offload_params=True)``;
- ``accelerate_fsdp2.yaml`` → ``fsdp2``: FSDP2 ``fully_shard`` per decoder layer and the root;
- ``accelerate_fsdp2_offload.yaml`` → ``fsdp2-offload``: the same with ``CPUOffloadPolicy``;
- ``accelerate_ddp.yaml`` → ``ddp``: ``DistributedDataParallel``;
- ``deepspeed_<strategy>_<precision>_<optimizer>_b<micro-batch>.json`` and ``accelerate_deepspeed_<same>.yaml`` →
  ``zero1``, ``zero2``, ``zero3``, ``zero2-offload``, ``zero3-offload``: ``deepspeed.initialize`` under accelerate;
- no config → ``single``: ``accelerate launch --num_processes 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from oomlab.core.choices import Route, Strategy
from oomlab.core.errors import InvalidValueError
from oomlab.core.models import ModelSpec
from oomlab.core.paths import OUTPUTS_DIR
from oomlab.core.setup import TrainingSetup
from oomlab.core.words import count
from oomlab.remedies import deepspeed_configs

CONFIGS_DIR = OUTPUTS_DIR / "configs"
TRAIN_SCRIPT = deepspeed_configs.TRAIN_SCRIPT
LAUNCH_DOC = "LAUNCH.md"
FSDP = "accelerate_fsdp.yaml"  # Strategy.FSDP: accelerate's default FSDP (fsdp_version 1)
FSDP_OFFLOAD = "accelerate_fsdp_offload.yaml"  # Strategy.FSDP_OFFLOAD: FSDP1 with fsdp_offload_params
FSDP2 = "accelerate_fsdp2.yaml"  # Strategy.FSDP2: fsdp_version 2
FSDP2_OFFLOAD = "accelerate_fsdp2_offload.yaml"  # Strategy.FSDP2_OFFLOAD: FSDP2 with fsdp_offload_params
DDP = "accelerate_ddp.yaml"  # Strategy.DDP: MULTI_GPU
LAUNCH_BATCH_CAP = 8  # the commands launch the largest micro-batch that fits, up to this

# The accelerate config of every launchable strategy but DeepSpeed's (a JSON + config per remedy) and SINGLE (none:
# ``accelerate launch --num_processes 1``).
ACCELERATE_CONFIG: dict[Strategy, str] = {
    Strategy.FSDP: FSDP, Strategy.FSDP_OFFLOAD: FSDP_OFFLOAD, Strategy.FSDP2: FSDP2,
    Strategy.FSDP2_OFFLOAD: FSDP2_OFFLOAD, Strategy.DDP: DDP,
}
ALL_FILES = (*ACCELERATE_CONFIG.values(), TRAIN_SCRIPT, LAUNCH_DOC)  # written for every plan (+ DeepSpeed's per remedy)


def launch_batch(max_batch: int | None) -> int:
    """The micro-batch a command launches: the largest that fits, at most :data:`LAUNCH_BATCH_CAP` (1 if none)."""
    return min(max_batch or 1, LAUNCH_BATCH_CAP)


def files_for(route: Route, setup: TrainingSetup, max_batch: int | None = None,
              accumulation: int = 1) -> tuple[str, ...]:
    """The files that launch ``setup`` on ``route`` (none where no config is written): its strategy's accelerate
    config, or a ZeRO remedy's own DeepSpeed JSON and accelerate config (for the micro-batch launched,
    :func:`launch_batch` of ``max_batch``), then ``train.py`` and ``LAUNCH.md``."""
    common = (TRAIN_SCRIPT, LAUNCH_DOC)
    if route is Route.DEVICE_MAP:
        return ()  # no config written (see LAUNCH.md)
    strategy = setup.strategy
    if strategy is Strategy.SINGLE:
        return common
    if strategy.deepspeed:
        if setup.precision not in deepspeed_configs.ACCELERATE_MIXED_PRECISION:
            return ()
        return (*deepspeed_configs.file_names(replace(setup, batch=launch_batch(max_batch)), accumulation), *common)
    config = ACCELERATE_CONFIG.get(strategy)
    return () if config is None else (config, *common)


@lru_cache(maxsize=64)
def decoder_layer_class(spec: ModelSpec) -> str:
    """The decoder-layer class FSDP wraps for ``spec``'s family: transformers' causal-LM class for its ``model_type``
    (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``), its ``_no_split_modules`` (``MistralDecoderLayer``, ``GPTNeoXLayer``...;
    accelerate takes a comma-separated list)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(spec.model_type)
    classes = getattr(getattr(transformers, name), "_no_split_modules", None) if name else None
    if not classes:
        raise InvalidValueError(f"model {spec.name!r} ({spec.model_type}): transformers names no decoder layer to wrap "
                         f"(causal-LM class {name!r} has no _no_split_modules)")
    return ",".join(classes)


@dataclass(frozen=True)
class LaunchSettings:
    """What the configs are written for."""

    num_processes: int = 4
    num_machines: int = 1
    mixed_precision: str = "fp16"  # accelerate's name: "fp16" on a T4 (no bf16), "bf16" where the GPU has it, "no"
    decoder_layer: str = "LlamaDecoderLayer"  # the family's (decoder_layer_class)
    model_id: str = "PATH/TO/MODEL"  # train.py's default --model


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
    raise ValueError(f"strategy {strategy.value!r} has no accelerate config of its own; those with one: "
                     f"{', '.join(s.value for s in ACCELERATE_CONFIG)} (DeepSpeed's: deepspeed_configs)")


CONFIG_ROWS = (
    (FSDP, Strategy.FSDP, "FSDP1 (`fsdp_version: 1`, accelerate's default): FullyShardedDataParallel FULL_SHARD, "
     "each decoder layer its own unit, accelerate's autocast around the forward (with mixed precision)"),
    (FSDP_OFFLOAD, Strategy.FSDP_OFFLOAD, "the same, sharded parameters, gradients and optimizer step on the host"),
    (FSDP2, Strategy.FSDP2, "FSDP2 (`fsdp_version: 2`): `fully_shard` per decoder layer and the root, "
     "MixedPrecisionPolicy, no autocast"),
    (FSDP2_OFFLOAD, Strategy.FSDP2_OFFLOAD, "the same with CPUOffloadPolicy"),
    (DDP, Strategy.DDP, "DistributedDataParallel: a full replica per GPU"),
)


def launch_doc(commands: list[tuple[str, str]], settings: LaunchSettings,
               deepspeed: tuple[tuple[str, str, Strategy, str], ...] = ()) -> str:
    """LAUNCH.md: the configs, what each launches, and the exact commands of the chosen remedies (``deepspeed``:
    ``(json, accelerate config, strategy, what it runs)`` of each ZeRO remedy written)."""
    machines = count(settings.num_machines, "machine")
    lines = [
        "# Launching the remedies", "",
        "Written by oomlab. Run the commands from this folder on the GPU machine (`pip install torch transformers "
        "accelerate peft bitsandbytes`; `deepspeed` for the DeepSpeed remedies). `--data FILE.txt` trains on a text "
        "file; without it `train.py` feeds random tokens (a memory and speed check). After the first step "
        "`train.py` prints what accelerate prepared (distributed type, wrapped model class, whether the forward runs "
        "under accelerate's autocast); each step prints its loss, tokens/s and `torch.cuda.max_memory_allocated`.", "",
        f"Model: `{settings.model_id}` (train.py's default `--model`). Configs: "
        f"{count(settings.num_processes, 'process')} per machine on {machines}, mixed precision "
        f"{settings.mixed_precision} (each command below sets its own with `--mixed_precision`), FSDP wraps each "
        f"`{settings.decoder_layer}`.", "",
        "| config | strategy | what accelerate builds |", "|---|---|---|",
        *(f"| `{name}` | `{strategy.value}` | {what} |" for name, strategy, what in CONFIG_ROWS),
        *(f"| `{yaml_name}` (→ `{json_name}`) | `{strategy.value}` | {what} |"
          for json_name, yaml_name, strategy, what in deepspeed),
        "| (none: `--num_processes 1`) | `single` | the model on one GPU |", "",
    ]
    for title, command in commands:
        lines += [f"## {title}", "", "```", command, "```", ""]
    lines += [
        "Each DeepSpeed remedy has its own JSON (stage, offload, bucket sizes as oomlab budgets them, precision, "
        "micro-batch, optimizer) and the accelerate config that points at it. `device_map=\"auto\"` remedies have "
        "no config: they run as one process that puts whole layers on successive GPUs (one GPU busy at a time), which "
        "`train.py` does not do.", "",
    ]
    return "\n".join(lines)
