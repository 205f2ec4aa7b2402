"""``oomlab check``: where the user's launch fails first -- while loading (the ``.to()`` of a replica, or the
partitions of ``zero.Init``) or in the training step, in which phase -- the per-GPU budget, and the smallest change
that makes it fit (a fitting knob of :func:`oomlab.remedies.knobs.knob_table` whose launch also loads).

Limitations: the load of an FSDP launch is the shard plus one unsharded decoder layer (NB: an approximation of
FSDP's unit-by-unit move); device_map and 4-bit loads are not checked (placed as loaded; the step decides).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from oomlab.budget.analytic import estimate_setup
from oomlab.budget.deepspeed_config import DeepSpeedSettings
from oomlab.budget.result import BudgetResult, Phase
from oomlab.core.choices import Method, Optimizer, Precision, Route, Strategy, plain
from oomlab.core.dtypes import load_dtype
from oomlab.core.errors import InvalidValueError
from oomlab.core.prices import HostRam, resolve_host_ram
from oomlab.core.setup import TrainingSetup
from oomlab.core.units import ceil_div, format_size
from oomlab.launch.inputs import check_inputs
from oomlab.launch.origin import OriginKind
from oomlab.launch.paths import ROWS, LoadPath, load_path_of
from oomlab.launch.read import LaunchInputs, UserLaunch
from oomlab.launch.resolve import read_launch
from oomlab.remedies.knobs import KnobChange, knob_table
from oomlab.remedies.remedy import Evaluator, caveats, launcher
from oomlab.reproduction.outside import case_outside
from oomlab.reproduction.replay import reproduce

# the launches a user with these GPUs most plausibly ran, besides the one read or assumed
PLAUSIBLE = (Strategy.SINGLE, Strategy.DDP, Strategy.ZERO2, Strategy.ZERO3, Strategy.FSDP, Strategy.FSDP2)
# the order in which a change is "smaller": what keeps the user's training most as it is comes first
KNOB_ORDER = ("checkpointing", "optimizer", "strategy", "precision", "method", "seq")


class FailsAt(enum.Enum):
    """Where the run fails first."""

    LOAD = "load"  # before training: while the weights are put on the GPUs
    STEP = "step"  # in the training step (forward, backward or optimizer)


@dataclass(frozen=True)
class LoadCheck:
    """The load of one launch path on one GPU."""

    path: LoadPath
    per_gpu_bytes: int | None  # what loading holds on each GPU at its end, outside PyTorch included (None: unchecked)
    capacity_bytes: int
    fits: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path.value, "how": ROWS[self.path].how, "per_gpu_bytes": self.per_gpu_bytes,
                "capacity_bytes": self.capacity_bytes, "fits": self.fits, "detail": self.detail}


@dataclass(frozen=True)
class Fix:
    """The smallest change that makes the run load and fit."""

    changes: tuple[tuple[str, str], ...]
    setup: TrainingSetup = field(repr=False)
    per_gpu_peak_bytes: int
    load: LoadCheck
    how: tuple[str, ...]  # where to make each change
    launch: str  # the command that runs it

    def to_dict(self) -> dict[str, Any]:
        return {"changes": [list(c) for c in self.changes], "per_gpu_peak_bytes": self.per_gpu_peak_bytes,
                "load": self.load.to_dict(), "how": list(self.how), "launch": self.launch}


@dataclass(frozen=True)
class CheckResult:
    """The answer of ``oomlab check``."""

    launch: UserLaunch
    load: LoadCheck
    budget: BudgetResult
    fails_at: FailsAt | None  # None: it loads and the step fits
    phase: Phase | None  # the step's phase it fails in; None when it fails at load (``load.path``) or fits
    smallest_fix: Fix | None  # None when it fits, or when no change of one or two knobs does
    host_ram: HostRam

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
                "host_ram_bytes": self.host_ram_bytes, "host_ram": self.host_ram.text}


def check_load(setup: TrainingSetup, path: LoadPath, load_dtype_name: str) -> LoadCheck:
    """Does loading fit each GPU on ``path``? The ``.to()`` paths run oomlab's ``Module._apply`` walk."""
    cap = setup.gpu.total_memory_bytes
    how = ROWS[path].how
    if path in (LoadPath.TRAINER_TO, LoadPath.ACCELERATE_TO, LoadPath.DEEPSPEED_TO):
        dtype = setup.precision.compute_dtype if path is LoadPath.DEEPSPEED_TO else load_dtype_name
        r = reproduce(model=setup.model.name, dtype=dtype, gpu=setup.gpu.name, device="simulated")
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
    return LoadCheck(path, None, cap, True, f"{how}: not checked at load (the step decides)")


