"""PyTorch's own ``MemTracker`` (``FSDPMemTracker`` for FSDP) extended for one training step, and what it returns.

``torch.distributed._tools.mem_tracker.MemTracker`` watches every storage created and freed at the dispatcher;
the step tracker adds grad hooks for trainable parameters only, the phase of the peak, the peak of each phase, and
a timeline of module-boundary snapshots.  Byte counts are exact storage sizes (``numel * itemsize``); the CUDA
caching allocator rounds each block up to 512 bytes, which adds at most 512 bytes per live tensor.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from oomlab.budget.result import MemCategory, Phase
from oomlab.budget.step import BACKWARD_DONE, library_versions

# mem_tracker's categories (``_MemRefType``), under the names oomlab uses.
CATEGORIES = ("parameter", "buffer", "gradient", "activation", "temp", "optstate", "other")


@dataclass(frozen=True)
class TraceResult:
    """Memory of one training step on one GPU (rank), traced or measured."""

    peak_bytes: int  # max allocated bytes over the step (what torch.cuda.max_memory_allocated would report)
    peak_phase: Phase  # the phase the peak falls in
    peak_by_category: Mapping[str, int]  # bytes per category at the peak (sums to peak_bytes)
    phase_peaks: Mapping[Phase, int]  # the peak of each phase
    timeline: tuple[tuple[str, Phase, Mapping[str, int]], ...]  # (event, phase, bytes by category)
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
            peak_phase=Phase(raw["peak_phase"]),
            peak_by_category=MappingProxyType({k: int(v) for k, v in raw["peak_by_category"].items()}),
            phase_peaks=MappingProxyType({Phase(k): int(v) for k, v in raw["phase_peaks"].items()}),
            timeline=tuple(
                (str(label), Phase(phase), MappingProxyType({k: int(v) for k, v in snap.items()}))
                for label, phase, snap in raw["timeline"]
            ),
            seconds=float(raw["seconds"]),
            versions=MappingProxyType(dict(raw["versions"])),
            method=str(raw["method"]),
            notes=tuple(raw.get("notes", ())),
        )


def _decoder_layer_depth(model: Any) -> int:
    """Depth (dots in the name + 1) of the first decoder layer (a ``_no_split_modules`` class: ``LlamaDecoderLayer``,
    ``GPTNeoXLayer``, ...); the timeline records down to one below."""
    classes = set()
    for module in model.modules():
        classes.update(getattr(module, "_no_split_modules", None) or ())
    for name, module in model.named_modules():
        if type(module).__name__ in classes or type(module).__name__.endswith("DecoderLayer"):
            return name.count(".") + 1
    return 3


def _tracker_class(base: type) -> type:
    """``base`` (MemTracker or FSDPMemTracker) extended for one training step.

    - grad hooks only on parameters that require grad: ``MemTracker`` registers a hook on every parameter,
      which PyTorch refuses for frozen ones (LoRA);
    - the phase of the peak, the peak of each phase, and a timeline of module-boundary snapshots (plus the
      highest point between two boundaries, so the figure shows the real peak).
    """
    import torch
    from torch.distributed._tools.common_utils import get_untyped_storages
    from torch.distributed._tools.mem_tracker import _MemRefType

    to_copy = torch.ops.aten._to_copy.default
    relabelled = ("Activation", "Temp")  # only tensors MemTracker calls activations or temporaries are relabelled

    class StepTracker(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, timeline_depth: int = 3, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._labels: dict[int, tuple[Any, str]] = {}  # id(winfo) -> (winfo, oomlab category)
            self.logits_shape: tuple[int, int] | None = None  # (tokens, vocab): tensors that size are "logits"
            self.label_sources: list[Any] = []  # callables -> (tensor, category) pairs, relabelled on each read
            self._opt_allocations: dict[int, Any] = {}  # id(winfo) -> winfo made inside optimizer.step()
            self._created: list[tuple[Any, Any]] = []
            self._optimizers: list[Any] = []  # the optimizers seen stepping
            self.timeline: list[tuple[str, Phase, dict[str, int]]] = []
            self.phase_peaks = dict.fromkeys(Phase, 0)
            self.peak_total = -1
            self.peak_snapshot: dict[str, int] = {}
            self.peak_phase = Phase.FORWARD
            self._timeline_depth = timeline_depth
            self._between: tuple[int, Phase, dict[str, int]] | None = None
            self._step_hooks: list[Any] = []
            self._after_backward = False  # set by the "backward done" mark: the rest of the step is the optimizer's
            self.host_categories: tuple[str, ...] = ()  # counted apart from the GPU total (fsdp-offload)

        # -- what is tracked
        def _track_module_params_and_buffers(self, module: Any, install_grad_hooks: bool = True) -> tuple[int, int]:
            memory = super()._track_module_params_and_buffers(module, install_grad_hooks=False)
            if install_grad_hooks:
                for param in module.parameters():
                    # leaves only: FSDP1 with use_orig_params exposes views into its flat parameter
                    if param.requires_grad and param.is_leaf \
                            and self._param_to_grad_hook_handles.get(param, None) is None:
                        self._param_to_grad_hook_handles[param] = (
                            param.register_hook(self._grad_hook),
                            param.register_post_accumulate_grad_hook(lambda p: self._grad_hook(p.grad)),
                        )
            return memory

        def _grad_hook(self, grad: Any) -> None:
            self._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)

        # -- oomlab's categories on top of MemTracker's: logits, autocast copies, FSDP1's buffers
        def _track(self, reftype: Any, t: Any) -> None:
            known = {id(w) for w in (self._winfo_of(st) for st in get_untyped_storages(t)) if w is not None}
            super()._track(reftype, t)
            for st in get_untyped_storages(t):
                winfo = self._winfo_of(st)
                if winfo is not None and id(winfo) not in known:
                    self._created.append((winfo, t))

        def _winfo_of(self, storage: Any) -> Any:
            return self._WINFO.get(storage, (None, None))[0]

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self._created: list[tuple[Any, Any]] = []  # storages this operation allocated, and their tensors
            self._deferred = False
            self._defer = True  # label the outputs before the peak bookkeeping looks at them
            try:
                res = super().__torch_dispatch__(func, types, args, kwargs)
            finally:
                self._defer = False
            if res is not NotImplemented and self._created:
                self._label_created(func, args)
            self._created = []
            if self._deferred:
                self._note_total()
            return res

        def _label_created(self, func: Any, args: Any) -> None:
            """oomlab's category of each storage the operation just allocated (views of older ones keep theirs)."""
            source = self._winfo(args[0]) if func is to_copy and args and isinstance(args[0], torch.Tensor) else None
            weight_cast = source is not None and source.reftype == _MemRefType.PARAM
            fsdp_state = getattr(self, "_fsdp_state", None)  # FSDPMemTracker's: what FSDP2 is doing now
            gathering = fsdp_state is not None and fsdp_state.name in ("PRE_FW", "PRE_BW")
            # a checkpointed layer's forward run again in backward: torch.utils.checkpoint recomputes under
            # enable_grad() while the autograd engine computes gradients with grad mode off; what the recompute
            # saves counts as activations (as MemTracker counts it when its module hooks see the recompute)
            recomputing = self._mod_tracker.is_bw and torch.is_grad_enabled()
            for winfo, out in self._created:
                if self._in_opt:
                    self._opt_allocations.setdefault(id(winfo), winfo)
                    continue
                label = None
                if winfo.reftype.value not in relabelled:
                    continue
                if weight_cast:
                    label = "autocast_copy"  # a half copy of a parameter, as autocast casts weights
                elif gathering:
                    label = "gathered_param"  # FSDP2's copy-out (FSDPMemTracker calls it unsharded once it returns)
                elif recomputing and winfo.reftype.value == "Temp":
                    label = "activation"
                elif self.logits_shape is not None and out.dim() >= 2 and out.shape[-1] == self.logits_shape[1] \
                        and out.numel() == self.logits_shape[0] * self.logits_shape[1]:
                    label = "logits"  # the LM head's output, its fp32 copies, log-softmax, their gradients
                if label is not None:
                    self._labels.setdefault(id(winfo), (winfo, label))

        def _winfo(self, t: Any) -> Any:
            t = getattr(t, "_local_tensor", t)  # a DTensor's bytes are its local shard's
            try:
                return self._WINFO.get(t.untyped_storage(), (None, None))[0]
            except (RuntimeError, NotImplementedError):  # a tensor without storage (a DTensor wrapper, say)
                return None

        def _delete_callback(self, winfo: Any, w_st: Any) -> None:
            self._labels.pop(id(winfo), None)
            self._opt_allocations.pop(id(winfo), None)
            super()._delete_callback(winfo, w_st)

        def _relabel_sources(self) -> None:
            for source in self.label_sources:
                for tensor, label in source():
                    winfo = self._winfo(tensor)
                    if winfo is None:
                        continue
                    if label == "gradient":
                        self._update_and_maybe_create_winfos(tensor, _MemRefType.GRAD)
                    else:
                        self._labels[id(winfo)] = (winfo, label)

        # -- phases and peaks
        def phase(self) -> Phase:
            if self._in_opt or self._after_backward:
                return Phase.OPTIMIZER
            return Phase.BACKWARD if self._mod_tracker.is_bw else Phase.FORWARD

        def current(self) -> dict[str, int]:
            """Bytes per category now; host-resident categories as "host_<category>"."""
            if self.label_sources:
                self._relabel_sources()
            snap = dict.fromkeys(CATEGORIES, 0)
            for dev_snap in self._curr_mem_snap.values():
                for key, value in dev_snap.items():
                    if isinstance(key, enum.Enum):
                        name = self._name(key.value)
                        snap[name] = snap.get(name, 0) + value
            for winfo, label in self._labels.values():
                if winfo.reftype.value in relabelled or label == "unsharded_param":  # FSDP1's are parameters
                    snap[self._name(winfo.reftype.value)] -= winfo.mem_consumed
                    snap[label] = snap.get(label, 0) + winfo.mem_consumed
            if self._opt_allocations:  # what optimizer.step() allocated and keeps in no state is a temporary
                state = {id(self._winfo(t)) for opt in self._optimizers for per_param in opt.state.values()
                         for t in per_param.values() if isinstance(t, torch.Tensor)}
                for key, winfo in self._opt_allocations.items():
                    if key not in state and winfo.reftype.value.lower() == "optstate":
                        snap[self._name(winfo.reftype.value)] -= winfo.mem_consumed
                        snap["temp"] = snap.get("temp", 0) + winfo.mem_consumed
            return snap

        def _host_bytes(self) -> int:
            """Bytes of the host-resident categories now (without building a whole snapshot: this runs per op)."""
            if self.label_sources:
                self._relabel_sources()
            host = sum(value for dev_snap in self._curr_mem_snap.values() for key, value in dev_snap.items()
                       if isinstance(key, enum.Enum) and _category_name(key.value) in self.host_categories)
            for winfo, label in self._labels.values():  # relabelled out of a host category onto the device
                if (winfo.reftype.value in relabelled or label == "unsharded_param") \
                        and _category_name(winfo.reftype.value) in self.host_categories:
                    host -= winfo.mem_consumed
            return host

        def _name(self, reftype_value: str) -> str:
            name = _category_name(reftype_value)
            return "host_" + name if name in self.host_categories else name

        def device_total(self, snap: Mapping[str, int]) -> int:
            return sum(v for k, v in snap.items() if not k.startswith("host_"))

        def _update_peak_stats(self, peak_state: Any) -> None:
            # NB: replaces MemTracker's per-module peak bookkeeping (a loop over every module after every op,
            # most of a 13B LoRA trace's time); the step's peak, per-phase peaks and timeline are kept here
            if getattr(self, "_defer", False):
                self._deferred = True
                return
            self._note_total()

        def _note_total(self) -> None:
            total = sum(d.get("Total", 0) for d in self._curr_mem_snap.values())
            if self.host_categories:
                total -= self._host_bytes()
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

        # -- FSDPMemTracker instruments FSDP's own pre/post forward and backward instead of module hooks: mark there
        def _fsdp_state_pre_forward(self, fsdp_mod: Any, orig: Any) -> Any:
            return self._marked(super()._fsdp_state_pre_forward(fsdp_mod, orig), fsdp_mod, "pre-fw")

        def _fsdp_state_post_forward(self, fsdp_mod: Any, orig: Any) -> Any:
            return self._marked(super()._fsdp_state_post_forward(fsdp_mod, orig), fsdp_mod, "post-fw")

        def _fsdp_param_group_pre_backward(self, fsdp_mod: Any, orig: Any) -> Any:
            return self._marked(super()._fsdp_param_group_pre_backward(fsdp_mod, orig), fsdp_mod, "pre-bw")

        def _fsdp_param_group_post_backward(self, fsdp_mod: Any, orig: Any) -> Any:
            return self._marked(super()._fsdp_param_group_post_backward(fsdp_mod, orig), fsdp_mod, "post-bw")

        def _marked(self, inner: Any, module: Any, what: str) -> Any:
            def marked(*args: Any, **kwargs: Any) -> Any:
                out = inner(*args, **kwargs)
                recompute = self._mod_tracker.is_bw and what.endswith("fw")
                self._mark_module(module, what + ("-ac" if recompute else ""))
                return out

            return marked

        def __enter__(self) -> Any:
            from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

            result = super().__enter__()
            if self._depth == 1:
                self._step_hooks = [
                    register_optimizer_step_pre_hook(lambda opt, *a: self._optimizer_starts(opt)),
                    register_optimizer_step_post_hook(lambda *a: self._mark_optimizer("optimizer.step end")),
                ]
                self.mark("start")
            return result

        def _optimizer_starts(self, optimizer: Any) -> None:
            if optimizer not in self._optimizers:
                self._optimizers.append(optimizer)
            self._mark_optimizer("optimizer.step start")

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

