"""Measured memory of one training step: tiny models trained for real on CPU, counted by the allocator.

The same step as :mod:`oomlab.budget.step` (:func:`~oomlab.budget.step.run_step`), on real tensors. The peak is the CPU
allocator's own count -- ``torch.profiler`` with ``profile_memory=True`` reports every allocation with the
allocator's running ``total_allocated`` -- plus the bytes already live when profiling starts (parameters,
buffers, token ids), which the profiler cannot see. A ``MemTracker`` runs alongside for the categories and the
timeline; bytes the allocator holds that dispatch-level tracking never sees appear as category ``"untracked"``
(the CPU RNG state ``torch.utils.checkpoint`` saves per checkpointed layer -- 5,056 bytes each -- is one; on a GPU
it lives in host memory).

:func:`measure_steps` runs several real steps under one profiling session and replays the allocator's events
phase by phase (forward, backward, optimizer, cut at :func:`~oomlab.budget.step.run_step`'s marks): the last step is a
**steady-state** step -- the optimizer state already exists -- which is what the analytic budget models.

QLoRA (:func:`qlora_model`): the tiny model is saved and loaded back through transformers'
``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
bnb_4bit_compute_dtype=<the setup's compute dtype>)`` on ``device_map="cpu"``: every decoder projection becomes a
bitsandbytes ``Linear4bit`` running bitsandbytes' CPU backend; then peft's ``prepare_model_for_kbit_training``
(``use_gradient_checkpointing`` as the setup's checkpointing), as oomlab's train.py and TRL's SFTTrainer call it:
it upcasts the embedding, norms and head to fp32 (:func:`oomlab.budget.states.kbit_upcast`; skipped where the budget
says the launch skips it), and peft LoRA goes on top.
``adamw-8bit`` is ``bitsandbytes.optim.AdamW8bit``, whose CPU step is bitsandbytes'
``_optimizer_update_8bit_blockwise_cpu``.

An optimizer stepped inside backward (``setup.optimizer_in_backward``): :class:`InBackwardOptimizer` builds one
optimizer per trained parameter and steps it from a post-accumulate-grad hook, as torchtune 0.4.0 does
(recipes/full_finetune_single_device.py :458-461, torchtune/training/memory.py :236-242); the step's own
``optimizer.step()`` after backward then does nothing.
"""

from __future__ import annotations

import functools
import gc
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from oomlab.budget import states
from oomlab.budget.result import Phase
from oomlab.budget.step import (
    BACKWARD_DONE,
    accelerate_autocast,
    apply_lora,
    build_model,
    library_versions,
    make_optimizer,
    real_data_decisions,
    run_step,
    step_dtypes,
    trainable_tensors,
)
from oomlab.budget.tracker import TraceResult, make_tracker
from oomlab.core.choices import Method, Precision, Strategy
from oomlab.core.errors import InvalidValueError
from oomlab.core.quiet import no_warning_logs, quiet_libraries
from oomlab.core.setup import TrainingSetup

MAX_MEASURED_PARAMETERS = 50_000_000  # real tensors on CPU: tiny models only
MARK_PREFIX = "oomlab.mark:"  # record_function names that cut the profiled steps into phases


