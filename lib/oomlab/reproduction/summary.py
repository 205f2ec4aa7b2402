"""A reproduction for readers: the account in words, the facts as rows, and what would have fitted."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from oomlab.core import seed
from oomlab.core.dtypes import load_dtype
from oomlab.core.gpus import known_gpus, load_gpu
from oomlab.core.markdown import md_text
from oomlab.core.seed import seed_report_text
from oomlab.core.units import format_size
from oomlab.reproduction.result import FigureComparison, ReproduceResult, compare_with_seed
from oomlab.reproduction.walk import unlimited_walk


def smallest_fitting_gpu(model: str, dtype: str, outside_bytes: int) -> str | None:
    """The shipped GPU with the least memory on which ``model.to('cuda')`` in ``dtype`` succeeds."""
    need = unlimited_walk(model, load_dtype(dtype).name)[-1].reserved_bytes
    fitting = [load_gpu(g) for g in known_gpus() if load_gpu(g).total_memory_bytes - outside_bytes >= need]
    return min(fitting, key=lambda g: g.total_memory_bytes).name if fitting else None


def summarize(result: ReproduceResult, gpus: int = 1) -> str:
    """A short Markdown account of the result, every figure taken from it."""
    gpu = load_gpu(result.gpu)
    usable = result.total_bytes - result.outside_pytorch_bytes
    lines = [
        f"**{md_text(result.model)}** in **{result.dtype}** needs {format_size(result.model_bytes)} for its tensors "
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


SEED_HEADERS = ("figure", "user's message", "reproduced", "same")


def seed_rows(comparisons: Iterable[FigureComparison]) -> list[list[str]]:
    """The user's message beside the reproduction, one row per figure (the report's table, the CLI's lines)."""
    return [[c.figure, c.seed, c.reproduced or "-", "yes" if c.matches else "no"] for c in comparisons]


def is_seed_result(result: ReproduceResult) -> bool:
    """Is this the user's case (llama-13b in float16 on a T4: :func:`oomlab.core.seed.is_seed_case`)?"""
    return seed.is_seed_case(result.model, result.dtype, result.gpu)


def decoding_target(result: ReproduceResult) -> tuple[str, str] | None:
    """What to decode beside the reproduction: the user's report for the user's case, else the reproduced
    message (``None`` when nothing was raised)."""
    if is_seed_result(result):
        return "the user's message", seed_report_text()
    if result.message:
        return "the reproduced message", result.message
    return None


def _aligned(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Rows as lines of left-aligned columns (layout only: the words are the rows')."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def render_text(result: ReproduceResult) -> str:
    """``python -m oomlab reproduce``'s plain-text answer: the case, the error or the room left, the facts, the
    frames, and for the seed's case its message beside the reproduction."""
    lines = [f"model {result.model} in {result.dtype} -> one {result.gpu} ({result.device})"]
    if result.raised:
        lines.append(f"raised {result.exception}: {result.message}")
    else:
        lines.append(f"no error: allocated {format_size(result.allocated_bytes)}, "
                     f"reserved {format_size(result.reserved_bytes)}, free {format_size(result.free_bytes)}")
    lines += _aligned(facts(result))
    if result.raised:
        lines.append("frames (innermost last): " + " > ".join(result.frames))
    if is_seed_result(result) and result.raised:
        lines += _aligned([SEED_HEADERS, *seed_rows(compare_with_seed(result))])
    return "\n".join(lines)
