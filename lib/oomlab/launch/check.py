"""``oomlab check``: where the user's launch fails first -- while loading (the ``.to()`` of a replica, or the
partitions of ``zero.Init``) or in the training step, in which phase -- the per-GPU budget, and the smallest change
that makes it fit (a fitting knob of :func:`oomlab.remedies.knobs.knob_table` whose launch also loads).

Limitations: the load of an FSDP launch is the shard plus one unsharded decoder layer (NB: an approximation of
FSDP's unit-by-unit move); a 4-bit base on one process per GPU is checked as bitsandbytes quantizes it on arrival
(:func:`oomlab.launch.load_peak.quantized_load`), device_map and sharded 4-bit loads are not (the step decides).
The host RAM every process on a node holds while loading is checked against the node's
(:func:`oomlab.launch.load_peak.host_load`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any

from oomlab.budget.deepspeed_config import DeepSpeedSettings
from oomlab.budget.estimator import estimate_setup
from oomlab.budget.result import BudgetResult, Phase
from oomlab.core.choices import BaseDtype, Method, Optimizer, Precision, Route, Strategy, plain
from oomlab.core.dtypes import load_dtype
from oomlab.core.errors import InvalidValueError
from oomlab.core.prices import HostRam, resolve_host_ram
from oomlab.core.setup import TORCHTUNE_CHUNKING, TrainingSetup, torchtune_strategies
from oomlab.core.units import ceil_div, format_size
from oomlab.core.user_input import read_user_text
from oomlab.core.versions import Versions, pin_text
from oomlab.launch import torchtune_fix
from oomlab.launch.fix_flags import FlagStyle, flag_style, with_flag
from oomlab.launch.framework import Framework, framework_of
from oomlab.launch.inputs import check_inputs
from oomlab.launch.load_peak import HostLoad, host_load, quantized_load
from oomlab.launch.memory_flags import LIGER_PLUGIN
from oomlab.launch.message import MessageReading, read_message
from oomlab.launch.origin import OriginKind
from oomlab.launch.paths import ROWS, LoadPath, load_path_of
from oomlab.launch.read import LaunchInputs, UserLaunch
from oomlab.launch.resolve import read_launch
from oomlab.launch.rewrite import ChangedFile, FileKind, changed_files, user_files
from oomlab.launch.trl_config import DTYPE_FLAG_SINCE
from oomlab.remedies.ladder import COST, KIND, Decision, Rung, Step, climb
from oomlab.remedies.remedy import Evaluator, launcher
from oomlab.reproduction.apply_walk import move_replica
from oomlab.reproduction.outside import case_outside

# the launches a user with these GPUs most plausibly ran, besides the one read or assumed
PLAUSIBLE = (Strategy.SINGLE, Strategy.DDP, Strategy.ZERO2, Strategy.ZERO3, Strategy.FSDP, Strategy.FSDP2)


class FailsAt(enum.Enum):
    """Where the run fails first."""

    LOAD = "load"  # before training: while the weights are put on the GPUs
    STEP = "step"  # in the training step (forward, backward or optimizer)
    HOST_RAM = "host-ram"  # the GPUs hold it, the host RAM does not (offloaded states, one copy per process)
    LOAD_HOST_RAM = "load-host-ram"  # while loading, the node's processes together need more host RAM than it has


@dataclass(frozen=True)
class LoadCheck:
    """The load of one launch path on one GPU."""

    path: LoadPath
    per_gpu_bytes: int | None  # what loading holds on each GPU at its end, outside PyTorch included (None: unchecked)
    capacity_bytes: int
    fits: bool
    detail: str
    host: HostLoad | None = None  # the host RAM each node holds while its processes load (None: not computed)

    @property
    def host_per_node_bytes(self) -> int:
        return 0 if self.host is None else self.host.per_node_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path.value, "how": ROWS[self.path].how, "per_gpu_bytes": self.per_gpu_bytes,
                "capacity_bytes": self.capacity_bytes, "fits": self.fits, "detail": self.detail,
                "host_per_node_bytes": self.host_per_node_bytes,
                "host_detail": None if self.host is None else self.host.detail}


@dataclass(frozen=True)
class Fix:
    """The least disruptive change that makes the run load and fit with the margin (:func:`oomlab.remedies.ladder.
    climb`, the one decision procedure ``plan`` and the pipeline use too), where to make it and the launch that
    carries it."""

    changes: tuple[tuple[str, str], ...]
    setup: TrainingSetup = field(repr=False)
    per_gpu_peak_bytes: int
    load: LoadCheck
    how: tuple[str, ...]  # where to make each change
    launch: str  # the command that runs it
    files: tuple[ChangedFile, ...] = ()  # the user's files with the fix in them, each changed line marked

    def to_dict(self) -> dict[str, Any]:
        return {"changes": [list(c) for c in self.changes], "per_gpu_peak_bytes": self.per_gpu_peak_bytes,
                "load": self.load.to_dict(), "how": list(self.how), "launch": self.launch,
                "files": [f.to_dict() for f in self.files]}


@dataclass(frozen=True)
class CheckResult:
    """The answer of ``oomlab check``."""

    launch: UserLaunch
    load: LoadCheck
    budget: BudgetResult
    fails_at: FailsAt | None  # None: it loads, the step fits the GPUs and the host RAM holds it
    phase: Phase | None  # the step's phase it fails in; None when it fails at load (``load.path``) or fits
    smallest_fix: Fix | None  # None when it fits with the margin, or when nothing on the ladder does
    host_ram: HostRam
    decision: Decision  # the ladder's verdict (fits / tight / does not fit, with the margin) and its steps
    message: MessageReading | None = None  # the user's OOM message against this budget (``--message``)

    @property
    def host_ram_bytes(self) -> int:
        return self.host_ram.host_ram_bytes

    @property
    def per_gpu_peak_bytes(self) -> int:
        """The first failure's per-GPU figure: the load's when it fails there, else the step's peak."""
        if self.fails_at is FailsAt.LOAD and self.load.per_gpu_bytes is not None:
            return self.load.per_gpu_bytes
        return self.budget.per_gpu_peak_bytes

    def to_dict(self) -> dict[str, Any]:
        s = self.launch.setup
        phase = f"load: {ROWS[self.load.path].how}" if self.fails_at is FailsAt.LOAD else plain(self.phase)
        return {"fails_at": None if self.fails_at is None else self.fails_at.value, "phase": phase,
                "per_gpu_peak_bytes": self.per_gpu_peak_bytes, "capacity_bytes": s.gpu.total_memory_bytes,
                "load": self.load.to_dict(), "step": self.budget.to_dict(),
                "setup": {"gpu": s.gpu.name, **self.launch.to_dict()},
                "smallest_fix": None if self.smallest_fix is None else self.smallest_fix.to_dict(),
                "host_ram_bytes": self.host_ram_bytes, "host_ram": self.host_ram.text,
                "verdict": self.decision.verdict.word, "decision": self.decision.to_dict(),
                "message": None if self.message is None else self.message.to_dict()}


