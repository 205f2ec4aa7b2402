"""The launch folder of a plan: every launch file written (atomically), and LAUNCH.md with the exact command of
each top remedy."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

from oomlab.core.choices import Method, Precision, Route, Strategy
from oomlab.core.files import write_text_atomic
from oomlab.core.models import load_model
from oomlab.core.paths import TEMPLATES_DIR
from oomlab.remedies.launch_files import (
    ACCELERATE_CONFIG,
    CONFIGS_DIR,
    DECODER_LAYER,
    DS_ACCELERATE,
    DS_JSON,
    LAUNCH_DOC,
    TRAIN_SCRIPT,
    LaunchSettings,
    accelerate_config,
    accelerate_deepspeed_config,
    deepspeed_zero3_offload,
    launch_doc,
)
from oomlab.remedies.plan import Plan
from oomlab.remedies.remedy import Remedy

LAUNCHABLE = (*ACCELERATE_CONFIG, Strategy.SINGLE)  # strategies with a command: every accelerate config, and one GPU

# accelerate's --mixed_precision for each precision train.py runs: it keeps fp32 trainable weights (full fine-tuning
# loads fp32, LoRA adapters are fp32 over a half base), so the pure-half precisions have no command.
MIXED_PRECISION_FLAG = {Precision.FP32: "no", Precision.FP16_MIXED: "fp16", Precision.BF16_MIXED: "bf16"}


def hub_id(source: str) -> str | None:
    """The Hugging Face repository in a model spec's source (``https://huggingface.co/<id>/blob/...``)."""
    match = re.search(r"huggingface\.co/([\w.-]+/[\w.-]+)", source)
    return match.group(1) if match else None


def launch_command(remedy: Remedy, model_id: str, seq: int, lora_rank: int = 8,
                   num_processes: int = 4) -> str | None:
    """The exact command that launches ``remedy`` from inside the configs folder.

    None where no launch file runs it: the device-map route, ZeRO-1/2, and pure fp16/bf16 (``train.py`` trains with
    fp32 trainable weights only).
    """
    if remedy.route is not Route.PROCESS_PER_GPU or remedy.strategy not in LAUNCHABLE:
        return None
    mixed_precision = MIXED_PRECISION_FLAG.get(remedy.precision)
    if mixed_precision is None:
        return None
    config = ACCELERATE_CONFIG.get(remedy.strategy)
    args = ["--model", model_id, "--method", remedy.method.value, "--seq", str(seq), "--batch",
            str(min(remedy.max_batch or 1, 8)), "--optimizer", remedy.optimizer.value]
    if remedy.method is not Method.FULL:
        args += ["--lora-rank", str(lora_rank)]
    if remedy.checkpointing:
        args.append("--checkpointing")
    if config is None:
        head = ["accelerate", "launch", "--num_processes", "1"]
    else:
        head = ["accelerate", "launch", "--config_file", config, "--num_processes", str(num_processes)]
    return shlex.join([*head, "--mixed_precision", mixed_precision, TRAIN_SCRIPT, *args])


def plan_settings(plan: Plan) -> LaunchSettings:
    """The settings the configs follow for ``plan``: its processes and machines, its model's decoder layer, and the
    mixed precision of its recommended remedy (fp16 without one)."""
    spec = load_model(plan.model)
    rec = plan.recommended
    mixed_precision = (MIXED_PRECISION_FLAG.get(rec.precision) if rec is not None else None) or "fp16"
    return LaunchSettings(num_processes=plan.gpus, num_machines=plan.nodes, mixed_precision=mixed_precision,
                          decoder_layer=DECODER_LAYER.get(spec.model_type, "LlamaDecoderLayer"))


def write_configs(out_dir: str | os.PathLike[str] = CONFIGS_DIR, plan: Plan | None = None,
                  settings: LaunchSettings | None = None, top: int = 3) -> dict[str, Path]:
    """Write every launch file into ``out_dir`` (atomically); return ``{file name: path}``.

    With a :class:`~oomlab.remedies.plan.Plan`, the settings follow it (:func:`plan_settings`) and LAUNCH.md gives
    the exact command of its ``top`` recommendable remedies that have a config.
    """
    import yaml

    out = Path(out_dir)
    if settings is None:
        settings = plan_settings(plan) if plan is not None else LaunchSettings()
    written = {}

    def put(name: str, text: str) -> None:
        written[name] = write_text_atomic(out / name, text)

    for strategy, name in ACCELERATE_CONFIG.items():
        put(name, yaml.safe_dump(accelerate_config(strategy, settings), sort_keys=False))
    put(DS_JSON, json.dumps(deepspeed_zero3_offload(settings), indent=2) + "\n")
    put(DS_ACCELERATE, yaml.safe_dump(accelerate_deepspeed_config(settings), sort_keys=False))
    put(TRAIN_SCRIPT, (TEMPLATES_DIR / "launch" / TRAIN_SCRIPT).read_text())
    commands = []
    model_id = "PATH/TO/MODEL"
    seq = 2048
    if plan is not None:
        model_id = hub_id(load_model(plan.model).source) or model_id
        seq = plan.seq
        chosen = [r for r in plan.remedies if r.recommendable and r.config_files][:top]
        for r in chosen:
            cmd = launch_command(r, model_id, plan.seq, lora_rank=plan.lora_rank, num_processes=plan.gpus)
            if cmd:
                commands.append((r.name, cmd))
    put(LAUNCH_DOC, launch_doc(commands, settings, model_id=model_id, seq=seq))
    return written
