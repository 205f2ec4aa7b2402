"""Reproduce the seed's failure: ``model.to("cuda")`` of a full-size model on one GPU.

``reproduce()`` runs PyTorch's own ``Module.to`` → ``_apply`` → ``convert`` walk, either on a
simulated device (the allocator model of :mod:`oomlab.allocator`, default without CUDA) or on a real
CUDA device capped to the chosen GPU's capacity.  Either way it returns a :class:`ReproduceResult`
with the OOM message, its figures, the failing tensor and how much of the model had moved.
"""

from __future__ import annotations

import traceback
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any

from oomlab.allocator import CachingAllocator, canonical_message_format, get_allocation_size, round_size
from oomlab.apply_walk import SimulatedCudaMode, WalkStep, tensor_names
from oomlab.errors import InvalidValueError, OomlabError, UnknownNameError
from oomlab.modeling import build_meta_model, tensor_nbytes
from oomlab.seed import SEED_DTYPE, SEED_GPU, SEED_MODEL, seed_figures
from oomlab.specs import DType, GPUSpec, ModelSpec, load_dtype, load_gpu, load_model
from oomlab.units import MiB, format_size

DEVICES = ("auto", "simulated", "cuda")
_UNLIMITED = 1 << 62  # capacity of the "how much would it take" walk


@dataclass(frozen=True)
class FailingTensor:
    """The tensor whose copy to the device failed."""

    name: str
    kind: str  # "parameter" or "buffer"
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


@dataclass(frozen=True)
class ReproduceResult:
    """What happened when the model was moved to the device."""

    model: str
    gpu: str
    dtype: str
    device: str  # "simulated" or "cuda"
    message_format: str
    raised: bool
    exception: str | None  # "torch.OutOfMemoryError" when raised
    message: str | None
    tried_bytes: int | None  # the "Tried to allocate" segment
    allocated_bytes: int  # allocator's allocated bytes at the end (at the failure if raised)
    reserved_bytes: int
    free_bytes: int  # device free memory at the end
    total_bytes: int  # device capacity ("total capacity")
    outside_pytorch_bytes: int  # memory on the GPU held outside this process's allocator
    outside_pytorch_source: str  # where that figure comes from
    failing_tensor: FailingTensor | None
    moved_bytes: int  # tensor bytes copied before the failure (all, if none)
    moved_parameters: int
    model_bytes: int  # the whole model's tensor bytes in this dtype
    model_parameters: int
    model_reserved_bytes: int  # what the allocator reserves for the whole model (unlimited walk)
    fits: bool  # whether the whole model fits this GPU's free memory in this dtype
    frames: tuple[str, ...]  # traceback function names, innermost last
    traceback: tuple[tuple[str, int, str], ...]  # (file, line, function), innermost last
    steps: tuple[WalkStep, ...] = field(repr=False)  # the walk as far as it went

    @property
    def moved_fraction(self) -> float:
        """Fraction of the model's parameters moved before the failure."""
        return self.moved_parameters / self.model_parameters

    def to_dict(self, include_steps: bool = False) -> dict[str, Any]:
        """JSON-ready dict (``steps`` left out unless asked for)."""
        data = asdict(self)
        if not include_steps:
            data.pop("steps")
        data["moved_fraction"] = self.moved_fraction
        data["traceback"] = [list(t) for t in self.traceback]
        data["frames"] = list(self.frames)
        if self.failing_tensor is not None:
            data["failing_tensor"]["shape"] = list(self.failing_tensor.shape)
        return data


# ------------------------------------------------------------------------------------------ walks


def walk_apply(
    spec: ModelSpec, dtype: DType, allocator: CachingAllocator
) -> tuple[SimulatedCudaMode, Any, BaseException | None]:
    """Build ``spec`` on meta in ``dtype`` and run the real ``model.to("cuda")`` against ``allocator``.

    Returns the mode (its ``steps`` and ``failure``), the model, and the exception raised, if any.
    """
    import torch

    model = build_meta_model(spec, dtype)
    mode = SimulatedCudaMode(allocator, tensor_names(model))
    error: BaseException | None = None
    try:
        with mode:
            model.to("cuda")
    except torch.OutOfMemoryError as err:
        error = err
    return mode, model, error


@cache
def unlimited_walk(model: str, dtype: str) -> tuple[WalkStep, ...]:
    """The whole ``_apply`` walk on a device with no limit: what the model takes, tensor by tensor."""
    allocator = CachingAllocator(_UNLIMITED)
    mode, _, _ = walk_apply(load_model(model), load_dtype(dtype), allocator)
    return tuple(mode.steps)


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


# ---------------------------------------------------------------------------------------- checks


