"""Ready-to-launch files for the plan's remedies: accelerate configs, a DeepSpeed ZeRO-3 offload JSON, a training
script (transformers + peft) and the exact commands, written into ``outputs/configs/``.

The accelerate configs are what ``accelerate config`` would write (and load with accelerate's own
``load_config_from_file``); the DeepSpeed JSON has concrete values (no ``"auto"``), so DeepSpeed's own
``DeepSpeedConfig`` accepts it as is.  Every file is written atomically.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oomlab.paths import OUTPUTS_DIR, TEMPLATES_DIR
from oomlab.report import write_text_atomic

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


def files_for(strategy: str, method: str) -> tuple[str, ...]:
    """The files that launch a remedy of this strategy (none for strategies without a written config)."""
    common = (TRAIN_SCRIPT, LAUNCH_DOC)
    if strategy == "fsdp":
        return (FSDP, *common)
    if strategy == "fsdp-offload":
        return (FSDP_OFFLOAD, DS_JSON, DS_ACCELERATE, *common)
    if strategy == "ddp":
        return (DDP, *common)
    if strategy == "single":
        return common
    return ()  # zero1/zero2 and device_map: no config written (see LAUNCH.md)


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


def hub_id(source: str) -> str | None:
    """The Hugging Face repository in a model spec's source (``https://huggingface.co/<id>/blob/...``)."""
    match = re.search(r"huggingface\.co/([\w.-]+/[\w.-]+)", source)
    return match.group(1) if match else None


def launch_command(remedy: Mapping[str, Any] | Any, model_id: str, seq: int, lora_rank: int = 8,
                   num_processes: int = 4) -> str | None:
    """The exact command that launches ``remedy`` (a Remedy or its dict) from inside the configs folder."""
    r = remedy if isinstance(remedy, Mapping) else remedy.to_dict()
    config = {"fsdp": FSDP, "fsdp-offload": FSDP_OFFLOAD, "ddp": DDP}.get(r["strategy"])
    if r["strategy"] not in ("fsdp", "fsdp-offload", "ddp", "single"):
        return None
    args = ["--model", model_id, "--method", r["method"], "--seq", str(seq), "--batch",
            str(min(r.get("max_batch") or 1, 8)), "--optimizer", r["optimizer"]]
    if r["method"] != "full":
        args += ["--lora-rank", str(lora_rank)]
    if r["checkpointing"]:
        args.append("--checkpointing")
    if config is None:
        head = ["accelerate", "launch", "--num_processes", "1", "--mixed_precision", "fp16"]
    else:
        head = ["accelerate", "launch", "--config_file", config, "--num_processes", str(num_processes)]
    return shlex.join([*head, TRAIN_SCRIPT, *args])


def _launch_doc(commands: list[tuple[str, str]], settings: LaunchSettings) -> str:
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


def write_configs(out_dir: str | os.PathLike[str] = CONFIGS_DIR, plan: Any = None,
                  settings: LaunchSettings | None = None, top: int = 3) -> dict[str, Path]:
    """Write every launch file into ``out_dir`` (atomically); return ``{file name: path}``.

    With a :class:`oomlab.plan.Plan`, the settings follow it (processes, model's decoder layer) and LAUNCH.md
    gives the exact command of its ``top`` recommendable remedies that have a config.
    """
    import yaml

    out = Path(out_dir)
    if settings is None:
        settings = LaunchSettings()
        if plan is not None:
            from oomlab.specs import load_model

            spec = load_model(plan.model)
            settings = LaunchSettings(num_processes=plan.gpus, num_machines=plan.nodes,
                                      decoder_layer=DECODER_LAYER.get(spec.model_type, "LlamaDecoderLayer"))
    written = {}

    def put(name: str, text: str) -> None:
        written[name] = write_text_atomic(out / name, text)

    put(FSDP, yaml.safe_dump(accelerate_fsdp_config(settings, offload=False), sort_keys=False))
    put(FSDP_OFFLOAD, yaml.safe_dump(accelerate_fsdp_config(settings, offload=True), sort_keys=False))
    put(DDP, yaml.safe_dump(accelerate_ddp_config(settings), sort_keys=False))
    put(DS_JSON, json.dumps(deepspeed_zero3_offload(settings), indent=2) + "\n")
    put(DS_ACCELERATE, yaml.safe_dump(accelerate_deepspeed_config(settings), sort_keys=False))
    put(TRAIN_SCRIPT, (TEMPLATES_DIR / "launch" / TRAIN_SCRIPT).read_text())
    commands = []
    if plan is not None:
        from oomlab.specs import load_model

        model_id = hub_id(load_model(plan.model).source) or "PATH/TO/MODEL"
        chosen = [r for r in plan.remedies if r.recommendable and r.config_files][:top]
        for r in chosen:
            cmd = launch_command(r, model_id, plan.seq, lora_rank=plan.lora_rank, num_processes=plan.gpus)
            if cmd:
                commands.append((r.name, cmd))
    put(LAUNCH_DOC, _launch_doc(commands, settings))
    return written


