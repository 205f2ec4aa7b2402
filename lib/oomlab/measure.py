"""Measured memory of one training step: tiny models trained for real on CPU, counted by the allocator.

The same step as :mod:`oomlab.trace` (:func:`oomlab.trace.run_step`), on real tensors. The peak is the CPU
allocator's own count -- ``torch.profiler`` with ``profile_memory=True`` reports every allocation with the
allocator's running ``total_allocated`` -- plus the bytes already live when profiling starts (parameters,
buffers, token ids), which the profiler cannot see. A ``MemTracker`` runs alongside for the categories and the
timeline; bytes the allocator holds that dispatch-level tracking never sees appear as category ``"untracked"``
(the CPU RNG state ``torch.utils.checkpoint`` saves per checkpointed layer -- 5,056 bytes each -- is one; on a GPU
it lives in host memory).
"""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from oomlab.errors import InvalidValueError
from oomlab.trace import (
    CATEGORIES,
    TracePhase,
    TraceResult,
    build_model,
    library_versions,
    make_optimizer,
    make_tracker,
    run_step,
    step_dtypes,
    trainable_parameters,
)
from oomlab.training import Method, Strategy, TrainingSetup

MAX_MEASURED_PARAMETERS = 50_000_000  # real tensors on CPU: tiny models only


