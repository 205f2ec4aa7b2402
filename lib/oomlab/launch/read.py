"""The user's launch files and command turned into a :class:`~oomlab.core.setup.TrainingSetup` whose every field
carries its origin (:class:`~oomlab.launch.origin.Sourced`).

Read: an accelerate config YAML, a DeepSpeed JSON (``"auto"`` resolved as the HF integration does, through
:func:`oomlab.budget.deepspeed_config.read_deepspeed_config`), HF ``TrainingArguments`` (a JSON dump, or the
``--flags`` of a transformers-style script), a ``torchrun`` / ``accelerate launch`` / ``deepspeed`` / ``python``
command line, a peft ``adapter_config.json``, a ``quantization_config`` and the model's ``config.json``.  Every key
or flag not modelled is listed (:class:`~oomlab.launch.origin.Unmodelled`); two places that disagree raise
:class:`~oomlab.core.errors.LaunchConflictError` naming both; what nobody says comes from the library's default
(named with its version) or is oomlab's assumption (the pipeline parameter's default), and says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from oomlab.budget.deepspeed_config import DeepSpeedSettings
from oomlab.core.choices import Attention, Method, Optimizer, Precision, choice, plain
from oomlab.core.errors import InvalidValueError, LaunchConflictError, UnknownNameError
from oomlab.core.models import ALL_LINEAR
from oomlab.core.setup import TrainingSetup
from oomlab.core.user_input import shown
from oomlab.core.versions import Versions
from oomlab.launch import keys as K
from oomlab.launch.claims import Claims, Strength
from oomlab.launch.command import LaunchCommand, Launcher, expand_env
from oomlab.launch.files import LaunchFile
from oomlab.launch.origin import (
    Origin,
    OriginKind,
    Sourced,
    Unmodelled,
    default_origin,
    flag_origin,
)

ASSUMED_SEQ = 2048  # the pipeline's seq default
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
# The largest count a launch may state: far beyond any real run, small enough that every estimate stays quick.
MAX_BATCH = 2**20  # a micro-batch per GPU
MAX_SEQ = 2**24  # a sequence length in tokens
MAX_PROCESSES = 65_536  # processes, GPUs per node, nodes
MAX_LORA = 2**20  # a LoRA rank or alpha
# accelerate's numbered choices (a YAML key or a launcher flag): the range each accepts
_NUMBERED = {"zero_stage": (0, 3), "fsdp_version": (1, 2)}


@dataclass(frozen=True)
class LaunchInputs:
    """The user's files and command (paths as given; None: not given)."""

    command: str | None = None
    accelerate_config: str | None = None
    deepspeed: str | None = None
    training_args: str | None = None
    adapter_config: str | None = None
    quantization_config: str | None = None
    model: str | None = None  # a shipped name or a config.json
    gpu: str = "t4"
    gpus: int | None = None  # GPUs per node on the machine (None: as the launch says)
    command_dir: str | None = None  # the folder holding the command (launch.txt): its relative paths start there
    seq: int | None = None  # ``check --seq N``: the sequence length, whatever the launch says
    batch: int | None = None  # ``check --batch N``: the micro-batch per GPU, whatever the launch says
    trainer: str | None = None  # ``check --trainer KIND``: the training loop, whatever the launch says
    loss: str | None = None  # ``check --loss KIND``: the loss kernel, whatever the launch says
    versions: Versions | None = None  # the user's releases (``check --versions``): TRL's defaults follow its release

    @property
    def given(self) -> bool:
        """Was any launch file or command given?"""
        return any((self.command, self.accelerate_config, self.deepspeed, self.training_args, self.adapter_config,
                    self.quantization_config))


