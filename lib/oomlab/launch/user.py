"""The user's setup as the pipeline starts from it: read from ``launch_dir`` when there is one, else the pipeline's
parameters, each field stated as an assumption (its default) or as given (``-p``).  Loads no torch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from oomlab.core.choices import Method, Strategy
from oomlab.core.models import load_model
from oomlab.core.setup import make_setup
from oomlab.launch.inputs import inputs_from_dir
from oomlab.launch.origin import Sourced, assumed, flag_origin
from oomlab.launch.read import UserLaunch
from oomlab.launch.resolve import SETUP_ORDER, read_launch
from oomlab.launch.trained_dtype import frozen_base_dtype

# pipeline parameter -> setup field (the pipeline's names are the setup's, but for the load dtype)
PARAM_FIELDS = ("gpus", "strategy", "method", "precision", "optimizer", "batch", "seq", "checkpointing", "attention",
                "lora_rank", "lora_targets", "trainer", "reference", "loss", "offload_activations")


def user_launch(params: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> UserLaunch:
    """The user's launch: ``params["launch_dir"]``'s files read (the ``model`` parameter unless the folder has a
    config.json), else the parameters themselves -- each field "assumed" where it is the registry's default
    (``defaults``), "given" where it differs."""
    folder = params.get("launch_dir")
    if folder is not None:  # an empty launch_dir is refused, not read as the current folder
        inputs = inputs_from_dir(folder, gpu=params["gpu"], gpus=params["gpus"])
        if inputs.model is None:
            inputs = type(inputs)(**{**inputs.__dict__, "model": params["model"]})
        launch = read_launch(inputs)
        if params.get("versions"):  # the files say nothing of the releases: the parameter does
            launch = replace(launch, setup=launch.setup.with_(versions=params["versions"]))
        return launch
    defaults = defaults or {}
    spec = load_model(params["model"])
    values = {name: params[name] for name in PARAM_FIELDS}
    # ddp on one GPU is single: launch_strategy
    setup = make_setup(model=spec, gpu=params["gpu"], versions=params.get("versions"), **values)
    one_process = setup.strategy.value != values["strategy"]
    fields: dict[str, Sourced] = {}
    for name in ("model", *PARAM_FIELDS):
        value = params[name]
        if name in defaults and value == defaults[name]:
            origin = assumed(f"no launch files: the pipeline's {name} default")
        else:
            origin = flag_origin(f"-p {name}={value}")
        fields[name] = Sourced(value if name == "model" else getattr(setup, name), origin)
    if one_process:
        fields["strategy"] = Sourced(Strategy.SINGLE, assumed("ddp on one GPU: one process (single)"))
    dtype = params.get("dtype")
    if dtype is None or (defaults.get("dtype") == dtype and "dtype" in defaults):
        fields["load_dtype"] = Sourced(setup.precision.compute_dtype, assumed(
            f"no dtype given: what from_pretrained loads, taken as the dtype {setup.precision.value} computes in"))
    else:
        fields["load_dtype"] = Sourced(dtype, flag_origin(f"-p dtype={dtype}"))
    base = frozen_base_dtype(fields["load_dtype"], setup.method, setup.precision)
    setup = setup.with_(base_dtype=base.value)  # -p dtype=float32 under LoRA: the base stays fp32
    if setup.method is not Method.FULL:  # full fine-tuning's weights follow the precision: the field is not shown
        fields["base_dtype"] = base
    fields["zero3_init"] = Sourced(True, assumed("a ZeRO-3 launch loads under zero.Init, as the HF Trainer does"))
    ordered = {name: fields[name] for name in SETUP_ORDER if name in fields}
    return UserLaunch(setup=setup, fields=ordered, deepspeed=None, launcher=None, hf_trainer=True, command=None,
                      unmodelled=(), files=())


def setup_rows(launch: UserLaunch) -> list[tuple[str, str, str]]:
    """``(field, value, origin)`` of every field, for a table (``oomlab check``'s and notebook 01's)."""
    return [(name, s.shown, str(s.origin)) for name, s in launch.fields.items()]

