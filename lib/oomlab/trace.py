"""Traced memory of one training step: PyTorch's own ``MemTracker`` under ``FakeTensorMode``, on CPU, at full size.

The reference the analytic budget (:mod:`oomlab.budget`) is checked against. A real ``transformers`` model (peft
for LoRA) runs one training step on fake tensors -- shapes, dtypes and storages but no data -- while
``torch.distributed._tools.mem_tracker.MemTracker`` (``FSDPMemTracker`` for FSDP) watches every storage created
and freed at the dispatcher. A 13B step traces in seconds with a few hundred MiB of host RAM.

One training step, the one this module traces (:func:`run_step`):

1. ``loss = model(input_ids=ids, labels=ids).loss`` -- causal-LM loss on random token ids, under
   ``torch.autocast("cpu", dtype=fp16|bf16)`` for the ``*-mixed`` precisions; only the loss is kept (as the
   Hugging Face ``Trainer`` does), so the logits die once backward no longer needs them;
2. ``loss.backward()``;
3. ``optimizer.step()``; 4. ``optimizer.zero_grad(set_to_none=True)``.

The optimizer is built just before the step and creates its state lazily inside ``step()``: the traced step is
the **first** step after building the model, the one that runs out of memory in practice (later steps start
with the optimizer state already allocated, but their peak is the same or lower).

Modelling choices (so traced and analytic agree on what is modelled):

- precision ``fp32``: model in float32, no autocast. ``fp16-mixed`` / ``bf16-mixed``: float32 parameters (they
  are the master weights) and autocast around forward and loss; CPU autocast keeps the same cache of cast weight
  copies as CUDA autocast (``cached_cast`` in ``autocast_mode.cpp`` applies to every device), freed when the
  outermost autocast exits, i.e. before backward. ``fp16`` / ``bf16``: parameters, gradients and optimizer
  state in that dtype.
- method ``lora``: peft ``LoraConfig(r, lora_alpha, target_modules, lora_dropout=0.0)``. **The frozen base is
  stored in the compute dtype** -- fp16 for ``fp16-mixed``, bf16 for ``bf16-mixed`` -- because a frozen base is
  kept in half in practice; the adapters are float32 for ``*-mixed`` (peft's ``autocast_adapter_dtype``) and in
  the model dtype otherwise. ``qlora`` is not traceable (bitsandbytes' NF4 kernels run on real data); it is
  measured at small scale by :func:`oomlab.measure.measure_real`.
- optimizer ``adamw``: ``torch.optim.AdamW(foreach=True)`` and ``sgd``: ``SGD(momentum=0.9, foreach=True)`` --
  ``foreach`` is what PyTorch picks by default for CUDA parameters (on CPU it would not), so the optimizer
  temporaries (AdamW's ``sqrt(v)`` over all parameters at once) match a GPU run. ``adamw-8bit`` is measured only.
- checkpointing: ``model.activation_checkpointing_enable({"use_reentrant": False})`` (transformers 5 renamed
  ``gradient_checkpointing_enable``), which checkpoints each decoder layer's ``forward``.
- strategy ``single`` and ``ddp``: the same per-rank trace (DDP's gradient buckets are reported by
  :func:`oomlab.measure.measure_ddp_buckets`); ``fsdp`` / ``fsdp-offload``: FSDP2 ``fully_shard`` per decoder layer
  and the root over a fake process group of ``world_size`` ranks; ``zero1`` / ``zero2`` are analytic only.
- Byte counts are exact storage sizes (``numel * itemsize``); the CUDA caching allocator rounds each block up to
  512 bytes, which adds at most 512 bytes per live tensor (a few hundred KiB for a 13B model).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from oomlab import paths
from oomlab.errors import InvalidValueError
from oomlab.specs import ModelSpec, model_from_config
from oomlab.training import Method, Optimizer, Precision, Strategy, TrainingSetup, make_setup

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TRACE_VERSION = 2  # bump when what a trace records changes; part of the cache key
CACHE_DIR = paths.CACHE_DIR
BACKWARD_DONE = "backward done"  # the timeline mark after loss.backward(); later events are the optimizer's
LEARNING_RATE = 1e-4  # irrelevant to memory; any positive value

# mem_tracker's categories (``_MemRefType``), under the names oomlab uses.
CATEGORIES = ("parameter", "buffer", "gradient", "activation", "temp", "optstate", "other")


class TracePhase(enum.Enum):
    """The part of a training step a memory figure belongs to."""

    FORWARD = "forward"  # model forward and loss, up to loss.backward()
    BACKWARD = "backward"  # loss.backward(), including recomputation of checkpointed layers
    OPTIMIZER = "optimizer"  # optimizer.step() and zero_grad()


@dataclass(frozen=True)
class TraceResult:
    """Memory of one training step on one GPU (rank), traced or measured."""

    peak_bytes: int  # max allocated bytes over the step (what torch.cuda.max_memory_allocated would report)
    peak_phase: TracePhase  # the phase the peak falls in
    peak_by_category: Mapping[str, int]  # bytes per category at the peak (sums to peak_bytes)
    phase_peaks: Mapping[TracePhase, int]  # the peak of each phase
    timeline: tuple[tuple[str, TracePhase, Mapping[str, int]], ...]  # (event, phase, bytes by category)
    seconds: float  # wall time of the trace (or measurement)
    versions: Mapping[str, str]  # torch, transformers, peft
    method: str  # "memtracker-fake", "fsdp-memtracker-fake", "real-cpu-allocator", ...
    notes: tuple[str, ...] = ()  # what was modelled differently from a GPU run, if anything

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (enums as their values)."""
        return {
            "peak_bytes": self.peak_bytes,
            "peak_phase": self.peak_phase.value,
            "peak_by_category": dict(self.peak_by_category),
            "phase_peaks": {p.value: v for p, v in self.phase_peaks.items()},
            "timeline": [[label, phase.value, dict(snap)] for label, phase, snap in self.timeline],
            "seconds": self.seconds,
            "versions": dict(self.versions),
            "method": self.method,
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> TraceResult:
        """The inverse of :meth:`to_json`."""
        return cls(
            peak_bytes=int(raw["peak_bytes"]),
            peak_phase=TracePhase(raw["peak_phase"]),
            peak_by_category=MappingProxyType({k: int(v) for k, v in raw["peak_by_category"].items()}),
            phase_peaks=MappingProxyType({TracePhase(k): int(v) for k, v in raw["phase_peaks"].items()}),
            timeline=tuple(
                (str(label), TracePhase(phase), MappingProxyType({k: int(v) for k, v in snap.items()}))
                for label, phase, snap in raw["timeline"]
            ),
            seconds=float(raw["seconds"]),
            versions=MappingProxyType(dict(raw["versions"])),
            method=str(raw["method"]),
            notes=tuple(raw.get("notes", ())),
        )


def library_versions() -> dict[str, str]:
    """Versions of the libraries a trace depends on."""
    import peft
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}