@dataclass(frozen=True)
class UserLaunch:
    """The user's setup as launched, each field with its origin."""

    setup: TrainingSetup
    fields: Mapping[str, Sourced]  # every setup field, plus load_dtype, launcher, zero3_init
    deepspeed: DeepSpeedSettings | None  # the DeepSpeed knobs (None: not a DeepSpeed launch)
    launcher: Launcher | None
    hf_trainer: bool  # an HF Trainer script (TrainingArguments given, as a file or flags); fields['trainer']: the kind
    command: LaunchCommand | None
    unmodelled: tuple[Unmodelled, ...]
    files: tuple[str, ...]
    # what a framework's read keeps for its fixes (torchtune: recipe, builder, the YAML's keys); JSON-able
    framework_values: Mapping[str, Any] = field(default_factory=dict)

    @property
    def load_dtype(self) -> str:
        return self.fields["load_dtype"].value

    @property
    def zero3_init(self) -> bool:
        return bool(self.fields["zero3_init"].value)

    @property
    def assumptions(self) -> tuple[str, ...]:
        """The fields nobody stated, with oomlab's reason for the value taken (``zero3_init`` only for a ZeRO-3
        launch: nothing else reads it)."""
        strategy = self.fields.get("strategy")
        zero3 = strategy is not None and strategy.value.zero_stage == 3
        return tuple(f"{name} = {s.shown}: {s.origin.where}" for name, s in self.fields.items()
                     if s.origin.kind is OriginKind.ASSUMED and (name != "zero3_init" or zero3))

    def to_dict(self) -> dict[str, Any]:
        return {"fields": {name: s.to_dict() for name, s in self.fields.items()},
                "launcher": None if self.launcher is None else self.launcher.value, "hf_trainer": self.hf_trainer,
                "command": None if self.command is None else self.command.to_dict(),
                "unmodelled": [u.to_dict() for u in self.unmodelled], "files": list(self.files),
                "framework_values": {k: list(v) if isinstance(v, tuple) else v
                                     for k, v in self.framework_values.items()},
                "assumptions": list(self.assumptions),
                "deepspeed": None if self.deepspeed is None else {k: plain(getattr(self.deepspeed, k)) for k in
                                                                  self.deepspeed.__dataclass_fields__}}


def bool_value(value: Any, origin: Origin) -> bool:
    if value is None or isinstance(value, bool):
        return value is None or value
    text = str(value).strip().lower()
    if text in _TRUE + _FALSE:
        return text in _TRUE
    raise InvalidValueError(f"{origin}: expected true or false, got {shown(value)}")


def int_value(value: Any, origin: Origin | str, high: int, low: int = 1) -> int:
    """A count the user states (a batch, a sequence length, a number of processes, a ZeRO stage): an integer, an
    integral float or the text of one, from ``low`` to ``high``; anything else (NaN, infinities, ``1e308``, a bool, a
    list) is refused naming ``origin``, the value and the range."""
    number: Any = value
    if isinstance(value, str):
        text = value.strip()
        try:
            number = int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                number = None
    whole = not isinstance(number, bool) and (isinstance(number, int) or isinstance(number, float)
                                               and math.isfinite(number) and number.is_integer())
    if not whole or not low <= number <= high:
        raise InvalidValueError(f"{origin}: expected an integer from {low} to {high:,}, got {shown(value)}")
    return int(number)


# ------------------------------------------------------------------------------------------ one reader per kind

Lookup = Callable[[str], tuple[bool, Any, Origin]]


def file_lookup(f: LaunchFile) -> Lookup:
    return lambda key: (f.has(key), f.get(key), f.origin(key))


def flag_lookup(cmd: LaunchCommand) -> Lookup:
    def look(key: str) -> tuple[bool, Any, Origin]:
        found = cmd.flag(f"--{key}", f"--{key.replace('_', '-')}", key)  # key=value: LLaMA-Factory's override
        if found is None:
            return False, None, flag_origin(f"--{key}")
        if not found[0].startswith("-"):
            return True, found[1], flag_origin(f"{found[0]}={found[1]}")
        return True, found[1], flag_origin(found[0] if found[1] is None else f"{found[0]} {found[1]}")
    return look


