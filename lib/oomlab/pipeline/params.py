"""The pipeline's parameters, declared once: every notebook, the CLI's ``run``, the explorer and the tests read
:data:`PARAMETERS`.  :func:`parse_params` reads a YAML file and ``key=value`` pairs into typed, validated values
before any notebook runs.  Importing this module loads no torch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oomlab.core.choices import (
    MESSAGE_FORMAT_NAMES,
    Attention,
    Device,
    Loss,
    Method,
    Optimizer,
    Precision,
    Reference,
    Strategy,
    Trainer,
)
from oomlab.core.defaults import DEFAULTS
from oomlab.core.dtypes import load_dtype
from oomlab.core.errors import InvalidValueError, OomlabError
from oomlab.core.gpus import load_gpu
from oomlab.core.models import ALL_LINEAR, known_models, load_model
from oomlab.core.prices import HOST_RAM_AUTO, seed_machine_text
from oomlab.core.setup import MAX_GPUS_PER_NODE
from oomlab.core.units import MiB, format_size, parse_memory_size
from oomlab.core.user_input import MAX_INT_DIGITS, SHOWN_CHARS, load_user_yaml, read_user_text, shown
from oomlab.core.versions import versions_from

if TYPE_CHECKING:
    from oomlab.launch.read import UserLaunch


@dataclass(frozen=True)
class Param:
    """One pipeline parameter: its type, default, help and what values it accepts."""

    name: str
    kind: type  # str, int, float or bool; None is accepted only when the default is None
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None  # inclusive lower bound for numbers
    maximum: float | None = None  # inclusive upper bound for numbers
    canonical: Callable[[Any], Any] | None = None  # validates and returns the canonical value

    @property
    def nullable(self) -> bool:
        return self.default is None


def _lora_targets(value: str) -> str:
    names = [t.strip() for t in value.split(",") if t.strip()]
    if not names:
        raise InvalidValueError(f"no LoRA target modules in {shown(value)}; e.g. {','.join(DEFAULTS.lora_targets)}")
    return ",".join(names)


def _model(value: str) -> str:
    """A shipped name as is; a config.json's path absolute (the notebooks run in their own folder)."""
    name = load_model(value).name
    return name if name in known_models() else str(Path(name).expanduser().resolve())


def _versions(value: str) -> str:
    """The user's releases as canonical pins (a pip freeze file read here: the notebooks get its pins)."""
    pins = versions_from(value).given
    return ",".join(f"{name}=={'.'.join(map(str, release))}" for name, release in pins)


def _launch_dir(value: str) -> str:
    """The folder, absolute (the notebooks run elsewhere); an empty value is refused, not read as the current
    folder."""
    if not value.strip():
        raise InvalidValueError(f"launch_dir {value!r} is empty; give a folder of launch files, or none for no "
                                "launch files")
    path = Path(value).expanduser()
    try:
        if path.is_dir():
            return str(path.resolve())
    except OSError as err:  # a name too long for the file system
        raise InvalidValueError(f"launch_dir {shown(value)} cannot be read: {err.strerror or err}") from err
    raise InvalidValueError(f"launch_dir {shown(value)} is not a folder of launch files")


MAX_BATCH = 2**16  # a micro-batch per GPU: past this the traced step's tensors overflow their sizes
MAX_TOKENS = 2**24  # batch x seq per GPU: 16M tokens, beyond any GPU's memory for any model


