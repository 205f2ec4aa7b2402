"""The fix in the user's own files: the DeepSpeed JSON, the accelerate YAML and the TrainingArguments JSON changed
exactly where the ladder's fix says, every changed line marked.

A value the fix changes is written where the launch read it (its origin: a file and key); the strategy goes where its
launcher reads it (``zero_optimization`` of the DeepSpeed JSON, ``deepspeed_config`` / ``fsdp_config`` of the accelerate
YAML); a number the DeepSpeed JSON states (not ``"auto"``) is kept consistent with the flags, since the HF integration
refuses a JSON that disagrees with TrainingArguments (``HfTrainerDeepSpeedConfig.trainer_config_finalize``).  The
user's files are never written: :class:`ChangedFile` holds the new text and the marked lines, for ``check`` to show.

An edit replaces the value on the key's own line where the key exists with a scalar (comments and layout kept);
otherwise the file is written again from its data (JSON with the file's indent, YAML block style) and the marks show
every line that differs."""

from __future__ import annotations

import copy
import difflib
import enum
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from oomlab.core.choices import Optimizer, Strategy
from oomlab.core.setup import TrainingSetup
from oomlab.core.user_input import read_user_text
from oomlab.launch.files import LaunchFile, read_json, read_yaml
from oomlab.launch.origin import OriginKind
from oomlab.launch.read import LaunchInputs, UserLaunch
from oomlab.remedies.ladder import Decision, Rung, rung_words

OPTIM_NAMES = {Optimizer.ADAMW: "adamw_torch", Optimizer.ADAMW_FUSED: "adamw_torch_fused",
               Optimizer.ADAMW_8BIT: "adamw_bnb_8bit", Optimizer.SGD: "sgd", Optimizer.ADAMW_HF: "adamw_hf"}
_OFFLOAD = {"device": "cpu", "pin_memory": True}
_SCALARS = (bool, int, float, str, type(None))


class FileKind(enum.Enum):
    """Which of the user's files: the launcher reads each differently."""

    DEEPSPEED = "DeepSpeed JSON"
    ACCELERATE = "accelerate config"
    TRAINING_ARGS = "TrainingArguments JSON"
    FRAMEWORK = "framework config"  # LLaMA-Factory's, axolotl's or TRL's YAML: edited where the launch read a value


@dataclass(frozen=True)
class UserFile:
    """One of the user's launch files as ``check`` read it, with its text."""

    kind: FileKind
    file: LaunchFile
    text: str

    @property
    def is_json(self) -> bool:
        return self.file.path.lower().endswith(".json")


@dataclass(frozen=True)
class KeyEdit:
    """One key of one file: set to ``value``, or removed (``remove``), and why."""

    key: str  # dotted
    value: Any
    why: str
    remove: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "value": None if self.remove else self.value, "remove": self.remove, "why": self.why}


@dataclass(frozen=True)
class ChangedFile:
    """One of the user's files with the fix in it."""

    path: str
    kind: FileKind
    before: str
    after: str
    edits: tuple[KeyEdit, ...]

    @property
    def marked(self) -> tuple[str, ...]:
        """The new file, line by line: ``+`` a changed or added line, ``-`` a removed one, two spaces otherwise."""
        diff = difflib.ndiff(self.before.splitlines(), self.after.splitlines())
        return tuple(line for line in diff if not line.startswith("? "))

    def hunks(self, context: int = 2) -> tuple[str, ...]:
        """:attr:`marked`, only the changed lines and ``context`` lines around each (``...`` between)."""
        marked = self.marked
        near = {j for i, line in enumerate(marked) if line[:1] in "+-"
                for j in range(i - context, i + context + 1)}
        out: list[str] = []
        for i, line in enumerate(marked):
            if i in near:
                if out and i - 1 not in near:
                    out.append("  ...")
                out.append(line)
        return tuple(out)

    @property
    def changed_lines(self) -> int:
        return sum(line.startswith("+ ") for line in self.marked)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "kind": self.kind.value, "edits": [e.to_dict() for e in self.edits],
                "text": self.after, "marked": list(self.marked)}


def _field_value(name: str, key: str, fix: TrainingSetup, accumulation: int) -> Any:
    """The fix's value of setup field ``name`` as file key ``key`` spells it."""
    if name == "batch":
        return fix.batch
    if name == "accumulation":
        return accumulation
    if name == "checkpointing":
        return not key.endswith("disable_gradient_checkpointing")  # LLaMA-Factory's key says the opposite
    if name == "seq":
        return fix.seq
    if name == "optimizer":
        return OPTIM_NAMES[fix.optimizer]
    if name == "gpus":
        return fix.gpus * fix.nodes if key.endswith("num_processes") else fix.gpus
    if name == "base_dtype":  # the load dtype's key (torch_dtype / dtype): the half dtype the precision computes in
        return fix.precision.compute_dtype
    raise KeyError(name)


_RUNG_FIELDS = {Rung.CHECKPOINTING: ("checkpointing",), Rung.MICRO_BATCH: ("batch", "accumulation"),
                Rung.FUSED_OPTIMIZER: ("optimizer",), Rung.OPTIMIZER_8BIT: ("optimizer",), Rung.SHORTER_SEQ: ("seq",),
                Rung.MORE_GPUS: ("gpus",), Rung.HALF_BASE: ("base_dtype",)}