def _first(look: Lookup, names: tuple[str, ...]) -> tuple[bool, Any, Origin]:
    for name in names:
        hit = look(name)
        if hit[0] and hit[1] is not None:
            return hit
        if hit[0] and hit[1] is None:  # a bare --flag
            return hit
    return False, None, look(names[0])[2]


def training_claims(claims: Claims, look: Lookup, is_json: bool) -> dict[str, Any]:
    """TrainingArguments (a JSON dump or script flags): the fields they state; returns the DeepSpeed / FSDP /
    model references they make."""
    refs: dict[str, Any] = {}
    fp16, bf16 = look("fp16"), look("bf16")
    on16 = fp16[0] and bool_value(fp16[1], fp16[2])
    onbf = bf16[0] and bool_value(bf16[1], bf16[2])
    if on16 and onbf:
        raise LaunchConflictError(f"contradiction in precision: {fp16[2]} says fp16 but {bf16[2]} says bf16; "
                                  "set one of them")
    if on16 or onbf:
        claims.say("precision", Precision.FP16_MIXED if on16 else Precision.BF16_MIXED, (fp16 if on16 else bf16)[2])
    elif is_json and fp16[0] and bf16[0]:
        claims.say("precision", Precision.FP32, fp16[2])
    hit = _first(look, K.BATCH_KEYS)
    if hit[0]:
        claims.say("batch", int_value(hit[1], hit[2], MAX_BATCH), hit[2])
    hit = _first(look, K.SEQ_KEYS)
    if hit[0] and hit[1] is not None:
        claims.say("seq", int_value(hit[1], hit[2], MAX_SEQ), hit[2])
    source, target = (look(key) for key in K.SOURCE_TARGET_KEYS)
    if source[0] and target[0] and source[1] is not None and target[1] is not None:  # prompt + answer, concatenated
        total = int_value(source[1], source[2], MAX_SEQ) + int_value(target[1], target[2], MAX_SEQ)
        claims.say("seq", total, Origin(source[2].kind, f"{source[2].where} + {target[2].where}", source[2].key,
                                        source[2].line))
    for key in K.CHECKPOINTING_KEYS:
        hit = look(key)
        if hit[0] and hit[1] is not None or hit[0] and not is_json:
            claims.say("checkpointing", bool_value(hit[1], hit[2]), hit[2])
    hit = look("optim")
    if hit[0] and hit[1] is not None:
        claims.say("optimizer", optimizer_of(hit[1], hit[2]), hit[2])
    hit = look("attn_implementation")
    if hit[0] and hit[1] is not None:
        claims.say("attention", attention_of(hit[1], hit[2]), hit[2])
    hit = _first(look, K.DTYPE_KEYS)
    if hit[0] and hit[1] not in (None, "auto"):
        claims.say("load_dtype", dtype_name(hit[1], hit[2]), hit[2])
    for name in ("deepspeed", "fsdp", "fsdp_config"):
        hit = look(name)
        if hit[0] and hit[1] not in (None, "", [], False):
            refs[name] = hit
        elif hit[0] and hit[1] is None and not is_json:
            refs[name] = hit  # a bare --deepspeed: the script reads its own JSON (given with --deepspeed F)
    hit = _first(look, K.ACCUMULATION_KEYS)
    if hit[0] and hit[1] is not None:  # fills a DeepSpeed JSON's "auto" (oomlab.launch.batch)
        refs["gradient_accumulation_steps"] = (int_value(hit[1], hit[2], MAX_BATCH), hit[2])
        claims.say("accumulation", refs["gradient_accumulation_steps"][0], hit[2])
    hit = _first(look, K.MODEL_KEYS)
    if hit[0] and hit[1]:
        refs["model"] = hit
    hit = look("use_peft")
    if hit[0] and bool_value(hit[1], hit[2]):
        claims.say("method", Method.LORA, hit[2])
    for names, target in ((K.LORA_RANK_KEYS, "lora_rank"), (K.LORA_ALPHA_KEYS, "lora_alpha")):
        hit = _first(look, names)
        if hit[0] and hit[1] is not None:
            claims.say(target, int_value(hit[1], hit[2], MAX_LORA), hit[2])
    hit = look("lora_target_modules")
    if hit[0] and hit[1]:
        claims.say("lora_targets", targets_of(hit[1]), hit[2])
    for names, bits in ((K.QUANT_4BIT_KEYS, 4), (K.QUANT_8BIT_KEYS, 8)):
        hit = _first(look, names)
        if hit[0] and bool_value(hit[1], hit[2]):
            claims.say("quantization", bits, hit[2])
    return refs


