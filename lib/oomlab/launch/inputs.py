"""The inputs of ``oomlab check`` and of the pipeline's ``launch_dir``, validated before any work: the GPU and model
names, every file's existence, a folder's files found by name and content (explicit files win over the folder's)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from oomlab.core.choices import Loss, Trainer, choice
from oomlab.core.errors import InvalidValueError, LaunchFileError
from oomlab.core.gpus import load_gpu
from oomlab.core.models import load_model
from oomlab.core.versions import Versions
from oomlab.launch.files import read_json, read_launch_text
from oomlab.launch.read import LaunchInputs

LAUNCH_COMMAND_FILES = ("launch.sh", "launch.txt", "command.txt")


def check_inputs(*, launch: str | None = None, launch_dir: str | os.PathLike[str] | None = None,
                 accelerate_config: str | None = None, deepspeed: str | None = None,
                 training_args: str | None = None, adapter_config: str | None = None,
                 quantization_config: str | None = None, model: str | None = None, gpu: str = "t4",
                 gpus: int | None = None, seq: int | None = None, batch: int | None = None,
                 trainer: str | None = None, versions: Versions | None = None,
                 loss: str | None = None) -> LaunchInputs:
    """Validated :class:`LaunchInputs`; a bad name or a missing file raises naming it (``seq``, ``batch``,
    ``trainer``: given on the command line, deciding whatever the launch says)."""
    load_gpu(gpu)
    if trainer is not None:
        choice(Trainer, trainer, "trainer")
    if loss is not None:
        choice(Loss, loss, "loss")
    if model is not None:
        load_model(model)
    given = {"accelerate_config": accelerate_config, "deepspeed": deepspeed, "training_args": training_args,
             "adapter_config": adapter_config, "quantization_config": quantization_config}
    for option, path in given.items():
        if path is not None and not Path(path).expanduser().exists():  # a FIFO or a folder: refused by its reader
            raise LaunchFileError(f"--{option.replace('_', '-')} {path!r}: no such file")
    base = inputs_from_dir(launch_dir, gpu=gpu, gpus=gpus, model=model) if launch_dir is not None else \
        LaunchInputs(model=model, gpu=gpu, gpus=gpus)
    changes: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    changes.update({k: v for k, v in (("seq", seq), ("batch", batch), ("trainer", trainer), ("versions", versions),
                                               ("loss", loss))
                    if v is not None})
    if launch is not None:  # typed here: its relative paths are the current folder's
        changes.update(command=launch, command_dir=None)
    return replace(base, **changes)


def inputs_from_dir(folder: str | os.PathLike[str], gpu: str, gpus: int | None = None,
                    model: str | None = None) -> LaunchInputs:
    """The launch files of a folder, recognised by name and content: ``launch.sh``/``launch.txt`` (the command),
    ``accelerate*.yaml``, a DeepSpeed JSON (``zero_optimization``), ``training_args.json`` (or any JSON with
    ``per_device_train_batch_size``), ``adapter_config.json``, ``quantization_config.json``, ``config.json``."""
    if not str(folder).strip():  # Path("") is the current folder: never read it unasked
        raise InvalidValueError(f"launch_dir {str(folder)!r} is empty; give the folder of launch files (launch.txt, "
                                "accelerate*.yaml, a DeepSpeed JSON, training_args.json, ...)")
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise InvalidValueError(f"launch_dir {str(folder)!r} is not a folder of launch files")
    found: dict[str, str] = {}
    command = None
    for name in LAUNCH_COMMAND_FILES:
        if (root / name).exists():  # a FIFO or a folder of that name is refused by the reader, not skipped
            text = read_launch_text(root / name, "launch command file")
            lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
            command = " ".join(ln.rstrip("\\").strip() for ln in lines)
            break
    for path in sorted(root.iterdir()):
        if path.suffix in (".yaml", ".yml") and "accelerate" in path.name:
            found.setdefault("accelerate_config", str(path))
        elif path.suffix == ".json":
            kind = _json_kind(path)
            if kind:
                if kind in found:
                    raise InvalidValueError(f"launch_dir {str(folder)!r} holds two {kind} files: {found[kind]} and "
                                            f"{path}; keep one")
                found[kind] = str(path)
    if model is None and "model" in found:
        model = found.pop("model")
    found.pop("model", None)
    return LaunchInputs(command=command, model=model, gpu=gpu, gpus=gpus, command_dir=str(root), **found)


def _json_kind(path: Path) -> str | None:
    if path.name == "adapter_config.json":
        return "adapter_config"
    if path.name == "quantization_config.json":
        return "quantization_config"
    data = read_json(path).data
    if "zero_optimization" in data or "train_micro_batch_size_per_gpu" in data:
        return "deepspeed"
    if "per_device_train_batch_size" in data or path.name == "training_args.json":
        return "training_args"
    if "model_type" in data or path.name == "config.json":
        return "model"
    if "peft_type" in data:
        return "adapter_config"
    return None
