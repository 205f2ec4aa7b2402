"""accelerate's ``device_map="auto"`` route: whole decoder layers on successive GPUs of one process, placed as
accelerate's own ``get_balanced_memory`` + ``infer_auto_device_map`` place them on the meta model, and the training
step's peak on each GPU shared out from the single-GPU budget.

The placement runs accelerate's arithmetic over the model's module tree (:mod:`oomlab.remedies.auto_device_map` over
:mod:`oomlab.core.module_tree`: committed data for a shipped model), so it imports no torch;
:func:`accelerate_device_map` runs accelerate itself on the meta model (torch, transformers), the evidence that the two
agree (``tests/remedies/test_placement_accelerate.py``).
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from oomlab.budget.estimator import estimate_setup
from oomlab.budget.result import BudgetResult, MemCategory, Phase
from oomlab.core.choices import Strategy
from oomlab.core.dtypes import load_dtype
from oomlab.core.memo import BoundedMemo
from oomlab.core.modeling import build_meta_model
from oomlab.core.models import ModelSpec
from oomlab.core.module_tree import module_tree
from oomlab.core.quiet import quiet_libraries
from oomlab.core.setup import TrainingSetup
from oomlab.remedies.auto_device_map import (
    balance_buffer,
    compute_module_sizes,
    get_balanced_memory,
    infer_auto_device_map,
)

NO_SPLIT = ("LlamaDecoderLayer", "MistralDecoderLayer")  # accelerate keeps a decoder layer on one device
CPU_BYTES = 1 << 62  # what accelerate is given for the CPU: whatever does not fit the GPUs goes there
SIZES_DTYPE = "float16"  # the dtype accelerate sizes the modules in


@dataclass(frozen=True)
class GPUPlacement:
    """What accelerate's device_map puts on one device."""

    device: int | str
    modules: tuple[str, ...]
    layers: tuple[int, ...]  # decoder layer indices
    weight_bytes: int  # the placed modules' parameters in the meta model's dtype
    peak_bytes: int  # the training step's peak on this GPU (every phase shared out, the largest; + outside PyTorch)
    holds_lm_head: bool = False  # the LM head (and so the logits and the loss) lives here

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "modules": list(self.modules), "layers": list(self.layers),
                "weight_bytes": self.weight_bytes, "peak_bytes": self.peak_bytes, "holds_lm_head": self.holds_lm_head}


@dataclass(frozen=True)
class DeviceMapPlacement:
    """accelerate's ``infer_auto_device_map`` after ``get_balanced_memory``, as ``device_map="auto"`` does."""

    setup: TrainingSetup = field(repr=False, compare=False)
    max_memory: Mapping[int | str, int]  # what accelerate was given (scaled to weight bytes, see place_device_map)
    gpus: tuple[GPUPlacement, ...]
    spilled: tuple[str, ...]  # modules accelerate put on "cpu" or "disk"

    @property
    def per_gpu_peak_bytes(self) -> int:
        return max(g.peak_bytes for g in self.gpus)

    def to_dict(self) -> dict[str, Any]:
        return {"max_memory": {str(k): v for k, v in self.max_memory.items()},
                "gpus": [g.to_dict() for g in self.gpus], "spilled": list(self.spilled)}


@lru_cache(maxsize=64)
def module_sizes(spec: ModelSpec) -> dict[str, int]:
    """accelerate's module sizes of ``spec`` in fp16 (``compute_module_sizes``), from its module tree; shared -- do
    not modify."""
    return compute_module_sizes(module_tree(spec), SIZES_DTYPE)


@lru_cache(maxsize=64)
def _buffer(spec: ModelSpec) -> int:
    """get_balanced_memory's buffer for ``spec``: the same for every placement of it."""
    return balance_buffer(module_tree(spec), module_sizes(spec), list(NO_SPLIT))


def auto_device_map(spec: ModelSpec, max_memory: Mapping[int, int]) -> dict[str, int | str]:
    """What ``device_map="auto"`` with ``max_memory`` (per GPU) places: accelerate's ``get_balanced_memory`` (each GPU
    capped at what it was given), then ``infer_auto_device_map`` with the rest on the CPU; over the module tree."""
    tree, sizes = module_tree(spec), module_sizes(spec)
    balanced = get_balanced_memory(tree, sizes, dict(max_memory), list(NO_SPLIT), _buffer(spec))
    balanced = {k: min(int(v), max_memory[k]) for k, v in balanced.items() if k in max_memory}
    return infer_auto_device_map(tree, sizes, {**balanced, "cpu": CPU_BYTES}, list(NO_SPLIT))


@lru_cache(maxsize=16)
def _meta_model(spec: ModelSpec) -> Any:
    """The fp16 meta model (transformers, no weights) accelerate places."""
    return build_meta_model(spec, load_dtype(SIZES_DTYPE))


_SIZE_MEMO: BoundedMemo[tuple, Any] = BoundedMemo(64)  # each entry keeps its meta model alive: few