def targets_of(value: Any) -> tuple[str, ...]:
    """LoRA target modules as written: a list, ``q_proj,v_proj``, ``[q_proj,v_proj]`` (a fire flag), or
    ``all-linear``."""
    if isinstance(value, str):
        text = value.strip().strip("[]")
        if text == ALL_LINEAR:
            return (ALL_LINEAR,)
        return tuple(t.strip("'\"") for t in text.replace(",", " ").split() if t.strip("'\""))
    return tuple(str(t) for t in value)


def optimizer_of(value: Any, origin: Origin | str) -> Optimizer:
    """A launch's optimizer name (the HF Trainer's ``optim`` spellings) as oomlab's choice; an unknown one refused
    with the names oomlab budgets."""
    name = str(value).lower()
    if name not in K.OPTIM_NAMES:
        raise UnknownNameError(f"optimizer ({origin})", name, K.OPTIM_NAMES, "the optimizers oomlab budgets")
    return K.OPTIM_NAMES[name]


def attention_of(value: Any, origin: Origin) -> Attention:
    """transformers' attn_implementation (or a framework's name for it) as oomlab's attention."""
    text = str(value).lower()
    if text.startswith("flash_attention") or text == "flex_attention":
        return Attention.SDPA  # NB: memory-efficient kernels save no s x s probabilities, as SDPA
    try:
        return choice(Attention, text, "attention")
    except InvalidValueError as err:
        raise InvalidValueError(f"{origin}: {err}") from err


def dtype_name(value: Any, origin: Origin) -> str:
    text = str(value).replace("torch.", "").lower()
    names = {"float16": "float16", "fp16": "float16", "half": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16",
             "float32": "float32", "fp32": "float32", "float": "float32"}
    if text not in names:
        raise UnknownNameError(f"load dtype ({origin})", value, sorted(set(names.values())))
    return names[text]


def accelerate_refs(claims: Claims, f: LaunchFile) -> dict[str, Any]:
    refs: dict[str, Any] = {}
    dist = str(f.get("distributed_type", "NO")).upper()
    known = ("NO", "MULTI_GPU", "DEEPSPEED", "FSDP")
    if dist not in known:
        raise UnknownNameError(f"distributed_type ({f.origin('distributed_type')})", dist, known)
    refs["distributed_type"] = (dist, f.origin("distributed_type"))
    if f.has("num_processes"):
        origin = f.origin("num_processes")
        refs["num_processes"] = (int_value(f.get("num_processes"), origin, MAX_PROCESSES), origin)
    if f.has("num_machines"):
        origin = f.origin("num_machines")
        claims.say("nodes", int_value(f.get("num_machines"), origin, MAX_PROCESSES), origin)
    if f.has("mixed_precision"):
        mixed = str(f.get("mixed_precision")).lower()
        if mixed not in K.ACCELERATE_MIXED:
            raise UnknownNameError(f"mixed_precision ({f.origin('mixed_precision')})", mixed, K.ACCELERATE_MIXED)
        claims.say("precision", K.ACCELERATE_MIXED[mixed], f.origin("mixed_precision"),
                   Strength.WEAK if mixed == "no" else Strength.STATED)
    if f.get("deepspeed_config.deepspeed_config_file"):
        refs["deepspeed"] = (True, f.get("deepspeed_config.deepspeed_config_file"),
                             f.origin("deepspeed_config.deepspeed_config_file"))
    for key in ("zero_stage", "offload_optimizer_device", "offload_param_device", "zero3_init_flag"):
        if f.has(f"deepspeed_config.{key}"):
            refs[key] = _numbered(key, f.get(f"deepspeed_config.{key}"), f.origin(f"deepspeed_config.{key}"))
    for key in ("fsdp_version", "fsdp_offload_params", "fsdp_sharding_strategy"):
        if f.has(f"fsdp_config.{key}"):
            refs[key] = _numbered(key, f.get(f"fsdp_config.{key}"), f.origin(f"fsdp_config.{key}"))
    if f.has("fsdp_config.fsdp_activation_checkpointing"):
        origin = f.origin("fsdp_config.fsdp_activation_checkpointing")
        claims.say("checkpointing", bool_value(f.get("fsdp_config.fsdp_activation_checkpointing"), origin), origin)
    return refs


