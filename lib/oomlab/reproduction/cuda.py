"""The real thing: ``model.to("cuda")`` on a CUDA device capped to the chosen GPU's capacity.

The model's tensors are allocated uninitialised on the host (``to_empty(device="cpu")``: pages are only
touched when copied), then the real ``model.to("cuda")`` runs; ``set_per_process_memory_fraction`` caps
what PyTorch may reserve to the chosen GPU's capacity minus the memory held outside PyTorch.
"""

from __future__ import annotations

from typing import Any

from oomlab.core.choices import MessageFormat
from oomlab.core.dtypes import DType
from oomlab.core.errors import OomlabError
from oomlab.core.gpus import GPUSpec
from oomlab.core.modeling import build_meta_model, tensor_nbytes, unique_tensors
from oomlab.core.models import ModelSpec
from oomlab.reproduction.allocator import get_allocation_size, round_size
from oomlab.reproduction.result import FailingTensor, ReproduceResult, traceback_frames
from oomlab.reproduction.steps import TensorKind, WalkStep
from oomlab.reproduction.traced_walk import tensor_names, unnamed
from oomlab.reproduction.walk import unlimited_walk


def reproduce_on_cuda(
    spec: ModelSpec, dtype: DType, gpu: GPUSpec, outside_bytes: int, outside_source: str
) -> ReproduceResult:
    """Run the real ``_apply`` walk on ``cuda:0``; the same report fields as the simulated run."""
    import torch
    from torch.overrides import TorchFunctionMode

    if not torch.cuda.is_available():
        raise OomlabError(
            "device 'cuda' needs a CUDA GPU, and torch.cuda.is_available() is False here; "
            "use --device simulated (or auto)"
        )
    device_total = torch.cuda.get_device_properties(0).total_memory
    budget = gpu.total_memory_bytes - outside_bytes
    fraction = min(1.0, budget / device_total)
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(0)

    model = build_meta_model(spec, dtype)
    model.to_empty(device="cpu")
    names = tensor_names(model)
    steps: list[WalkStep] = []
    failure: list[Any] = []
    moved = {"bytes": 0, "params": 0}

    class Observe(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            tensor = args[0] if args else None
            if func is torch.Tensor.to and isinstance(tensor, torch.Tensor) and tensor.device.type != "cuda":
                name, kind = names.get(id(tensor)) or unnamed(tensor)
                try:
                    out = func(*args, **kwargs)
                except torch.OutOfMemoryError:
                    failure.append(
                        (name, kind, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."),
                         tensor_nbytes(tensor))
                    )
                    raise
                if out.device.type == "cuda":
                    moved["bytes"] += tensor_nbytes(out)
                    moved["params"] += out.numel() if kind is TensorKind.PARAMETER else 0
                    steps.append(
                        WalkStep(
                            index=len(steps), name=name, kind=kind, shape=tuple(out.shape),
                            dtype=str(out.dtype).removeprefix("torch."), nbytes=tensor_nbytes(out),
                            tried_bytes=get_allocation_size(round_size(tensor_nbytes(out))),
                            allocated_bytes=torch.cuda.memory_allocated(0),
                            reserved_bytes=torch.cuda.memory_reserved(0),
                            moved_bytes=moved["bytes"], moved_parameters=moved["params"],
                        )
                    )
                return out
            return func(*args, **kwargs)

    error: BaseException | None = None
    try:
        with Observe():
            model.to("cuda")
    except torch.OutOfMemoryError as err:
        error = err
    free, _ = torch.cuda.mem_get_info(0)
    allocated, reserved = torch.cuda.memory_allocated(0), torch.cuda.memory_reserved(0)
    model_bytes = sum(tensor_nbytes(t) for t in unique_tensors(model))
    del model
    torch.cuda.empty_cache()
    whole = unlimited_walk(spec.name, dtype.name)
    model_reserved = whole[-1].reserved_bytes if whole else 0
    failing = FailingTensor(*failure[0]) if failure else None
    trace = traceback_frames(error) if error is not None else ()
    return ReproduceResult(
        model=spec.name,
        gpu=gpu.name,
        dtype=dtype.name,
        device=f"cuda ({torch.cuda.get_device_name(0)}, capped to {fraction:.4f} of it)",
        message_format=MessageFormat.NEW.value,
        raised=error is not None,
        exception=f"torch.{type(error).__name__}" if error is not None else None,
        message=str(error) if error is not None else None,
        tried_bytes=get_allocation_size(round_size(failing.nbytes)) if failing else None,
        allocated_bytes=allocated,
        reserved_bytes=reserved,
        free_bytes=free,
        total_bytes=device_total,
        outside_pytorch_bytes=outside_bytes,
        outside_pytorch_source=outside_source + "; applied as a cap on reserved memory",
        failing_tensor=failing,
        moved_bytes=moved["bytes"],
        moved_parameters=moved["params"],
        model_bytes=model_bytes,
        model_parameters=spec.num_parameters,
        model_reserved_bytes=model_reserved,
        fits=model_reserved <= budget,
        frames=tuple(name for _, _, name in trace),
        traceback=trace,
        steps=tuple(steps),
    )