@contextlib.contextmanager
def _memoised_sizes() -> Iterator[None]:
    """accelerate's ``compute_module_sizes`` and ``find_tied_parameters``, memoised per meta model.

    ``infer_auto_device_map`` recomputes the sizes of the same (cached, never modified) meta model thousands of
    times; the results are the same each time, so they are computed once.
    """
    from unittest import mock

    from accelerate.utils import modeling as acc

    sizes, tied = acc.compute_module_sizes, acc.find_tied_parameters

    def memo_sizes(model: Any, *args: Any, **kwargs: Any) -> Any:
        key = ("sizes", id(model), args, tuple(sorted((k, str(v)) for k, v in kwargs.items())))
        held = _SIZE_MEMO.get(key)
        if held is None or held[0] is not model:  # the model is kept: an id is never reused for another
            held = _SIZE_MEMO[key] = (model, sizes(model, *args, **kwargs))
        return copy.copy(held[1])  # accelerate updates the dict it gets (tied weights): hand out copies

    def memo_tied(model: Any, *args: Any, **kwargs: Any) -> Any:
        key = ("tied", id(model), args, tuple(sorted(kwargs.items())))
        held = _SIZE_MEMO.get(key)
        if held is None or held[0] is not model:
            held = _SIZE_MEMO[key] = (model, tied(model, *args, **kwargs))
        return copy.deepcopy(held[1])

    with mock.patch.object(acc, "compute_module_sizes", memo_sizes), \
            mock.patch.object(acc, "find_tied_parameters", memo_tied):
        yield