def _storage_bytes(tensors: Iterator[Any]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _allocator_peak(prof: Any) -> int:
    """The most bytes allocated while profiling, over blocks allocated while profiling.

    Replays the CPU allocator's allocation and free events in time order. A free counts only when its block was
    allocated in this session: the allocator's own running ``total_allocated`` lives as long as the process and
    also drops when a block from an earlier profiling session is freed (a garbage-collected earlier model, say).
    """
    from torch._C._profiler import _EventType

    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            fields = event.extra_fields
            events.append((event.start_time_ns, int(fields.alloc_size), int(fields.ptr)))
    live: dict[int, int] = {}
    current = peak = 0
    for _, size, ptr in sorted(events, key=lambda e: e[0]):
        if size > 0:
            live[ptr] = live.get(ptr, 0) + size
            current += size
            peak = max(peak, current)
        elif ptr in live:
            current -= live.pop(ptr)
    return peak


def _check_measurable(setup: TrainingSetup) -> None:
    if setup.model.num_parameters > MAX_MEASURED_PARAMETERS:
        raise InvalidValueError(
            f"model {setup.model.name!r} has {setup.model.num_parameters:,} parameters; measure_real trains for "
            f"real on CPU and takes tiny models only (<= {MAX_MEASURED_PARAMETERS:,}); use trace_step for full size"
        )
    if setup.method is Method.QLORA:
        # NB: bitsandbytes 0.50 has a CPU path for NF4 Linear4bit; building the quantized tiny model is not done yet
        raise InvalidValueError(
            "measure_real does not build QLoRA models yet; use source='analytic' for method 'qlora'"
        )
    if setup.strategy not in (Strategy.SINGLE, Strategy.DDP):
        raise InvalidValueError(
            f"measure_real runs strategy 'single' (the per-rank step of 'ddp' too); got {setup.strategy.value!r}: "
            "use trace_step for fsdp, or measure_fsdp_gloo for a real process group"
        )


def real_model(setup: TrainingSetup, seed: int = 0) -> Any:
    """The setup's tiny model with real, randomly initialised weights on CPU."""
    import torch

    torch.manual_seed(seed)
    return build_model(setup, "cpu")


def measure_real(setup: TrainingSetup, steps: int = 2) -> TraceResult:
    """Train a tiny ``setup`` for real on CPU for ``steps`` steps; the memory of the first step, measured.

    ``peak_bytes`` is the CPU allocator's peak during the first step (see the module docstring);
    the categories, phases and timeline come from a ``MemTracker`` that watches the same step. Later steps run
    to check the step is repeatable (their peak is not reported: the optimizer state then already exists).
    ``ddp`` setups measure the single-rank step; :func:`measure_ddp_buckets` measures DDP's own buffers.
    """
    _check_measurable(setup)
    if steps < 1:
        raise InvalidValueError(f"invalid steps {steps!r}; must be >= 1")
    return _measure(setup, steps)


def _measure(setup: TrainingSetup, steps: int, wrap: Any = None) -> TraceResult:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from oomlab.trace import real_data_decisions

    start = time.perf_counter()
    gc.collect()  # no garbage from earlier work freed during the measured step
    model = real_model(setup)
    dtypes = step_dtypes(setup)
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, setup.model.vocab_size, (setup.batch, setup.seq), generator=generator)
    baseline = _storage_bytes(iter([*model.parameters(), *model.buffers(), input_ids]))
    tracker = make_tracker(model)
    tracker.track_external(model, input_ids)
    # real_data_decisions changes nothing on real tensors; it keeps the traced and measured code paths identical
    with real_data_decisions(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, tracker:
        step_model = model if wrap is None else wrap(model)
        optimizer = make_optimizer(setup, trainable_parameters(model))
        run_step(step_model, optimizer, input_ids, dtypes.autocast, tracker.mark)
    allocated_peak = baseline + _allocator_peak(prof)
    with real_data_decisions():
        for _ in range(steps - 1):
            run_step(step_model, optimizer, input_ids, dtypes.autocast)
    by_category = dict(tracker.peak_snapshot)
    by_category["untracked"] = allocated_peak - tracker.peak_total
    return TraceResult(
        peak_bytes=allocated_peak,
        peak_phase=tracker.peak_phase,
        peak_by_category=MappingProxyType(by_category),
        phase_peaks=MappingProxyType(dict(tracker.phase_peaks)),
        timeline=tuple((label, phase, MappingProxyType(snap)) for label, phase, snap in tracker.timeline),
        seconds=time.perf_counter() - start,
        versions=MappingProxyType(library_versions()),
        method="real-cpu-allocator" if wrap is None else "real-cpu-allocator-ddp-gloo",
    )


@dataclass(frozen=True)
class DDPBuckets:
    """DDP's extra memory over a single-GPU step, measured with a real gloo process group of one rank."""

    single_peak_bytes: int  # the plain step
    ddp_peak_bytes: int  # DistributedDataParallel(gradient_as_bucket_view=False), PyTorch's default
    ddp_view_peak_bytes: int  # DistributedDataParallel(gradient_as_bucket_view=True)
    gradient_bytes: int  # one copy of the trainable parameters' gradients

    @property
    def bucket_bytes(self) -> int:
        """Extra bytes of DDP with its default flat buckets (gradients copied into them)."""
        return self.ddp_peak_bytes - self.single_peak_bytes

    @property
    def view_bucket_bytes(self) -> int:
        """Extra bytes when the gradients are views into the buckets."""
        return self.ddp_view_peak_bytes - self.single_peak_bytes


def measure_ddp_buckets(setup: TrainingSetup) -> DDPBuckets:
    """Measure DDP's gradient buckets: the step of ``setup`` plain, and wrapped in DDP both ways (real gloo, 1 rank).

    DDP allocates its buckets when it is constructed, so the measured region starts before ``DDP(...)``.
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    _check_measurable(setup)
    setup = setup.with_(strategy=Strategy.SINGLE, gpus=1, nodes=1)
    single = _measure(setup, 1)
    peaks = []
    if dist.is_initialized():
        raise InvalidValueError("measure_ddp_buckets creates a gloo process group; one is already initialised")
    for as_view in (False, True):
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
        try:
            wrap = functools.partial(DistributedDataParallel, gradient_as_bucket_view=as_view)
            peaks.append(_measure(setup, 1, wrap=wrap).peak_bytes)
        finally:
            dist.destroy_process_group()
    model = real_model(setup)
    grads = sum(p.numel() * p.element_size() for p in trainable_parameters(model))
    del torch
    return DDPBuckets(single.peak_bytes, peaks[0], peaks[1], grads)


__all__ = ["CATEGORIES", "DDPBuckets", "TracePhase", "measure_ddp_buckets", "measure_real"]
