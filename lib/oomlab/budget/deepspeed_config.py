"""DeepSpeed's ZeRO knobs as oomlab budgets them, and a user's DeepSpeed JSON read into the same setup the flags give.

:class:`DeepSpeedSettings` holds the ``zero_optimization`` (and ``data_types``) keys that change memory, with
DeepSpeed 0.19.8's defaults (``deepspeed/runtime/zero/config.py``, cited per field).  The three keys the Hugging Face
integration fills in for ``"auto"`` from the model's hidden size ``h`` (``transformers/integrations/deepspeed.py``
``HfTrainerDeepSpeedConfig.trainer_config_finalize``, lines 194-243 in transformers 5.24) default to that resolution
-- it is what oomlab's launch JSON writes and what the HF Trainer / accelerate run from an ``"auto"`` config:

- ``reduce_bucket_size = h * h`` (line 232: ``fill_only("zero_optimization.reduce_bucket_size", hidden_size *
  hidden_size)``);
- ``stage3_prefetch_bucket_size = int(0.9 * h * h)`` (lines 235-238);
- ``stage3_param_persistence_threshold = 10 * h`` (lines 239-242).

``fill_only``/``fill_match`` (lines 108-133) replace a value only where the JSON says ``"auto"``; a key the JSON
leaves out keeps DeepSpeed's own default (``reduce_bucket_size`` 5e8 elements: a 1 GB half bucket).
:func:`read_deepspeed_config` reads a JSON that way.  Offload is part of the strategy (``zero2-offload``,
``zero3-offload``); optimizer offload without parameter offload under stage 3 is ``offload_param=False``;
``offload_param`` below stage 3 is ignored, as DeepSpeed ignores it (:func:`ignored_offload_param`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from oomlab.core.choices import Choice, Optimizer, Strategy
from oomlab.core.defaults import DEFAULT_LORA_ALPHA, DEFAULT_LORA_TARGETS
from oomlab.core.errors import InvalidValueError
from oomlab.core.memo import BoundedMemo
from oomlab.core.models import ModelSpec
from oomlab.core.setup import TrainingSetup, make_setup
from oomlab.core.user_input import load_user_json, read_user_text, shown

# DeepSpeed 0.19.8 defaults, deepspeed/runtime/zero/config.py
REDUCE_BUCKET_SIZE = 500_000_000  # config.py:113 reduce_bucket_size = Field(pp_int(5e8))
ALLGATHER_BUCKET_SIZE = 500_000_000  # config.py:132
SUB_GROUP_SIZE = 1_000_000_000  # config.py:182
PREFETCH_BUCKET_SIZE = 50_000_000  # config.py:222 stage3_prefetch_bucket_size
PARAM_PERSISTENCE_THRESHOLD = 100_000  # config.py:228 stage3_param_persistence_threshold
MAX_LIVE_PARAMETERS = 1_000_000_000  # config.py:245 stage3_max_live_parameters
MAX_REUSE_DISTANCE = 1_000_000_000  # config.py:251 stage3_max_reuse_distance
MAX_ELEMENTS = 10**15  # a bucket, threshold or distance in elements: 2 PB of half values, beyond any machine
MAX_MICRO_BATCH = 2**20  # train_micro_batch_size_per_gpu
AUTO = "auto"
OFFLOAD_PARAM_IGNORED = "DeepSpeed ignores offload_param below stage 3"
# the blocks of a DeepSpeed JSON that are mappings, with one example each (what DeepSpeed's config classes accept)
_BLOCKS = {"fp16": '{"enabled": true}', "bf16": '{"enabled": true}', "optimizer": '{"type": "AdamW"}',
           "zero_optimization": '{"stage": 2}', "offload_optimizer": '{"device": "cpu"}',
           "offload_param": '{"device": "cpu"}', "data_types": '{"grad_accum_dtype": "fp32"}'}
HIDDEN_SIZE_KEYS = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")


class OptimizerSource(Choice):
    """What builds the optimizer ``deepspeed.initialize`` wraps (``runtime/engine.py:2328-2346``).

    The setup's ``optimizer`` says which update rule; this says whose code runs it, which decides the step's
    temporaries over the fp32 partition."""

    DEEPSPEED = "deepspeed"  # the JSON's "optimizer" block (Adam/AdamW): FusedAdam, DeepSpeedCPUAdam offloaded
    TORCH_ADAM = "torch-adam"  # the block with "torch_adam": true: torch.optim.AdamW (engine.py:2377-2380)
    # no block: the HF Trainer's create_optimizer (optim=...): a decay and a no-decay group (trainer.py:1273-1286)
    TRAINER = "trainer"
    SCRIPT = "script"  # a script's own optimizer over every trained parameter, one group (oomlab's train.py)


@dataclass(frozen=True)
class DeepSpeedSettings:
    """The DeepSpeed knobs that change memory (element counts, as DeepSpeed's JSON gives them).

    ``None`` means ``"auto"`` as the HF integration resolves it (see the module docstring); :func:`resolve` turns a
    settings object into concrete numbers for one model.
    """

    reduce_bucket_size: int | None = None  # IPG bucket elements (config.py:113; auto: h*h)
    allgather_bucket_size: int = ALLGATHER_BUCKET_SIZE  # only the legacy all-gather path uses it (runtime/utils.py)
    overlap_comm: bool | None = None  # None: DeepSpeed's own default, stage == 3 (config.py:138, 384-387)
    contiguous_gradients: bool = True  # config.py:102: gradients copied into the IPG bucket
    stage3_max_live_parameters: int = MAX_LIVE_PARAMETERS  # caps the prefetch (partitioned_param_coordinator.py)
    stage3_max_reuse_distance: int = MAX_REUSE_DISTANCE  # params reused within it stay gathered
    stage3_prefetch_bucket_size: int | None = None  # auto: int(0.9*h*h)
    stage3_param_persistence_threshold: int | None = None  # params this small stay gathered; auto: 10*h
    sub_group_size: int = SUB_GROUP_SIZE  # elements of one ZeRO-3 optimizer sub-group (config.py:182)
    offload_param: bool | None = None  # zero3-offload: the parameter partitions on the host too (None: yes)
    grad_accum_fp32: bool = False  # data_types.grad_accum_dtype "fp32" (engine.py:1799-1810; default: model dtype)
    # None: as oomlab's launch JSON does it -- adamw as the JSON's AdamW block, any other optimizer a client one
    optimizer_source: OptimizerSource | None = None


def resolve(settings: DeepSpeedSettings | None, spec: ModelSpec, strategy: Strategy,
            optimizer: Optimizer | None = None) -> DeepSpeedSettings:
    """``settings`` (``None``: every default) with ``"auto"`` filled in for ``spec`` and the strategy's stage, and
    (given the ``optimizer``) who builds it as oomlab's launch JSON does: ``adamw`` as the JSON's AdamW block
    (``remedies/deepspeed_configs.py``), any other optimizer the script's own."""
    s = settings or DeepSpeedSettings()
    h = spec.hidden_size
    source = s.optimizer_source
    if source is None and optimizer is not None:
        source = OptimizerSource.DEEPSPEED if optimizer is Optimizer.ADAMW else OptimizerSource.SCRIPT
    return replace(
        s,
        reduce_bucket_size=h * h if s.reduce_bucket_size is None else s.reduce_bucket_size,
        overlap_comm=strategy.zero_stage == 3 if s.overlap_comm is None else s.overlap_comm,
        stage3_prefetch_bucket_size=int(0.9 * h * h) if s.stage3_prefetch_bucket_size is None
        else s.stage3_prefetch_bucket_size,
        stage3_param_persistence_threshold=10 * h if s.stage3_param_persistence_threshold is None
        else s.stage3_param_persistence_threshold,
        offload_param=strategy is Strategy.ZERO3_OFFLOAD and s.offload_param is not False,
        optimizer_source=source,
    )


_RESOLVED: BoundedMemo[tuple, DeepSpeedSettings] = BoundedMemo()


def settings_for(setup: TrainingSetup, settings: DeepSpeedSettings | None = None) -> DeepSpeedSettings:
    """The resolved settings a DeepSpeed setup runs with (memoised on the model, strategy and settings)."""
    key = (setup.model, setup.strategy, setup.optimizer, settings)
    found = _RESOLVED.get(key)
    if found is None:
        found = _RESOLVED[key] = resolve(settings, setup.model, setup.strategy, setup.optimizer)
    return found


# ------------------------------------------------------------------------------------------ reading a JSON


@dataclass(frozen=True)
class DeepSpeedLaunch:
    """A DeepSpeed JSON read for one model and machine: the setup it trains and the knobs it sets."""

    setup: TrainingSetup
    settings: DeepSpeedSettings  # as the JSON says ("auto" left as None)

    @property
    def resolved(self) -> DeepSpeedSettings:
        return settings_for(self.setup, self.settings)


def _block(config: Mapping[str, Any], key: str, where: str = "") -> Mapping[str, Any]:
    """The block ``config[key]`` (absent or null: empty); anything but a mapping is refused with an example."""
    value = config.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidValueError(f"{where}{key} must be a block of keys such as {_BLOCKS[key]}, got {shown(value)}")
    return value


def _device(zero: Mapping[str, Any], key: str) -> str | None:
    """``zero_optimization.<key>.device`` ("none" and absent: None)."""
    block = _block(zero, key, "zero_optimization.")
    if not block:
        return None
    device = str(block.get("device", "none")).lower()
    if device not in ("none", "cpu", "nvme"):
        raise InvalidValueError(f"unknown {key}.device {device!r}; known: cpu, none, nvme")
    if device == "nvme":
        raise InvalidValueError(f"{key}.device 'nvme' is not budgeted by oomlab (ZeRO-Infinity swaps to NVMe); "
                                "use 'cpu'")
    return None if device == "none" else device


def _strategy(stage: Any, optimizer_offload: str | None, param_offload: str | None) -> tuple[Strategy, bool | None]:
    if isinstance(stage, bool) or stage not in (1, 2, 3):
        raise InvalidValueError(f"invalid zero_optimization.stage {stage!r}; oomlab budgets ZeRO stages 1, 2 and 3")
    if stage != 3:
        # NB: DeepSpeed runs offload_param below stage 3 and ignores it: engine.py _configure_zero_optimizer hands
        # stages 1 and 2 only offload_optimizer_config (stage_1_and_2.py DeepSpeedZeroOptimizer takes no param
        # offload), and zero/config.py DeepSpeedZeroConfig accepts the key at any stage.  The parameters stay on
        # the GPU; the reader lists the key as not modelled (:func:`ignored_offload_param`).
        param_offload = None
    if param_offload and not optimizer_offload:
        raise InvalidValueError("offload_param without offload_optimizer is not budgeted; offload both, or neither")
    if stage == 1:
        if optimizer_offload:
            raise InvalidValueError("offload_optimizer with ZeRO stage 1 is not budgeted; use stage 2 "
                                    "(the same host step, gradients partitioned)")
        return Strategy.ZERO1, None
    if stage == 2:
        return (Strategy.ZERO2_OFFLOAD if optimizer_offload else Strategy.ZERO2), None
    if optimizer_offload:
        return Strategy.ZERO3_OFFLOAD, None if param_offload else False
    return Strategy.ZERO3, None


def ignored_offload_param(config: Mapping[str, Any]) -> bool:
    """Does the JSON ask for ``offload_param`` at a ZeRO stage below 3, where DeepSpeed ignores it?"""
    zero = config.get("zero_optimization")
    if not isinstance(zero, Mapping) or zero.get("stage") == 3:
        return False
    block = zero.get("offload_param")
    return isinstance(block, Mapping) and str(block.get("device", "none")).lower() != "none"


def _enabled(config: Mapping[str, Any], key: str) -> bool | str:
    value = _block(config, key).get("enabled", False)
    if value is None or value == AUTO or isinstance(value, bool):
        return bool(value) if value != AUTO else AUTO
    raise InvalidValueError(f"{key}.enabled must be true, false or \"auto\", got {shown(value)}")


def _precision(config: Mapping[str, Any], precision: str | None) -> str:
    """fp16 / bf16 blocks → fp16-mixed / bf16-mixed; "auto" takes the Trainer's flag (``precision``)."""
    fp16, bf16 = _enabled(config, "fp16"), _enabled(config, "bf16")
    if bf16 is True:
        return "bf16-mixed"
    if fp16 is True:
        return "fp16-mixed"
    if AUTO in (fp16, bf16):
        if precision is None:
            raise InvalidValueError("fp16/bf16 'enabled' is 'auto' (the Trainer's --fp16/--bf16 decide); pass "
                                    "precision='fp16-mixed', 'bf16-mixed' or 'fp32'")
        return precision
    return "fp32"


def _optimizer(config: Mapping[str, Any], optimizer: str) -> str:
    """An ``"optimizer"`` block of type Adam/AdamW is DeepSpeed's own (FusedAdam / DeepSpeedCPUAdam): ``adamw``;
    without one the Trainer passes its own optimizer (``optimizer``; its default is ``adamw-fused``)."""
    block = _block(config, "optimizer")
    if not block:
        return optimizer
    kind = str(block.get("type", "")).lower()
    if kind not in ("adam", "adamw"):
        raise InvalidValueError(f"optimizer type {block.get('type')!r} is not budgeted; known: Adam, AdamW")
    return "adamw"


def optimizer_source(config: Mapping[str, Any]) -> OptimizerSource:
    """Whose optimizer a JSON runs: its ``"optimizer"`` block builds DeepSpeed's (``engine.py:2329-2333``; with
    ``params.torch_adam: true`` torch's AdamW, ``get_optimizer_configuration`` :2377-2380); without one the HF
    integration hands DeepSpeed the Trainer's own (``transformers/integrations/deepspeed.py:576-589``
    ``deepspeed_optim_sched``: ``trainer.create_optimizer()``, ``zero_allow_untested_optimizer``)."""
    block = _block(config, "optimizer")
    if not block:  # NB: read as the Trainer's; a script's own optimizer in one group differs by the norms' padding
        return OptimizerSource.TRAINER
    params = block.get("params")
    torch_adam = isinstance(params, Mapping) and params.get("torch_adam") in (True, "true", "True")
    return OptimizerSource.TORCH_ADAM if torch_adam else OptimizerSource.DEEPSPEED


def _on(value: Any) -> bool:
    """A JSON switch turned on (``true``, or DeepSpeed's string spelling ``"true"``)."""
    return value is True or str(value).lower() == "true"


# What oomlab budgets of a DeepSpeed run, said by every refusal below
MODELLED = ("oomlab budgets ZeRO-1/2/3 with an fp32 master partition and fp32 optimizer states, CPU offload, every "
            "rank holding its micro-batch's whole sequence, and an eager (uncompiled) model")
# (key path, is it on?, what it does to memory, the DeepSpeed 0.19.8 source): settings that move memory and are not
# budgeted -- refused where a JSON turns them on, never silently budgeted as if absent
_UNMODELLED: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("sequence_parallel_size", lambda v: v not in (None, 1),
     "Ulysses sequence (context) parallelism: each rank holds 1/N of every sequence's activations and the data-"
     "parallel world is world / N (runtime/config.py:468-469)"),
    ("compile.deepcompile", _on, "DeepCompile: torch.compile of the engine with its own activation freeing and "
                                  "offload passes (compile/config.py:15)"),
    ("compile.offload_activation", _on, "activation offloading to the host (compile/config.py:27)"),
    ("compile.offload_opt_states", _on, "optimizer-state offloading by DeepCompile (compile/config.py:39)"),
    ("compile.free_activation", _on, "DeepCompile's early activation freeing (compile/config.py:21)"),
    ("zero_optimization.zero_quantized_weights", _on, "ZeRO++ int8 weight all-gathers (zero/config.py:328)"),
    ("zero_optimization.zero_quantized_gradients", _on, "ZeRO++ quantized gradient reduction (zero/config.py:340)"),
    ("zero_optimization.zero_hpz_partition_size", lambda v: v not in (None, 0, 1),
     "ZeRO++ hpZ: a secondary weight partition per node group (zero/config.py:324)"),
    ("bf16.bf16_master_weights_and_grads", _on, "bf16 master weights and gradients: no fp32 master partition "
                                                 "(precision_config.py:63)"),
    ("bf16.bf16_optimizer_states", _on, "bf16 optimizer states (precision_config.py:68)"),
    ("fp16.fp16_master_weights_and_grads", _on, "fp16 master weights and gradients (runtime/config.py:702)"),
)