def check_load(setup: TrainingSetup, path: LoadPath, load_dtype_name: str) -> LoadCheck:
    """Does loading fit each GPU on ``path``? The ``.to()`` paths walk ``Module._apply`` over the model's module tree
    against the allocator model (:func:`oomlab.reproduction.apply_walk.move_replica`: the simulated reproduction's
    figures, without torch); a 4-bit base is quantized as it arrives (:func:`quantized_load`).  The host RAM per node
    rides along (:func:`host_load`)."""
    return replace(_gpu_load(setup, path, load_dtype_name), host=host_load(setup, path, load_dtype_name))


def _gpu_load(setup: TrainingSetup, path: LoadPath, load_dtype_name: str) -> LoadCheck:
    cap = setup.gpu.total_memory_bytes
    how = ROWS[path].how
    if path in (LoadPath.TRAINER_TO, LoadPath.ACCELERATE_TO, LoadPath.DEEPSPEED_TO):
        dtype = setup.precision.compute_dtype if path is LoadPath.DEEPSPEED_TO else load_dtype_name
        r = move_replica(setup.model.name, dtype, setup.gpu.name)
        need = r.model_reserved_bytes + r.outside_pytorch_bytes
        if r.raised:
            tensor = r.failing_tensor.name if r.failing_tensor else "a tensor"
            detail = (f"{how}: the {dtype} replica needs {format_size(r.model_reserved_bytes)} reserved, "
                      f"{format_size(r.total_bytes - r.outside_pytorch_bytes)} usable; torch.OutOfMemoryError at "
                      f"{tensor} after {r.moved_fraction:.1%} of the parameters: {r.message}")
        else:
            detail = f"{how}: the {dtype} replica, {format_size(r.model_reserved_bytes)} reserved, fits"
        return LoadCheck(path, need, cap, not r.raised, detail)
    outside = case_outside(setup.model.name, setup.gpu, 1).total_bytes
    if path is LoadPath.ZERO_INIT:
        half = load_dtype(setup.precision.compute_dtype).itemsize
        part = ceil_div(setup.model.num_parameters, setup.world_size) * half
        need = part + outside
        return LoadCheck(path, need, cap, need <= cap,
                         f"{how}: a 1/{setup.world_size} partition, {format_size(part)} per GPU")
    if path in (LoadPath.FSDP_UNITS, LoadPath.FSDP2_SHARDS):
        size = load_dtype(load_dtype_name).itemsize
        spec = setup.model
        layer = spec.layer_params
        shard = ceil_div(spec.num_parameters, setup.world_size) * size
        need = shard + layer * size + outside  # NB: one decoder layer unsharded at a time
        if setup.strategy.offloads:
            need = layer * size + outside
        return LoadCheck(path, need, cap, need <= cap, f"{how}: the shard and one unsharded layer, "
                         f"{format_size(need - outside)}")
    if path is LoadPath.QUANTIZED and not (setup.strategy.fsdp or setup.strategy.zero_stage == 3):
        q = quantized_load(setup, load_dtype_name, outside)
        return LoadCheck(path, q.total_bytes, cap, q.total_bytes <= cap, f"{how}: {q.text(load_dtype_name)}")
    return LoadCheck(path, None, cap, True, f"{how}: not checked at load (the step decides)")


