"""What an expert would remark on in a message's figures: spilling, caps, other processes, edited text ..."""

from __future__ import annotations

from dataclasses import dataclass

from oomlab.core.choices import Choice
from oomlab.core.gpus import GPUSpec
from oomlab.core.size_ranges import format_interval
from oomlab.core.units import GiB, MiB, format_size
from oomlab.explanation.backend import Backend, backend_terms
from oomlab.explanation.message import OomMessage
from oomlab.explanation.outside import (
    LEGACY_CONTEXT_BYTES,
    LEGACY_FLAG_BYTES,
    ExpectedOutside,
    OutsideReading,
    describe_expected,
)
from oomlab.explanation.processes import ProcessAccount
from oomlab.explanation.request import is_segment_interval

FREE_MARGIN_BYTES = 256 * MiB  # NB: cudaMalloc needs contiguous pages; a little free above the request can fail

HOST_REQUEST_FLAG_BYTES = 1024 * GiB  # NB: a single host allocation of 1 TiB or more is no model tensor

_EXACT_LIMIT = 2**50  # beyond this, torch's double-based format_size cannot be inverted exactly


class AnomalyCode(Choice):
    """What an anomaly is about: short and stable (the JSON writes the value)."""

    ALLOCATED_ABOVE_TOTAL = "allocated_above_total"
    ALLOWED_CAP = "allowed_cap"
    AMBIGUOUS_PROCESSES = "ambiguous_processes"
    BACKEND_MISMATCH = "backend_mismatch"
    DEVICE_NOT_ZERO = "device_not_zero"
    FREE_ABOVE_REQUEST = "free_above_request"
    GPU_MISMATCH = "gpu_mismatch"
    HIP_BACKEND = "hip_backend"
    MULTIPLE_MESSAGES = "multiple_messages"
    NEGATIVE_OUTSIDE = "negative_outside"
    NOT_TORCH_FORMAT = "not_torch_format"
    OTHER_PROCESSES = "other_processes"
    OUTSIDE_LARGE = "outside_large"
    PRIVATE_POOLS = "private_pools"
    REQUEST_ABOVE_TOTAL = "request_above_total"
    REQUEST_HUGE = "request_huge"
    RESERVED_ABOVE_TOTAL = "reserved_above_total"
    SCANNED_TAIL = "scanned_tail"
    TRIED_NOT_A_SEGMENT = "tried_not_a_segment"
    TRUNCATED = "truncated"
    UNREADABLE = "unreadable"
    WATERMARK_DISABLED = "watermark_disabled"
    XPU_BACKEND = "xpu_backend"


TOLD_IN_VERDICT = (AnomalyCode.TRUNCATED, AnomalyCode.UNREADABLE, AnomalyCode.MULTIPLE_MESSAGES,
                   AnomalyCode.SCANNED_TAIL)  # the verdict words these itself


@dataclass(frozen=True)
class Anomaly:
    """Something in the figures an expert would remark on."""

    code: AnomalyCode
    text: str  # one or two plain sentences


def find_anomalies(msg: OomMessage, outside: tuple[int, int] | None, gpu: GPUSpec | None,
                   account: ProcessAccount | None = None, expected: ExpectedOutside | None = None) -> list[Anomaly]:
    """The remarks on ``msg``: every backend's (cut, unreadable, retyped, repeated), then its own backend's.

    ``expected``: the memory outside PyTorch its GPU should show (:func:`oomlab.explanation.outside.expected_outside`;
    None for a backend without shipped figures, which is remarked on above :data:`LEGACY_FLAG_BYTES`)."""
    out: list[Anomaly] = []
    if msg.missing:
        out.append(Anomaly(AnomalyCode.TRUNCATED, "The message is cut off or edited: it lacks "
                           + ", ".join(msg.missing) + "; what follows uses only the figures present."))
    if msg.unreadable:
        out.append(Anomaly(AnomalyCode.UNREADABLE, "Unreadable figures (not a size as torch prints it): "
                           + "; ".join(f"{u.name} reads {u.text!r}" for u in msg.unreadable) + "."))
    if msg.backend is Backend.MPS:
        out += _mps_anomalies(msg)
    elif msg.backend is Backend.CPU:
        out += _cpu_anomalies(msg)
    else:
        out += _device_anomalies(msg, outside, gpu, account, expected)
    if gpu is not None and msg.backend not in (None, Backend.CUDA):
        out.append(Anomaly(AnomalyCode.BACKEND_MISMATCH,
                           f"--gpu {gpu.name} names an NVIDIA GPU, but {msg.backend.article} {msg.backend.value} "
                           "allocator wrote this "
                           "message: its figures are not that GPU's."))
    if msg.occurrences > 1:
        out.append(Anomaly(AnomalyCode.MULTIPLE_MESSAGES,
                           f"The input holds {msg.occurrences} OOM messages; the most complete (the last on ties) "
                           "is decoded."))
    if msg.scanned_tail:
        out.append(Anomaly(AnomalyCode.SCANNED_TAIL,
                           "The input is very long; only its last 4,000,000 characters were read."))
    return out