def refuse_unmodelled(config: Mapping[str, Any]) -> None:
    """Refuse a DeepSpeed setting that moves memory and that oomlab does not budget, naming the key, what it does,
    and what oomlab models (:data:`MODELLED`)."""
    for path, on, what in _UNMODELLED:
        node: Any = config
        for part in path.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if node is not None and on(node):
            raise InvalidValueError(f"{path} {shown(node)} is not budgeted: {what}. {MODELLED}; remove the key to "
                                    "budget the run without it")


def _elements(zero: Mapping[str, Any], key: str, default: int | None, auto_allowed: bool) -> int | None:
    value = zero.get(key, default)
    if value == AUTO:
        if not auto_allowed:
            raise InvalidValueError(f"zero_optimization.{key} is 'auto', which only {', '.join(HIDDEN_SIZE_KEYS)} "
                                    "accept; give a number")
        return None
    return _whole(value, f"zero_optimization.{key}", 0, MAX_ELEMENTS, "a number of elements")


def _whole(value: Any, what: str, low: int, high: int, kind: str) -> int:
    """A whole number (``5e8`` and ``"5e8"`` read as DeepSpeed's ``pp_int`` reads them) from ``low`` to ``high``; NaN,
    infinities, fractions, bools and numbers outside are refused naming ``what`` and the range."""
    number = value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        raise InvalidValueError(f"invalid {what} {shown(value)}; expected {kind}")
    whole = isinstance(number, int) or math.isfinite(number) and number.is_integer()
    if not (whole and low <= number <= high):
        raise InvalidValueError(f"invalid {what} {shown(value)}; expected {kind}: a whole number from {low:,} to "
                                f"{high:,}")
    return int(number)


