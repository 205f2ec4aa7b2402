"""``model.to("cuda")`` walked over the model's module tree (:mod:`oomlab.core.module_tree`) without torch: the
tensors in ``Module._apply``'s order charged to the caching-allocator model, step for step what the traced walk
(:mod:`oomlab.reproduction.traced_walk`, PyTorch's own ``_apply`` on a meta model) records, and the figures of its
simulated reproduction (:func:`oomlab.reproduction.replay.reproduce` with ``device="simulated"``) but its traceback.

``Module._apply`` (torch/nn/modules/module.py) moves each child module's tensors first, depth first, then the
module's own parameters, then its own buffers, ``None`` slots skipped; a tied tensor is copied once, at its first
visit, under its first name (``tensor_names``).  ``tests/reproduction/test_apply_walk.py`` checks every shipped
model, in every dtype, against the traced walk, and the replica's figures against the simulated reproduction.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from oomlab.core.choices import MessageFormat
from oomlab.core.dtypes import load_dtype
from oomlab.core.gpus import load_gpu
from oomlab.core.models import load_model
from oomlab.core.module_tree import ELEMENT_BYTES, ModuleNode, ModuleTree, module_tree
from oomlab.core.outside import TorchEra
from oomlab.core.seed import is_seed_case
from oomlab.reproduction.allocator import CachingAllocator, SimulatedOutOfMemory, get_allocation_size, round_size
from oomlab.reproduction.outside import case_outside
from oomlab.reproduction.result import FailingTensor
from oomlab.reproduction.steps import UNLIMITED_BYTES, TensorKind, WalkStep


@dataclass(frozen=True)
class MovedTensor:
    """One tensor ``Module._apply`` copies to the device."""

    name: str  # its first qualified name
    kind: TensorKind
    shape: tuple[int, ...]
    dtype: str
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * ELEMENT_BYTES[self.dtype]


def apply_order(tree: ModuleTree, dtype: str) -> tuple[MovedTensor, ...]:
    """The tensors of ``tree`` built in ``dtype``, in ``Module._apply``'s order, each once."""
    moved: set[str] = set()

    def visit(prefix: str, node: ModuleNode) -> Iterator[MovedTensor]:
        for name, child in node.children:
            yield from visit(f"{prefix}.{name}" if prefix else name, child)
        for kind, entries in ((TensorKind.PARAMETER, node.parameters), (TensorKind.BUFFER, node.buffers)):
            for entry in entries:
                qualified = f"{prefix}.{entry.name}" if prefix else entry.name
                first = tree.tied.get(qualified, qualified)
                if first not in moved:
                    moved.add(first)
                    yield MovedTensor(first, kind, entry.shape, entry.dtype_in(dtype), entry.numel)

    return tuple(visit("", tree.root))


@dataclass(frozen=True)
class WalkOutcome:
    """How far the walk went against one allocator, and where it stopped."""

    steps: tuple[WalkStep, ...]
    failure: FailingTensor | None  # the tensor whose copy the allocator refused
    message: str | None  # the OOM message the allocator gave


def replay(tensors: tuple[MovedTensor, ...], allocator: CachingAllocator) -> WalkOutcome:
    """Copy ``tensors`` in order against ``allocator`` (a zero-byte tensor is recorded, not allocated), as the traced
    walk's ``SimulatedCudaMode`` does, until the allocator refuses one."""
    steps: list[WalkStep] = []
    moved_bytes = moved_params = 0
    for t in tensors:
        nbytes = t.nbytes
        try:
            if nbytes:
                allocator.malloc(nbytes)
        except SimulatedOutOfMemory as oom:
            return WalkOutcome(tuple(steps), FailingTensor(t.name, t.kind, t.shape, t.dtype, nbytes), oom.message)
        moved_bytes += nbytes
        if t.kind is TensorKind.PARAMETER:
            moved_params += t.numel
        steps.append(WalkStep(len(steps), t.name, t.kind, t.shape, t.dtype, nbytes,
                              get_allocation_size(round_size(nbytes)), allocator.allocated_bytes,
                              allocator.reserved_bytes, moved_bytes, moved_params))
    return WalkOutcome(tuple(steps), None, None)


