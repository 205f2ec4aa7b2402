"""The launch folder of a plan: every launch file written (atomically) -- the accelerate configs, each top DeepSpeed
remedy's JSON and accelerate config, ``train.py`` with the plan's model as its default -- and LAUNCH.md with the exact
command of each top remedy."""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import replace
from pathlib import Path

from oomlab.core.choices import Method, Route, Strategy
from oomlab.core.errors import InvalidValueError
from oomlab.core.files import write_text_atomic
from oomlab.core.models import load_model
from oomlab.core.paths import TEMPLATES_DIR
from oomlab.core.setup import TrainingSetup
from oomlab.core.user_input import shown
from oomlab.remedies import deepspeed_configs
from oomlab.remedies.deepspeed_configs import ACCELERATE_MIXED_PRECISION, train_args
from oomlab.remedies.launch_files import (
    ACCELERATE_CONFIG,
    CONFIGS_DIR,
    LAUNCH_DOC,
    TRAIN_SCRIPT,
    LaunchSettings,
    accelerate_config,
    decoder_layer_class,
    launch_batch,
    launch_doc,
)
from oomlab.remedies.plan import Plan
from oomlab.remedies.remedy import Remedy, launcher

# strategies with a command: every accelerate config, one GPU, and DeepSpeed's ZeRO stages
LAUNCHABLE = (*ACCELERATE_CONFIG, Strategy.SINGLE, *(s for s in Strategy if s.deepspeed))
DEFAULT_MODEL_LINE = 'DEFAULT_MODEL = "huggyllama/llama-13b"'  # the template's; write_configs puts the plan's model


def hub_id(source: str) -> str | None:
    """The Hugging Face repository in a model spec's source (``https://huggingface.co/<id>/blob/...``)."""
    match = re.search(r"huggingface\.co/([\w.-]+/[\w.-]+)", source)
    return match.group(1) if match else None


def launch_setup(remedy: Remedy, seq: int | None = None, batch: int | None = None) -> TrainingSetup | None:
    """The setup a remedy's command launches: its own, at the launched micro-batch (``batch`` when given: the
    ladder's fix launches the micro-batch it chose, with its margin) and ``seq`` when given."""
    if remedy.setup is None:
        return None
    changes = {"batch": launch_batch(remedy.max_batch if batch is None else batch)} | (
        {"seq": seq} if seq is not None else {})
    return replace(remedy.setup, **changes)


def launch_command(remedy: Remedy, model_id: str, seq: int, lora_rank: int = 8,
                   num_processes: int = 4, accumulation: int = 1, batch: int | None = None) -> str | None:
    """The exact command that launches ``remedy`` from inside the configs folder.

    None where no launch file runs it: the device-map route, pure fp16/bf16 (``train.py`` trains with fp32
    trainable weights only), a framework's chunked loss (torchtune's, litgpt's, axolotl's: ``train.py`` runs
    transformers' head and loss, Liger's or Cut Cross-Entropy) and a run whose versions name torchtune or litgpt
    (their own launchers and model code).  A DeepSpeed remedy launches its own accelerate config
    (:mod:`.deepspeed_configs`).
    """
    if remedy.route is not Route.PROCESS_PER_GPU or remedy.strategy not in LAUNCHABLE:
        return None
    if remedy.setup is not None and (remedy.setup.loss.chunked or remedy.setup.versions.framework != "transformers"):
        return None  # a framework's own loss, or its own launcher (torchtune's tune run, litgpt's CLI)
    mixed_precision = ACCELERATE_MIXED_PRECISION.get(remedy.precision)
    if mixed_precision is None:
        return None
    setup = launch_setup(remedy, seq, batch)
    if remedy.strategy.deepspeed:
        return None if setup is None else deepspeed_configs.launch_command(setup, model_id, accumulation)
    config = ACCELERATE_CONFIG.get(remedy.strategy)
    if setup is not None:
        args = train_args(setup, model_id, accumulation)
    else:  # a remedy read back from results JSON: what it records
        args = ["--model", model_id, "--method", remedy.method.value, "--seq", str(seq), "--batch",
                str(launch_batch(remedy.max_batch)), "--optimizer", remedy.optimizer.value]
        args += ["--lora-rank", str(lora_rank)] if remedy.method is not Method.FULL else []
        args += ["--checkpointing"] if remedy.checkpointing else []
    if config is None:
        head = ["accelerate", "launch", "--num_processes", "1"]
    else:
        head = ["accelerate", "launch", "--config_file", config, "--num_processes", str(num_processes)]
    return shlex.join([*head, "--mixed_precision", mixed_precision, TRAIN_SCRIPT, *args])