def _numbered(key: str, value: Any, origin: Origin) -> tuple[Any, Origin]:
    """``(value, origin)`` of an accelerate key or flag; a numbered choice (``zero_stage``, ``fsdp_version``) as an
    int in its range."""
    if key in _NUMBERED:
        low, high = _NUMBERED[key]
        return int_value(value, origin, high, low), origin
    return value, origin


def _nodes(value: Any, origin: Origin) -> tuple[int, Origin]:
    """torchrun's ``--nnodes N`` or ``MIN:MAX`` (elastic, torch/distributed/run.py ``parse_min_max_nnodes``): the
    fewest nodes, each bound checked.  An elastic job starts, and restarts after a node is lost, with as few as MIN
    nodes; every sharded state per GPU (ZeRO, FSDP) and a DeepSpeed train_batch_size's micro-batch are largest on
    the fewest, so MIN is the world a fit must survive."""
    parts = [int_value(part, origin, MAX_PROCESSES) for part in str(value).split(":")]
    if len(parts) > 2 or parts[0] > parts[-1]:
        raise InvalidValueError(f"{origin}: expected N or MIN:MAX nodes with MIN <= MAX, got {shown(value)}")
    if len(parts) == 1 or parts[0] == parts[1]:
        return parts[0], origin
    return parts[0], Origin(origin.kind, f"{origin.where} (elastic: its fewest nodes, where each GPU holds most)")