def _phase(load: LoadCheck, budget: BudgetResult) -> tuple[FailsAt | None, Phase | None]:
    if not load.fits:
        return FailsAt.LOAD, None
    if not budget.fits:
        return FailsAt.STEP, budget.peak_phase
    return None, None


_OPTIM_FLAGS = {Optimizer.ADAMW: "--optim adamw_torch", Optimizer.ADAMW_FUSED: "--optim adamw_torch_fused",
                Optimizer.ADAMW_8BIT: "--optim adamw_bnb_8bit", Optimizer.SGD: "--optim sgd"}
_PRECISION_FLAGS = {Precision.BF16_MIXED: "--bf16", Precision.FP16_MIXED: "--fp16", Precision.FP32: "no --fp16/--bf16"}


def _how(launch: UserLaunch, knob: str, shown: str, fix: TrainingSetup, route: Route) -> str:
    """Where to make one change of the fitting configuration (``fix`` on ``route``; ``shown``: the knob's new value
    as the table writes it), from the origin of the field it changes."""
    sourced = launch.fields.get(knob)
    where = "" if sourced is None or sourced.origin.kind is OriginKind.ASSUMED else f" (now: {sourced.origin})"
    if knob == "strategy":
        strategy = fix.strategy
        if route is Route.DEVICE_MAP:
            return "one process, from_pretrained(device_map='auto')" + where
        if strategy.zero_stage is not None:
            stage = strategy.zero_stage
            offload = " with offload_optimizer (and, for stage 3, offload_param) device cpu" \
                if strategy.offloads_optimizer else ""
            text = f"DeepSpeed ZeRO-{stage}: zero_optimization.stage {stage}{offload}"
            if stage == 3:
                text += "; from_pretrained after TrainingArguments(deepspeed=...) so it loads under zero.Init"
            return text + where
        return f"strategy {strategy.value} (oomlab plan --write-configs writes its accelerate config)" + where
    flags = {"checkpointing": "--gradient_checkpointing", "seq": f"--max_seq_length {fix.seq}",
             "optimizer": _OPTIM_FLAGS[fix.optimizer],
             "precision": _PRECISION_FLAGS.get(fix.precision, fix.precision.value),
             "method": "a peft LoraConfig (adapter_config.json)" + (" over a bitsandbytes 4-bit base" if fix.method
                                                                    is Method.QLORA else "")}
    return f"{knob} {shown}: {flags.get(knob, shown)}{where}"


def _fix_launch(launch: UserLaunch, row: KnobChange, fix: TrainingSetup, route: Route) -> str:
    """The user's command with the flags of the change added (the file changes are in ``how``); without a command,
    the launch the changed strategy stands for (the user's strategy where the change is device_map's route)."""
    if launch.command is None:
        return launcher(route, launch.setup.strategy if route is Route.DEVICE_MAP else fix.strategy)
    text = launch.command.text
    extra = {"checkpointing": "--gradient_checkpointing", "seq": "--max_seq_length"}
    for knob, _ in row.changes:
        flag = extra.get(knob)
        if flag and flag not in text:
            text += f" {flag}" + ("" if knob == "checkpointing" else f" {fix.seq}")
    return text


