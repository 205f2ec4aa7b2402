"""The inputs of ``oomlab check`` and of the pipeline's ``launch_dir``, validated before any work: the GPU and model
names, every file's existence, a folder's files found by name and content (explicit files win over the folder's)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from oomlab.core.gpus import load_gpu
from oomlab.core.models import load_model
from oomlab.launch.files import LaunchFileError
from oomlab.launch.read import LaunchInputs
from oomlab.launch.resolve import inputs_from_dir

FILE_OPTIONS = ("accelerate_config", "deepspeed", "training_args", "adapter_config", "quantization_config")


def check_inputs(*, launch: str | None = None, launch_dir: str | os.PathLike[str] | None = None,
                 accelerate_config: str | None = None, deepspeed: str | None = None,
                 training_args: str | None = None, adapter_config: str | None = None,
                 quantization_config: str | None = None, model: str | None = None, gpu: str = "t4",
                 gpus: int | None = None) -> LaunchInputs:
    """Validated :class:`LaunchInputs`; a bad name or a missing file raises naming it."""
    load_gpu(gpu)
    if model is not None:
        load_model(model)
    given = {"accelerate_config": accelerate_config, "deepspeed": deepspeed, "training_args": training_args,
             "adapter_config": adapter_config, "quantization_config": quantization_config}
    for option, path in given.items():
        if path is not None and not Path(path).expanduser().is_file():
            raise LaunchFileError(f"--{option.replace('_', '-')} {path!r}: no such file")
    base = inputs_from_dir(launch_dir, gpu=gpu, gpus=gpus, model=model) if launch_dir is not None else \
        LaunchInputs(model=model, gpu=gpu, gpus=gpus)
    changes = {k: v for k, v in given.items() if v is not None}
    if launch is not None:
        changes["command"] = launch
    return replace(base, **changes)
