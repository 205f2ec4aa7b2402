"""Reproduce the seed's failure: ``model.to("cuda")`` of a full-size model on one GPU.

:func:`reproduce` runs PyTorch's own ``Module.to`` → ``_apply`` → ``convert`` walk, either on a simulated device
(the allocator model of :mod:`oomlab.reproduction.allocator`, default without CUDA) or on a real CUDA device capped
to the chosen GPU's capacity (:mod:`oomlab.reproduction.cuda`).  Either way it returns a
:class:`~oomlab.reproduction.result.ReproduceResult` with the OOM message, its figures, the failing tensor and how
much of the model had moved.
"""

from __future__ import annotations

import torch

from oomlab.core.choices import Device, MessageFormat, choice, message_format
from oomlab.core.dtypes import DType, load_dtype
from oomlab.core.errors import InvalidValueError
from oomlab.core.gpus import GPUSpec, load_gpu
from oomlab.core.models import ModelSpec, load_model
from oomlab.core.outside import TorchEra
from oomlab.core.seed import SEED_DTYPE, SEED_GPU, SEED_MODEL, is_seed_case
from oomlab.core.units import MiB
from oomlab.reproduction.allocator import CachingAllocator, get_allocation_size, round_size
from oomlab.reproduction.cuda import reproduce_on_cuda
from oomlab.reproduction.outside import case_outside
from oomlab.reproduction.result import FailingTensor, ReproduceResult, traceback_frames
from oomlab.reproduction.traced_walk import walk_apply
from oomlab.reproduction.walk import unlimited_walk


def validate(
    model: str, dtype: str, gpu: str, non_pytorch_mib: float | None, device: str | Device,
    fmt: str | MessageFormat,
) -> tuple[ModelSpec, DType, GPUSpec, Device, MessageFormat]:
    """Check every input before any work starts; raise :class:`OomlabError` naming the bad value."""
    spec = load_model(model)
    dt = load_dtype(dtype)
    gpu_spec = load_gpu(gpu)
    where = choice(Device, device, "device")
    canonical = message_format(fmt)
    if non_pytorch_mib is not None:
        capacity_mib = gpu_spec.total_memory_bytes / MiB
        if not 0 <= non_pytorch_mib < capacity_mib:
            raise InvalidValueError(
                f"invalid non-PyTorch memory {non_pytorch_mib} MiB; must be >= 0 and below the "
                f"{gpu_spec.name} capacity of {capacity_mib:.2f} MiB"
            )
    return spec, dt, gpu_spec, where, canonical


def reproduce(
    model: str = SEED_MODEL,
    dtype: str = SEED_DTYPE,
    gpu: str = SEED_GPU,
    non_pytorch_mib: float | None = None,
    device: str = "auto",
    message_format: MessageFormat | str | None = None,
) -> ReproduceResult:
    """Move ``model`` in ``dtype`` to one ``gpu`` as ``model.to("cuda")`` does, and report the outcome.

    ``non_pytorch_mib`` is the memory held on the GPU outside PyTorch (CUDA context, other processes); by default
    the case's (:func:`oomlab.reproduction.outside.case_outside`: the seed's derived figure for the seed's case, else
    the shipped one for the GPU and the torch era of the message format).
    ``message_format`` (simulated device): ``"auto"`` or None gives the seed's torch <= 2.0 wording for the seed's
    case and the current (torch >= 2.1) one otherwise.
    """
    if message_format in (None, "auto"):
        message_format = MessageFormat.OLD if is_seed_case(model, dtype, gpu) else MessageFormat.NEW
    spec, dt, gpu_spec, where, fmt = validate(model, dtype, gpu, non_pytorch_mib, device, message_format)
    if non_pytorch_mib is None:
        era = TorchEra.OLD if fmt is MessageFormat.OLD else TorchEra.NEW
        shipped = case_outside(spec.name, gpu_spec, 1, dt.name, era)
        outside, outside_source = shipped.total_bytes, shipped.source
    else:
        outside = round(non_pytorch_mib * MiB)
        outside_source = "given (--non-pytorch-mib)"
    if where is Device.AUTO:
        where = Device.CUDA if torch.cuda.is_available() else Device.SIMULATED
    if where is Device.CUDA:
        return reproduce_on_cuda(spec, dt, gpu_spec, outside, outside_source)
    return reproduce_simulated(spec, dt, gpu_spec, outside, outside_source, fmt)


def reproduce_simulated(spec: ModelSpec, dt: DType, gpu_spec: GPUSpec, outside: int, outside_source: str,
                        fmt: MessageFormat) -> ReproduceResult:
    """The walk against the caching-allocator model, with fake CUDA tensors (no GPU needed)."""
    allocator = CachingAllocator(gpu_spec.total_memory_bytes, outside, message_format=fmt)
    mode, _, error = walk_apply(spec, dt, allocator)
    whole = unlimited_walk(spec.name, dt.name)
    failing = FailingTensor(*mode.failure) if mode.failure else None
    tried = None
    if failing is not None:
        tried = get_allocation_size(round_size(failing.nbytes))
    moved = mode.steps[-1] if mode.steps else None
    model_reserved = whole[-1].reserved_bytes if whole else 0
    trace = traceback_frames(error) if error is not None else ()
    return ReproduceResult(
        model=spec.name,
        gpu=gpu_spec.name,
        dtype=dt.name,
        device="simulated",
        message_format=fmt.value,
        raised=error is not None,
        exception=f"torch.{type(error).__name__}" if error is not None else None,
        message=str(error) if error is not None else None,
        tried_bytes=tried,
        allocated_bytes=allocator.allocated_bytes,
        reserved_bytes=allocator.reserved_bytes,
        free_bytes=allocator.free_device_bytes,
        total_bytes=gpu_spec.total_memory_bytes,
        outside_pytorch_bytes=outside,
        outside_pytorch_source=outside_source,
        failing_tensor=failing,
        moved_bytes=moved.moved_bytes if moved else 0,
        moved_parameters=moved.moved_parameters if moved else 0,
        # each tensor once, as the unlimited walk moved it (the meta model's own tensors, read after the walk, hold a
        # tied weight twice: a fake tensor is not shallow-copied into the tied parameter, so each name gets its own)
        model_bytes=sum(step.nbytes for step in whole),
        model_parameters=spec.num_parameters,
        model_reserved_bytes=model_reserved,
        fits=model_reserved <= gpu_spec.total_memory_bytes - outside,
        frames=tuple(name for _, _, name in trace),
        traceback=trace,
        steps=tuple(mode.steps),
    )