def smallest_fix(launch: UserLaunch, host_ram_bytes: int) -> Fix | None:
    """The fitting knob change (one, else two) whose launch also loads, the least intrusive first."""
    base = launch.setup
    evaluator = Evaluator(host_ram_bytes, None)
    candidates = []
    for row in knob_table(base, host_ram_bytes, evaluator=evaluator):
        setup, route = row.setup, row.route
        if not row.fits or setup is None or route is None:
            continue
        if any(c.harmful for c in caveats(setup)):
            continue
        path = load_path_of(setup, trainer=launch.trainer, zero3_init=True, route=route)
        load = check_load(setup, path, launch.load_dtype)
        if not load.fits:
            continue
        rank = (len(row.changes), max(KNOB_ORDER.index(k) for k, _ in row.changes), row.per_gpu_peak_bytes or 0)
        candidates.append((rank, row, setup, route, load))
    if not candidates:
        return None
    _, row, setup, route, load = min(candidates, key=lambda c: c[0])
    how = tuple(_how(launch, k, shown, setup, route) for k, shown in row.changes)
    return Fix(row.changes, setup, row.per_gpu_peak_bytes or 0, load, how, _fix_launch(launch, row, setup, route))


def check_launch(inputs: LaunchInputs, host_ram: str | int | None = None,
                 launch: UserLaunch | None = None) -> CheckResult:
    """Read the launch (unless given), check its load and its step, and find the smallest fix (``host_ram``: per
    node, with its unit; None or ``"auto"``: assumed from the instance that carries these GPUs)."""
    launch = launch or read_launch(inputs)
    setup = launch.setup
    host = resolve_host_ram(host_ram, setup.gpu.name, setup.gpus)
    path = load_path_of(setup, trainer=launch.trainer, zero3_init=launch.zero3_init)
    load = check_load(setup, path, launch.load_dtype)
    settings: DeepSpeedSettings | None = launch.deepspeed if setup.strategy.deepspeed else None
    budget = estimate_setup(setup, deepspeed=settings)
    fails_at, phase = _phase(load, budget)
    fix = smallest_fix(launch, host.host_ram_bytes) if fails_at is not None else None
    return CheckResult(launch, load, budget, fails_at, phase, fix, host)


def other_launches(launch: UserLaunch) -> list[tuple[str, str, str, str]]:
    """The verdict under each plausible launch of the same training (the user's first): ``(strategy, how the weights
    load, where it fails first, per-GPU figure)``."""
    base = launch.setup
    strategies = [base.strategy] + [s for s in PLAUSIBLE if s is not base.strategy]
    rows = []
    for strategy in strategies:
        if strategy is Strategy.SINGLE and base.world_size > 1 or strategy is Strategy.DDP and base.world_size == 1:
            continue
        try:
            setup = base.with_(strategy=strategy)
        except InvalidValueError as err:
            rows.append((strategy.value, "-", f"cannot run: {err}", "-"))
            continue
        path = load_path_of(setup, trainer=launch.trainer, zero3_init=True)
        load = check_load(setup, path, launch.load_dtype)
        step = estimate_setup(setup, deepspeed=launch.deepspeed if setup.strategy is base.strategy else None)
        if not load.fits:
            where, figure = "load", load.per_gpu_bytes or 0
        elif not step.fits:
            where, figure = f"step ({step.peak_phase.value})", step.per_gpu_peak_bytes
        else:
            where, figure = "fits", step.per_gpu_peak_bytes
        mark = " (as launched)" if strategy is base.strategy else ""
        rows.append((strategy.value + mark, ROWS[path].short, where, format_size(figure)))
    return rows


def check(*, gpu: str, launch: str | None = None, launch_dir: str | None = None, accelerate_config: str | None = None,
          deepspeed: str | None = None, training_args: str | None = None, adapter_config: str | None = None,
          quantization_config: str | None = None, model: str | None = None, gpus: int | None = None,
          host_ram: str | int | None = None) -> CheckResult:
    """``python -m oomlab check`` as a function: the user's launch (a command line, a folder of launch files, or the
    files one by one) read on ``gpu`` and checked (:func:`check_launch`); a bad name or file raises naming it."""
    inputs = check_inputs(launch=launch, launch_dir=launch_dir, accelerate_config=accelerate_config,
                          deepspeed=deepspeed, training_args=training_args, adapter_config=adapter_config,
                          quantization_config=quantization_config, model=model, gpu=gpu, gpus=gpus)
    return check_launch(inputs, host_ram=host_ram)