# ------------------------------------------------------------------------------------------------ tiny models

TINY_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 344,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 512,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "_source": "oomlab tiny LLaMA for traced-vs-measured checks",
}


def tiny_model(**config: Any) -> ModelSpec:
    """A tiny LLaMA-family spec (h=128, 2 layers, V=512 unless overridden)."""
    fields = {**TINY_CONFIG, **config}
    name = "tiny-llama-" + "-".join(f"{k}{v}" for k, v in sorted(config.items())) if config else "tiny-llama"
    return model_from_config(fields, name)


def tiny_setup(model_config: Mapping[str, Any] | None = None, **kw: Any) -> TrainingSetup:
    """A :class:`TrainingSetup` over :func:`tiny_model` (defaults: batch 2, seq 128; every other knob as given)."""
    kw.setdefault("batch", 2)
    kw.setdefault("seq", 128)
    kw.setdefault("gpu", "a100-80gb")  # only for validation (bf16 support); traces do not depend on the GPU
    return make_setup(model=tiny_model(**dict(model_config or {})), **kw)


# --------------------------------------------------------------------------------------------- building a step


@dataclass(frozen=True)
class StepDTypes:
    """The dtypes one setup trains with (torch dtype names)."""

    storage: str  # dtype of the (base) model's parameters as built
    autocast: str | None  # autocast dtype around forward and loss, or None
    adapters_fp32: bool  # LoRA adapters kept in float32 (peft's autocast_adapter_dtype)