def plan_accumulation(plan: Plan, remedy: Remedy) -> int:
    """The gradient accumulation ``remedy`` launches with: the ladder's for the plan's fix (the global batch kept),
    else 1."""
    return plan.decision.accumulation if remedy is plan.fix and plan.decision is not None else 1


def plan_launch_command(plan: Plan, remedy: Remedy | None, model_id: str) -> str | None:
    """The command that launches ``remedy`` of ``plan`` (its recommendation by default): at its own sequence length,
    micro-batch and, for the ladder's fix, gradient accumulation."""
    if remedy is None:
        return None
    seq = plan.seq if remedy.setup is None else remedy.setup.seq
    return launch_command(remedy, model_id, seq, lora_rank=plan.lora_rank, num_processes=plan.gpus,
                          accumulation=plan_accumulation(plan, remedy), batch=plan_batch(plan, remedy))


def plan_batch(plan: Plan, remedy: Remedy) -> int | None:
    """The micro-batch the plan's fix launches (the ladder's); None: the remedy's own largest that fits."""
    return plan.fix.setup.batch if remedy is plan.fix and plan.fix.setup is not None else None


def plan_settings(plan: Plan) -> LaunchSettings:
    """The settings the configs follow for ``plan``: its processes and machines, its model (hub id) and family's
    decoder layer, and the mixed precision of its recommended remedy (fp16 without one)."""
    spec = load_model(plan.model)
    rec = plan.recommended
    mixed_precision = (ACCELERATE_MIXED_PRECISION.get(rec.precision) if rec is not None else None) or "fp16"
    return LaunchSettings(num_processes=plan.gpus, num_machines=plan.nodes, mixed_precision=mixed_precision,
                          decoder_layer=decoder_layer_class(spec), model_id=hub_id(spec.source) or "PATH/TO/MODEL")


def train_script(model_id: str) -> str:
    """``train.py`` with ``model_id`` as its default ``--model``."""
    text = (TEMPLATES_DIR / "launch" / TRAIN_SCRIPT).read_text()
    if DEFAULT_MODEL_LINE not in text:  # pragma: no cover - a template edited without its marker
        raise ValueError(f"{TRAIN_SCRIPT} template lost its {DEFAULT_MODEL_LINE!r} line")
    return text.replace(DEFAULT_MODEL_LINE, f"DEFAULT_MODEL = {json.dumps(model_id)}")


def deepspeed_texts(setup: TrainingSetup, accumulation: int = 1) -> dict[str, str]:
    """``{file name: text}`` of a ZeRO ``setup``'s DeepSpeed JSON (``batch``: the micro-batch launched) and the
    accelerate config that uses it."""
    import yaml

    json_name, yaml_name = deepspeed_configs.file_names(setup, accumulation)
    return {json_name: json.dumps(deepspeed_configs.deepspeed_json(setup, accumulation=accumulation), indent=2)
            + "\n", yaml_name: yaml.safe_dump(deepspeed_configs.accelerate_deepspeed_config(setup, accumulation),
                                               sort_keys=False)}


def write_deepspeed_files(out_dir: str | os.PathLike[str], setup: TrainingSetup) -> dict[str, Path]:
    """Write the DeepSpeed JSON of a ZeRO ``setup`` and the accelerate config that uses it into ``out_dir``
    (atomically, never over a file oomlab did not write: :func:`check_destination`); return ``{file name: path}``."""
    return _write_all(Path(out_dir), deepspeed_texts(setup))