def _phase(load: LoadCheck, budget: BudgetResult, host_ram_bytes: int) -> tuple[FailsAt | None, Phase | None]:
    if not load.fits:
        return FailsAt.LOAD, None
    if load.host_per_node_bytes > host_ram_bytes:
        return FailsAt.LOAD_HOST_RAM, None
    if not budget.fits:
        return FailsAt.STEP, budget.peak_phase
    if budget.host_ram_bytes > host_ram_bytes:
        return FailsAt.HOST_RAM, None
    return None, None


_OPTIM_FLAGS = {Optimizer.ADAMW: "--optim adamw_torch", Optimizer.ADAMW_FUSED: "--optim adamw_torch_fused",
                Optimizer.ADAMW_8BIT: "--optim adamw_bnb_8bit", Optimizer.SGD: "--optim sgd",
                Optimizer.ADAMW_HF: "--optim adamw_hf"}
_PRECISION_FLAGS = {Precision.BF16_MIXED: "--bf16", Precision.FP16_MIXED: "--fp16", Precision.FP32: "no --fp16/--bf16"}


_FSDP_FLAGS = {Strategy.FSDP: "full_shard auto_wrap", Strategy.FSDP_OFFLOAD: "full_shard auto_wrap offload",
               Strategy.FSDP2: "full_shard auto_wrap", Strategy.FSDP2_OFFLOAD: "full_shard auto_wrap offload"}