def step_dtypes(setup: TrainingSetup) -> StepDTypes:
    """Storage and compute dtypes for a setup; see the module docstring for the choices."""
    precision, adapters = setup.precision, setup.method in (Method.LORA, Method.QLORA)
    if precision is Precision.FP32:
        return StepDTypes("float32", None, False)
    half = precision.compute_dtype
    if precision in (Precision.FP16_MIXED, Precision.BF16_MIXED):
        # full fine-tuning keeps fp32 parameters (master weights); a frozen base is stored in half
        return StepDTypes(half if adapters else "float32", half, adapters)
    return StepDTypes(half, None, adapters)  # peft keeps adapters fp32 over a half base by default


def build_model(setup: TrainingSetup, device: str) -> Any:
    """The setup's model on ``device`` ("meta" for traces, "cpu" for real tiny runs), in training mode.

    Checkpointing and attention are set on the transformers model; LoRA is applied with peft. QLoRA is built
    by :mod:`oomlab.measure` (it needs real weights to quantize).
    """
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    if setup.method is Method.QLORA:
        raise InvalidValueError("method 'qlora' needs real weights; build it with oomlab.measure.measure_real")
    dtypes = step_dtypes(setup)
    config = setup.model.hf_config()
    config.use_cache = False  # a training step: no KV cache
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(
                config, dtype=getattr(torch, dtypes.storage), attn_implementation=setup.attention.value
            )
        if setup.checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    finally:
        hf_logging.set_verbosity(verbosity)
    if setup.method is Method.LORA:
        model = apply_lora(model, setup, adapters_fp32=dtypes.adapters_fp32)
    model.train()
    return model


def apply_lora(model: Any, setup: TrainingSetup, *, adapters_fp32: bool) -> Any:
    """Wrap ``model`` with peft LoRA adapters on ``setup.lora_targets`` (base frozen)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=setup.lora_rank,
        lora_alpha=setup.lora_alpha,
        target_modules=list(setup.lora_targets),
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config, autocast_adapter_dtype=adapters_fp32)


def make_optimizer(setup: TrainingSetup, params: list[Any]) -> Any:
    """The setup's optimizer over ``params`` (state created lazily by the first ``step()``)."""
    import torch

    if setup.optimizer is Optimizer.ADAMW:
        return torch.optim.AdamW(params, lr=LEARNING_RATE, foreach=True)
    if setup.optimizer is Optimizer.SGD:
        return torch.optim.SGD(params, lr=LEARNING_RATE, momentum=0.9, foreach=True)
    try:
        import bitsandbytes as bnb
    except ImportError as err:  # pragma: no cover - bitsandbytes is a dependency
        raise InvalidValueError("optimizer 'adamw-8bit' needs bitsandbytes; pip install bitsandbytes") from err
    return bnb.optim.AdamW8bit(params, lr=LEARNING_RATE)


def trainable_parameters(model: Any) -> list[Any]:
    return [p for p in model.parameters() if p.requires_grad]


def run_step(
    model: Any,
    optimizer: Any,
    input_ids: Any,
    autocast_dtype: str | None,
    mark: Callable[[str], None] = lambda label: None,
) -> None:
    """One training step: forward with loss, backward, optimizer step, zero_grad (set_to_none)."""
    import torch

    if autocast_dtype is None:
        autocast = contextlib.nullcontext()
    else:
        autocast = torch.autocast(device_type="cpu", dtype=getattr(torch, autocast_dtype))
    with autocast:
        loss = model(input_ids=input_ids, labels=input_ids).loss
    mark("loss")
    loss.backward()
    mark(BACKWARD_DONE)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    mark("zero_grad done")


# -------------------------------------------------------------------------------------------------- the tracker


def _decoder_layer_depth(model: Any) -> int:
    """Depth (dots in the name + 1) of the first ``*DecoderLayer``; the timeline records down to one below."""
    for name, module in model.named_modules():
        if type(module).__name__.endswith("DecoderLayer"):
            return name.count(".") + 1
    return 3