def settings_from_config(config: Mapping[str, Any], strategy: Strategy, offload_param: bool | None = None
                         ) -> DeepSpeedSettings:
    """The knobs of a DeepSpeed JSON: ``"auto"`` → ``None``; a key left out → DeepSpeed's own default."""
    zero = _block(config, "zero_optimization")
    overlap = zero.get("overlap_comm")
    accum = str(_block(config, "data_types").get("grad_accum_dtype") or "").lower()
    return DeepSpeedSettings(
        reduce_bucket_size=_elements(zero, "reduce_bucket_size", REDUCE_BUCKET_SIZE, True),
        allgather_bucket_size=_elements(zero, "allgather_bucket_size", ALLGATHER_BUCKET_SIZE, False),
        overlap_comm=None if overlap is None else bool(overlap),
        contiguous_gradients=bool(zero.get("contiguous_gradients", True)),
        stage3_max_live_parameters=_elements(zero, "stage3_max_live_parameters", MAX_LIVE_PARAMETERS, False),
        stage3_max_reuse_distance=_elements(zero, "stage3_max_reuse_distance", MAX_REUSE_DISTANCE, False),
        stage3_prefetch_bucket_size=_elements(zero, "stage3_prefetch_bucket_size", PREFETCH_BUCKET_SIZE, True),
        stage3_param_persistence_threshold=_elements(zero, "stage3_param_persistence_threshold",
                                                     PARAM_PERSISTENCE_THRESHOLD, True),
        sub_group_size=_elements(zero, "sub_group_size", SUB_GROUP_SIZE, False),
        offload_param=offload_param,
        grad_accum_fp32=accum in ("fp32", "float32", "float"),
        optimizer_source=optimizer_source(config),
    )