def _device_anomalies(msg: OomMessage, outside: tuple[int, int] | None, gpu: GPUSpec | None,
                      account: ProcessAccount | None, expected: ExpectedOutside | None) -> list[Anomaly]:
    """The caching allocators' (CUDA, HIP, XPU) remarks."""
    out: list[Anomaly] = []
    terms = backend_terms(msg.backend)
    t, total, alloc = msg.tried, msg.total, msg.allocated
    reserved = msg.reserved_low_high
    if total is not None and alloc is not None and alloc.low_bytes > total.high_bytes:
        out.append(Anomaly(AnomalyCode.ALLOCATED_ABOVE_TOTAL,
                           f"{alloc.text} allocated exceeds the {total.text} total capacity: the driver is spilling "
                           "into system memory (Windows WDDM 'shared GPU memory', or unified memory), which is slow; "
                           "the capacity figure is the GPU's own memory."))
    elif total is not None and reserved is not None and reserved[0] > total.high_bytes:
        out.append(Anomaly(AnomalyCode.RESERVED_ABOVE_TOTAL,
                           f"reserved memory ({format_interval(reserved)}) exceeds the {total.text} total capacity: "
                           "the driver is spilling into system memory (WDDM shared memory, or unified memory)."))
    if t is not None and total is not None and t.low_bytes > total.high_bytes:
        text = (f"The single request of {t.text} is larger than the whole GPU ({total.text}): no allocator setting "
                "and no freeing can make it fit; a shape is far larger than intended, or the work must be split "
                "into chunks.")
        if t.low_bytes >= 2**50:
            text += " A request this absurd usually comes from an overflowing or negative size computation."
        out.append(Anomaly(AnomalyCode.REQUEST_ABOVE_TOTAL, text))
    if t is not None and not is_segment_interval(t):
        out.append(Anomaly(AnomalyCode.TRIED_NOT_A_SEGMENT,
                           f"{t.text} is no size the caching allocator asks {terms.malloc} for (2 MiB, 20 MiB or a "
                           "multiple of 2 MiB from 10 MiB): torch before 1.5 printed the request itself, or the "
                           "message was edited."))
    if msg.device_index not in (None, 0):
        out.append(Anomaly(AnomalyCode.DEVICE_NOT_ZERO,
                           f"The failure is on GPU {msg.device_index}, not GPU 0: in a multi-GPU job, check which "
                           "rank or device this is (the index is relative to "
                           f"{'HIP_VISIBLE_DEVICES' if msg.backend is Backend.HIP else 'CUDA_VISIBLE_DEVICES'})."))
    if msg.allowed is not None:
        text = (f"A cap of {msg.allowed.text} is set (torch.cuda.set_per_process_memory_fraction, or "
                f"per_process_memory_fraction in {terms.alloc_conf}): this process may reserve no more, "
                "whatever the GPU has free.")
        if reserved is not None and t is not None and reserved[0] + t.low_bytes > msg.allowed.high_bytes:
            text += " Reserved memory plus the request exceeds the cap: the cap, not the GPU, refused it."
        out.append(Anomaly(AnomalyCode.ALLOWED_CAP, text))
    if msg.free is not None and t is not None and msg.free.low_bytes >= t.high_bytes + FREE_MARGIN_BYTES:
        out.append(Anomaly(AnomalyCode.FREE_ABOVE_REQUEST,
                           f"{msg.free.text} was free, at least the {t.text} asked: the device was not full when the "
                           "message was written — an allowed cap, memory released by another process in between, "
                           "or a driver reservation refused the request."))
    if outside is not None and outside[1] < 0:
        out.append(Anomaly(AnomalyCode.NEGATIVE_OUTSIDE,
                           "total − free − reserved is negative: the figures are inconsistent (memory spilled to "
                           "system memory, or the message was edited)."))
    elif outside is not None and outside_large(outside, expected):
        held = f"{format_interval(outside)} of the GPU is held outside this process's PyTorch allocator"
        if expected is not None:
            text = f"{held}, above the {describe_expected(expected)}."
            if expected.multi_gpu is not None and outside[0] <= expected.multi_gpu[1]:
                text += (f" One rank of a multi-GPU job holds NCCL's buffers too ({format_interval(expected.multi_gpu)}"
                         " in all): if this is one, give the number of GPUs and it is expected.")
        else:
            text = (f"{held}, far above {terms.context} with its {terms.handles} "
                    f"({format_interval(LEGACY_CONTEXT_BYTES)}).")
        text += (" Usually that is another process on the GPU, or in a multi-GPU job every rank initialising "
                 f"{'HIP' if msg.backend is Backend.HIP else 'CUDA'} (or putting tensors) on GPU 0 before calling "
                 "torch.cuda.set_device(local_rank).")
        out.append(Anomaly(AnomalyCode.OUTSIDE_LARGE, text))
    if account is not None:
        out += _process_anomalies(account, terms.process_lister)
    if msg.private_pools is not None and msg.private_pools.high_bytes > 0:
        out.append(Anomaly(AnomalyCode.PRIVATE_POOLS,
                           f"{msg.private_pools.text} is allocated in private pools ({terms.graphs} / torch.compile "
                           "'reduce-overhead'): memory the ordinary cache cannot reuse."))
    if msg.backend is Backend.HIP:
        out.append(Anomaly(AnomalyCode.HIP_BACKEND,
                           "A ROCm (HIP) build: the same caching-allocator rules and figures apply, "
                           "with hipMalloc and the HIP runtime in place of cudaMalloc and CUDA."))
    if msg.backend is Backend.XPU:
        out.append(Anomaly(AnomalyCode.XPU_BACKEND,
                           "An Intel XPU build: its caching allocator keeps CUDA's block and segment "
                           "sizes, so the request range and fragmentation read the same."))
    odd = [s.text for s in (t, total, msg.free, alloc, msg.reserved, msg.reserved_unallocated, msg.in_use)
           if s is not None and not s.canonical and s.value_bytes < _EXACT_LIMIT]
    if odd:
        out.append(Anomaly(AnomalyCode.NOT_TORCH_FORMAT,
                           f"{', '.join(odd)} is not how torch prints sizes (two decimals, KiB/MiB/GiB): the message "
                           "was retyped or edited, so its intervals are wider."))
    if (gpu is not None and total is not None and msg.backend in (None, Backend.CUDA)
            and not total.low_bytes <= gpu.total_memory_bytes <= total.high_bytes):
        out.append(Anomaly(AnomalyCode.GPU_MISMATCH,
                           f"A {gpu.display_name} reports {format_size(gpu.total_memory_bytes)}, not the message's "
                           f"{total.text}: the message comes from another GPU, or this one under another "
                           "driver, ECC setting or MIG slice."))
    return out