def _tracker_class(base: type) -> type:
    """``base`` (MemTracker or FSDPMemTracker) extended for one training step.

    - grad hooks only on parameters that require grad: ``MemTracker`` registers a hook on every parameter,
      which PyTorch refuses for frozen ones (LoRA);
    - the phase of the peak, the peak of each phase, and a timeline of module-boundary snapshots (plus the
      highest point between two boundaries, so the figure shows the real peak).
    """
    from torch.distributed._tools.mem_tracker import _MemRefType

    class StepTracker(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, timeline_depth: int = 3, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.timeline: list[tuple[str, TracePhase, dict[str, int]]] = []
            self.phase_peaks = dict.fromkeys(TracePhase, 0)
            self.peak_total = -1
            self.peak_snapshot: dict[str, int] = {}
            self.peak_phase = TracePhase.FORWARD
            self._timeline_depth = timeline_depth
            self._between: tuple[int, TracePhase, dict[str, int]] | None = None
            self._step_hooks: list[Any] = []
            self._after_backward = False  # set by the "backward done" mark: the rest of the step is the optimizer's
            self.host_categories: tuple[str, ...] = ()  # counted apart from the GPU total (fsdp-offload)

        # -- what is tracked
        def _track_module_params_and_buffers(self, module: Any, install_grad_hooks: bool = True) -> tuple[int, int]:
            memory = super()._track_module_params_and_buffers(module, install_grad_hooks=False)
            if install_grad_hooks:
                for param in module.parameters():
                    if param.requires_grad and self._param_to_grad_hook_handles.get(param, None) is None:
                        self._param_to_grad_hook_handles[param] = (
                            param.register_hook(self._grad_hook),
                            param.register_post_accumulate_grad_hook(lambda p: self._grad_hook(p.grad)),
                        )
            return memory

        def _grad_hook(self, grad: Any) -> None:
            self._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)

        # -- phases and peaks
        def phase(self) -> TracePhase:
            if self._in_opt or self._after_backward:
                return TracePhase.OPTIMIZER
            return TracePhase.BACKWARD if self._mod_tracker.is_bw else TracePhase.FORWARD

        def current(self) -> dict[str, int]:
            """Bytes per category now; host-resident categories as "host_<category>"."""
            snap = dict.fromkeys(CATEGORIES, 0)
            for dev_snap in self._curr_mem_snap.values():
                for key, value in dev_snap.items():
                    if isinstance(key, enum.Enum):
                        name = _category_name(key.value)
                        if name in self.host_categories:
                            name = "host_" + name
                        snap[name] = snap.get(name, 0) + value
            return snap

        def device_total(self, snap: Mapping[str, int]) -> int:
            return sum(v for k, v in snap.items() if not k.startswith("host_"))

        def _update_peak_stats(self, peak_state: Any) -> None:
            # NB: replaces MemTracker's per-module peak bookkeeping (a loop over every module after every op,
            # most of a 13B LoRA trace's time); the step's peak, per-phase peaks and timeline are kept here
            self._note_total()

        def _note_total(self) -> None:
            if self.host_categories:
                total = self.device_total(self.current())
            else:
                total = sum(d.get("Total", 0) for d in self._curr_mem_snap.values())
            phase = self.phase()
            if total > self.phase_peaks[phase]:
                self.phase_peaks[phase] = total
            if total > self.peak_total:
                self.peak_total, self.peak_snapshot, self.peak_phase = total, self.current(), phase
            if self._between is None or total > self._between[0]:
                self._between = (total, phase, self.current())

        # -- the timeline
        def mark(self, label: str) -> None:
            if label == BACKWARD_DONE:
                self._after_backward = True
            snap = self.current()
            total = self.device_total(snap)
            if self._between is not None and self.timeline:
                peak_total, phase, peak_snap = self._between
                if peak_total > total and peak_total > self.device_total(self.timeline[-1][2]):
                    self.timeline.append((f"peak before {label}", phase, peak_snap))
            self.timeline.append((label, self.phase(), snap))
            self._between = (total, self.phase(), snap)

        def _mark_module(self, module: Any, what: str) -> None:
            if module is None:
                return
            name = self._mod_tracker.get_known_fqn(module)
            if name is not None and name.count(".") + 1 <= self._timeline_depth:
                self.mark(f"{name} {what}")

        def _pre_fw_hook(self, module: Any, inputs: Any) -> None:
            super()._pre_fw_hook(module, inputs)
            self._mark_module(module, "pre-fw-ac" if self._mod_tracker.is_bw else "pre-fw")

        def _post_fw_hook(self, module: Any, inputs: Any, outputs: Any) -> None:
            super()._post_fw_hook(module, inputs, outputs)
            self._mark_module(module, "post-fw-ac" if self._mod_tracker.is_bw else "post-fw")

        def _pre_bw_hook(self, module: Any, args: Any) -> None:
            super()._pre_bw_hook(module, args)
            self._mark_module(module, "pre-bw")

        def _post_bw_hook(self, module: Any, args: Any) -> None:
            super()._post_bw_hook(module, args)
            self._mark_module(module, "post-bw")

        def __enter__(self) -> Any:
            from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

            result = super().__enter__()
            if self._depth == 1:
                self._step_hooks = [
                    register_optimizer_step_pre_hook(lambda *a: self._mark_optimizer("optimizer.step start")),
                    register_optimizer_step_post_hook(lambda *a: self._mark_optimizer("optimizer.step end")),
                ]
                self.mark("start")
            return result

        def _mark_optimizer(self, label: str) -> None:
            # the pre hook runs before MemTracker's own (which sets _in_opt): the phase is the optimizer's
            in_opt, self._in_opt = self._in_opt, True
            self.mark(label)
            self._in_opt = in_opt

        def __exit__(self, *args: Any) -> None:
            if self._depth == 1:
                for handle in self._step_hooks:
                    handle.remove()
                self._step_hooks = []
            super().__exit__(*args)

    return StepTracker