def read_deepspeed_config(config: Mapping[str, Any] | str | Path, *, model: str | ModelSpec, gpu: str, gpus: int = 1,
                          nodes: int = 1, seq: int = 2048, method: str = "full", precision: str | None = None,
                          optimizer: str = "adamw-fused", batch: int = 1, checkpointing: bool = False,
                          attention: str = "sdpa", lora_rank: int = 8, lora_alpha: int = DEFAULT_LORA_ALPHA,
                          lora_targets: Sequence[str] | str = DEFAULT_LORA_TARGETS, source: str | None = None
                          ) -> DeepSpeedLaunch:
    """The setup and knobs a DeepSpeed JSON (a dict or a path) trains ``model`` with on ``nodes`` × ``gpus``.

    What the JSON does not say comes from the keyword arguments (the Trainer's flags): the sequence length, method,
    checkpointing; ``precision`` where fp16/bf16 are ``"auto"``, ``batch`` where the micro-batch is, and
    ``optimizer`` where the JSON has no ``"optimizer"`` block.  A bad value is refused naming ``source`` (the file;
    a path's own name by default), the key and what is accepted.
    """
    if not isinstance(config, Mapping):
        source = source or str(config)
        config = _read_json(config)
    try:
        refuse_unmodelled(config)
        zero = _block(config, "zero_optimization")
        strategy, offload_param = _strategy(zero.get("stage", 0), _device(zero, "offload_optimizer"),
                                            _device(zero, "offload_param"))
        micro = config.get("train_micro_batch_size_per_gpu", AUTO)
        if micro != AUTO:
            batch = _whole(micro, "train_micro_batch_size_per_gpu", 1, MAX_MICRO_BATCH, "a number of samples")
        precision, optimizer = _precision(config, precision), _optimizer(config, optimizer)
        settings = settings_from_config(config, strategy, offload_param)
    except InvalidValueError as err:
        if source is None:
            raise
        raise InvalidValueError(f"{source}: {err}") from err
    setup = make_setup(model=model, gpu=gpu, gpus=gpus, nodes=nodes, strategy=strategy, method=method,
                       precision=precision, optimizer=optimizer, batch=batch, seq=seq, checkpointing=checkpointing,
                       attention=attention, lora_rank=lora_rank, lora_alpha=lora_alpha, lora_targets=lora_targets)
    return DeepSpeedLaunch(setup, settings)


