"""What an expert would remark on in a message's figures: spilling, caps, other processes, edited text ..."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oomlab.core.units import GiB, MiB, format_size
from oomlab.explanation.message import OomMessage, format_interval, interval_sub
from oomlab.explanation.request import is_segment_interval

CUDA_CONTEXT_BYTES = (300 * MiB, 600 * MiB)  # NB: typical CUDA context + cuBLAS/cuDNN handles, driver-dependent

FREE_MARGIN_BYTES = 256 * MiB  # NB: cudaMalloc needs contiguous pages; a little free above the request can fail

OUTSIDE_FLAG_BYTES = 1 * GiB  # "far above a CUDA context": flag memory outside the allocator above this

_EXACT_LIMIT = 2**50  # beyond this, torch's double-based format_size cannot be inverted exactly


@dataclass(frozen=True)
class Anomaly:
    """Something in the figures an expert would remark on."""

    code: str  # short, stable: "allocated_above_total"
    text: str  # one or two plain sentences

def outside_split(msg: OomMessage) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """New format with "this process has U in use": (U − reserved, total − free − U), clamped at 0."""
    reserved = msg.reserved_low_high
    if msg.in_use is None or reserved is None or msg.total is None or msg.free is None:
        return None
    own = interval_sub((msg.in_use.low_bytes, msg.in_use.high_bytes), reserved)
    others = interval_sub(interval_sub((msg.total.low_bytes, msg.total.high_bytes),
                                         (msg.free.low_bytes, msg.free.high_bytes)),
                           (msg.in_use.low_bytes, msg.in_use.high_bytes))
    return (max(own[0], 0), max(own[1], 0)), (max(others[0], 0), max(others[1], 0))

def find_anomalies(msg: OomMessage, outside: tuple[int, int] | None, gpu: Any) -> list[Anomaly]:
    out: list[Anomaly] = []
    t, total, alloc = msg.tried, msg.total, msg.allocated
    reserved = msg.reserved_low_high
    if msg.missing:
        out.append(Anomaly("truncated", "The message is cut off or edited: it lacks "
                           + ", ".join(msg.missing) + "; what follows uses only the figures present."))
    if total is not None and alloc is not None and alloc.low_bytes > total.high_bytes:
        out.append(Anomaly("allocated_above_total",
                           f"{alloc.text} allocated exceeds the {total.text} total capacity: the driver is spilling "
                           "into system memory (Windows WDDM 'shared GPU memory', or unified memory), which is slow; "
                           "the capacity figure is the GPU's own memory."))
    elif total is not None and reserved is not None and reserved[0] > total.high_bytes:
        out.append(Anomaly("reserved_above_total",
                           f"reserved memory ({format_interval(reserved)}) exceeds the {total.text} total capacity: "
                           "the driver is spilling into system memory (WDDM shared memory, or unified memory)."))
    if t is not None and total is not None and t.low_bytes > total.high_bytes:
        text = (f"The single request of {t.text} is larger than the whole GPU ({total.text}): no allocator setting "
                "and no freeing can make it fit; a shape is far larger than intended, or the work must be split "
                "into chunks.")
        if t.low_bytes >= 2**50:
            text += " A request this absurd usually comes from an overflowing or negative size computation."
        out.append(Anomaly("request_above_total", text))
    if t is not None and not is_segment_interval(t):
        out.append(Anomaly("tried_not_a_segment",
                           f"{t.text} is no size the caching allocator asks cudaMalloc for (2 MiB, 20 MiB or a "
                           "multiple of 2 MiB from 10 MiB): torch before 1.5 printed the request itself, or the "
                           "message was edited."))
    if msg.device_index not in (None, 0):
        out.append(Anomaly("device_not_zero",
                           f"The failure is on GPU {msg.device_index}, not GPU 0: in a multi-GPU job, check which "
                           "rank or device this is (the index is relative to CUDA_VISIBLE_DEVICES)."))
    if msg.allowed is not None:
        text = (f"A cap of {msg.allowed.text} is set (torch.cuda.set_per_process_memory_fraction, or "
                "per_process_memory_fraction in PYTORCH_CUDA_ALLOC_CONF): this process may reserve no more, "
                "whatever the GPU has free.")
        if reserved is not None and t is not None and reserved[0] + t.low_bytes > msg.allowed.high_bytes:
            text += " Reserved memory plus the request exceeds the cap: the cap, not the GPU, refused it."
        out.append(Anomaly("allowed_cap", text))
    if msg.free is not None and t is not None and msg.free.low_bytes >= t.high_bytes + FREE_MARGIN_BYTES:
        out.append(Anomaly("free_above_request",
                           f"{msg.free.text} was free, at least the {t.text} asked: the device was not full when the "
                           "message was written — an allowed cap, memory released by another process in between, "
                           "or a driver reservation refused the request."))
    if outside is not None and outside[1] < 0:
        out.append(Anomaly("negative_outside",
                           "total − free − reserved is negative: the figures are inconsistent (memory spilled to "
                           "system memory, or the message was edited)."))
    elif outside is not None and outside[0] > OUTSIDE_FLAG_BYTES:
        text = (f"{format_interval(outside)} of the GPU is held outside this process's PyTorch allocator, far above "
                f"a CUDA context ({format_size(CUDA_CONTEXT_BYTES[0])}–{format_size(CUDA_CONTEXT_BYTES[1])}).")
        split = outside_split(msg)
        if split is not None:
            own, others = split
            text += (f" Of it, {format_interval(own)} is this process's own memory outside PyTorch (CUDA context, "
                     f"cuBLAS/cuDNN workspaces, NCCL buffers, other libraries) and {format_interval(others)} is held "
                     "by other processes.")
        text += (" Usually that is another process on the GPU, or in a multi-GPU job every rank initialising CUDA "
                 "(or putting tensors) on GPU 0 before calling torch.cuda.set_device(local_rank).")
        out.append(Anomaly("outside_large", text))
    if msg.processes:
        listed = ", ".join(f"process {p.pid}: {p.memory.text}" for p in msg.processes)
        text = f"NVML lists processes on this GPU ({listed})."
        if msg.in_use is None and len(msg.processes) == 1:
            text += (" No line says 'this process': in a container NVML shows this process under its host PID, "
                     "so the listed process may be this one.")
        out.append(Anomaly("other_processes", text))
    if msg.private_pools is not None and msg.private_pools.high_bytes > 0:
        out.append(Anomaly("private_pools",
                           f"{msg.private_pools.text} is allocated in private pools (CUDA Graphs / torch.compile "
                           "'reduce-overhead'): memory the ordinary cache cannot reuse."))
    if msg.backend == "HIP":
        out.append(Anomaly("hip_backend", "A ROCm (HIP) build: the same caching-allocator rules and figures apply."))
    odd = [s.text for s in (t, total, msg.free, alloc, msg.reserved, msg.reserved_unallocated, msg.in_use)
           if s is not None and not s.canonical and s.value_bytes < _EXACT_LIMIT]
    if odd:
        out.append(Anomaly("not_torch_format",
                           f"{', '.join(odd)} is not how torch prints sizes (two decimals, KiB/MiB/GiB): the message "
                           "was retyped or edited, so its intervals are wider."))
    if gpu is not None and total is not None and not total.low_bytes <= gpu.total_memory_bytes <= total.high_bytes:
        out.append(Anomaly("gpu_mismatch",
                           f"A {gpu.display_name} reports {format_size(gpu.total_memory_bytes)}, not the message's "
                           f"{total.text}: the message comes from another GPU, or this one under another "
                           "driver, ECC setting or MIG slice."))
    if msg.occurrences > 1:
        out.append(Anomaly("multiple_messages",
                           f"The input holds {msg.occurrences} OOM messages; the most complete (the last on ties) "
                           "is decoded."))
    if msg.scanned_tail:
        out.append(Anomaly("scanned_tail", "The input is very long; only its last 4,000,000 characters were read."))
    return out