_FSDP_CATEGORIES = {"sharded_param": "parameter", "sharded_grad": "gradient", "inputs": "other"}
OFFLOADED_CATEGORIES = ("parameter", "gradient", "optstate")  # on the host under fsdp-offload


def _category_name(value: str) -> str:
    """mem_tracker's category value ("Optstate", "Sharded Param", ...) as an oomlab category.

    FSDP's sharded parameters and gradients are "parameter" and "gradient"; its other categories keep their
    names ("unsharded_param", "unsharded_grad", "all_gather", "reduce_scatter").
    """
    key = value.lower().replace(" ", "_")
    return _FSDP_CATEGORIES.get(key, key)


def tracker_result(tracker: Any, *, seconds: float, method: str, notes: tuple[str, ...] = ()) -> TraceResult:
    """A :class:`TraceResult` from a tracker that ran a step."""
    return TraceResult(
        peak_bytes=int(tracker.peak_total),
        peak_phase=tracker.peak_phase,
        peak_by_category=MappingProxyType(dict(tracker.peak_snapshot)),
        phase_peaks=MappingProxyType(dict(tracker.phase_peaks)),
        timeline=tuple((label, phase, MappingProxyType(snap)) for label, phase, snap in tracker.timeline),
        seconds=seconds,
        versions=MappingProxyType(library_versions()),
        method=method,
        notes=notes,
    )


def make_tracker(model: Any, optimizer: Any = None, *, fsdp: bool = False) -> Any:
    """A step tracker for ``model`` (``FSDPMemTracker`` based when ``fsdp``; it needs the optimizer up front)."""
    if fsdp:
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        return _tracker_class(FSDPMemTracker)(model, optimizer, timeline_depth=_decoder_layer_depth(model) + 1)
    from torch.distributed._tools.mem_tracker import MemTracker

    return _tracker_class(MemTracker)(timeline_depth=_decoder_layer_depth(model) + 1)


# --------------------------------------------------------------------------------------------------- tracing


