"""Traced memory of one training step: PyTorch's own ``MemTracker`` under ``FakeTensorMode``, on CPU, at full size.

The reference the analytic budget (:mod:`oomlab.budget.analytic`) is checked against. A real ``transformers``
model (peft for LoRA) runs the step of :mod:`oomlab.budget.step` on fake tensors -- shapes, dtypes and storages but
no data -- while the step tracker of :mod:`oomlab.budget.tracker` watches every storage created and freed. A 13B
step traces in seconds with a few hundred MiB of host RAM.

The traced step is the **first** step after building the model (the optimizer creates its state lazily inside
``step()``), the one that runs out of memory in practice; :func:`traced_budget` turns it into the steady state
the analytic budget models (later steps start with the optimizer state already allocated).

- strategy ``single`` and ``ddp``: the same per-rank trace (DDP's gradient buckets are measured by
  :func:`oomlab.instruments.measured.measure_ddp_buckets`); ``fsdp`` / ``fsdp-offload``: FSDP2 ``fully_shard`` per
  decoder layer and the root over a fake process group of ``world_size`` ranks; ``zero1`` / ``zero2`` are analytic
  only; ``qlora`` and ``adamw-8bit`` are measured only (bitsandbytes' kernels need real data).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

from oomlab.budget import workspace
from oomlab.budget.analytic import sft_estimate
from oomlab.budget.launchers import fsdp1_buffers, shard_fsdp1, shard_fsdp2
from oomlab.budget.result import BudgetResult, MemCategory, Phase, Source
from oomlab.budget.step import (
    build_model,
    library_versions,
    make_optimizer,
    real_data_decisions,
    run_step,
    to_empty_tied,
    trainable_tensors,
)
from oomlab.budget.tracker import OFFLOADED_CATEGORIES, TraceResult, budget_category, make_tracker, tracker_result
from oomlab.core import paths
from oomlab.core.choices import FSDP1_STRATEGIES, BaseDtype, Method, Optimizer, Strategy, Trainer
from oomlab.core.errors import InvalidValueError
from oomlab.core.files import write_json_atomic
from oomlab.core.quiet import quiet_libraries
from oomlab.core.setup import TrainingSetup

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TRACE_VERSION = 5  # bump when what a trace records changes; part of the cache key



# --------------------------------------------------------------------------------------------------- tracing


def _check_traceable(setup: TrainingSetup) -> None:
    if setup.trainer is not Trainer.SFT:
        raise InvalidValueError(
            f"trainer {setup.trainer.value!r} is analytic only: the traced step is the SFT step, and a trace of it "
            "would not hold the reference model, the concatenated pairs or TRL's fused head; use source='analytic' "
            "(oomlab.budget.trainers, checked against real TRL steps: docs/trainers-small-scale.md)")
    if setup.optimizer_in_backward:
        raise InvalidValueError("optimizer in backward is analytic only: the traced step runs one optimizer.step() "
                                "after backward; use source='analytic' (oomlab.budget.optimizer_in_backward, checked "
                                "against real CPU steps: docs/small-scale-measured.md)")
    if setup.offload_activations:
        raise InvalidValueError("activation offloading is analytic only: the traced step keeps its saved tensors on "
                                "the device; use source='analytic' (oomlab.budget.activation_offload)")
    if setup.loss.fused:
        why = ("the traced step runs transformers' head and loss over the whole logits, not a framework's chunks"
               if setup.loss.chunked else "its kernels are Triton's, which do not run on CPU, and the traced step "
               "computes transformers' loss")
        raise InvalidValueError(f"loss {setup.loss.value!r} is analytic only: {why}; use source='analytic' "
                                "(oomlab.budget.loss_kernels)")
    if setup.strategy in (Strategy.ZERO1, Strategy.ZERO2):
        raise InvalidValueError(
            f"strategy {setup.strategy.value!r} is analytic only: DeepSpeed ZeRO has no PyTorch-native tracer on "
            "CPU; use source='analytic'"
        )
    if setup.method is Method.QLORA:
        raise InvalidValueError(
            "method 'qlora' cannot be traced: bitsandbytes' NF4 kernels need real data (not FakeTensorMode); "
            "measure a tiny model with oomlab.instruments.measured.measure_steps, or use source='analytic'"
        )
    if setup.optimizer is Optimizer.ADAMW_8BIT:
        raise InvalidValueError(
            "optimizer 'adamw-8bit' cannot be traced: bitsandbytes' 8-bit kernels need real data; measure a "
            "tiny model with oomlab.instruments.measured.measure_steps, or use source='analytic'"
        )


def _input_ids(setup: TrainingSetup) -> Any:
    import torch

    return torch.randint(0, setup.model.vocab_size, (setup.batch, setup.seq))


def _logits_shape(setup: TrainingSetup) -> tuple[int, int]:
    return setup.batch * setup.seq, setup.model.vocab_size


def _trace_single(setup: TrainingSetup) -> TraceResult:
    """One process's step (``single``, and each rank of ``ddp``: DDP's buckets are added by :func:`traced_budget`)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    start = time.perf_counter()
    with quiet_libraries(), real_data_decisions():
        model = build_model(setup, "meta")
        with FakeTensorMode(allow_non_fake_inputs=True):
            to_empty_tied(model)
            input_ids = _input_ids(setup)
            tracker = make_tracker(model)
            tracker.logits_shape = _logits_shape(setup)
            tracker.track_external(model, input_ids)
            with tracker:
                optimizer = make_optimizer(setup, trainable_tensors(model))
                run_step(model, optimizer, input_ids, tracker.mark)
    return tracker_result(tracker, seconds=time.perf_counter() - start, method="memtracker-fake")


