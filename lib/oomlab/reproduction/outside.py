"""Memory held on the seed's GPU outside PyTorch, derived from the seed's own figures."""

from __future__ import annotations

from functools import cache

from oomlab.core.gpus import load_gpu
from oomlab.core.seed import SEED_DTYPE, SEED_GPU, SEED_MODEL, seed_figures
from oomlab.core.units import format_size
from oomlab.reproduction.walk import unlimited_walk


@cache
def seed_outside_bytes() -> int:
    """Memory held outside PyTorch on the seed's GPU 0, derived from the seed's own figures.

    Along the unlimited walk of llama-13b in float16, find the copy whose "Tried to allocate" and the
    allocated/reserved figures just before it print exactly as the seed's; then
    ``outside = total capacity - reserved - free`` (the free figure as printed).
    """
    figures = seed_figures()
    gpu = load_gpu(SEED_GPU)
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
    return gpu.total_memory_bytes - matches[0].reserved_bytes - figures.free_bytes