def launcher_refs(claims: Claims, cmd: LaunchCommand) -> dict[str, Any]:
    """What the launcher's own options say: processes, nodes, distributed type, precision, DeepSpeed knobs."""
    refs: dict[str, Any] = {}

    env = dict(cmd.env)

    def opt(*names: str) -> tuple[Any, Origin] | None:
        found = cmd.option(*names)
        return None if found is None else (expand_env(found[1], env),
                                           flag_origin(f"{found[0]} {found[1] or ''}".strip()))

    if cmd.launcher in (Launcher.TORCHRUN, Launcher.TUNE):  # tune run passes its options to torchrun
        n, nodes = opt("--nproc_per_node", "--nproc-per-node"), opt("--nnodes")
        if n and n[0] not in ("gpu", "auto"):
            claims.say("gpus", int_value(n[0], n[1], MAX_PROCESSES), n[1])
        elif n is None:
            claims.say("gpus", 1, default_origin("torch torchrun", "--nproc_per_node 1"), Strength.DEFAULT)
        if nodes:
            claims.say("nodes", *_nodes(nodes[0], nodes[1]))
    elif cmd.launcher is Launcher.DEEPSPEED:
        # runner.py parse_args: --num_gpus/--num_accelerators; --num_nodes, which argparse's prefix matching also
        # takes as --num_node; -H/--hostfile
        n, nodes, hostfile = opt("--num_gpus", "--num_accelerators"), opt("--num_nodes", "--num_node"), \
            opt("--hostfile", "-H")
        if n:
            claims.say("gpus", int_value(n[0], n[1], MAX_PROCESSES), n[1])
        count = None if nodes is None else int_value(nodes[0], nodes[1], MAX_PROCESSES)
        if hostfile:  # read by oomlab.launch.nodes: --num_nodes keeps its first hosts
            refs["hostfile"] = (hostfile[0], hostfile[1], count, None if nodes is None else nodes[1], n is not None)
        elif nodes:
            claims.say("nodes", count, nodes[1])
        refs["distributed_type"] = ("DEEPSPEED", flag_origin("deepspeed (the launcher)"))
    elif cmd.launcher is Launcher.LLAMAFACTORY:
        # launcher.py (LLaMA-Factory 0.9.5) lines 64-66: torchrun --nnodes $NNODES --nproc_per_node $NPROC_PER_NODE,
        # NPROC_PER_NODE defaulting to every visible GPU (get_device_count); oomlab.launch.resolve counts those
        for name, field_name in (("NPROC_PER_NODE", "gpus"), ("NNODES", "nodes")):
            if name in env:
                origin = flag_origin(f"{name}={env[name]} (LLaMA-Factory launcher.py)")
                claims.say(field_name, int_value(env[name], origin, MAX_PROCESSES), origin)
    elif cmd.launcher is Launcher.TRL:  # trl/cli/accelerate_launcher.py: accelerate launch's own --num_processes
        hit = cmd.flag("--num_processes")
        if hit and hit[1] is not None:
            refs["num_processes"] = (int_value(hit[1], flag_origin(f"--num_processes {hit[1]}"), MAX_PROCESSES),
                                     flag_origin(f"--num_processes {hit[1]}"))
    elif cmd.launcher is Launcher.AXOLOTL:
        pass  # axolotl train runs accelerate launch -m axolotl.cli.train: a process per visible GPU
    elif cmd.launcher is Launcher.PYTHON and "SLURM_NTASKS_PER_NODE" in env:
        pass  # srun starts SLURM_NTASKS_PER_NODE processes per node (oomlab.launch.nodes.slurm_claims)
    elif cmd.launcher is Launcher.PYTHON:
        claims.say("gpus", 1, flag_origin("python (one process)"))
    else:
        for names, key in ((("--num_processes",), "num_processes"), (("--num_machines",), "nodes")):
            hit = opt(*names)
            if hit and key == "nodes":
                claims.say("nodes", int_value(hit[0], hit[1], MAX_PROCESSES), hit[1])
            elif hit:
                refs[key] = (int_value(hit[0], hit[1], MAX_PROCESSES), hit[1])
        for switch, dist in (("--use_deepspeed", "DEEPSPEED"), ("--use_fsdp", "FSDP"), ("--multi_gpu", "MULTI_GPU")):
            hit = opt(switch)
            if hit:
                refs["distributed_type"] = (dist, hit[1])
        hit = opt("--mixed_precision")
        if hit:
            mixed = str(hit[0]).lower()
            if mixed not in K.ACCELERATE_MIXED:
                raise UnknownNameError(f"mixed_precision ({hit[1]})", mixed, K.ACCELERATE_MIXED)
            claims.say("precision", K.ACCELERATE_MIXED[mixed], hit[1], Strength.WEAK if mixed == "no"
                       else Strength.STATED)
        hit = opt("--deepspeed_config_file")
        if hit:
            refs["deepspeed"] = (True, hit[0], hit[1])
        for key in ("zero_stage", "offload_optimizer_device", "offload_param_device", "zero3_init_flag",
                    "fsdp_version", "fsdp_offload_params"):
            hit = opt(f"--{key}")
            if hit:
                refs[key] = _numbered(key, *hit)
        hit = opt("--config_file")
        if hit:
            refs["config_file"] = hit
    return refs