def validate(
    model: str, dtype: str, gpu: str, non_pytorch_mib: float | None, device: str, message_format: str
) -> tuple[ModelSpec, DType, GPUSpec]:
    """Check every input before any work starts; raise :class:`OomlabError` naming the bad value."""
    spec = load_model(model)
    dt = load_dtype(dtype)
    gpu_spec = load_gpu(gpu)
    if device not in DEVICES:
        raise UnknownNameError("device", device, DEVICES)
    canonical_message_format(message_format)
    if non_pytorch_mib is not None:
        capacity_mib = gpu_spec.total_memory_bytes / MiB
        if not 0 <= non_pytorch_mib < capacity_mib:
            raise InvalidValueError(
                f"invalid non-PyTorch memory {non_pytorch_mib} MiB; must be >= 0 and below the "
                f"{gpu_spec.name} capacity of {capacity_mib:.2f} MiB"
            )
    return spec, dt, gpu_spec


def _frames(error: BaseException) -> tuple[tuple[str, int, str], ...]:
    return tuple((f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(error.__traceback__))


# ------------------------------------------------------------------------------------- reproduce


def reproduce(
    model: str = SEED_MODEL,
    dtype: str = SEED_DTYPE,
    gpu: str = SEED_GPU,
    non_pytorch_mib: float | None = None,
    device: str = "auto",
    message_format: str | None = None,
) -> ReproduceResult:
    """Move ``model`` in ``dtype`` to one ``gpu`` as ``model.to("cuda")`` does, and report the outcome.

    ``non_pytorch_mib`` is the memory held on the GPU outside PyTorch (CUDA context, other processes);
    by default the figure derived from the seed's message (:func:`seed_outside_bytes`).
    ``message_format`` defaults to the seed's (``"torch<=2.0"``) when simulated.
    """
    spec, dt, gpu_spec = validate(model, dtype, gpu, non_pytorch_mib, device, message_format or "old")
    fmt = canonical_message_format(message_format or "old")
    if non_pytorch_mib is None:
        outside = seed_outside_bytes()
        outside_source = (
            "derived from the seed's message: total capacity - reserved - free "
            f"= {format_size(outside)} (the T4's CUDA context and driver)"
        )
    else:
        outside = round(non_pytorch_mib * MiB)
        outside_source = "given (--non-pytorch-mib)"
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "simulated"
    if device == "cuda":
        from oomlab.reproduce_cuda import reproduce_on_cuda

        return reproduce_on_cuda(spec, dt, gpu_spec, outside, outside_source)

    allocator = CachingAllocator(gpu_spec.total_memory_bytes, outside, message_format=fmt)
    mode, meta_model, error = walk_apply(spec, dt, allocator)
    whole = unlimited_walk(spec.name, dt.name)
    failing = FailingTensor(*mode.failure) if mode.failure else None
    tried = None
    if failing is not None:
        tried = get_allocation_size(round_size(failing.nbytes))
    moved = mode.steps[-1] if mode.steps else None
    model_reserved = whole[-1].reserved_bytes if whole else 0
    trace = _frames(error) if error is not None else ()
    return ReproduceResult(
        model=spec.name,
        gpu=gpu_spec.name,
        dtype=dt.name,
        device="simulated",
        message_format=fmt,
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
        model_bytes=sum(tensor_nbytes(t) for t in unique_tensors(meta_model)),
        model_parameters=spec.num_parameters,
        model_reserved_bytes=model_reserved,
        fits=model_reserved <= gpu_spec.total_memory_bytes - outside,
        frames=tuple(name for _, _, name in trace),
        traceback=trace,
        steps=tuple(mode.steps),
    )


def unique_tensors(model: Any) -> list[Any]:
    """Parameters and buffers of ``model``, each tensor once (tied weights count once)."""
    seen: dict[int, Any] = {}
    for _, t in list(model.named_parameters()) + list(model.named_buffers()):
        seen.setdefault(id(t), t)
    return list(seen.values())


# -------------------------------------------------------------------------------- seed comparison


@dataclass(frozen=True)
class FigureComparison:
    """One figure of the OOM message: the seed's text beside the reproduction's."""

    figure: str
    seed: str
    reproduced: str | None

    @property
    def matches(self) -> bool:
        return self.seed == self.reproduced


def compare_with_seed(result: ReproduceResult) -> list[FigureComparison]:
    """The seed's five figures beside the reproduced ones, as printed by ``format_size``."""
    seed = seed_figures()

    def fmt(value: int | None) -> str | None:
        return None if value is None else format_size(value)

    return [
        FigureComparison("Tried to allocate", seed.tried, fmt(result.tried_bytes)),
        FigureComparison("total capacity", seed.total, fmt(result.total_bytes)),
        FigureComparison("already allocated", seed.allocated, fmt(result.allocated_bytes)),
        FigureComparison("free", seed.free, fmt(result.free_bytes)),
        FigureComparison("reserved in total by PyTorch", seed.reserved, fmt(result.reserved_bytes)),
    ]


__all__ = [
    "DEVICES",
    "FailingTensor",
    "FigureComparison",
    "OomlabError",
    "ReproduceResult",
    "compare_with_seed",
    "facts",
    "reproduce",
    "seed_outside_bytes",
    "smallest_fitting_gpu",
    "summarize",
    "unlimited_walk",
    "walk_apply",
]


# ----------------------------------------------------------------------------------- what decides


def smallest_fitting_gpu(model: str, dtype: str, outside_bytes: int) -> str | None:
    """The shipped GPU with the least memory on which ``model.to('cuda')`` in ``dtype`` succeeds."""
    from oomlab.specs import known_gpus

    need = unlimited_walk(model, load_dtype(dtype).name)[-1].reserved_bytes
    fitting = [load_gpu(g) for g in known_gpus() if load_gpu(g).total_memory_bytes - outside_bytes >= need]
    return min(fitting, key=lambda g: g.total_memory_bytes).name if fitting else None


def summarize(result: ReproduceResult, gpus: int = 1) -> str:
    """A short Markdown account of the result, every figure taken from it."""
    gpu = load_gpu(result.gpu)
    usable = result.total_bytes - result.outside_pytorch_bytes
    lines = [
        f"**{result.model}** in **{result.dtype}** needs {format_size(result.model_bytes)} for its tensors "
        f"({result.model_parameters:,} parameters), and the caching allocator reserves "
        f"{format_size(result.model_reserved_bytes)} to hold them. One {gpu.display_name} offers "
        f"{format_size(result.total_bytes)}, of which {format_size(usable)} is usable by PyTorch once "
        f"{format_size(result.outside_pytorch_bytes)} is held outside it.",
    ]
    if result.raised and result.failing_tensor is not None:
        ft = result.failing_tensor
        lines.append(
            f"`model.to('cuda')` raised `{result.exception}` while `Module._apply` → `convert` copied "
            f"`{ft.name}` ({' × '.join(map(str, ft.shape))}, {ft.dtype}, {format_size(ft.nbytes)}; the "
            f"allocator asked for a {format_size(result.tried_bytes or 0)} segment), after "
            f"{result.moved_fraction:.1%} of the parameters ({format_size(result.moved_bytes)}) had been "
            f"copied."
        )
        cached = result.reserved_bytes - result.allocated_bytes
        if cached < (result.tried_bytes or 0):
            lines.append(
                f"Reserved ({format_size(result.reserved_bytes)}) exceeds allocated "
                f"({format_size(result.allocated_bytes)}) by only {format_size(cached)}, less than the "
                f"request: fragmentation is not the cause, and `max_split_size_mb` cannot help."
            )
        else:
            lines.append(
                f"{format_size(cached)} is reserved but unallocated, at least the size of the request: "
                f"fragmentation contributes."
            )
        lines.append(
            "The whole model does not fit this GPU in this dtype."
            if not result.fits
            else "The whole model would fit this GPU: something besides the model holds the memory."
        )
    elif result.raised:
        lines.append(f"`model.to('cuda')` raised `{result.exception}`.")
    else:
        lines.append(
            f"`model.to('cuda')` succeeded: {format_size(result.allocated_bytes)} allocated, "
            f"{format_size(result.free_bytes)} left free — before any training memory (gradients, "
            f"optimizer state, activations) is counted."
        )
    if gpus > 1:
        lines.append(
            f"With {gpus} GPUs the capacities add up to {format_size(gpus * result.total_bytes)} "
            f"({gpus} × {gpu.nvidia_smi_total_mib} MiB in nvidia-smi), but `model.to('cuda')` puts a full "
            f"replica on each GPU: they are not one pool. Only sharding (FSDP/ZeRO-3) or a layer-wise "
            f"device map divides the model, to {format_size(result.model_bytes // gpus)} of weights per GPU."
        )
    return "\n\n".join(lines)


def facts(result: ReproduceResult) -> list[tuple[str, str]]:
    """The result as (label, value) rows for display."""
    ft = result.failing_tensor
    rows = [("failing tensor", ft.name if ft else "none")]
    if ft is not None:
        rows += [
            ("its shape and dtype", f"{list(ft.shape)} {ft.dtype}"),
            ("its size / segment asked of cudaMalloc",
             f"{format_size(ft.nbytes)} / {format_size(result.tried_bytes or 0)}"),
        ]
    return rows + [
        ("moved before the failure" if ft else "moved",
         f"{format_size(result.moved_bytes)} ({result.moved_fraction:.1%} of the parameters)"),
        ("whole model (tensors)", f"{format_size(result.model_bytes)} ({result.model_parameters:,} parameters)"),
        ("whole model (reserved by the allocator)", format_size(result.model_reserved_bytes)),
        ("GPU capacity", format_size(result.total_bytes)),
        ("memory outside PyTorch", f"{format_size(result.outside_pytorch_bytes)}: {result.outside_pytorch_source}"),
        ("whole model fits one GPU", "yes" if result.fits else "no"),
    ]


def is_seed_case(result: ReproduceResult) -> bool:
    """Is this the user's case (llama-13b in float16 on a T4)?"""
    return (result.model, result.dtype, result.gpu) == (SEED_MODEL, SEED_DTYPE, SEED_GPU)


def decoding_target(result: ReproduceResult) -> tuple[str, str] | None:
    """What to decode beside the reproduction: the user's report for the user's case, else the reproduced
    message (``None`` when nothing was raised)."""
    from oomlab.seed import seed_report_text

    if is_seed_case(result):
        return "the user's message", seed_report_text()
    if result.message:
        return "the reproduced message", result.message
    return None