def _check_traceable(setup: TrainingSetup) -> None:
    if setup.strategy in (Strategy.ZERO1, Strategy.ZERO2):
        raise InvalidValueError(
            f"strategy {setup.strategy.value!r} is analytic only: DeepSpeed ZeRO has no PyTorch-native tracer on "
            "CPU; use source='analytic', or trace 'ddp' (ZeRO-0) or 'fsdp' (ZeRO-3) to bracket it"
        )
    if setup.method is Method.QLORA:
        raise InvalidValueError(
            "method 'qlora' cannot be traced: bitsandbytes' NF4 kernels need real data (not FakeTensorMode); "
            "measure a tiny model with oomlab.measure.measure_real, or use source='analytic'"
        )
    if setup.optimizer is Optimizer.ADAMW_8BIT:
        raise InvalidValueError(
            "optimizer 'adamw-8bit' cannot be traced: bitsandbytes' 8-bit kernels need real data; measure a "
            "tiny model with oomlab.measure.measure_real, or use source='analytic'"
        )


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence transformers' logging while tracing (warnings stay warnings)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)


@contextlib.contextmanager
def real_data_decisions() -> Iterator[None]:
    """Make transformers take, on fake tensors, the branches it takes on the real token ids.

    transformers reads tensor *values* in one place of a LLaMA training forward: ``find_packed_sequence_indices``
    checks whether the position ids describe several packed sequences, and skips the check -- assuming packing --
    when the tensor is fake (``is_tracing``). Assuming packing disables SDPA's ``is_causal`` fast path and
    materialises a ``batch x 1 x seq x seq`` mask plus an additive copy per layer, memory a real step never
    allocates. Our ids are one unpacked sequence per row (positions ``0 .. seq-1``), for which the real answer
    is ``None``.
    """
    from unittest import mock

    from transformers import masking_utils

    with mock.patch.object(masking_utils, "find_packed_sequence_indices", lambda position_ids: None):
        yield


def _trace_single(setup: TrainingSetup) -> TraceResult:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    start = time.perf_counter()
    dtypes = step_dtypes(setup)
    with _quiet(), real_data_decisions():
        model = build_model(setup, "meta")
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.to_empty(device="cpu")
            input_ids = torch.randint(0, setup.model.vocab_size, (setup.batch, setup.seq))
            tracker = make_tracker(model)
            tracker.track_external(model, input_ids)
            with tracker:
                optimizer = make_optimizer(setup, trainable_parameters(model))
                run_step(model, optimizer, input_ids, dtypes.autocast, tracker.mark)
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


def _trace_fsdp(setup: TrainingSetup) -> TraceResult:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    start = time.perf_counter()
    dtypes = step_dtypes(setup)
    offload = setup.strategy is Strategy.FSDP_OFFLOAD
    with _quiet(), real_data_decisions(), own_propagation_fake_mode(), fake_process_group(setup.world_size):
        model = build_model(setup, "meta")
        mesh = init_device_mesh("cpu", (setup.world_size,))
        kwargs: dict[str, Any] = {"mesh": mesh}
        if offload:
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
        for module in model.modules():
            if type(module).__name__.endswith("DecoderLayer"):
                fully_shard(module, **kwargs)
        fully_shard(model, **kwargs)
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.to_empty(device="cpu")
            input_ids = torch.randint(0, setup.model.vocab_size, (setup.batch, setup.seq))
            optimizer = make_optimizer(setup, trainable_parameters(model))  # after fully_shard: sharded state
            tracker = make_tracker(model, optimizer, fsdp=True)
            if offload:
                tracker.host_categories = OFFLOADED_CATEGORIES
            tracker.track_inputs((input_ids,))
            with tracker:
                run_step(model, optimizer, input_ids, dtypes.autocast, tracker.mark)
    notes = ("parameter, gradient and optstate offloaded: reported as host_*, not in peak_bytes",) if offload else ()
    return tracker_result(tracker, seconds=time.perf_counter() - start, method="fsdp-memtracker-fake", notes=notes)


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
    if setup.strategy in (Strategy.FSDP, Strategy.FSDP_OFFLOAD):
        result = _trace_fsdp(setup)
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
        elif isinstance(value, enum.Enum):
            value = value.value
        fields[f.name] = value
    payload = {"setup": fields, "versions": library_versions(), "trace_version": TRACE_VERSION}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def cache_path(setup: TrainingSetup) -> Path:
    return CACHE_DIR / f"trace-{cache_key(setup)}.json"