def _change(step: Step) -> tuple[str, str]:
    """One ladder step as ``(knob, new value)``, as the table and the JSON write it."""
    s = step.setup
    if step.rung is Rung.MICRO_BATCH:
        return "batch", f"{s.batch} (gradient accumulation x{step.accumulation}: the same global batch)"
    if step.rung is Rung.CHUNKED_NF4:
        pin = s.versions.release("torchtune") or TORCHTUNE_CHUNKING  # the one pin the rung changes
        return "versions", f"{pin_text('torchtune', pin)} (it pins a chunking torchao)"
    knob = {Rung.HALF_BASE: "base_dtype",
            Rung.FUSED_OPTIMIZER: "optimizer", Rung.OPTIMIZER_8BIT: "optimizer", Rung.CHECKPOINTING: "checkpointing",
            Rung.SHARDING: "strategy", Rung.OFFLOAD: "strategy", Rung.LORA: "method", Rung.QLORA: "method",
            Rung.MORE_GPUS: "gpus", Rung.PRECOMPUTE_REFERENCE: "reference", Rung.FUSED_LOSS: "loss",
            Rung.SHORTER_SEQ: "seq"}[step.rung]
    if knob == "base_dtype":
        return knob, s.precision.compute_dtype
    return knob, "on" if knob == "checkpointing" else str(plain(getattr(s, knob)))


def _given_accumulation(launch: UserLaunch) -> int:
    """The user's gradient accumulation (1 where the launch does not set it): the ladder multiplies it."""
    given = launch.fields.get("accumulation")
    return given.value if given is not None and isinstance(given.value, int) else 1


def _how(launch: UserLaunch, step: Step) -> str:
    """Where to make one change, from the origin of the field it changes, and what it costs."""
    knob, shown = _change(step)
    fix = step.setup
    sourced = launch.fields.get(knob)
    where = "" if sourced is None or sourced.origin.kind is OriginKind.ASSUMED else f" (now: {sourced.origin})"
    cost = f" [{KIND[step.rung].value}: {COST[step.rung]}]"
    if knob == "strategy":
        strategy = fix.strategy
        if strategy.zero_stage is not None:
            stage = strategy.zero_stage
            offload = " with offload_optimizer (and, for stage 3, offload_param) device cpu" \
                if strategy.offloads_optimizer else ""
            text = f"DeepSpeed ZeRO-{stage}: zero_optimization.stage {stage}{offload}"
            if stage == 3:
                text += "; from_pretrained after TrainingArguments(deepspeed=...) so it loads under zero.Init"
            return text + where + cost
        return (f"strategy {strategy.value}: --fsdp \"{_FSDP_FLAGS[strategy]}\" (or accelerate's FSDP config: "
                f"oomlab plan --write-configs writes it)" + where + cost)
    style = flag_style(launch.command)
    batch_words = (f"{style.spell('batch', str(fix.batch))} "
                   f"{style.spell('accumulation', str(_given_accumulation(launch) * step.accumulation))}")
    if _is_torchtune(launch):
        words = torchtune_fix.how(launch, knob, fix, batch_words)
        return f"{knob} {shown}: {words or shown}{where}{cost}"
    flags = {"checkpointing": style.spell("checkpointing", None), "seq": style.spell("seq", str(fix.seq)),
             "optimizer": style.spell("optim", _OPTIM_FLAGS[fix.optimizer].split()[-1]),
             "batch": batch_words,
             "gpus": f"{fix.gpus} processes per node (torchrun --nproc_per_node, accelerate --num_processes, "
                     "deepspeed --num_gpus)",
             "reference": "--precompute_ref_log_probs True (TRL's DPOConfig / KTOConfig)",
             "loss": _liger_how(launch, style),
             "base_dtype": _half_base_how(launch, fix),
             "method": "a peft LoraConfig (adapter_config.json)" + (" over a bitsandbytes 4-bit base" if fix.method
                                                                    is Method.QLORA else "")
                       + (f", the base loaded in {fix.precision.compute_dtype} ({_half_base_how(launch, fix)})"
                          if launch.setup.base_dtype is BaseDtype.FP32 and fix.base_dtype is BaseDtype.HALF
                          else "")}
    return f"{knob} {shown}: {flags.get(knob, shown)}{where}{cost}"


