"""Memory held outside PyTorch: the seed's, derived from its own figures (shipped as data, so no torch is imported
here), and each case's (the shipped figures of :mod:`oomlab.core.outside` otherwise)."""

from __future__ import annotations

from oomlab.core.gpus import GPUSpec
from oomlab.core.outside import OutsideMemory, TorchEra, outside_memory
from oomlab.core.seed import SEED_DTYPE, SEED_OUTSIDE_BYTES, is_seed_case
from oomlab.core.units import format_size


def seed_outside_bytes() -> int:
    """Memory held outside PyTorch on the seed's GPU 0, derived from the seed's own figures: the shipped
    :data:`oomlab.core.seed.SEED_OUTSIDE_BYTES` (derived along the unlimited walk by
    :func:`oomlab.reproduction.walk.derive_seed_outside_bytes`; a test re-derives it).

    NB: this makes the seed's free figure an input and its reserved figure a fit: any outside memory from
    465.81 to 601.81 MiB reproduces the other figures (:func:`oomlab.reproduction.honesty.honest_reproduction`).
    """
    return SEED_OUTSIDE_BYTES


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