def _storage_bytes(tensors: Iterator[Any]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def allocator_peak(prof: Any) -> int:
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


class InBackwardOptimizer:
    """torchtune's optimizer in backward on real tensors: ``make_optimizer(setup, [p])`` for each trained parameter,
    stepped and its gradient set to ``None`` by ``p.register_post_accumulate_grad_hook`` as soon as autograd has
    accumulated it.  ``step`` and ``zero_grad`` (what the step calls after backward) do nothing; ``state`` is every
    per-parameter optimizer's."""

    def __init__(self, setup: TrainingSetup, params: list[Any]) -> None:
        self.optimizers = {p: make_optimizer(setup, [p]) for p in params}
        for p in params:
            p.register_post_accumulate_grad_hook(self._step_one)

    def _step_one(self, param: Any) -> None:
        optimizer = self.optimizers[param]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    @property
    def state(self) -> dict[Any, Any]:
        return {p: s for optimizer in self.optimizers.values() for p, s in optimizer.state.items()}

    def step(self) -> None:
        """Nothing: every parameter stepped inside backward."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing: every gradient was freed by its hook."""


def step_optimizer(setup: TrainingSetup, params: list[Any]) -> Any:
    """The optimizer the measured step runs: :class:`InBackwardOptimizer` where the setup steps inside backward, else
    :func:`~oomlab.budget.step.make_optimizer`'s."""
    return InBackwardOptimizer(setup, params) if setup.optimizer_in_backward else make_optimizer(setup, params)


def _check_measurable(setup: TrainingSetup) -> None:
    if setup.model.num_parameters > MAX_MEASURED_PARAMETERS:
        raise InvalidValueError(
            f"model {setup.model.name!r} has {setup.model.num_parameters:,} parameters; measure_real trains for "
            f"real on CPU and takes tiny models only (<= {MAX_MEASURED_PARAMETERS:,}); use trace_step for full size"
        )
    if setup.strategy not in (Strategy.SINGLE, Strategy.DDP):
        raise InvalidValueError(
            f"measure_real runs strategy 'single' (the per-rank step of 'ddp' too); got {setup.strategy.value!r}: "
            "use trace_step for fsdp, or measure_fsdp_gloo for a real process group"
        )


def real_model(setup: TrainingSetup, seed: int = 0) -> Any:
    """The setup's tiny model with real, randomly initialised weights on CPU (QLoRA: see :func:`qlora_model`)."""
    import torch

    torch.manual_seed(seed)
    if setup.method is Method.QLORA:
        return qlora_model(setup)
    return build_model(setup, "cpu")


def qlora_model(setup: TrainingSetup) -> Any:
    """The tiny model of a QLoRA ``setup``: random weights quantized to NF4 by bitsandbytes, LoRA by peft.

    The base is built in the compute dtype, saved, and loaded back with transformers' ``BitsAndBytesConfig``
    (NF4, double quantization, compute dtype of the setup's precision) on ``device_map="cpu"``: the decoder
    projections become ``bitsandbytes.nn.Linear4bit``; the embedding, norms and LM head stay in the compute dtype.
    """
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    compute = getattr(torch, setup.precision.compute_dtype)
    half = Precision.BF16 if compute is torch.bfloat16 else Precision.FP16
    base = build_model(setup.with_(method=Method.FULL, precision=half, checkpointing=False), "cpu")
    quantization = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute,
    )
    with tempfile.TemporaryDirectory(prefix="oomlab-qlora-") as folder, quiet_libraries(), no_warning_logs():
        base.save_pretrained(folder)
        del base
        model = AutoModelForCausalLM.from_pretrained(
            folder, quantization_config=quantization, device_map="cpu", dtype=compute,
            attn_implementation=setup.attention.value,
        )
    model.config.use_cache = False
    if states.kbit_upcast(setup):  # as train.py prepares it: non-4-bit parameters to fp32
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=setup.checkpointing)
    if setup.checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model = apply_lora(model, setup, adapters_fp32=True)
    autocast = step_dtypes(setup).autocast
    if autocast is not None:  # a mixed precision under accelerate: its autocast wrap, as build_model does
        accelerate_autocast(model, autocast)
    model.train()
    return model


def _quant_state_tensors(model: Any) -> Iterator[Any]:
    """The tensors of every 4-bit weight's quantization state (absmax, codes, offset): not parameters or buffers."""
    for module in model.modules():
        state = getattr(getattr(module, "weight", None), "quant_state", None)
        while state is not None:
            for name in ("absmax", "code", "offset"):
                value = getattr(state, name, None)
                if value is not None and hasattr(value, "untyped_storage"):
                    yield value
            state = getattr(state, "state2", None)