def accelerate_device_map(spec: ModelSpec, max_memory: Mapping[int, int]) -> dict[str, int | str]:
    """:func:`auto_device_map` as accelerate itself computes it on the fp16 meta model (torch, transformers): the
    evidence the torch-free placement is checked against."""
    from accelerate.utils import get_balanced_memory as acc_balanced
    from accelerate.utils import infer_auto_device_map as acc_infer

    model = _meta_model(spec)
    # quiet: accelerate says "Device 0 is not available": there is no GPU here, by design
    # and, when layers spill, that their buffers may not fit a GPU: the spill itself is what the remedy reports
    with quiet_libraries(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Current model requires .* bytes of buffer for offloaded layers")
        with _memoised_sizes():
            balanced = acc_balanced(model, max_memory=dict(max_memory), no_split_module_classes=list(NO_SPLIT),
                                    dtype=SIZES_DTYPE)
            balanced = {k: min(int(v), max_memory[k]) for k, v in balanced.items() if k in max_memory}
            return dict(acc_infer(model, max_memory={**balanced, "cpu": CPU_BYTES},
                                  no_split_module_classes=list(NO_SPLIT), dtype=SIZES_DTYPE))


def layer_index(name: str) -> int | None:
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part == "layers" and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


def _inside(placed: set[str], name: str) -> bool:
    """Is module ``name`` inside one of the placed modules (itself or a parent; accelerate's ``""`` is the whole
    model)?"""
    parts = name.split(".")
    return any(".".join(parts[:k]) in placed for k in range(len(parts) + 1))


def layer_modules(names: Iterable[str]) -> tuple[tuple[str, int], ...]:
    """The decoder layers' own modules among ``names`` (``…layers.{i}``), with their indices."""
    found = ((name, layer_index(name)) for name in names)
    return tuple((name, i) for name, i in found if i is not None and name.endswith(f"layers.{i}"))


def head_modules(names: Iterable[str]) -> tuple[str, ...]:
    """The LM head's module among ``names`` (``lm_head`` when none is named so)."""
    return tuple(n for n in names if n == "lm_head" or n.endswith(".lm_head")) or ("lm_head",)


def _covered(placed: tuple[str, ...], layers: tuple[tuple[str, int], ...]) -> tuple[int, ...]:
    inside = set(placed)
    found = {i for i in map(layer_index, placed) if i is not None}
    found.update(i for name, i in layers if _inside(inside, name))
    return tuple(sorted(found))


def _holds(placed: tuple[str, ...], heads: tuple[str, ...]) -> bool:
    inside = set(placed)
    return any(_inside(inside, h) for h in heads)


def covered_layers(placed: tuple[str, ...], sizes: Mapping[str, int]) -> tuple[int, ...]:
    """The decoder layers inside the placed modules: a layer itself, or every layer of a placed parent
    (``{"": 0}``, what accelerate returns when the whole model fits one GPU, holds all of them)."""
    return _covered(placed, layer_modules(sizes))


def holds_head(placed: tuple[str, ...], sizes: Mapping[str, int]) -> bool:
    """Do the placed modules hold the LM head (the module itself or a parent of it)?"""
    return _holds(placed, head_modules(sizes))


@lru_cache(maxsize=64)
def _named_parts(spec: ModelSpec) -> tuple[tuple[tuple[str, int], ...], tuple[str, ...]]:
    """``spec``'s decoder-layer modules and LM head among its sized modules: read once per model."""
    sizes = module_sizes(spec)
    return layer_modules(sizes), head_modules(sizes)


def share_out(components: Mapping[MemCategory, int], weight_bytes: int, layers: int, holds_lm_head: bool,
              setup: TrainingSetup, total_weight_bytes: int) -> int:
    """One GPU's share of a single-GPU budget's ``components``: weights, gradients, optimizer state and workspace
    by its share of the weight bytes, activations by its share of the decoder layers, logits and loss on the LM
    head's GPU only, and the whole outside-PyTorch memory on each."""
    peak = 0
    for category, value in components.items():
        if category is MemCategory.OUTSIDE_PYTORCH:
            peak += value
        elif category is MemCategory.LOGITS_LOSS:
            peak += value if holds_lm_head else 0
        elif category is MemCategory.ACTIVATIONS:
            peak += round(value * layers / setup.model.num_hidden_layers)
        else:
            peak += round(value * weight_bytes / total_weight_bytes)
    return peak


def phase_components(result: BudgetResult) -> dict[Phase, dict[MemCategory, int]]:
    """Each phase of a single-GPU budget with what ``memory_allocated`` does not see added (the allocator's
    overhead and the memory outside PyTorch, as at the budget's peak)."""
    extra = {k: result.components.get(k, 0) for k in (MemCategory.ALLOCATOR_OVERHEAD, MemCategory.OUTSIDE_PYTORCH)}
    return {phase: {**dict(comps), **extra} for phase, comps in result.phases.items()}


def gpu_peak(result: BudgetResult, weight_bytes: int, layers: int, holds_lm_head: bool, setup: TrainingSetup,
             total_weight_bytes: int) -> int:
    """One GPU's peak: every phase of the single-GPU budget shared out, the largest.

    Each GPU peaks in its own phase: the LM head's GPU in the forward's end (the logits and the loss), the others
    where their layers' share is largest (with checkpointing, the recompute in backward).  Taking only the single
    budget's peak phase would drop the logits from the head's GPU whenever the recompute phase is the larger.
    NB: a recomputed layer's own activations and workspace are shared out like the rest, not put whole on the GPU
    that recomputes it.
    """
    return max(share_out(comps, weight_bytes, layers, holds_lm_head, setup, total_weight_bytes)
               for comps in phase_components(result).values())


def place_device_map(setup: TrainingSetup, result: BudgetResult | None = None) -> DeviceMapPlacement:
    """Place ``setup``'s model over its GPUs as accelerate's own ``get_balanced_memory`` + ``infer_auto_device_map``
    do (:func:`auto_device_map`).

    accelerate sizes modules by their weights; a training step needs more per weight byte (gradients, optimizer
    state, activations).  Each GPU's memory is therefore given to accelerate in weight bytes: (capacity − outside
    PyTorch − logits and loss) / (the single-GPU budget's bytes per weight byte).  The step's peak per GPU is then
    the single-GPU budget's components shared out: weights, gradients, optimizer state and workspace by the share
    of parameters placed there, activations by the share of decoder layers, logits and loss on the LM head's GPU,
    and the outside-PyTorch memory on each.  NB: the peaks of different GPUs are taken at the single budget's
    peak phase.
    """
    single = setup.with_(strategy=Strategy.SINGLE, gpus=1, nodes=1)
    result = estimate_setup(single) if result is None else result
    sizes = module_sizes(setup.model)
    comps = result.components
    outside = comps.get(MemCategory.OUTSIDE_PYTORCH, 0)
    logits = max(phase.get(MemCategory.LOGITS_LOSS, 0) for phase in result.phases.values())  # the head's GPU
    per_weight = (result.per_gpu_peak_bytes - outside - logits) / max(1, sizes[""])
    usable = setup.gpu.total_memory_bytes - outside - logits
    scaled = {i: max(0, int(usable / per_weight)) for i in range(setup.gpus)}
    device_map = auto_device_map(setup.model, scaled)
    weights_total = sizes[""]
    layer_names, heads = _named_parts(setup.model)
    per_device: dict[Any, list[str]] = {}
    for name, device in device_map.items():
        per_device.setdefault(device, []).append(name)
    gpus = []
    for device in range(setup.gpus):
        names = tuple(per_device.get(device, ()))
        wbytes = sum(sizes.get(n, 0) for n in names)
        layers = _covered(names, layer_names)
        head = _holds(names, heads)
        peak = gpu_peak(result, wbytes, len(layers), head, setup, weights_total)
        gpus.append(GPUPlacement(device, names, layers, wbytes, peak if names else outside, head))
    spilled = tuple(n for d, ns in per_device.items() if not isinstance(d, int) for n in ns)
    return DeviceMapPlacement(setup, {**scaled}, tuple(gpus), spilled)


def replace_peak(placement: DeviceMapPlacement, result: BudgetResult) -> int:
    """The peak of the most loaded GPU for a new single-GPU budget, with the placement kept (a GPU given no module
    holds only the memory outside PyTorch, as in :func:`place_device_map`; when every module spilled, that is all)."""
    total = module_sizes(placement.setup.model)[""]
    outside = result.components.get(MemCategory.OUTSIDE_PYTORCH, 0)
    return max(gpu_peak(result, g.weight_bytes, len(g.layers), g.holds_lm_head, placement.setup, total)
               if g.modules else outside for g in placement.gpus)