def _read_json(path: str | Path) -> Mapping[str, Any]:
    """A DeepSpeed JSON file read as a user's file (:mod:`oomlab.core.user_input`): a mapping, or refused."""
    text = read_user_text(path, "DeepSpeed JSON")
    try:
        data = load_user_json(text, f"DeepSpeed JSON {str(path)!r}")
    except json.JSONDecodeError as err:
        raise InvalidValueError(f"{path}:{err.lineno}:{err.colno}: malformed JSON: {err.msg}") from err
    if not isinstance(data, Mapping):
        raise InvalidValueError(f"{path}: expected a DeepSpeed JSON mapping of keys, got {type(data).__name__}")
    return data


def settings_rows(settings: DeepSpeedSettings) -> list[tuple[str, Any]]:
    """``(key, value)`` of every knob, for display."""
    return [(f.name, getattr(settings, f.name)) for f in fields(settings)]


# ------------------------------------------------------------------------------------------ writing a JSON


def zero_optimization_block(setup: TrainingSetup, settings: DeepSpeedSettings | None = None) -> dict[str, Any]:
    """The ``zero_optimization`` block that runs ``setup`` with ``settings`` -- concrete numbers, no ``"auto"`` (what
    :func:`settings_from_config` reads back to the same resolved settings)."""
    ds = settings_for(setup, settings)
    block: dict[str, Any] = {
        "stage": setup.strategy.zero_stage, "overlap_comm": ds.overlap_comm,
        "contiguous_gradients": ds.contiguous_gradients, "reduce_bucket_size": ds.reduce_bucket_size,
        "allgather_bucket_size": ds.allgather_bucket_size,
    }
    if setup.strategy.offloads_optimizer:
        block["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if setup.strategy.zero_stage == 3:
        block.update({
            "stage3_prefetch_bucket_size": ds.stage3_prefetch_bucket_size,
            "stage3_param_persistence_threshold": ds.stage3_param_persistence_threshold,
            "stage3_max_live_parameters": ds.stage3_max_live_parameters,
            "stage3_max_reuse_distance": ds.stage3_max_reuse_distance, "sub_group_size": ds.sub_group_size,
        })
        if ds.offload_param:
            block["offload_param"] = {"device": "cpu", "pin_memory": True}
    return block


def precision_block(setup: TrainingSetup) -> dict[str, Any]:
    """``fp16`` (dynamic loss scaling, DeepSpeed's defaults) or ``bf16`` for a mixed precision; nothing for fp32."""
    if setup.precision.uses_bf16:
        return {"bf16": {"enabled": True}}
    if setup.precision.compute_dtype == "float16":
        return {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                         "hysteresis": 2, "min_loss_scale": 1}}
    return {}


def data_types_block(settings: DeepSpeedSettings) -> dict[str, Any]:
    return {"data_types": {"grad_accum_dtype": "fp32"}} if settings.grad_accum_fp32 else {}
