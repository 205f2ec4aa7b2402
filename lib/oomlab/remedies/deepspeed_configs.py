"""The launch files of each DeepSpeed ZeRO remedy: its DeepSpeed JSON (concrete values, no ``"auto"``), the accelerate
config that points at it, and the command.

The JSON is what oomlab budgets, knob for knob: the stage and offload devices of the strategy, the ``zero_optimization``
knobs as :func:`oomlab.budget.deepspeed_config.resolve` resolves them (the HF integration's ``"auto"``, written out),
fp16 (dynamic loss scaling) or bf16, the micro-batch, and the optimizer -- ``adamw`` as DeepSpeed's own
``"optimizer": {"type": "AdamW"}`` (FusedAdam, DeepSpeedCPUAdam offloaded: ``deepspeed/runtime/engine.py:2376-2409``;
``train.py`` then hands accelerate a ``DummyOptim``), any other as the client optimizer the training script passes (no
optimizer block; ``zero_allow_untested_optimizer`` for SGD and 8-bit AdamW, ``zero_force_ds_cpu_optimizer: false``
under offload, ``engine.py:2342-2347``).  :func:`oomlab.budget.deepspeed_config.read_deepspeed_config` reads each JSON
back to the same setup and knobs.  ``train_batch_size`` is left for DeepSpeed to derive (micro-batch × accumulation ×
world size), so one JSON loads on any world size.

A JSON differs by the strategy, the precision, the optimizer and the micro-batch, so its file name says all four
(:func:`file_names`): ``deepspeed_zero2_bf16_adamw_b4.json`` beside ``accelerate_deepspeed_zero2_bf16_adamw_b4.yaml``.
"""

from __future__ import annotations

import shlex
from typing import Any

from oomlab.budget.deepspeed_config import (
    DeepSpeedSettings,
    data_types_block,
    precision_block,
    settings_for,
    zero_optimization_block,
)
from oomlab.core.choices import ZERO_STAGES, Loss, Method, Optimizer, Precision
from oomlab.core.setup import TrainingSetup

TRAIN_SCRIPT = "train.py"
# accelerate's --mixed_precision of each precision train.py runs (it keeps fp32 trainable weights, so the pure-half
# precisions have none); oomlab.launch.keys.ACCELERATE_MIXED reads a user's mixed_precision back through it
ACCELERATE_MIXED_PRECISION = {Precision.FP32: "no", Precision.FP16_MIXED: "fp16", Precision.BF16_MIXED: "bf16"}
ADAMW_PARAMS = {"lr": 2e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}  # train.py's defaults


def _require_deepspeed(setup: TrainingSetup) -> None:
    if not setup.strategy.deepspeed:
        raise ValueError(f"strategy {setup.strategy.value!r} is not DeepSpeed; those that are: "
                         f"{', '.join(s.value for s in ZERO_STAGES)}")


def file_names(setup: TrainingSetup, accumulation: int = 1) -> tuple[str, str]:
    """``(DeepSpeed JSON, accelerate config)`` of a ZeRO setup (its ``batch`` is the micro-batch launched,
    ``accumulation`` the micro-batches per optimizer step)."""
    _require_deepspeed(setup)
    precision = ACCELERATE_MIXED_PRECISION.get(setup.precision, setup.precision.value)
    stem = f"{setup.strategy.value.replace('-', '_')}_{'fp32' if precision == 'no' else precision}_" \
           f"{setup.optimizer.value.replace('-', '_')}_b{setup.batch}" + (f"_a{accumulation}" if accumulation > 1
                                                                          else "")
    return f"deepspeed_{stem}.json", f"accelerate_deepspeed_{stem}.yaml"


def deepspeed_json(setup: TrainingSetup, settings: DeepSpeedSettings | None = None,
                   accumulation: int = 1) -> dict[str, Any]:
    """The DeepSpeed JSON that runs ``setup`` (a ``zero*`` strategy) with ``settings`` (default: HF's ``"auto"``)."""
    _require_deepspeed(setup)
    ds = settings_for(setup, settings)
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": setup.batch,
        "gradient_accumulation_steps": accumulation,  # = train.py --accumulation (accelerate checks they match)
        "gradient_clipping": 1.0,
        **precision_block(setup),
        **data_types_block(ds),
        "zero_optimization": zero_optimization_block(setup, settings),
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }
    if setup.optimizer is Optimizer.ADAMW:
        config["optimizer"] = {"type": "AdamW", "params": dict(ADAMW_PARAMS)}
    else:
        if setup.optimizer in (Optimizer.SGD, Optimizer.ADAMW_8BIT):
            config["zero_allow_untested_optimizer"] = True  # not in ZERO_SUPPORTED_OPTIMIZERS (zero/utils.py:45-48)
        if setup.strategy.offloads_optimizer:
            config["zero_force_ds_cpu_optimizer"] = False  # the client optimizer steps on the host
    if setup.strategy.zero_stage == 3:
        config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
    return config


def accelerate_deepspeed_config(setup: TrainingSetup, accumulation: int = 1) -> dict[str, Any]:
    """The accelerate config of a ZeRO remedy: ``distributed_type: DEEPSPEED`` pointing at its JSON, ``zero.Init``
    while loading under stage 3 (``zero3_init_flag``).  No ``mixed_precision`` key: beside ``deepspeed_config_file``
    accelerate refuses one ("the following accelerate config variables will be ignored", accelerate/utils/
    dataclasses.py ``DeepSpeedPlugin._deepspeed_config_checks``); the JSON's fp16/bf16 block decides, and the command's
    ``--mixed_precision`` must match it (``DeepSpeedPlugin.set_mixed_precision``)."""
    json_name, _ = file_names(setup, accumulation)
    return {
        "compute_environment": "LOCAL_MACHINE", "distributed_type": "DEEPSPEED",
        "deepspeed_config": {"deepspeed_config_file": json_name, "zero3_init_flag": setup.strategy.zero_stage == 3},
        "num_machines": setup.nodes, "num_processes": setup.world_size, "machine_rank": 0,
        "main_training_function": "main", "rdzv_backend": "static", "same_network": True, "use_cpu": False,
    }


def train_args(setup: TrainingSetup, model_id: str, accumulation: int = 1) -> list[str]:
    """``train.py``'s arguments for ``setup``: the model, method (with the family's LoRA targets), length, micro-batch,
    optimizer and checkpointing."""
    args = ["--model", model_id, "--method", setup.method.value, "--seq", str(setup.seq), "--batch", str(setup.batch),
            "--optimizer", setup.optimizer.value]
    if setup.method is not Method.FULL:
        args += ["--lora-rank", str(setup.lora_rank), "--lora-alpha", str(setup.lora_alpha),
                 "--lora-targets", ",".join(setup.lora_targets)]
    if setup.checkpointing:
        args.append("--checkpointing")
    if accumulation > 1:
        args += ["--accumulation", str(accumulation)]
    if setup.loss is not Loss.STANDARD:
        args += ["--loss", setup.loss.value]
    return args


def launch_command(setup: TrainingSetup, model_id: str, accumulation: int = 1) -> str:
    """``accelerate launch`` of ``train.py`` with the remedy's accelerate config, model, method, precision, batch and
    gradient accumulation."""
    _, yaml_name = file_names(setup, accumulation)
    head = ["accelerate", "launch", "--config_file", yaml_name, "--num_processes", str(setup.world_size),
            "--mixed_precision", ACCELERATE_MIXED_PRECISION[setup.precision]]
    return shlex.join([*head, TRAIN_SCRIPT, *train_args(setup, model_id, accumulation)])