# How a traced category counts in a budget (anything else: workspace).  "logits" and "autocast_copy" are oomlab's
# own labels on top of MemTracker's (see StepTracker.__torch_dispatch__): the analytic budget's categories mean the
# same things.
TRACE_CATEGORIES: Mapping[str, MemCategory] = MappingProxyType({
    "parameter": MemCategory.WEIGHTS, "buffer": MemCategory.WEIGHTS, "gradient": MemCategory.GRADIENTS,
    "activation": MemCategory.ACTIVATIONS, "temp": MemCategory.WORKSPACE, "optstate": MemCategory.OPTIMIZER_STATE,
    "logits": MemCategory.LOGITS_LOSS, "autocast_copy": MemCategory.WORKSPACE, "gathered_param": MemCategory.WORKSPACE,
    "other": MemCategory.WORKSPACE, "unsharded_param": MemCategory.WORKSPACE,
    "unsharded_grad": MemCategory.WORKSPACE, "all_gather": MemCategory.WORKSPACE,
    "reduce_scatter": MemCategory.WORKSPACE, "untracked": MemCategory.WORKSPACE,
})


def budget_category(trace_category: str) -> MemCategory:
    """The :class:`MemCategory` a traced category counts as."""
    return TRACE_CATEGORIES.get(trace_category, MemCategory.WORKSPACE)