PARAMETERS: dict[str, Param] = {
    p.name: p
    for p in (
        Param("model", str, DEFAULTS.model, "shipped model name or path to a config.json",
              canonical=_model),
        Param("dtype", str, DEFAULTS.dtype, "storage dtype of the weights",
              canonical=lambda v: load_dtype(v).name),
        Param("gpu", str, DEFAULTS.gpu, "GPU model", canonical=lambda v: load_gpu(v).name),
        Param("gpus", int, DEFAULTS.gpus, "number of GPUs", minimum=1),
        Param("non_pytorch_mib", float, None, "MiB held on the GPU outside PyTorch (None: measured/default)",
              minimum=0),
        Param("device", str, "auto", "where to reproduce the failure", choices=tuple(d.value for d in Device)),
        Param("message_format", str, "auto", "which PyTorch OOM message to print: old = torch<=2.0, new = torch>=2.1, "
              "auto = the seed's old one for the seed's case, else new", choices=("auto", *MESSAGE_FORMAT_NAMES)),
        Param("precision", str, DEFAULTS.precision.value, "training precision",
              choices=tuple(p.value for p in Precision)),
        Param("optimizer", str, DEFAULTS.optimizer.value, "optimizer", choices=tuple(o.value for o in Optimizer)),
        Param("batch", int, DEFAULTS.batch, "micro-batch per GPU", minimum=1, maximum=MAX_BATCH),
        Param("seq", int, DEFAULTS.seq, "sequence length in tokens", minimum=1),
        Param("checkpointing", bool, DEFAULTS.checkpointing, "activation checkpointing in the user's configuration"),
        Param("attention", str, DEFAULTS.attention.value, "attention implementation",
              choices=tuple(a.value for a in Attention)),
        Param("lora_rank", int, DEFAULTS.lora_rank,
              "the user's LoRA rank (method lora/qlora), and the LoRA/QLoRA remedies'", minimum=1),
        Param("strategy", str, DEFAULTS.strategy.value, "the user's launch when no launch_dir says (ddp on one GPU is "
              "single)",
              choices=tuple(s.value for s in Strategy)),
        Param("method", str, DEFAULTS.method.value, "what the user's run trains when no launch_dir says",
              choices=tuple(m.value for m in Method)),
        Param("trainer", str, DEFAULTS.trainer.value, "the user's training loop when no launch_dir says: sft, or "
              "TRL's dpo / orpo / kto / grpo / ppo / reward (their reference model, pairs, generation)",
              choices=tuple(t.value for t in Trainer)),
        Param("reference", str, DEFAULTS.reference.value, "the trainer's reference model: default (as its config "
              "defaults it), resident, or none (precompute_ref_log_probs)", choices=tuple(r.value for r in Reference)),
        Param("loss", str, DEFAULTS.loss.value, "the user's loss kernel when no launch_dir says: standard "
              "(transformers' loss over the logits), liger-flce (Liger's fused linear cross-entropy), cce (Cut "
              "Cross-Entropy) or a framework's chunked loss (chunked*: oomlab.core.choices.Loss)",
              choices=tuple(m.value for m in Loss)),
        Param("offload_activations", bool, DEFAULTS.offload_activations, "the user's activation offloading (TRL's "
              "activation_offloading) when no launch_dir says"),
        Param("lora_targets", str, ",".join(DEFAULTS.lora_targets), "the user's LoRA target modules, "
              f"comma-separated (names of the model's nn.Linear modules, or {ALL_LINEAR})",
              canonical=_lora_targets),
        Param("launch_dir", str, None, "a folder of the user's launch files (launch.txt, accelerate*.yaml, a "
              "DeepSpeed JSON, training_args.json, adapter_config.json, quantization_config.json, config.json): "
              "they decide the setup; none: the setup is the parameters above, stated as assumptions",
              canonical=_launch_dir),
        Param("host_ram", str, HOST_RAM_AUTO, "host RAM per node, with its unit; auto: assumed, the listed instance "
              f"with these GPUs (in specs/prices.json), else {seed_machine_text(sentence=False)}",
              canonical=lambda v: v if str(v).strip().lower() == HOST_RAM_AUTO else (parse_memory_size(v), v)[1]),
        Param("trace", bool, True, "also trace setups with PyTorch's MemTracker (seconds each, cached)"),
        Param("versions", str, None, "the releases the user's run uses: name==release pins, comma-separated "
              "(torch==2.0.1,transformers==4.31.0), or a pip freeze file; none: the installed ones",
              canonical=_versions),
    )
}

# Injected into a notebook when its parameters cell declares them; not user parameters.
RESULTS_PATH_PARAM = "results_path"
OUT_DIR_PARAM = "out_dir"
SETUP_PATH_PARAM = "setup_path"  # the run's setup record (oomlab.launch.record), read once by the runner

_NONE_WORDS = ("none", "null", "~")
_TRUE_WORDS = ("true", "yes", "on", "1")
_FALSE_WORDS = ("false", "no", "off", "0")
_KIND_WORDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _accepted() -> str:
    return ", ".join(sorted(PARAMETERS))


def _convert(param: Param, raw: Any) -> Any:
    """Turn a YAML value or a ``key=value`` string into ``param.kind`` (or None), or raise."""
    expects = f"parameter {param.name!r} expects {_KIND_WORDS[param.kind]}"
    if param.nullable:
        expects += " or none"
    none_word = isinstance(raw, str) and raw.strip().lower() in _NONE_WORDS
    if raw is None or (none_word and (param.kind is not str or param.nullable)):
        if param.nullable:
            return None
        raise InvalidValueError(f"{expects}, got {shown(raw)}")
    if isinstance(raw, str) and param.kind is not str:
        text = raw.strip().lower()
        try:
            if param.kind is bool:
                if text not in _TRUE_WORDS + _FALSE_WORDS:
                    raise ValueError(text)
                return text in _TRUE_WORDS
            if len(text.lstrip("+-")) > 2 * MAX_INT_DIGITS:  # int() of 5,000 digits: Python's own limit, slowly
                raise ValueError(text)
            return param.kind(text)
        except ValueError as err:
            raise InvalidValueError(f"{expects}, got {shown(raw)}") from err
    if param.kind is str and isinstance(raw, int | float) and not isinstance(raw, bool):
        return str(raw)  # a YAML number where a name or size is expected: judged as the same text given by -p
    if isinstance(raw, bool) and param.kind is not bool:  # bool is an int subclass: refuse `gpus: true`
        raise InvalidValueError(f"{expects}, got {shown(raw)}")
    if param.kind is float and isinstance(raw, int):
        return float(raw)
    if not isinstance(raw, param.kind):
        raise InvalidValueError(f"{expects}, got {shown(raw)}")
    return raw