def _is_torchtune(launch: UserLaunch) -> bool:
    return launch.command is not None and framework_of(launch.command) is Framework.TORCHTUNE


def _half_base_how(launch: UserLaunch, fix: TrainingSetup) -> str:
    """How the user's launch loads the frozen base in half: the key or flag that loaded it in fp32, TRL's
    ``--dtype``, or from_pretrained's ``torch_dtype`` in the user's script."""
    half, flag = fix.precision.compute_dtype, _load_dtype_flag(launch)
    sourced = launch.fields.get("load_dtype")
    if sourced is not None and sourced.origin.kind is OriginKind.FILE:
        return f"{sourced.origin.key} {half}"
    if flag is not None:
        return f"{flag} {half}"
    return f"from_pretrained(..., torch_dtype=torch.{half}) in the script"


def _load_dtype_flag(launch: UserLaunch) -> str | None:
    """The command-line flag that sets the load dtype: the one the launch gave, else TRL's ``--dtype``."""
    sourced = launch.fields.get("load_dtype")
    if sourced is not None and sourced.origin.kind is OriginKind.FLAG and sourced.origin.where.startswith("--"):
        return sourced.origin.where.split("=")[0].split()[0]
    if launch.command is not None and framework_of(launch.command) is Framework.TRL:
        release = launch.setup.versions.release("trl")
        return "--torch_dtype" if release is not None and release < DTYPE_FLAG_SINCE else "--dtype"
    return None


def _liger_how(launch: UserLaunch, style: FlagStyle) -> str:
    """How the user's launch turns Liger's fused linear cross-entropy on."""
    if launch.command is not None and framework_of(launch.command) is Framework.AXOLOTL:
        return (f"in the YAML, plugins: [{LIGER_PLUGIN}.LigerPlugin] and {style.names['loss']}: true (pip install "
                "liger-kernel)")
    return f"{style.spell('loss', 'True')} (pip install liger-kernel)"


def _fix_launch(launch: UserLaunch, decision: Decision, files: tuple[ChangedFile, ...] = ()) -> str:
    """The user's command changed where the fix says (every Trainer flag of the change set or replaced; the strategy
    as ``--deepspeed`` / ``--fsdp``); without a command, the launch the fixed strategy stands for.  A change ``files``
    makes in the user's own file (the key the launch read it from; the strategy in the DeepSpeed JSON or the accelerate
    YAML) is not also given as a flag: the command keeps naming those files."""
    fix = decision.setup
    if launch.command is None:
        return launcher(Route.PROCESS_PER_GPU, fix.strategy, fix.versions.framework)
    if _is_torchtune(launch):
        edited = {e.key for f in files for e in f.edits}
        return torchtune_fix.fixed(launch, [(_change(step)[0], step.setup) for step in decision.steps],
                                   _given_accumulation(launch) * decision.accumulation, edited)
    text = launch.command.text
    style = flag_style(launch.command)
    in_files = {f.path for f in files}
    strategy_in_files = any(f.kind is not FileKind.TRAINING_ARGS and any(
        e.key.startswith(("zero_optimization", "deepspeed_config", "fsdp_config", "distributed_type")) for e in f.edits)
        for f in files)
    for step in decision.steps:
        knob, _ = _change(step)
        s = step.setup
        sourced = launch.fields.get(knob)
        if (knob == "strategy" and strategy_in_files) or (sourced is not None and sourced.origin.kind is
                                                          OriginKind.FILE and sourced.origin.where in in_files):
            continue  # changed in the user's file, where the launch reads it
        if knob == "checkpointing":
            text = style.set(text, "checkpointing", None)
        elif knob == "seq":
            text = style.set(text, "seq", str(s.seq))
        elif knob == "batch":  # the user's accumulation (1 when not given) times the ladder's
            text = style.set(text, "batch", str(s.batch))
            text = style.set(text, "accumulation", str(_given_accumulation(launch) * decision.accumulation))
        elif knob == "optimizer":
            text = style.set(text, "optim", _OPTIM_FLAGS[s.optimizer].split()[-1])
        elif knob == "reference":
            text = with_flag(text, "--precompute_ref_log_probs", "True")
        elif knob == "base_dtype" and (flag := _load_dtype_flag(launch)) is not None:
            text = with_flag(text, flag, s.precision.compute_dtype)
        elif knob == "loss" and framework_of(launch.command) is not Framework.AXOLOTL:  # axolotl: its YAML's plugins
            text = style.set(text, "loss", "True")
        elif knob == "gpus":
            for option in ("--nproc_per_node", "--nproc-per-node", "--num_processes", "--num_gpus"):
                if launch.command.option(option):
                    text = with_flag(text, option, str(s.gpus))
        elif knob == "strategy" and s.strategy.deepspeed:
            text = with_flag(text, "--deepspeed", f"ds_zero{s.strategy.zero_stage}"
                             + ("_offload" if s.strategy.offloads else "") + ".json")
        elif knob == "strategy" and s.strategy in _FSDP_FLAGS:
            text = with_flag(text, "--fsdp", f'"{_FSDP_FLAGS[s.strategy]}"')
    return text