def write_cache(path: Path, result: TraceResult) -> None:
    """Write atomically: a temporary file in the same folder, then ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(result.to_json(), handle)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


# ------------------------------------------------------------------------------------- as a budget

_TRACE_TO_BUDGET = {
    "parameter": "WEIGHTS", "buffer": "WEIGHTS", "gradient": "GRADIENTS", "activation": "ACTIVATIONS",
    "temp": "WORKSPACE", "optstate": "OPTIMIZER_STATE", "other": "WORKSPACE", "unsharded_param": "WORKSPACE",
    "unsharded_grad": "WORKSPACE", "all_gather": "WORKSPACE", "reduce_scatter": "WORKSPACE", "untracked": "WORKSPACE",
}


def steady_phase_totals(trace: TraceResult) -> dict[TracePhase, int]:
    """Phase peaks of a steady-state step from a first-step trace.

    The traced step is the first: its optimizer state appears inside ``optimizer.step()``.  In every later
    step that state already exists during forward and backward, so it is added to those phases' peaks.
    """
    state = _final_optimizer_state(trace)
    return {
        phase: total + (state if phase is not TracePhase.OPTIMIZER else 0)
        for phase, total in trace.phase_peaks.items()
    }


def _final_optimizer_state(trace: TraceResult) -> int:
    for _, _, snap in reversed(trace.timeline):
        if "optstate" in snap:
            return int(snap["optstate"])
    return int(trace.peak_by_category.get("optstate", 0))


def traced_budget(setup: TrainingSetup, outside_bytes: int | None = None) -> Any:
    """A :class:`oomlab.budget.BudgetResult` whose allocated figures come from :func:`trace_step`.

    Steady state, as the analytic budget: the first step's trace plus the optimizer state during forward and
    backward (:func:`steady_phase_totals`).  Components at the peak are the trace's categories mapped onto
    :class:`~oomlab.budget.MemCategory`; outside-PyTorch memory and allocator overhead are the analytic ones.
    """
    from oomlab import budget

    trace = trace_step(setup)
    steady = steady_phase_totals(trace)
    buckets = budget.ddp_bucket_bytes(setup)  # DDP's flat buckets: measured = gradient bytes (measure_ddp_buckets)
    totals = {phase: total + buckets for phase, total in steady.items()}
    peak_phase = max(totals, key=lambda p: totals[p])
    analytic = budget.estimate_setup(setup, outside_bytes)
    if peak_phase is trace.peak_phase:
        breakdown, breakdown_total = trace.peak_by_category, trace.peak_bytes
    else:  # the steady-state peak falls in another phase: take that phase's largest timeline snapshot
        snaps = [snap for _, phase, snap in trace.timeline if phase is peak_phase] or [trace.peak_by_category]
        breakdown = max(snaps, key=lambda snap: sum(v for k, v in snap.items() if not k.startswith("host_")))
        breakdown_total = sum(v for k, v in breakdown.items() if not k.startswith("host_"))
    components: dict[Any, int] = {}
    for category, value in breakdown.items():
        if category.startswith("host_") or not value:
            continue
        key = budget.MemCategory[_TRACE_TO_BUDGET.get(category, "WORKSPACE")]
        components[key] = components.get(key, 0) + int(value)
    # the steady state's optimizer state (and the gap to the phase's true peak between snapshots)
    extra = steady[peak_phase] - breakdown_total
    if extra:
        key = budget.MemCategory.OPTIMIZER_STATE
        components[key] = components.get(key, 0) + extra
    if buckets:
        components[budget.MemCategory.WORKSPACE] = components.get(budget.MemCategory.WORKSPACE, 0) + buckets
    for key in (budget.MemCategory.ALLOCATOR_OVERHEAD, budget.MemCategory.OUTSIDE_PYTORCH):
        components[key] = analytic.components[key]
    phases = {budget.Phase(p.value): MappingProxyType({budget.MemCategory.ACTIVATIONS: v}) for p, v in totals.items()}
    return budget.BudgetResult(
        setup=setup, source="traced", peak_phase=budget.Phase(peak_phase.value),
        phases=MappingProxyType(phases), components=MappingProxyType(components),
        host_ram_bytes=analytic.host_ram_bytes, capacity_bytes=analytic.capacity_bytes,
        notes=(f"traced with {trace.method} in {trace.seconds:.1f} s", *trace.notes, *analytic.notes),
    )