@contextlib.contextmanager
def fake_process_group(world_size: int) -> Iterator[None]:
    """A fake ``world_size``-rank default process group (collectives do nothing) for the duration."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise InvalidValueError(
            "trace_step for fsdp needs to create a fake process group, but one is already initialised in this "
            "process; call torch.distributed.destroy_process_group() first or trace in a fresh process"
        )
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def own_propagation_fake_mode() -> Iterator[None]:
    """Make DTensor's sharding propagation run in its own ``FakeTensorMode``, not the trace's.

    ``ShardingPropagator`` computes output metadata by running each op at *global* shape under
    ``detect_fake_mode() or FakeTensorMode()``; inside a fake trace that is the trace's own mode, so
    ``FSDPMemTracker`` (which skips only ops of a different fake mode) counts those global-shape tensors --
    with ``AdamW(foreach=True)`` an unsharded copy of the optimizer temporaries. In its own mode they are
    skipped, and fake-PG numbers match a real gloo process group.
    """
    from unittest import mock

    from torch.distributed.tensor import _sharding_prop

    with mock.patch.object(_sharding_prop, "detect_fake_mode", lambda *args, **kwargs: None):
        yield


@contextlib.contextmanager
def host_offload_on_cpu() -> Iterator[None]:
    """What CPU offload needs to trace on a CPU: ``Tensor.pin_memory()`` returns the tensor itself (fake tensors
    cannot be pinned -- ``aten._pin_memory`` has no fake implementation -- and pinning changes where host bytes live,
    not how many), and a CPU stream gets the no-op ``synchronize`` FSDP1's offload calls (CPU work is synchronous).
    """
    from unittest import mock

    import torch

    with mock.patch.object(torch.Tensor, "pin_memory", lambda self, *args, **kwargs: self), \
            mock.patch.object(torch.cpu.Stream, "synchronize", lambda self: None, create=True):
        yield


def _trace_fsdp1(setup: TrainingSetup) -> TraceResult:
    """FSDP1 as accelerate prepares it (:func:`oomlab.budget.launchers.shard_fsdp1`), built inside the fake mode on a
    fake ``world_size``-rank process group, watched by the step tracker (FSDP1's gathered half parameters relabelled
    as workspace, its sharded gradients as gradients)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    start = time.perf_counter()
    offload = setup.strategy.offloads
    with quiet_libraries(), real_data_decisions(), fake_process_group(setup.world_size), host_offload_on_cpu():
        model = build_model(setup, "meta")
        with FakeTensorMode(allow_non_fake_inputs=True):
            wrapped = shard_fsdp1(model, setup)
            input_ids = _input_ids(setup)
            tracker = make_tracker(wrapped)
            tracker.logits_shape = _logits_shape(setup)
            tracker.label_sources.append(fsdp1_buffers(wrapped))
            if offload:
                tracker.host_categories = OFFLOADED_CATEGORIES
            tracker.track_external(wrapped, input_ids)
            with tracker:
                optimizer = make_optimizer(setup, trainable_tensors(wrapped))
                run_step(wrapped, optimizer, input_ids, tracker.mark)
    notes = ("parameter, gradient and optstate offloaded: reported as host_*, not in peak_bytes",) if offload else ()
    return tracker_result(tracker, seconds=time.perf_counter() - start, method="fsdp1-memtracker-fake", notes=notes)