def resident_bytes(model: Any, *tensors: Any) -> int:
    """Bytes of the model's parameters, buffers and 4-bit quantization states (plus ``tensors``), each storage once."""
    return _storage_bytes(iter([*model.parameters(), *model.buffers(), *_quant_state_tensors(model), *tensors]))


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

    start = time.perf_counter()
    gc.collect()  # no garbage from earlier work freed during the measured step
    model = real_model(setup)
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, setup.model.vocab_size, (setup.batch, setup.seq), generator=generator)
    baseline = resident_bytes(model, input_ids)
    tracker = make_tracker(model)
    tracker.track_external(model, input_ids)
    # real_data_decisions changes nothing on real tensors; it keeps the traced and measured code paths identical
    with real_data_decisions(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, tracker:
        step_model = model if wrap is None else wrap(model)
        optimizer = step_optimizer(setup, trainable_tensors(model))
        run_step(step_model, optimizer, input_ids, tracker.mark)
    allocated_peak = baseline + allocator_peak(prof)
    with real_data_decisions():
        for _ in range(steps - 1):
            run_step(step_model, optimizer, input_ids)
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
class StepMeasurement:
    """Real training steps on CPU, counted by the allocator phase by phase (see :func:`measure_steps`)."""

    step_phase_peaks: tuple[Mapping[Phase, int], ...]  # per step: the allocator's peak in each phase
    resident_bytes: int  # parameters, buffers, quantization states and token ids before the first step
    optimizer_state_bytes: int  # the optimizer's state tensors after the last step, each storage once
    seconds: float  # wall time of building the model and running the steps
    model_source: str  # how the model was built

    @property
    def steady_phase_peaks(self) -> Mapping[Phase, int]:
        """The last step's phase peaks: a steady-state step when more than one step ran."""
        return self.step_phase_peaks[-1]

    @property
    def peak_bytes(self) -> int:
        """The steady-state step's peak (what ``torch.cuda.max_memory_allocated`` would report for it)."""
        return max(self.steady_phase_peaks.values())

    @property
    def peak_phase(self) -> Phase:
        peaks = self.steady_phase_peaks
        return max(peaks, key=lambda p: peaks[p])


def measure_steps(setup: TrainingSetup, steps: int = 2) -> StepMeasurement:
    """Train a tiny ``setup`` for real on CPU for ``steps`` steps, every step measured phase by phase.

    One ``torch.profiler`` session (``profile_memory=True``) covers all steps; :func:`~oomlab.budget.step.run_step`'s
    marks are recorded as ``record_function`` events and the allocator's allocation and free events are replayed
    in time order (:func:`_allocator_phase_peaks`). The second and later steps start with the optimizer state
    already allocated: the steady state the analytic budget models. Works for every method (QLoRA included) and
    optimizer (``adamw-8bit`` included): no ``MemTracker`` is involved.
    """
    _check_measurable(setup)
    if steps < 1:
        raise InvalidValueError(f"invalid steps {steps!r}; must be >= 1")
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    def mark(label: str) -> None:
        with record_function(MARK_PREFIX + label):
            pass

    start = time.perf_counter()
    gc.collect()
    model = real_model(setup)
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, setup.model.vocab_size, (setup.batch, setup.seq), generator=generator)
    resident = resident_bytes(model, input_ids)
    optimizer = step_optimizer(setup, trainable_tensors(model))
    with real_data_decisions(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(steps):
            mark(STEP_START)
            run_step(model, optimizer, input_ids, mark)
    state = _storage_bytes(
        value for per_param in optimizer.state.values() for value in per_param.values() if _is_tensor(value)
    )
    return StepMeasurement(
        step_phase_peaks=tuple(
            MappingProxyType({phase: resident + peak for phase, peak in step.items()})
            for step in _allocator_phase_peaks(prof)
        ),
        resident_bytes=resident,
        optimizer_state_bytes=state,
        seconds=time.perf_counter() - start,
        model_source="bitsandbytes NF4 (double quant) + peft LoRA" if setup.method is Method.QLORA
        else "transformers from_config" + (" + peft LoRA" if setup.method is Method.LORA else ""),
    )


STEP_START = "step start"
_PHASE_AFTER_MARK = {STEP_START: Phase.FORWARD, "loss": Phase.BACKWARD, BACKWARD_DONE: Phase.OPTIMIZER}


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "untyped_storage")


def _allocator_phase_peaks(prof: Any) -> list[dict[Phase, int]]:
    """Per step, the most bytes allocated in each phase, over blocks allocated while profiling.

    Replays allocation and free events as :func:`allocator_peak` does; the ``record_function`` marks of
    :func:`measure_steps` cut the timeline into steps (at each ``step start``) and phases. A phase's peak includes
    the bytes live when it begins.
    """
    from torch._C._profiler import _EventType

    events: list[tuple[int, int, int, str | None]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            fields = event.extra_fields
            events.append((event.start_time_ns, int(fields.alloc_size), int(fields.ptr), None))
        elif event.tag == _EventType.TorchOp and event.name.startswith(MARK_PREFIX):
            events.append((event.start_time_ns, 0, 0, event.name[len(MARK_PREFIX):]))
    live: dict[int, int] = {}
    current = 0
    steps: list[dict[Phase, int]] = []
    phase: Phase | None = None
    for _, size, ptr, label in sorted(events, key=lambda e: e[0]):
        if label is not None:
            if label == STEP_START:
                steps.append({})
            phase = _PHASE_AFTER_MARK.get(label, phase)
            if phase is not None and label in _PHASE_AFTER_MARK:
                steps[-1][phase] = max(steps[-1].get(phase, 0), current)
            continue
        if size > 0:
            live[ptr] = live.get(ptr, 0) + size
            current += size
            if phase is not None:
                steps[-1][phase] = max(steps[-1].get(phase, 0), current)
        elif ptr in live:
            current -= live.pop(ptr)
    return steps


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
    grads = sum(p.numel() * p.element_size() for p in trainable_tensors(model))
    del torch
    return DDPBuckets(single.peak_bytes, peaks[0], peaks[1], grads)


__all__ = ["DDPBuckets", "InBackwardOptimizer", "StepMeasurement", "measure_ddp_buckets", "measure_real",
           "measure_steps", "qlora_model", "step_optimizer"]