def _user_accumulation(launch: UserLaunch) -> int:
    given = launch.fields.get("accumulation")
    return int(given.value) if given is not None and isinstance(given.value, int) else 1


def _numeric(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _deepspeed_edits(ds: LaunchFile, fix: TrainingSetup, configured: TrainingSetup, accumulation: int,
                     why: Mapping[str, str]) -> list[KeyEdit]:
    edits = []
    strategy = fix.strategy
    if strategy.deepspeed and strategy is not configured.strategy:
        words = why.get("strategy", "")
        edits.append(KeyEdit("zero_optimization.stage", strategy.zero_stage, words))
        if strategy.offloads_optimizer:
            edits.append(KeyEdit("zero_optimization.offload_optimizer.device", "cpu", words)
                         if isinstance(ds.get("zero_optimization.offload_optimizer"), Mapping)
                         else KeyEdit("zero_optimization.offload_optimizer", dict(_OFFLOAD), words))
        if strategy is Strategy.ZERO3_OFFLOAD:
            edits.append(KeyEdit("zero_optimization.offload_param.device", "cpu", words)
                         if isinstance(ds.get("zero_optimization.offload_param"), Mapping)
                         else KeyEdit("zero_optimization.offload_param", dict(_OFFLOAD), words))
    # numbers the JSON states must agree with TrainingArguments (the HF integration checks them)
    world = fix.gpus * fix.nodes
    for key, value, field in (("train_micro_batch_size_per_gpu", fix.batch, "batch"),
                              ("gradient_accumulation_steps", accumulation, "accumulation"),
                              ("train_batch_size", fix.batch * accumulation * world, "batch")):
        if _numeric(ds.get(key)) and ds.get(key) != value:
            edits.append(KeyEdit(key, value, why.get(field, why.get("gpus", ""))))
    if fix.optimizer is not configured.optimizer and isinstance(ds.get("optimizer"), Mapping):
        edits.append(KeyEdit("optimizer", None, why.get("optimizer", "") + "; without an optimizer block the "
                             "Trainer builds --optim's optimizer and DeepSpeed wraps it", remove=True))
    return edits


def _accelerate_edits(acc: LaunchFile, fix: TrainingSetup, configured: TrainingSetup, accumulation: int,
                      why: Mapping[str, str]) -> list[KeyEdit]:
    edits = []
    strategy, words = fix.strategy, why.get("strategy", "")
    kind = str(acc.get("distributed_type", "")).upper()
    if strategy is not configured.strategy:
        if strategy.deepspeed:
            if kind != "DEEPSPEED":
                edits.append(KeyEdit("distributed_type", "DEEPSPEED", words))
            edits.append(KeyEdit("deepspeed_config.zero_stage", strategy.zero_stage, words))
            if strategy.offloads_optimizer:
                edits.append(KeyEdit("deepspeed_config.offload_optimizer_device", "cpu", words))
            if strategy is Strategy.ZERO3_OFFLOAD:
                edits.append(KeyEdit("deepspeed_config.offload_param_device", "cpu", words))
        elif strategy.fsdp:
            if kind != "FSDP":
                edits.append(KeyEdit("distributed_type", "FSDP", words))
            edits.append(KeyEdit("fsdp_config.fsdp_offload_params", strategy.offloads, words))
            version = 2 if strategy in (Strategy.FSDP2, Strategy.FSDP2_OFFLOAD) else 1
            if version == 2 or acc.has("fsdp_config.fsdp_version"):
                edits.append(KeyEdit("fsdp_config.fsdp_version", version, words))
    world = fix.gpus * fix.nodes
    if _numeric(acc.get("num_processes")) and acc.get("num_processes") != world:
        edits.append(KeyEdit("num_processes", world, why.get("gpus", "")))
    if _numeric(acc.get("deepspeed_config.gradient_accumulation_steps")) \
            and acc.get("deepspeed_config.gradient_accumulation_steps") != accumulation:
        edits.append(KeyEdit("deepspeed_config.gradient_accumulation_steps", accumulation, why.get("accumulation", "")))
    return edits


def fix_edits(launch: UserLaunch, decision: Decision, files: Sequence[UserFile]) -> dict[str, list[KeyEdit]]:
    """Every key edit of the fix, by file path."""
    fix = decision.setup
    if fix is None or not decision.steps:
        return {}
    accumulation = _user_accumulation(launch) * decision.accumulation
    why: dict[str, str] = {}
    for step in decision.steps:
        for name in _RUNG_FIELDS.get(step.rung, ("strategy",) if step.rung in (Rung.SHARDING, Rung.OFFLOAD)
                                     else ()):
            why[name] = rung_words(step.rung)
    out: dict[str, list[KeyEdit]] = {}
    by_path = {f.file.path: f for f in files}
    # torchtune: its optimizer is a component (and fused) and its processes tune run's: the command carries them
    command_only = ("optimizer", "gpus") if launch.framework_values.get("recipe") else ()
    for name, words in why.items():  # each changed field where the launch read it
        sourced = launch.fields.get(name)  # the strategy: where its launcher reads it (below)
        if name == "strategy" or name in command_only or sourced is None \
                or sourced.origin.kind is not OriginKind.FILE or sourced.origin.where not in by_path:
            continue
        key = sourced.origin.key
        out.setdefault(sourced.origin.where, []).append(KeyEdit(key, _field_value(name, key, fix, accumulation),
                                                                words))
    structural = {FileKind.DEEPSPEED: _deepspeed_edits, FileKind.ACCELERATE: _accelerate_edits}
    for user in files:
        if user.kind in structural:
            edits = out.setdefault(user.file.path, [])
            for edit in structural[user.kind](user.file, fix, decision.configured, accumulation, why):
                if all(e.key != edit.key for e in edits):
                    edits.append(edit)
    return {path: edits for path, edits in out.items() if edits}


def _indent(text: str) -> int:
    match = re.search(r"\n( +)\S", text)
    return len(match.group(1)) if match else 2


def _scalar_text(value: Any, json_file: bool) -> str:
    if json_file:
        return json.dumps(value)
    return yaml.safe_dump(value, default_flow_style=True).splitlines()[0]


def _in_place(lines: list[str], file: LaunchFile, edit: KeyEdit, json_file: bool) -> bool:
    """Replace the value on the key's own line; False where that cannot be done safely."""
    line = file.lines.get(edit.key)
    if edit.remove or line is None or not isinstance(file.get(edit.key), _SCALARS) \
            or not isinstance(edit.value, _SCALARS):
        return False
    leaf = re.escape(edit.key.rsplit(".", 1)[-1])
    pattern = (rf'("{leaf}"\s*:\s*)("(?:[^"\\]|\\.)*"|[-+0-9.eE]+|true|false|null)' if json_file
               else rf"^(\s*{leaf}\s*:\s*)([^#\n]*?)(?=\s*(?:#.*)?$)")
    new, count = re.subn(pattern, lambda m: m.group(1) + _scalar_text(edit.value, json_file), lines[line - 1],
                         count=1)
    if count != 1:
        return False
    lines[line - 1] = new
    return True


def _set(data: dict[str, Any], edit: KeyEdit) -> None:
    *parents, leaf = edit.key.split(".")
    node = data
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    if edit.remove:
        node.pop(leaf, None)
    else:
        node[leaf] = copy.deepcopy(edit.value)


def rewrite(user: UserFile, edits: Sequence[KeyEdit]) -> ChangedFile:
    """The user's file with ``edits``: in place where every edit can be, else written again."""
    file, text, kind, json_file = user.file, user.text, user.kind, user.is_json
    lines = text.splitlines(keepends=True)
    if all(_in_place(lines, file, edit, json_file) for edit in edits):
        return ChangedFile(file.path, kind, text, "".join(lines), tuple(edits))
    data = json.loads(json.dumps(file.data))  # plain dicts and lists, a copy
    for edit in edits:
        _set(data, edit)
    after = (json.dumps(data, indent=_indent(text)) + "\n" if json_file
             else yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
    return ChangedFile(file.path, kind, text, after, tuple(edits))


def changed_files(launch: UserLaunch, decision: Decision, files: Sequence[UserFile]) -> tuple[ChangedFile, ...]:
    """The user's files with the fix in them; those the fix does not touch are left out."""
    edits = fix_edits(launch, decision, files)
    return tuple(rewrite(user, edits[user.file.path]) for user in files if user.file.path in edits)


def _kind(file: LaunchFile, inputs: LaunchInputs) -> FileKind | None:
    """Which launch file ``file`` is: as ``inputs`` named it, else by what it holds; None for the files a fix never
    changes (adapter_config.json, config.json, a quantization_config)."""
    named = {inputs.deepspeed: FileKind.DEEPSPEED, inputs.accelerate_config: FileKind.ACCELERATE,
             inputs.training_args: FileKind.TRAINING_ARGS}
    if file.path in named:
        return named[file.path]
    if file.has("zero_optimization") or file.has("train_micro_batch_size_per_gpu"):
        return FileKind.DEEPSPEED
    if file.has("distributed_type") or file.has("compute_environment"):
        return FileKind.ACCELERATE
    if file.path.lower().endswith(".json"):
        return FileKind.TRAINING_ARGS if file.has("per_device_train_batch_size") or file.has("output_dir") else None
    return FileKind.FRAMEWORK


def user_files(inputs: LaunchInputs, launch: UserLaunch) -> tuple[UserFile, ...]:
    """The user's launch files as ``check`` read them (``launch.files``: the same paths, the same bounded reads),
    each with its kind and text."""
    out = []
    for path in launch.files:
        suffix = path.lower().rsplit(".", 1)[-1]
        if suffix not in ("json", "yaml", "yml"):
            continue
        file = read_json(path) if suffix == "json" else read_yaml(path)
        kind = _kind(file, inputs)
        if kind is not None:
            out.append(UserFile(kind, file, read_user_text(path, kind.value)))
    return tuple(out)