def _trace_fsdp2(setup: TrainingSetup) -> TraceResult:
    """FSDP2 as accelerate prepares it (:func:`oomlab.budget.launchers.shard_fsdp2`) over a fake process group,
    watched by a step tracker built on torch's ``FSDPMemTracker``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    start = time.perf_counter()
    offload = setup.strategy.offloads
    with quiet_libraries(), real_data_decisions(), own_propagation_fake_mode(), fake_process_group(setup.world_size), \
            host_offload_on_cpu():
        model = shard_fsdp2(build_model(setup, "meta"), setup)
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.to_empty(device="cpu")
            input_ids = _input_ids(setup)
            optimizer = make_optimizer(setup, trainable_tensors(model))  # after fully_shard: sharded state
            tracker = make_tracker(model, optimizer, fsdp=True)
            tracker.logits_shape = _logits_shape(setup)
            if offload:
                tracker.host_categories = OFFLOADED_CATEGORIES
            tracker.track_inputs((input_ids,))
            with tracker:
                run_step(model, optimizer, input_ids, tracker.mark)
    notes = ("parameter, gradient and optstate offloaded: reported as host_*, not in peak_bytes",) if offload else ()
    return tracker_result(tracker, seconds=time.perf_counter() - start, method="fsdp2-memtracker-fake", notes=notes)


def trace_step(setup: TrainingSetup, *, use_cache: bool = True) -> TraceResult:
    """Trace the first training step of ``setup`` on one GPU (rank), at full size, on CPU.

    See the module docstring for what the step is and how each knob is modelled. Results are cached under
    ``outputs/cache/`` by a hash of the setup, the library versions and :data:`TRACE_VERSION`;
    ``use_cache=False`` traces again (and refreshes the cache).
    """
    _check_traceable(setup)
    path = cache_path(setup)
    if use_cache and path.is_file():
        try:
            return TraceResult.from_json(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError):
            pass  # a damaged entry: trace again and overwrite it
    if setup.strategy in FSDP1_STRATEGIES:
        result = _trace_fsdp1(setup)
    elif setup.strategy.fsdp:
        result = _trace_fsdp2(setup)
    else:
        result = _trace_single(setup)
    write_cache(path, result)
    return result


# ------------------------------------------------------------------------------------------------------ cache


def cache_key(setup: TrainingSetup) -> str:
    """sha256 over the setup's traced fields, the library versions and :data:`TRACE_VERSION`."""
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(setup):
        value = getattr(setup, f.name)
        if f.name == "model":
            value = {"name": value.name, "config": dict(value.config)}
        elif f.name == "gpu":
            continue  # a trace does not depend on the GPU model
        elif f.name in ("trainer", "reference", "loss", "offload_activations", "optimizer_in_backward"):
            continue  # a trace is always the SFT step with transformers' loss (others are refused): keys hold
        elif f.name == "base_dtype" and value is BaseDtype.HALF:
            continue  # the default keeps the keys of the traces made before the field existed
        elif isinstance(value, enum.Enum):
            value = value.value
        fields[f.name] = value
    payload = {"setup": fields, "versions": library_versions(), "trace_version": TRACE_VERSION}
    if os.environ.get(SOURCE_KEY_FLAG) == "1":  # not yet the default: it changes every key (a full re-trace)
        payload["sources"] = source_fingerprint()
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


# The modules whose code runs while a step is traced (what a cached TraceResult records); the oomlab.budget modules
# they import are followed too.  Not fsdp.py or workspace.py: traced_budget reads workspace after the trace, and both
# are analytic formulas, so an edit there must not throw away every cached trace.
TRACE_SOURCE_ROOTS = ("traced", "tracker", "step", "launchers")
SOURCE_KEY_FLAG = "OOMLAB_TRACE_KEY_SOURCES"  # "1": the cache key includes source_fingerprint()
_BUDGET_IMPORT = re.compile(r"^\s*from\s+oomlab\.budget(?:\.(\w+))?\s+import\s+\(?([\w\s,]+)\)?", re.MULTILINE)


def trace_sources() -> tuple[str, ...]:
    """The ``oomlab.budget`` modules a trace depends on: :data:`TRACE_SOURCE_ROOTS` and, transitively, what they
    import from ``oomlab.budget`` -- except what :mod:`traced` imports only to turn a finished trace into a budget
    (the analytic estimate, the workspace terms), which decides nothing a trace records.  Sorted module names."""
    folder = Path(__file__).parent
    seen: set[str] = set()
    todo = list(TRACE_SOURCE_ROOTS)
    while todo:
        name = todo.pop()
        if name in seen or not (folder / f"{name}.py").is_file():
            continue
        seen.add(name)
        if name == "traced":
            continue  # hashed itself; its other imports (analytic) only read a finished trace
        for module, names in _BUDGET_IMPORT.findall((folder / f"{name}.py").read_text()):
            if module:
                todo.append(module)
            else:  # from oomlab.budget import activations as act, workspace
                todo += [part.split()[0] for part in names.split(",") if part.strip()]
    return tuple(sorted(seen))


