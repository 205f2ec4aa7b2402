"""The user's launch as one JSON record: read once per pipeline run (by the runner, before any notebook), written to
``results/setup.json`` and read back by every notebook as the same typed :class:`~oomlab.launch.read.UserLaunch` --
the setup, every field with its origin, the DeepSpeed knobs, the command, what was not modelled.

The record carries the model's ``config.json`` fields themselves, so a notebook never reads the user's files again
(they may have changed since, or live where the kernel cannot see).  Loads no torch.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from oomlab.budget.deepspeed_config import DeepSpeedSettings, OptimizerSource
from oomlab.core.choices import (
    Attention,
    BaseDtype,
    Loss,
    Method,
    Optimizer,
    Precision,
    Reference,
    Strategy,
    Trainer,
    choice,
)
from oomlab.core.errors import InvalidValueError
from oomlab.core.gpus import load_gpu
from oomlab.core.models import ModelSpec, known_models, load_model, model_from_config
from oomlab.core.setup import TrainingSetup, validate
from oomlab.core.user_input import read_user_text
from oomlab.core.versions import versions_from
from oomlab.launch.command import LaunchCommand, Launcher
from oomlab.launch.origin import Origin, OriginKind, Sourced, Unmodelled
from oomlab.launch.read import UserLaunch

RECORD_VERSION = 1
SETUP_RECORD_NAME = "setup.json"  # under the run's results/
_CHOICES = {"strategy": Strategy, "method": Method, "precision": Precision, "optimizer": Optimizer,
            "attention": Attention, "trainer": Trainer, "reference": Reference, "loss": Loss, "base_dtype": BaseDtype}
_FIELD_KINDS: dict[str, Any] = {**_CHOICES, "launcher": Launcher}


def _model_record(spec: ModelSpec) -> dict[str, Any]:
    shipped = spec.name in known_models()  # a shipped spec is named by its short name; a file's by its path
    return {"name": spec.name, "shipped": shipped, "source": spec.source,
            "config": None if shipped else dict(spec.config)}


def _model_of(record: dict[str, Any]) -> ModelSpec:
    if record["shipped"]:
        return load_model(record["name"])
    return model_from_config(record["config"], record["name"], record["source"])


def setup_record(setup: TrainingSetup) -> dict[str, Any]:
    """``setup`` as JSON: choices by name, the model with its config fields when it is not a shipped one."""
    return {"model": _model_record(setup.model), "gpu": setup.gpu.name, "gpus": setup.gpus, "nodes": setup.nodes,
            **{name: getattr(setup, name).value for name in _CHOICES},
            "batch": setup.batch, "seq": setup.seq, "checkpointing": setup.checkpointing,
            "offload_activations": setup.offload_activations, "optimizer_in_backward": setup.optimizer_in_backward,
            "lora_rank": setup.lora_rank, "lora_alpha": setup.lora_alpha, "lora_targets": list(setup.lora_targets),
            # the user's pins only (the installed releases are the reading machine's, as when the setup was made)
            "versions": {name: ".".join(map(str, release)) for name, release in setup.versions.given},
            "assumed_versions": list(setup.versions.assumed)}


def setup_of(record: dict[str, Any]) -> TrainingSetup:
    """The :class:`TrainingSetup` :func:`setup_record` wrote (validated again, its strategy kept as written)."""
    return validate(TrainingSetup(
        model=_model_of(record["model"]), gpu=load_gpu(record["gpu"]), gpus=record["gpus"], nodes=record["nodes"],
        **{name: choice(kind, record.get(name, kind.__members__[next(iter(kind.__members__))].value), name)
           for name, kind in _CHOICES.items()},  # a record from before trainer, reference, loss: their first
        batch=record["batch"], seq=record["seq"], checkpointing=record["checkpointing"],
        offload_activations=record.get("offload_activations", False),
        optimizer_in_backward=record.get("optimizer_in_backward", False),  # a record from before the field: False
        lora_rank=record["lora_rank"], lora_alpha=record["lora_alpha"], lora_targets=tuple(record["lora_targets"]),
        versions=replace(versions_from(record.get("versions", {})),
                         assumed=tuple(record.get("assumed_versions", ())))))


def _origin_of(d: dict[str, Any]) -> Origin:
    return Origin(OriginKind(d["kind"]), d["where"], d["key"], d["line"])


def _value_of(name: str, value: Any) -> Any:
    kind = _FIELD_KINDS.get(name)
    if kind is not None:
        return kind(value)
    return tuple(value) if isinstance(value, list) else value


def _command_of(d: dict[str, Any] | None) -> LaunchCommand | None:
    if d is None:
        return None
    return LaunchCommand(text=d["text"], launcher=Launcher(d["launcher"]), env=tuple(d["env"].items()),
                         options=tuple((k, v) for k, v in d["options"]), script=d["script"],
                         flags=tuple((k, v) for k, v in d["flags"]), config=d.get("config"))


def launch_record(launch: UserLaunch) -> dict[str, Any]:
    """``launch`` as one JSON-able record (:func:`launch_of` reads it back equal)."""
    return {"version": RECORD_VERSION, "setup": setup_record(launch.setup), **launch.to_dict()}


def launch_of(record: dict[str, Any]) -> UserLaunch:
    """The :class:`UserLaunch` :func:`launch_record` wrote."""
    if record.get("version") != RECORD_VERSION:
        raise InvalidValueError(f"setup record version {record.get('version')!r}; this oomlab reads version "
                                f"{RECORD_VERSION}: run the pipeline again (python -m oomlab run)")
    fields = {name: Sourced(_value_of(name, f["value"]), _origin_of(f["origin"]),
                            tuple(_origin_of(o) for o in f["also"]))
              for name, f in record["fields"].items()}
    ds = record["deepspeed"]
    if ds is not None and ds.get("optimizer_source") is not None:
        ds = {**ds, "optimizer_source": OptimizerSource(ds["optimizer_source"])}
    return UserLaunch(
        setup=setup_of(record["setup"]), fields=fields, deepspeed=None if ds is None else DeepSpeedSettings(**ds),
        launcher=None if record["launcher"] is None else Launcher(record["launcher"]), hf_trainer=record["hf_trainer"],
        command=_command_of(record["command"]),
        unmodelled=tuple(Unmodelled(_origin_of(u["origin"]), u["value"], u["why"]) for u in record["unmodelled"]),
        files=tuple(record["files"]),
        framework_values={k: tuple(v) if isinstance(v, list) else v
                          for k, v in record.get("framework_values", {}).items()})


def write_launch(path: str | Path, launch: UserLaunch) -> Path:
    path = Path(path)
    path.write_text(json.dumps(launch_record(launch), indent=1, sort_keys=True) + "\n")
    return path


def read_launch_record(path: str | Path) -> UserLaunch:
    """The launch the runner recorded at ``path`` (read within :mod:`oomlab.core.user_input`'s bounds)."""
    return launch_of(json.loads(read_user_text(path, "the run's setup record")))
