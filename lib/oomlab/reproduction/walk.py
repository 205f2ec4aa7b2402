"""``model.to("cuda")`` of a full-size model, step by step: the tensors ``Module._apply`` copies and the caching
allocator after each, on a device with no limit -- what the model takes -- and the seed's outside-PyTorch memory
derived along it.

The walk runs over the model's module tree (:mod:`oomlab.reproduction.apply_walk`), so it imports no torch for a
shipped model; it is step for step the walk PyTorch's own ``Module._apply`` makes on the meta model
(:mod:`oomlab.reproduction.traced_walk`, tested for every shipped model in every dtype).  The traced walk's own names
(``walk_apply``, ``SimulatedCudaMode``, ``tensor_names``, ``unnamed``) are still read from here, loading torch then.
"""

from __future__ import annotations

from typing import Any

from oomlab.core.gpus import load_gpu
from oomlab.core.seed import SEED_DTYPE, SEED_GPU, SEED_MODEL, seed_figures
from oomlab.core.units import format_size
from oomlab.reproduction.apply_walk import tree_unlimited_walk
from oomlab.reproduction.steps import UNLIMITED_BYTES, TensorKind, WalkStep

__all__ = ["UNLIMITED_BYTES", "TensorKind", "WalkStep", "derive_seed_outside_bytes", "unlimited_walk"]
_TRACED = ("walk_apply", "SimulatedCudaMode", "tensor_names", "unnamed")  # torch: from traced_walk, on first use


def unlimited_walk(model: str, dtype: str) -> tuple[WalkStep, ...]:
    """The whole ``_apply`` walk on a device with no limit: what the model takes, tensor by tensor."""
    return tree_unlimited_walk(model, dtype)


def derive_seed_outside_bytes() -> int:
    """Memory held outside PyTorch on the seed's GPU 0, derived from the seed's own figures (what
    :data:`oomlab.core.seed.SEED_OUTSIDE_BYTES` ships).

    Along the unlimited walk of llama-13b in float16, find the copy whose "Tried to allocate" and the
    allocated/reserved figures just before it print exactly as the seed's; then
    ``outside = total capacity - reserved - free`` (the free figure as printed).
    """
    figures = seed_figures()
    steps = unlimited_walk(SEED_MODEL, SEED_DTYPE)
    matches = [
        before
        for before, step in zip(steps, steps[1:], strict=False)
        if format_size(step.tried_bytes) == figures.tried
        and format_size(before.allocated_bytes) == figures.allocated
        and format_size(before.reserved_bytes) == figures.reserved
    ]
    if len(matches) != 1:  # pragma: no cover - guards the derivation itself
        raise RuntimeError(f"expected exactly one point of the walk to match the seed, found {len(matches)}")
    return load_gpu(SEED_GPU).total_memory_bytes - matches[0].reserved_bytes - figures.free_bytes


def __getattr__(name: str) -> Any:
    """The traced walk's names, for the importers that read them from here (PEP 562): torch loads only then."""
    if name in _TRACED:
        from oomlab.reproduction import traced_walk

        return getattr(traced_walk, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