@lru_cache(maxsize=256)  # keyed by user input (a config.json path): bounded
def tree_unlimited_walk(model: str, dtype: str) -> tuple[WalkStep, ...]:
    """The whole walk on a device with no limit (the steps of
    :func:`oomlab.reproduction.traced_walk.traced_unlimited_walk`)."""
    dt = load_dtype(dtype)
    return replay(apply_order(module_tree(load_model(model)), dt.name), CachingAllocator(UNLIMITED_BYTES)).steps


@dataclass(frozen=True)
class ReplicaMove:
    """``model.to("cuda")`` of one full replica on one GPU: the simulated reproduction's figures (no traceback: no
    code ran)."""

    model: str
    gpu: str
    dtype: str
    message_format: MessageFormat
    raised: bool  # torch.OutOfMemoryError
    message: str | None
    tried_bytes: int | None  # the "Tried to allocate" segment
    allocated_bytes: int  # the allocator's at the end (at the failure if raised)
    reserved_bytes: int
    free_bytes: int
    total_bytes: int
    outside_pytorch_bytes: int
    outside_pytorch_source: str
    failing_tensor: FailingTensor | None
    moved_bytes: int
    moved_parameters: int
    model_bytes: int  # the whole model's tensor bytes in this dtype
    model_parameters: int
    model_reserved_bytes: int  # what the allocator reserves for the whole model (unlimited walk)
    fits: bool
    steps: tuple[WalkStep, ...]

    @property
    def moved_fraction(self) -> float:
        """Fraction of the model's parameters moved before the failure."""
        return self.moved_parameters / self.model_parameters


@lru_cache(maxsize=256)  # keyed by user input: bounded
def move_replica(model: str, dtype: str, gpu: str) -> ReplicaMove:
    """``reproduce(model, dtype, gpu, device="simulated")``'s figures, walked over the module tree: the memory outside
    PyTorch the case's (the seed's derived figure for the seed's case), the message in the seed's torch <= 2.0 wording
    for the seed's case and the current one otherwise."""
    spec, dt, gpu_spec = load_model(model), load_dtype(dtype), load_gpu(gpu)
    fmt = MessageFormat.OLD if is_seed_case(model, dtype, gpu) else MessageFormat.NEW
    shipped = case_outside(spec.name, gpu_spec, 1, dt.name, TorchEra.OLD if fmt is MessageFormat.OLD else TorchEra.NEW)
    outside = shipped.total_bytes
    allocator = CachingAllocator(gpu_spec.total_memory_bytes, outside, message_format=fmt)
    tensors = apply_order(module_tree(spec), dt.name)
    walk = replay(tensors, allocator)
    whole = tree_unlimited_walk(spec.name, dt.name)
    last = walk.steps[-1] if walk.steps else None
    model_reserved = whole[-1].reserved_bytes if whole else 0
    failing = walk.failure
    return ReplicaMove(
        model=spec.name, gpu=gpu_spec.name, dtype=dt.name, message_format=fmt, raised=failing is not None,
        message=walk.message, tried_bytes=None if failing is None else get_allocation_size(round_size(failing.nbytes)),
        allocated_bytes=allocator.allocated_bytes, reserved_bytes=allocator.reserved_bytes,
        free_bytes=allocator.free_device_bytes, total_bytes=gpu_spec.total_memory_bytes,
        outside_pytorch_bytes=outside, outside_pytorch_source=shipped.source, failing_tensor=failing,
        moved_bytes=last.moved_bytes if last else 0, moved_parameters=last.moved_parameters if last else 0,
        model_bytes=sum(t.nbytes for t in tensors), model_parameters=spec.num_parameters,
        model_reserved_bytes=model_reserved, fits=model_reserved <= gpu_spec.total_memory_bytes - outside,
        steps=walk.steps)
