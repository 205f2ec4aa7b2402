"""Run the real ``Module.to("cuda")`` on a weightless model, with device memory simulated (torch).

``torch.nn.Module.to`` → ``_apply`` → ``convert`` → ``Tensor.to`` runs exactly as in PyTorch; a
``TorchFunctionMode`` intercepts each ``Tensor.to``/``Tensor.cuda`` that targets a CUDA device, charges
the copy to the :class:`~oomlab.reproduction.allocator.CachingAllocator` model, and hands back a fake ``cuda:0``
tensor (``torch.empty_strided(..., device="cuda")`` under ``FakeTensorMode``), so the moved parameters
report ``cuda:0`` on a machine without CUDA.  When the allocator model refuses, the mode raises
``torch.OutOfMemoryError`` from inside ``convert``, so the traceback runs through ``_apply``.

What the reproduction's traceback and layer layouts need; the walk's figures themselves come torch-free from
:mod:`oomlab.reproduction.walk` (over the module tree), checked step for step against :func:`traced_unlimited_walk`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode

from oomlab.core.dtypes import DType, load_dtype
from oomlab.core.modeling import build_meta_model
from oomlab.core.models import ModelSpec, load_model
from oomlab.reproduction.allocator import CachingAllocator, SimulatedOutOfMemory, get_allocation_size, round_size
from oomlab.reproduction.steps import UNLIMITED_BYTES, TensorKind, WalkStep


def tensor_names(model: torch.nn.Module) -> dict[int, tuple[str, TensorKind]]:
    """``id(tensor) -> (qualified name, parameter or buffer)``, first name for shared tensors."""
    names: dict[int, tuple[str, TensorKind]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), (name, TensorKind.PARAMETER))
    for name, b in model.named_buffers(remove_duplicate=False):
        names.setdefault(id(b), (name, TensorKind.BUFFER))
    return names


def unnamed(tensor: torch.Tensor) -> tuple[str, TensorKind]:
    """The name and kind of a moved tensor that :func:`tensor_names` does not know."""
    return f"<tensor {tuple(tensor.shape)}>", TensorKind.TENSOR


class SimulatedCudaMode(TorchFunctionMode):
    """Serve ``Tensor.to(cuda)``/``Tensor.cuda()`` from an allocator model with fake CUDA tensors."""

    def __init__(self, allocator: CachingAllocator, names: dict[int, tuple[str, TensorKind]]) -> None:
        super().__init__()
        self.allocator = allocator
        self.names = names
        self.steps: list[WalkStep] = []
        self.failure: tuple[str, TensorKind, tuple[int, ...], str, int] | None = None
        self._fake = FakeTensorMode(allow_non_fake_inputs=True)
        self._done: dict[int, torch.Tensor] = {}  # tied weights are copied once
        self._moved_bytes = 0
        self._moved_params = 0

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.to or func is torch.Tensor.cuda:
            tensor = args[0]
            if func is torch.Tensor.cuda:
                device, dtype = torch.device("cuda"), None
            else:
                device, dtype, _, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            if device is not None and device.type == "cuda" and tensor.device.type != "cuda":
                return self._copy_to_device(tensor, dtype)
        return func(*args, **kwargs)

    def _copy_to_device(self, tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
        if id(tensor) in self._done:
            return self._done[id(tensor)]
        dtype = dtype if dtype is not None and (tensor.is_floating_point() or tensor.is_complex()) else None
        dtype = dtype or tensor.dtype
        nbytes = tensor.numel() * torch.empty((), dtype=dtype, device="meta").element_size()
        name, kind = self.names.get(id(tensor)) or unnamed(tensor)
        dtype_name = str(dtype).removeprefix("torch.")
        try:
            if nbytes:
                self.allocator.malloc(nbytes)
        except SimulatedOutOfMemory as oom:
            self.failure = (name, kind, tuple(tensor.shape), dtype_name, nbytes)
            # Raised here, inside Module._apply's convert(), as PyTorch would.
            raise torch.OutOfMemoryError(oom.message) from None
        self._moved_bytes += nbytes
        if kind is TensorKind.PARAMETER:
            self._moved_params += tensor.numel()
        self.steps.append(
            WalkStep(
                index=len(self.steps),
                name=name,
                kind=kind,
                shape=tuple(tensor.shape),
                dtype=dtype_name,
                nbytes=nbytes,
                tried_bytes=get_allocation_size(round_size(nbytes)),
                allocated_bytes=self.allocator.allocated_bytes,
                reserved_bytes=self.allocator.reserved_bytes,
                moved_bytes=self._moved_bytes,
                moved_parameters=self._moved_params,
            )
        )
        with self._fake:
            out = torch.empty_strided(tuple(tensor.shape), tuple(tensor.stride()), dtype=dtype, device="cuda")
        self._done[id(tensor)] = out
        return out


def walk_apply(
    spec: ModelSpec, dtype: DType, allocator: CachingAllocator
) -> tuple[SimulatedCudaMode, Any, BaseException | None]:
    """Build ``spec`` on meta in ``dtype`` and run the real ``model.to("cuda")`` against ``allocator``.

    Returns the mode (its ``steps`` and ``failure``), the model, and the exception raised, if any.
    """
    model = build_meta_model(spec, dtype)
    mode = SimulatedCudaMode(allocator, tensor_names(model))
    error: BaseException | None = None
    try:
        with mode:
            model.to("cuda")
    except torch.OutOfMemoryError as err:
        error = err
    return mode, model, error


@lru_cache(maxsize=256)  # keyed by user input (a config.json path): bounded
def traced_unlimited_walk(model: str, dtype: str) -> tuple[WalkStep, ...]:
    """The whole ``_apply`` walk on a device with no limit, traced: what the model takes, tensor by tensor."""
    allocator = CachingAllocator(UNLIMITED_BYTES)
    mode, _, _ = walk_apply(load_model(model), load_dtype(dtype), allocator)
    return tuple(mode.steps)