def load_dtype_of(launch: UserLaunch, setup: TrainingSetup) -> str:
    """The dtype ``setup``'s launch loads in: the user's, but half where a fix loads an fp32-loaded base in half."""
    if launch.setup.base_dtype is BaseDtype.FP32 and setup.base_dtype is BaseDtype.HALF:
        return setup.precision.compute_dtype
    return launch.load_dtype


def smallest_fix(launch: UserLaunch, decision: Decision, files: tuple[ChangedFile, ...] = ()) -> Fix | None:
    """The ladder's fix as ``check`` shows it: each change, where to make it, the user's files with it (``files``:
    :func:`oomlab.launch.rewrite.changed_files`) and the launch that carries it."""
    fix = decision.setup
    if not decision.steps or fix is None:
        return None
    path = load_path_of(fix, hf_trainer=launch.hf_trainer, zero3_init=True)
    load = check_load(fix, path, load_dtype_of(launch, fix))
    return Fix(tuple(_change(s) for s in decision.steps), fix, decision.fixed.evaluation.per_gpu_peak_bytes, load,
               tuple(_how(launch, s) for s in decision.steps), _fix_launch(launch, decision, files), files)


def own_framework_launch(launch: UserLaunch, decision: Decision | None) -> str | None:
    """The user's own framework command (torchtune's ``tune run``) with every change of ``decision``, where oomlab
    writes no launch files of its own (None: a transformers launch, no command, or nothing to change)."""
    if launch.command is None or decision is None or launch.setup.versions.framework == "transformers":
        return None
    fix = smallest_fix(launch, decision)
    return None if fix is None else fix.launch


def decide(launch: UserLaunch, host_ram_bytes: int) -> Decision:
    """The one decision procedure on the user's launch: the ladder, each rung's launch also walked through its load
    path (a rung that cannot get the weights onto the GPUs, or whose processes' load exceeds the node's host RAM, does
    not fit)."""
    def loads(setup: TrainingSetup) -> bool:
        path = load_path_of(setup, hf_trainer=launch.hf_trainer, zero3_init=launch.zero3_init or setup != launch.setup)
        load = check_load(setup, path, load_dtype_of(launch, setup))
        return load.fits and load.host_per_node_bytes <= host_ram_bytes

    return climb(launch.setup, Evaluator(host_ram_bytes, None), loads)