def _check(param: Param, value: Any) -> Any:
    """Validate a converted value against choices, bounds and the spec loaders; return it canonical."""
    if value is None:
        return None
    if param.choices is not None and value not in param.choices:
        raise InvalidValueError(
            f"parameter {param.name!r} must be one of {', '.join(param.choices)}; got {shown(value)}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidValueError(f"parameter {param.name!r} must be a finite number, got {shown(value)}")
    if isinstance(value, int | float) and not isinstance(value, bool) and abs(value) >= 10**MAX_INT_DIGITS:
        raise InvalidValueError(f"parameter {param.name!r} must be a number of at most {MAX_INT_DIGITS} digits, got "
                                f"{shown(value)}")
    if param.minimum is not None and value < param.minimum:
        raise InvalidValueError(f"parameter {param.name!r} must be >= {param.minimum:g}, got {shown(value)}")
    if param.maximum is not None and value > param.maximum:
        raise InvalidValueError(f"parameter {param.name!r} must be at most {param.maximum:g}, got {shown(value)}")
    if param.canonical is not None:
        try:
            return param.canonical(value)
        except OomlabError as err:
            raise InvalidValueError(f"parameter {param.name!r}: {err}") from err
    return value


def _shown(value: Any) -> str:
    """A default as ``-p`` accepts it back: ``none``, ``true``/``false``, else the value itself."""
    if value is None:
        return _NONE_WORDS[0]
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def render_params_help() -> str:
    """The registry as help text (the ``run`` subcommand's epilog): one line per parameter -- name, type (with its
    lower bound), default as ``-p`` accepts it, help and, where the values are a fixed set, the choices."""
    rows = [(p.name, p.kind.__name__ + ("" if p.minimum is None else f" >= {p.minimum:g}")
             + ("" if p.maximum is None else f", <= {p.maximum:g}")
             + (" or none" if p.nullable else ""), _shown(p.default),
             p.help + (f"; one of {', '.join(p.choices)}" if p.choices else "")) for p in PARAMETERS.values()]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [f"  {name:<{widths[0]}}  {kind:<{widths[1]}}  {default:<{widths[2]}}  {text}"
             for name, kind, default, text in rows]
    header = f"  {'KEY':<{widths[0]}}  {'TYPE':<{widths[1]}}  {'DEFAULT':<{widths[2]}}  MEANING"
    return "\n".join(["parameters (-p KEY=VALUE, or KEY: VALUE lines in --params FILE.yaml):", header, *lines])


def validate_params(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Type-check and validate ``raw`` (strings or typed values), fill defaults; raise on any bad key."""
    values: dict[str, Any] = {}
    for key, value in raw.items():
        param = PARAMETERS.get(key) if isinstance(key, str) else None
        if param is None:
            raise InvalidValueError(f"unknown parameter {shown(key)}; accepted: {_accepted()}")
        values[key] = _check(param, _convert(param, value))
    params = {name: values.get(name, param.default) for name, param in PARAMETERS.items()}
    _check_together(params)
    return params


def _check_together(params: Mapping[str, Any]) -> None:
    """What no single parameter can check: the sequence against the model, the GPU count against the ceiling --
    the same rules ``make_setup`` applies, before any notebook runs."""
    spec = load_model(params["model"])
    if params["seq"] > spec.max_position_embeddings:
        raise InvalidValueError(
            f"parameter 'seq' {params['seq']} exceeds {spec.name}'s max_position_embeddings "
            f"{spec.max_position_embeddings}: use a sequence length up to that (or a config.json that allows more)")
    if params["gpus"] > MAX_GPUS_PER_NODE:
        raise InvalidValueError(f"parameter 'gpus' must be at most {MAX_GPUS_PER_NODE}, got {params['gpus']}")
    if params["batch"] * params["seq"] > MAX_TOKENS:
        raise InvalidValueError(
            f"parameters 'batch' {params['batch']} x 'seq' {params['seq']} make {params['batch'] * params['seq']:,} "
            f"tokens per GPU; at most {MAX_TOKENS:,} are accepted: lower batch or seq")
    _check_non_pytorch(params)
    if params["lora_rank"] > spec.hidden_size:
        raise InvalidValueError(
            f"parameter 'lora_rank' {params['lora_rank']} exceeds {spec.name}'s hidden size {spec.hidden_size}: use "
            f"a rank from 1 to {spec.hidden_size}")
    _check_setup(params)  # last: the single parameters' own messages first


def _check_setup(params: Mapping[str, Any]) -> None:
    """The parameters' own setup must be one oomlab can run (QLoRA in fp32, bf16 on a T4 ...): refused here, in
    milliseconds, as make_setup refuses it (a launch_dir's setup is read, and refused, when the run starts)."""
    if params.get("launch_dir") is not None:
        return
    from oomlab.core.setup import make_setup

    try:
        make_setup(model=params["model"], gpu=params["gpu"],
                   **{name: params[name] for name in ("gpus", "strategy", "method", "precision", "optimizer", "batch",
                                                     "seq", "checkpointing", "attention", "lora_rank",
                                                     "lora_targets")})
    except OomlabError as err:
        raise InvalidValueError(f"the user's setup: {err}") from err


def _check_non_pytorch(params: Mapping[str, Any]) -> None:
    """Memory held outside PyTorch must leave the GPU some: below its total memory, as the reproduction requires
    (checked here, not 30 seconds into notebook 01)."""
    mib = params["non_pytorch_mib"]
    if mib is None:
        return
    gpu = load_gpu(params["gpu"])
    total_mib = gpu.total_memory_bytes / MiB
    if not mib < total_mib:
        raise InvalidValueError(
            f"parameter 'non_pytorch_mib' {mib:g} MiB is not below the total memory of gpu {gpu.name!r}, "
            f"{total_mib:.2f} MiB ({format_size(gpu.total_memory_bytes)}): give less than {total_mib:.2f}, or none "
            "for the measured/default figure")


def read_user_setup(params: Mapping[str, Any]) -> UserLaunch:
    """The user's setup, read from ``launch_dir`` or assumed from the (validated) parameters -- once per run: the
    runner records it for every notebook (:mod:`oomlab.launch.record`).  One oomlab cannot run is refused naming the
    bad file or combination, before any notebook runs (imported here: it loads the launch readers, which the
    registry's importers need not)."""
    from oomlab.launch.user import user_launch

    try:
        return user_launch(params, {name: p.default for name, p in PARAMETERS.items()})
    except OomlabError as err:
        where = f"launch_dir {shown(params['launch_dir'])}" if params.get("launch_dir") else "the user's setup"
        raise InvalidValueError(f"{where}: {err}") from err


def _read_params_file(params_file: str | os.PathLike[str]) -> dict[Any, Any]:
    """The YAML mapping of a params file, read within :mod:`oomlab.core.user_input`'s bounds: a regular file of a
    few MiB, UTF-8, no YAML aliases (a 316-byte alias bomb expanded to a 35.8 MB message), nesting bounded."""
    import yaml

    path = Path(params_file)
    name = shown(str(path))
    if not (path.exists() or path.is_symlink()):
        raise InvalidValueError(f"params file {name} does not exist")
    text = read_user_text(path, "params file")
    try:
        loaded = load_user_yaml(text)
    except yaml.YAMLError as err:
        detail = str(err)
        detail = detail if len(detail) <= 4 * SHOWN_CHARS else detail[:4 * SHOWN_CHARS] + "…"
        raise InvalidValueError(f"params file {name} is not valid YAML: {detail}") from err
    if loaded is None:  # an empty file: no overrides
        return {}
    if not isinstance(loaded, dict):
        raise InvalidValueError(
            f"params file {name} must be a mapping of parameter: value, got {type(loaded).__name__};"
            f" accepted: {_accepted()}"
        )
    return loaded


def parse_params(
    pairs: Iterable[str] = (), params_file: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """Read ``params_file`` (YAML mapping) then ``key=value`` pairs (which win); return every parameter (the launch
    they name is read by :func:`read_user_setup`, once, when the run starts)."""
    raw: dict[Any, Any] = {} if params_file is None else _read_params_file(params_file)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidValueError(
                f"malformed parameter {shown(pair)}: expected key=value; accepted: {_accepted()}"
            )
        raw[key.strip()] = value.strip()
    return validate_params(raw)


def notebook_launch(setup_path: str, params: Mapping[str, Any]) -> UserLaunch:
    """The launch a notebook works on: the record the runner wrote at ``setup_path`` (the pipeline: read once, the
    same typed value in every notebook), else -- a notebook opened by hand, ``setup_path`` empty -- read from its
    parameter cell's ``params``."""
    if setup_path:
        from oomlab.launch.record import read_launch_record

        return read_launch_record(setup_path)
    return read_user_setup(validate_params(params))