def check_destination(out_dir: str | os.PathLike[str], files: dict[str, str]) -> None:
    """Refuse to write ``files`` (``{name: text}``) into ``out_dir`` when that would overwrite what oomlab did not
    write: ``out_dir`` an existing file (not a folder), or a folder holding a file of one of these names whose bytes
    differ from what oomlab would write (a byte-identical one is left as it is).  Nothing is written before this
    check, so a refusal changes nothing."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InvalidValueError(f"launch folder {shown(str(out))} is an existing file, not a folder: oomlab never "
                                "overwrites a file it did not write; give a new folder, or one oomlab wrote")
    if not out.is_dir():
        return
    clashes = [name for name, text in files.items() if not _holds(out / name, _as_written(text))]
    if clashes:
        shown_names = ", ".join(clashes[:8]) + (f" and {len(clashes) - 8} more" if len(clashes) > 8 else "")
        raise InvalidValueError(
            f"launch folder {shown(str(out))} already holds {shown_names}, which oomlab would write with other "
            "contents: oomlab never overwrites files it did not write; give a new folder (or an empty one), or move "
            "those files away")


def _holds(path: Path, data: bytes) -> bool:
    """Is ``path`` absent, or a regular file of exactly ``data`` (what oomlab would write there)?"""
    if not (path.exists() or path.is_symlink()):
        return True
    if path.is_symlink() or not path.is_file() or path.stat().st_size != len(data):
        return False
    return path.read_bytes() == data


def _as_written(text: str) -> bytes:
    """The bytes :func:`write_text_atomic` writes for ``text`` (a text-mode file: ``os.linesep`` line ends)."""
    return text.replace("\n", os.linesep).encode("utf-8")


def _write_all(out: Path, files: dict[str, str]) -> dict[str, Path]:
    """:func:`check_destination`, then every file written atomically; one already there holds exactly its text (the
    check said so) and is left as it is."""
    check_destination(out, files)
    return {name: out / name if (out / name).exists() else write_text_atomic(out / name, text)
            for name, text in files.items()}


def top_launches(plan: Plan, top: int = 3) -> list[Remedy]:
    """The remedies LAUNCH.md gives commands for: the plan's recommended one first, then the best-ranked other
    recommendable remedies that have launch files, ``top`` in all."""
    rec = plan.recommended
    rest = [r for r in plan.remedies if r.recommendable and r.config_files and r is not rec]
    return ([rec] if rec is not None else []) + rest[:max(top - (rec is not None), 0)]


def launch_texts(plan: Plan | None = None, settings: LaunchSettings | None = None,
                 top: int = 3) -> dict[str, str]:
    """``{file name: text}`` of every launch file :func:`write_configs` writes, in its order."""
    import yaml

    if settings is None:
        settings = plan_settings(plan) if plan is not None else LaunchSettings()
    files = {name: yaml.safe_dump(accelerate_config(strategy, settings), sort_keys=False)
             for strategy, name in ACCELERATE_CONFIG.items()}
    files[TRAIN_SCRIPT] = train_script(settings.model_id)
    commands, deepspeed = [], []
    if plan is not None:
        for r in top_launches(plan, top):
            acc = plan_accumulation(plan, r)
            setup = launch_setup(r, plan.seq if r.setup is None else r.setup.seq, plan_batch(plan, r))
            if r.strategy.deepspeed and setup is not None:
                json_name, yaml_name = deepspeed_configs.file_names(setup, acc)
                if json_name not in files:
                    files.update(deepspeed_texts(setup, acc))
                    deepspeed.append((json_name, yaml_name, r.strategy, launcher(r.route, r.strategy)))
            cmd = plan_launch_command(plan, r, settings.model_id)
            if cmd:
                commands.append((r.name, cmd))
    files[LAUNCH_DOC] = launch_doc(commands, settings, tuple(deepspeed))
    return files


def write_configs(out_dir: str | os.PathLike[str] = CONFIGS_DIR, plan: Plan | None = None,
                  settings: LaunchSettings | None = None, top: int = 3) -> dict[str, Path]:
    """Write every launch file into ``out_dir`` (atomically); return ``{file name: path}``.

    With a :class:`~oomlab.remedies.plan.Plan`, the settings follow it (:func:`plan_settings`), each of its
    :func:`top_launches` gets its command in LAUNCH.md, and each DeepSpeed one among them its JSON and accelerate
    config.  Never over a file oomlab did not write (:func:`check_destination`): ``out_dir`` an existing file, or a
    folder holding a file of one of these names with other contents, is refused before anything is written.
    """
    return _write_all(Path(out_dir), launch_texts(plan, settings, top))
