"""Memory held outside PyTorch: the seed's, derived from its own figures, and each case's (the shipped figures of
:mod:`oomlab.core.outside` otherwise)."""

from __future__ import annotations

from functools import cache

from oomlab.core.gpus import GPUSpec, load_gpu
from oomlab.core.outside import OutsideMemory, TorchEra, outside_memory
from oomlab.core.seed import SEED_DTYPE, SEED_GPU, SEED_MODEL, is_seed_case, seed_figures
from oomlab.core.units import format_size
from oomlab.reproduction.walk import unlimited_walk


@cache
def seed_outside_bytes() -> int:
    """Memory held outside PyTorch on the seed's GPU 0, derived from the seed's own figures.

    Along the unlimited walk of llama-13b in float16, find the copy whose "Tried to allocate" and the
    allocated/reserved figures just before it print exactly as the seed's; then
    ``outside = total capacity - reserved - free`` (the free figure as printed).

    NB: this makes the seed's free figure an input and its reserved figure a fit: any outside memory from
    465.81 to 601.81 MiB reproduces the other figures (:func:`oomlab.reproduction.honesty.honest_reproduction`).
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


def case_outside(model: str, gpu: GPUSpec, world_size: int = 1, dtype: str = SEED_DTYPE,
                 era: TorchEra = TorchEra.NEW) -> OutsideMemory:
    """Memory outside PyTorch for a case: the seed's own derived figure for the seed's case (llama-13b in float16 on
    a T4, the user's torch 2.0 run) plus the shipped NCCL figure for its world size, else the shipped figures for the
    GPU, the world size and the era."""
    shipped = outside_memory(gpu, world_size, era)
    if not is_seed_case(model, dtype, gpu.name):
        return shipped
    derived = seed_outside_bytes()
    source = (f"CUDA context {format_size(derived)} derived from the user's own message: total capacity - reserved - "
              "free on the seed's T4 under torch 2.0 (derived)")
    if shipped.nccl_bytes:
        source += "; " + shipped.source.split("; ", 1)[1]
    return OutsideMemory(derived, shipped.nccl_bytes, source)