def check_launch(inputs: LaunchInputs, host_ram: str | int | None = None,
                 launch: UserLaunch | None = None, message: str | None = None) -> CheckResult:
    """Read the launch (unless given), check its load and its step, and find the smallest fix (``host_ram``: per
    node, with its unit; None or ``"auto"``: assumed from the instance that carries these GPUs); ``message``: the
    text of the user's OOM message, set against the budget (:mod:`oomlab.launch.message`)."""
    launch = launch or read_launch(inputs)
    setup = launch.setup
    host = resolve_host_ram(host_ram, setup.gpu.name, setup.gpus)
    path = load_path_of(setup, hf_trainer=launch.hf_trainer, zero3_init=launch.zero3_init)
    load = check_load(setup, path, launch.load_dtype)
    settings: DeepSpeedSettings | None = launch.deepspeed if setup.strategy.deepspeed else None
    budget = estimate_setup(setup, deepspeed=settings)
    fails_at, phase = _phase(load, budget, host.host_ram_bytes)
    decision = decide(launch, host.host_ram_bytes)
    reading = None if message is None else read_message(launch, message)[0]
    files = changed_files(launch, decision, user_files(inputs, launch)) if decision.steps and decision.setup else ()
    return CheckResult(launch, load, budget, fails_at, phase, smallest_fix(launch, decision, files), host, decision,
                       reading)


def other_launches(launch: UserLaunch) -> list[tuple[str, str, str, str]]:
    """The verdict under each plausible launch of the same training (the user's first): ``(strategy, how the weights
    load, where it fails first, per-GPU figure)``."""
    base = launch.setup
    plausible = torchtune_strategies(base) if base.versions.framework == "torchtune" else PLAUSIBLE
    strategies = [base.strategy] + [s for s in plausible if s is not base.strategy]
    rows = []
    for strategy in strategies:
        if strategy is Strategy.SINGLE and base.world_size > 1 or strategy is Strategy.DDP and base.world_size == 1:
            continue
        try:
            setup = base.with_(strategy=strategy)
        except InvalidValueError as err:
            rows.append((strategy.value, "-", f"cannot run: {err}", "-"))
            continue
        path = load_path_of(setup, hf_trainer=launch.hf_trainer, zero3_init=True)
        load = check_load(setup, path, launch.load_dtype)
        step = estimate_setup(setup, deepspeed=launch.deepspeed if setup.strategy is base.strategy else None)
        if not load.fits:
            where, figure = "load", load.per_gpu_bytes or 0
        elif not step.fits:
            where = "load (init)" if step.loading_peaks else f"step ({step.peak_phase.value})"
            figure = step.per_gpu_peak_bytes
        else:
            where, figure = "fits", step.per_gpu_peak_bytes
        mark = " (as launched)" if strategy is base.strategy else ""
        rows.append((strategy.value + mark, ROWS[path].short, where, format_size(figure)))
    return rows


def check(*, gpu: str, launch: str | None = None, launch_dir: str | None = None, accelerate_config: str | None = None,
          deepspeed: str | None = None, training_args: str | None = None, adapter_config: str | None = None,
          quantization_config: str | None = None, model: str | None = None, gpus: int | None = None,
          host_ram: str | int | None = None, message: str | None = None, seq: int | None = None,
          batch: int | None = None, trainer: str | None = None, versions: Versions | None = None,
          loss: str | None = None) -> CheckResult:
    """``python -m oomlab check`` as a function: the user's launch (a command line, a folder of launch files, or the
    files one by one) read on ``gpu`` and checked (:func:`check_launch`); ``seq``, ``batch`` and ``trainer`` decide
    whatever the launch says (their origin: given on the command line); a bad name or file raises naming it."""
    inputs = check_inputs(launch=launch, launch_dir=launch_dir, accelerate_config=accelerate_config,
                          deepspeed=deepspeed, training_args=training_args, adapter_config=adapter_config,
                          quantization_config=quantization_config, model=model, gpu=gpu, gpus=gpus, seq=seq,
                          batch=batch, trainer=trainer, versions=versions, loss=loss)
    text = None if message is None else read_user_text(message, "OOM message")  # a file: bounded, refused clearly
    return check_launch(inputs, host_ram=host_ram, message=text)