# ------------------------------------------------------------------------------------------- CPU test runs


def launch_env(config_file: str | os.PathLike[str], num_processes: int) -> dict[str, str]:
    """The environment ``accelerate launch --config_file CONFIG`` gives each process (accelerate's own code)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(
        ["--config_file", str(config_file), "--num_processes", str(num_processes), TRAIN_SCRIPT])
    args, _, _ = _validate_launch_command(args)
    return {k: v for k, v in prepare_multi_gpu_env(args).items() if k.startswith(("ACCELERATE_", "FSDP_"))}


def _free_port() -> int:
    """A free TCP port on loopback for the launched processes' rendezvous."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CPU_ATTEMPTS = 3


def run_on_cpu(config_dir: str | os.PathLike[str], config: str, script_args: list[str], num_processes: int = 2,
               timeout: float = 240.0, attempts: int = CPU_ATTEMPTS) -> list[tuple[int, str]]:
    """Run ``train.py`` under ``config`` on CPU: ``num_processes`` gloo processes started as accelerate would.

    The environment is accelerate's for that config (:func:`launch_env`) plus the torchrun-style rank variables and
    ``ACCELERATE_USE_CPU``; on CPU the script applies the config's FSDP sharding itself (see ``shard_on_cpu``).
    Returns ``(exit code, output)`` per process.

    NB: on a loaded two-core CI machine a gloo rank that had finished its steps was seen to die of SIGABRT
    ("terminate called without an active exception") while the interpreter exited -- gloo's worker threads torn
    down at exit (pytorch/pytorch#190489). The run is deterministic, so when any rank is killed by a signal it is run
    again, up to ``attempts`` times, from an empty ``--log-json`` file; an ordinary failure (exit code > 0) is never
    retried.
    """
    if attempts < 1:
        raise ValueError(f"attempts={attempts!r} is not accepted: give 1 or more")
    log = Path(script_args[script_args.index("--log-json") + 1]) if "--log-json" in script_args else None
    results: list[tuple[int, str]] = []
    for _ in range(attempts):
        if log is not None:
            log.unlink(missing_ok=True)
        results = _run_once(Path(config_dir), config, script_args, num_processes, timeout)
        if not any(code < 0 for code, _ in results):
            break
    return results


def _run_once(folder: Path, config: str, script_args: list[str], num_processes: int,
              timeout: float) -> list[tuple[int, str]]:
    import subprocess
    import sys

    env = launch_env(folder / config, num_processes)
    port = _free_port()
    procs = []
    for rank in range(num_processes):
        proc_env = {**os.environ, **env, "RANK": str(rank), "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": str(num_processes), "LOCAL_WORLD_SIZE": str(num_processes),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "ACCELERATE_USE_CPU": "true",
                    "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore::FutureWarning"}
        procs.append(subprocess.Popen([sys.executable, str(folder / TRAIN_SCRIPT), *script_args], env=proc_env,
                                      cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        results.append((proc.returncode, out))
    return results