def outside_large(outside: tuple[int, int], expected: ExpectedOutside | None) -> bool:
    """Whether memory outside PyTorch is above what the GPU should show: the whole interval above the expected range
    (its top: see :mod:`.outside` for why not a multiple of the budget's point), or above the legacy threshold for a
    backend without shipped figures."""
    if expected is not None:
        return expected.reading(outside) is OutsideReading.ABOVE
    return outside[0] > LEGACY_FLAG_BYTES


def _process_anomalies(account: ProcessAccount, lister: str) -> list[Anomaly]:
    out: list[Anomaly] = []
    if account.others:
        listed = ", ".join(f"process {p.pid}: {p.memory.text}" for p in account.others)
        out.append(Anomaly(AnomalyCode.OTHER_PROCESSES,
                           f"Other processes hold memory on this GPU ({listed}), as {lister} "
                           "lists them: memory this process cannot have."))
    if account.candidates:
        pids = ", ".join(f"{p.pid} ({p.memory.text})" for p in account.candidates)
        out.append(Anomaly(AnomalyCode.AMBIGUOUS_PROCESSES,
                           f"{account.listed} processes are listed and none is called 'this process' (a container "
                           f"shows host PIDs): this one is one of {pids}, each holding at least its reserved memory, "
                           "so its memory in use, its memory outside PyTorch and the other processes' share are "
                           "ambiguous; total − free − reserved, the memory outside its allocator, is not."))
    return out


def _mps_anomalies(msg: OomMessage) -> list[Anomaly]:
    out: list[Anomaly] = []
    mps = msg.mps
    sizes = [s for s in (msg.tried, *(() if mps is None else (mps.allocated, mps.other_allocations, mps.max_allowed)))
             if s is not None]
    odd = [s.text for s in sizes if not s.canonical]
    if odd:
        out.append(Anomaly(AnomalyCode.NOT_TORCH_FORMAT,
                           f"{', '.join(odd)} is not how the MPS allocator prints sizes (two "
                           "decimals): the message was retyped or edited, so its intervals are wider."))
    if mps is not None and mps.max_allowed is None and not msg.missing:
        out.append(Anomaly(AnomalyCode.WATERMARK_DISABLED,
                           "No 'max allowed' figure: the high-watermark limit is off (PYTORCH_MPS_HIGH_WATERMARK_RATIO"
                           "=0.0), so Metal itself refused the heap — unified memory was exhausted, and macOS was "
                           "likely swapping."))
    return out


def _cpu_anomalies(msg: OomMessage) -> list[Anomaly]:
    out: list[Anomaly] = []
    if msg.tried is not None and msg.tried.low_bytes >= HOST_REQUEST_FLAG_BYTES:
        out.append(Anomaly(AnomalyCode.REQUEST_HUGE,
                           f"A single host allocation of {format_size(msg.tried.value_bytes)}: no host has that; a "
                           "shape is far larger than intended (a size computed from the wrong dimension, or an "
                           "overflow)."))
    return out