def source_fingerprint() -> str:
    """sha256 over the source of every module in :func:`trace_sources` (names and bytes): a change to the code that
    decides a trace changes it, so cached traces need no hand-bumped version."""
    folder = Path(__file__).parent
    digest = hashlib.sha256()
    for name in trace_sources():
        digest.update(name.encode() + b"\0" + (folder / f"{name}.py").read_bytes() + b"\0")
    return digest.hexdigest()


def cache_path(setup: TrainingSetup) -> Path:
    return paths.cache_dir() / f"trace-{cache_key(setup)}.json"


def write_cache(path: Path, result: TraceResult) -> None:
    """Write atomically (:func:`oomlab.core.files.write_json_atomic`): a reader never sees half a trace."""
    write_json_atomic(path, result.to_json())


# ------------------------------------------------------------------------------------- as a budget


def steady_phase_totals(trace: TraceResult) -> dict[Phase, int]:
    """Phase peaks of a steady-state step from a first-step trace.

    The traced step is the first: its optimizer state appears inside ``optimizer.step()``.  In every later
    step that state already exists during forward and backward, so it is added to those phases' peaks.
    """
    state = _final_optimizer_state(trace)
    return {
        phase: total + (state if phase is not Phase.OPTIMIZER else 0)
        for phase, total in trace.phase_peaks.items()
    }


def _final_optimizer_state(trace: TraceResult) -> int:
    for _, _, snap in reversed(trace.timeline):
        if "optstate" in snap:
            return int(snap["optstate"])
    return int(trace.peak_by_category.get("optstate", 0))


def traced_budget(setup: TrainingSetup, outside_bytes: int | None = None) -> BudgetResult:
    """A :class:`~oomlab.budget.result.BudgetResult` whose allocated figures come from :func:`trace_step`.

    Steady state, as the analytic budget: the first step's trace plus the optimizer state during forward and
    backward (:func:`steady_phase_totals`).  Components at the peak are the trace's categories mapped onto
    :class:`~oomlab.budget.result.MemCategory`; outside-PyTorch memory and allocator overhead are the analytic ones.
    """
    trace = trace_step(setup)
    steady = steady_phase_totals(trace)
    buckets = workspace.ddp_bucket_bytes(setup)  # DDP's flat buckets: measured = gradient bytes (measure_ddp_buckets)
    totals = {phase: total + buckets for phase, total in steady.items()}
    peak_phase = max(totals, key=lambda p: totals[p])
    analytic = sft_estimate(setup, outside_bytes)  # the traced step is SFT's (it refuses other trainers)
    if peak_phase is trace.peak_phase:
        breakdown, breakdown_total = trace.peak_by_category, trace.peak_bytes
    else:  # the steady-state peak falls in another phase: take that phase's largest timeline snapshot
        snaps = [snap for _, phase, snap in trace.timeline if phase is peak_phase] or [trace.peak_by_category]
        breakdown = max(snaps, key=lambda snap: sum(v for k, v in snap.items() if not k.startswith("host_")))
        breakdown_total = sum(v for k, v in breakdown.items() if not k.startswith("host_"))
    components: dict[MemCategory, int] = {}
    for category, value in breakdown.items():
        if category.startswith("host_") or not value:
            continue
        key = budget_category(category)
        components[key] = components.get(key, 0) + int(value)
    # the steady state's optimizer state (and the gap to the phase's true peak between snapshots)
    extra = steady[peak_phase] - breakdown_total
    if extra:
        components[MemCategory.OPTIMIZER_STATE] = components.get(MemCategory.OPTIMIZER_STATE, 0) + extra
    if buckets:
        components[MemCategory.WORKSPACE] = components.get(MemCategory.WORKSPACE, 0) + buckets
    for key in (MemCategory.ALLOCATOR_OVERHEAD, MemCategory.OUTSIDE_PYTORCH):
        components[key] = analytic.components[key]
    phases = {p: MappingProxyType({MemCategory.ACTIVATIONS: v}) for p, v in totals.items()}
    return BudgetResult(
        setup=setup, source=Source.TRACED, peak_phase=peak_phase,
        phases=MappingProxyType(phases), components=MappingProxyType(components),
        host_ram_bytes=analytic.host_ram_bytes, capacity_bytes=analytic.capacity_bytes,
        notes=(f"traced with {trace.method} in {trace.seconds:.1f} s", *trace.notes, *analytic.notes),
        outside_source=analytic.outside_source, load=analytic.load,
    )
