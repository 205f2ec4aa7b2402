"""Read an out-of-memory message into figures with their rounding (the traceback: :mod:`.frames`).

The CUDA caching allocator prints two formats (``c10/cuda/CUDACachingAllocator.cpp``):

* torch ≤ 2.0: ``CUDA out of memory. Tried to allocate X (GPU n; T total capacity; A already allocated;
  F free; [L allowed; ]R reserved in total by PyTorch)`` — releases before 1.5 ended ``C cached)``, C being
  reserved − allocated (kept as ``reserved_unallocated``; those releases also printed the request, not the segment).
* torch ≥ 2.1: ``CUDA out of memory. Tried to allocate X. GPU n has a total capacity of T of which F is free.
  [Including non-PyTorch memory, this process has U memory in use. | Process PID has U memory in use. …]
  [L allowed; ]Of the allocated memory A is allocated by PyTorch, [with P allocated in private pools
  (e.g., CUDA Graphs), ]and R is reserved by PyTorch but unallocated.`` — some releases spell
  ``total capacty``; ROCm builds say ``HIP out of memory``; the newest ``Out of memory``.

The other backends (:class:`~.backend.Backend`):

* XPU (``c10/xpu/XPUCachingAllocator.cpp``): the torch ≥ 2.1 wording with ``XPU out of memory`` and a closing
  ``Please use `empty_cache` to release all unoccupied cached memory.``; Intel's extension (IPEX) printed the
  torch ≤ 2.0 wording without the free figure.
* MPS (``aten/src/ATen/mps/MPSAllocator.mm``): ``MPS backend out of memory (MPS allocated: A, other
  allocations: O[, max allowed: M]). Tried to allocate X on private|shared pool. [Use
  PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 …]`` — its own ``format_size`` labels binary sizes ``KB``/``MB``/``GB``
  in older releases (``KiB``/``MiB``/``GiB`` in newer ones) and divides in single precision.
* CPU (``c10/core/impl/alloc_cpu.cpp``): ``DefaultCPUAllocator: can't allocate memory: you tried to allocate
  N bytes. Error code E (reason)`` — Windows: ``DefaultCPUAllocator: not enough memory: you tried to allocate
  N bytes.`` — one exact byte count.

Every figure of the caching allocators is torch's ``format_size`` (2 decimals), so a printed figure stands for an
interval of bytes: :class:`PrintedSize` keeps the text, the value and that interval.  A figure whose label is
there but whose value is no size (``Tried to allocate banana MiB``) is an :class:`UnreadableFigure`, not missing.

Parsing never backtracks badly: every quantifier is bounded, each field is searched for in a window
of at most :data:`WINDOW_CHARS` characters after the message's start, and inputs longer than
:data:`MAX_SCAN_CHARS` are scanned in their last :data:`MAX_SCAN_CHARS` characters only (an OOM
message ends a log; ``OomMessage.scanned_tail`` says when this happened).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from oomlab.core.choices import MessageFormat
from oomlab.core.errors import NotAnOomMessageError
from oomlab.core.user_input import shown
from oomlab.explanation.backend import Backend
from oomlab.explanation.printed import PrintedSize, exact_size, mps_printed_size, printed_size

MAX_SCAN_CHARS = 4_000_000  # longer inputs: only the tail is scanned
MAX_INPUT_BYTES = 64 * 2**20  # the most ``explain --file`` / standard input reads: a whole training log, bounded
WINDOW_CHARS = 3_000  # one message (with its hint) is < 1,000 characters
MAX_MESSAGES = 64  # at most this many occurrences are decoded; the best one is kept

_SIZE = r"(\d{1,30}(?:\.\d{1,12})?)\s{0,3}(bytes|byte|[KMGT]i?B|B)\b"
# A figure's value where its label stands, whatever it is: one token, perhaps with a unit.
_RAW = r"([^\s;()]{1,40}(?:\s{1,3}(?:[KMGT]i?B|bytes?|B)\b)?)"
# What a size cut off by the end of the input can look like: "136", "136.0", "14.75 Gi", "1024 byt".
_SIZE_PREFIX = re.compile(r"\d{1,30}(?:\.\d{0,12})?(?:\s{1,3}(?:[KMGT](?:i?B?)|B|b(?:y(?:t(?:es?)?)?)?)?)?")


@dataclass(frozen=True)
class UnreadableFigure:
    """A figure whose label the message has but whose value is no size (``Tried to allocate banana MiB``)."""

    name: str  # the figure: "tried", "total", "free", "mps_allocated" …
    text: str  # what stands where the size should be: "banana MiB"


# ------------------------------------------------------------------------------------------ message

_ANCHOR = re.compile(
    r"(?:(CUDA|HIP|XPU)\s{1,8}out\s{1,8}of\s{1,8}memory"
    r"|(MPS)\s{1,8}backend\s{1,8}out\s{1,8}of\s{1,8}memory"
    r"|Default(CPU)Allocator\s{0,3}:\s{0,3}(?:can't|not\s{1,3}enough)\s{1,3}(?:allocate\s{1,3})?memory"
    r"|(Out)\s{1,8}of\s{1,8}memory(?=\.\s{0,8}Tried))",
    re.IGNORECASE)
_BACKEND_GROUPS = {"cuda": Backend.CUDA, "hip": Backend.HIP, "xpu": Backend.XPU, "mps": Backend.MPS,
                   "cpu": Backend.CPU}
# Nothing of the message follows its first words on their line: "CUDA out of memory." alone.
_BARE_TAIL = re.compile(r"[ \t]{0,40}\.?[ \t]{0,40}(?:\r?\n|\Z)")
_TRIED_PREFIX_RE = re.compile(r"\A\.?\s{0,8}Tried\s{1,8}to\s{1,8}allocate\s{1,8}")
_TRIED = re.compile(r"\A\.?\s{0,8}Tried\s{1,8}to\s{1,8}allocate\s{1,8}" + _SIZE)
_TRIED_RAW = re.compile(r"\A\.?\s{0,8}Tried\s{1,8}to\s{1,8}allocate\s{1,8}" + _RAW)
_V = "<V>"  # where a field's value stands in the templates below
_OLD_TEMPLATES = {
    "total": _V + r"\s{1,3}total\s{1,3}capacity\s{0,3};",
    "allocated": _V + r"\s{1,3}already\s{1,3}allocated",
    "free": _V + r"\s{1,3}free\s{0,3};",
    "allowed": _V + r"\s{1,3}allowed\s{0,3};",
    "reserved": _V + r"\s{1,3}reserved\s{1,3}in\s{1,3}total\s{1,3}by\s{1,3}PyTorch",
    # torch before 1.5 printed the cache (reserved − allocated) as "X cached)"
    "reserved_unallocated": _V + r"\s{1,3}cached\s{0,3}\)",
}
_NEW_TEMPLATES = {
    "total": r"total\s{1,3}capaci?ty\s{1,3}of\s{1,3}" + _V,
    "free": r"of\s{1,3}which\s{1,3}" + _V + r"\s{1,3}is\s{1,3}free",
    "in_use": r"this\s{1,3}process\s{1,3}has\s{1,3}" + _V + r"\s{1,3}memory\s{1,3}in\s{1,3}use",
    "allowed": _V + r"\s{1,3}allowed\s{0,3};",
    "allocated": r"Of\s{1,3}the\s{1,3}allocated\s{1,3}memory\s{1,3}" + _V + r"\s{1,3}is\s{1,3}allocated",
    "private_pools": r"with\s{1,3}" + _V + r"\s{1,3}allocated\s{1,3}in\s{1,3}private\s{1,3}pools",
    "reserved_unallocated": _V + r"\s{1,3}is\s{1,3}reserved\s{1,3}by\s{1,3}PyTorch\s{1,3}but\s{1,3}unallocated",
}
_MPS_TEMPLATES = {
    "mps_allocated": r"MPS\s{1,3}allocated\s{0,3}:\s{0,3}" + _V,
    "other_allocations": r"other\s{1,3}allocations\s{0,3}:\s{0,3}" + _V,
    "max_allowed": r"max\s{1,3}allowed\s{0,3}:\s{0,3}" + _V,
    "tried": r"Tried\s{1,8}to\s{1,8}allocate\s{1,8}" + _V,
}


def _compiled(templates: dict[str, str], value: str) -> dict[str, re.Pattern[str]]:
    return {name: re.compile(t.replace(_V, value)) for name, t in templates.items()}


_FIELDS_OLD, _RAW_OLD = _compiled(_OLD_TEMPLATES, _SIZE), _compiled(_OLD_TEMPLATES, _RAW)
_FIELDS_NEW, _RAW_NEW = _compiled(_NEW_TEMPLATES, _SIZE), _compiled(_NEW_TEMPLATES, _RAW)
_FIELDS_MPS, _RAW_MPS = _compiled(_MPS_TEMPLATES, _SIZE), _compiled(_MPS_TEMPLATES, _RAW)
_DEVICE_OLD = re.compile(r"\(\s{0,3}GPU\s{1,3}(\d{1,6})\s{0,3};")
_DEVICE_NEW = re.compile(r"GPU\s{1,3}(\d{1,6})\s{1,3}has\s{1,3}a\s{1,3}total\s{1,3}capac")
_MPS_POOL = re.compile(r"Tried\s{1,8}to\s{1,8}allocate\s{1,8}[^\s;()]{1,40}(?:\s{1,3}[A-Za-z]{1,5})?\s{1,3}on\s{1,3}"
                       r"(private|shared)\s{1,3}pool")
_CPU_TRIED = re.compile(r"\A\s{0,3}:\s{0,3}you\s{1,3}tried\s{1,3}to\s{1,3}allocate\s{1,3}(\d{1,30})\s{1,3}bytes")
_CPU_TRIED_RAW = re.compile(r"\A\s{0,3}:\s{0,3}you\s{1,3}tried\s{1,3}to\s{1,3}allocate\s{1,3}" + _RAW)
_CPU_ERRNO = re.compile(r"\A\s{0,3}\.?\s{0,3}Error\s{1,3}code\s{1,3}(\d{1,6})\s{0,3}(?:\(([^()]{1,80})\))?")
_PROCESS = re.compile(r"Process\s{1,3}(\d{1,10})\s{1,3}has\s{1,3}" + _SIZE + r"\s{1,3}memory\s{1,3}in\s{1,3}use")
_NEW_MARKERS = re.compile(r"has\s{1,3}a\s{1,3}total\s{1,3}capac|is\s{1,3}allocated\s{1,3}by\s{1,3}PyTorch|"
                          r"reserved\s{1,3}by\s{1,3}PyTorch\s{1,3}but|of\s{1,3}which")
_OLD_MARKERS = re.compile(r"\(\s{0,3}GPU\s{1,3}\d|total\s{1,3}capacity\s{0,3};|already\s{1,3}allocated|"
                          r"reserved\s{1,3}in\s{1,3}total")
_CUDA_ERROR = re.compile(r"CUDA\s{1,3}error\s{0,3}:\s{0,3}out\s{1,3}of\s{1,3}memory", re.IGNORECASE)
_XPU_4GB = re.compile(r"can\s{1,3}NOT\s{1,3}allocate\s{1,3}memory\s{1,3}block\s{1,3}with\s{1,3}size\s{1,3}larger"
                      r"\s{1,3}than\s{1,3}4\s{0,3}GB", re.IGNORECASE)

OLD_FIELDS = ("tried", "device", "total", "allocated", "free", "reserved")
NEW_FIELDS = ("tried", "device", "total", "free", "allocated", "reserved_unallocated")
XPU_OLD_FIELDS = ("tried", "device", "total", "allocated", "reserved")  # IPEX's wording has no free figure
MPS_FIELDS = ("mps_allocated", "other_allocations", "tried", "pool")
CPU_FIELDS = ("tried",)


@dataclass(frozen=True)
class ProcessMemory:
    """A ``Process PID has U memory in use`` clause (another process, or this one seen from a container)."""

    pid: int
    memory: PrintedSize


@dataclass(frozen=True)
class MpsFigures:
    """The figures only an MPS message has (``aten/src/ATen/mps/MPSAllocator.mm``)."""

    allocated: PrintedSize | None  # "MPS allocated": every Metal heap the MPS allocator holds, buffers cached too
    other_allocations: PrintedSize | None  # the Metal driver's allocated size for this process minus those heaps
    max_allowed: PrintedSize | None  # the high watermark: PYTORCH_MPS_HIGH_WATERMARK_RATIO × the working-set size
    pool: str | None  # "private" (GPU-only buffers) or "shared" (CPU-visible buffers)


@dataclass(frozen=True)
class HostError:
    """What the operating system answered the CPU allocator (``Error code 12 (Cannot allocate memory)``)."""

    code: int | None  # errno; None in the Windows wording ("not enough memory"), which prints none
    reason: str  # strerror's text, or "not enough memory" (Windows)


@dataclass(frozen=True)
class OomMessage:
    """The figures of one out-of-memory message; a figure the message lacks is ``None`` and named in ``missing``."""

    format: MessageFormat | None  # OLD, NEW, or None (MPS, CPU, or cut off before the format shows)
    backend: Backend | None  # None for the newest builds' plain "Out of memory"
    device_index: int | None
    tried: PrintedSize | None  # caching allocators: the segment asked of the device; MPS: the heap buffer; CPU: exact
    total: PrintedSize | None  # device capacity
    free: PrintedSize | None  # cudaMemGetInfo free
    allocated: PrintedSize | None  # old: already allocated; new: allocated by PyTorch (private pools included)
    reserved: PrintedSize | None  # old format only: reserved in total by PyTorch
    reserved_unallocated: PrintedSize | None  # new format; old format before 1.5 ("cached")
    in_use: PrintedSize | None  # new format: this process's memory in use, non-PyTorch included
    private_pools: PrintedSize | None  # new format: allocated in private pools (CUDA Graphs)
    allowed: PrintedSize | None  # set_per_process_memory_fraction cap
    processes: tuple[ProcessMemory, ...]  # new format: "Process PID has U memory in use"
    mps: MpsFigures | None  # MPS messages only
    host: HostError | None  # CPU messages only
    hint: str | None  # "max_split_size_mb" or "expandable_segments": the advice the message printed
    missing: tuple[str, ...]  # figures of this format that the text lacks (cut off, or edited)
    unreadable: tuple[UnreadableFigure, ...]  # figures whose label is there but whose value is no size
    message: str  # the message as decoded, spacing normalised
    occurrences: int  # OOM messages found in the input (the best-filled one, the last on ties, is decoded)
    scanned_tail: bool  # True when the input exceeded MAX_SCAN_CHARS and only its tail was scanned

    @property
    def has_figure(self) -> bool:
        """Does the message give at least one size (the request, a device figure, a process's memory, an MPS
        figure)?  One without any -- cut before its first figure, or garbled -- has nothing to explain."""
        mps = self.mps or MpsFigures(None, None, None, None)
        sizes = (self.tried, self.total, self.free, self.allocated, self.reserved, self.reserved_unallocated,
                 self.in_use, self.private_pools, self.allowed, mps.allocated, mps.other_allocations, mps.max_allowed)
        return any(size is not None for size in sizes) or bool(self.processes)

    @property
    def reserved_low_high(self) -> tuple[int, int] | None:
        """Reserved bytes as an interval: printed (old) or allocated + reserved-but-unallocated (new)."""
        if self.reserved is not None:
            return self.reserved.low_bytes, self.reserved.high_bytes
        if self.allocated is not None and self.reserved_unallocated is not None:
            return (self.allocated.low_bytes + self.reserved_unallocated.low_bytes,
                    self.allocated.high_bytes + self.reserved_unallocated.high_bytes)
        return None

    @property
    def reserved_bytes(self) -> int | None:
        """Reserved bytes: printed (old format) or derived as allocated + unallocated (new format)."""
        if self.reserved is not None:
            return self.reserved.value_bytes
        if self.allocated is not None and self.reserved_unallocated is not None:
            return self.allocated.value_bytes + self.reserved_unallocated.value_bytes
        return None


def _size_from(match: re.Match[str], group: int = 1) -> PrintedSize:
    return printed_size(match.group(group), match.group(group + 1))


def _unreadable(name: str, raw: re.Match[str] | None, text: str) -> UnreadableFigure | None:
    """The figure ``raw`` found where a size should stand, unless it is a size cut off by the input's end."""
    if raw is None:
        return None
    value = raw.group(1).rstrip(".,;:")
    if not value or _SIZE_PREFIX.fullmatch(text[raw.start(1):].strip()):
        return None  # nothing there, or "136.0" / "14.75 Gi" at the very end: cut, not unreadable
    return UnreadableFigure(name, value)


def _normalise(text: str) -> str:
    return " ".join(text.split())


_TRIED_PREFIX = ". Tried to allocate"
_MESSAGE_ENDS = ("PYTORCH_CUDA_ALLOC_CONF", "environment-variables)", "alloc-conf)", "reserved in total by PyTorch)",
                 "cached)", "but unallocated.", "unoccupied cached memory.")
_MPS_ENDS = ("(may cause system failure).", "(may cause system failure)", " pool.")


def _empty(backend: Backend | None, text: str) -> OomMessage:
    return OomMessage(
        format=None, backend=backend, device_index=None, tried=None, total=None, free=None, allocated=None,
        reserved=None, reserved_unallocated=None, in_use=None, private_pools=None, allowed=None, processes=(),
        mps=None, host=None, hint=None, missing=(), unreadable=(), message=text[:1000], occurrences=1,
        scanned_tail=False)


def _fields(rest: str, strict: dict[str, re.Pattern[str]], loose: dict[str, re.Pattern[str]],
            read: Callable[[str, str], PrintedSize] = printed_size,
            ) -> tuple[dict[str, PrintedSize], list[UnreadableFigure]]:
    """Each field's figure where its strict pattern matches; where only its loose one does, the unreadable text."""
    found: dict[str, PrintedSize] = {}
    unreadable: list[UnreadableFigure] = []
    for name, pattern in strict.items():
        m = pattern.search(rest)
        if m is not None:
            found[name] = read(m.group(1), m.group(2))
            continue
        bad = _unreadable(name, loose[name].search(rest), rest)
        if bad is not None:
            unreadable.append(bad)
    return found, unreadable


def _decode_caching(text: str, backend: Backend | None, body: str) -> OomMessage | None:
    """A caching allocator's message (CUDA, HIP, XPU): ``body`` follows its anchor, spacing normalised."""
    unreadable: list[UnreadableFigure] = []
    tried_match = _TRIED.match(body)
    tried = _size_from(tried_match) if tried_match else None
    rest = body[tried_match.end():] if tried_match else ""
    if tried_match is None:
        raw = _TRIED_RAW.match(body)
        bad = _unreadable("tried", raw, body)
        if bad is not None:
            unreadable.append(bad)
            rest = body[raw.start(1) + len(bad.text):]
        else:
            stub = body[:40].strip()
            if stub and not (_TRIED_PREFIX.startswith(stub) or stub.startswith((_TRIED_PREFIX, _TRIED_PREFIX[2:]))):
                return None  # "CUDA out of memory" in a sentence, not an allocator message
    if rest.lstrip().startswith("(") or _OLD_MARKERS.search(rest):
        fmt: MessageFormat | None = MessageFormat.OLD
    elif rest.startswith(".") or _NEW_MARKERS.search(rest):
        fmt = MessageFormat.NEW
    else:
        fmt = None
    found: dict[str, PrintedSize] = {}
    device: int | None = None
    processes: tuple[ProcessMemory, ...] = ()
    if fmt is not None:
        old = fmt is MessageFormat.OLD
        found, more = _fields(rest, _FIELDS_OLD if old else _FIELDS_NEW, _RAW_OLD if old else _RAW_NEW)
        unreadable += more
        m = (_DEVICE_OLD if old else _DEVICE_NEW).search(rest)
        device = int(m.group(1)) if m else None
        if not old:
            processes = tuple(ProcessMemory(int(m.group(1)), _size_from(m, 2)) for m in _PROCESS.finditer(rest))
    if fmt is MessageFormat.OLD:
        expected = XPU_OLD_FIELDS if backend is Backend.XPU else OLD_FIELDS
    elif fmt is MessageFormat.NEW:
        expected = NEW_FIELDS
    else:  # nothing after the request tells the format: the rest is cut off (an unreadable request is not)
        expected = () if unreadable else ("tried", "format")
    have = (set(found) | ({"tried"} if tried else set()) | ({"device"} if device is not None else set())
            | {u.name for u in unreadable})
    if fmt is MessageFormat.OLD and "reserved_unallocated" in found:
        have.add("reserved")  # the pre-1.5 "cached" figure stands in for it
    hint = ("expandable_segments" if "expandable_segments" in rest
            else "max_split_size_mb" if "max_split_size_mb" in rest else None)
    ends = [text.find(marker) + len(marker) for marker in _MESSAGE_ENDS if marker in text]
    return replace(
        _empty(backend, text), format=fmt, device_index=device, tried=tried,
        total=found.get("total"), free=found.get("free"), allocated=found.get("allocated"),
        reserved=found.get("reserved"), reserved_unallocated=found.get("reserved_unallocated"),
        in_use=found.get("in_use"), private_pools=found.get("private_pools"), allowed=found.get("allowed"),
        processes=processes, hint=hint, missing=tuple(f for f in expected if f not in have),
        unreadable=tuple(unreadable), message=text[: max(ends)] if ends else text[:1000],
    )


def _decode_mps(text: str, body: str) -> OomMessage:
    """``MPS backend out of memory (MPS allocated: …, other allocations: …[, max allowed: …]). Tried to allocate …``."""
    found, unreadable = _fields(body, _FIELDS_MPS, _RAW_MPS, mps_printed_size)
    pool = _MPS_POOL.search(body)
    watermark = "max_allowed" in found or "HIGH_WATERMARK" in body or "max allowed" in body
    expected = MPS_FIELDS + (("max_allowed",) if watermark else ())
    have = set(found) | {u.name for u in unreadable} | ({"pool"} if pool else set())
    ends = [text.find(marker) + len(marker) for marker in _MPS_ENDS if marker in text]
    mps = MpsFigures(found.get("mps_allocated"), found.get("other_allocations"), found.get("max_allowed"),
                     pool.group(1) if pool else None)
    return replace(_empty(Backend.MPS, text), tried=found.get("tried"), mps=mps,
                   missing=tuple(f for f in expected if f not in have), unreadable=tuple(unreadable),
                   message=text[: min(ends)] if ends else text[:1000])


def _decode_cpu(text: str, body: str) -> OomMessage:
    """``DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes. Error code E (reason)``."""
    windows = text.lower().startswith("defaultcpuallocator: not")
    m = _CPU_TRIED.match(body)
    tried = exact_size(int(m.group(1))) if m else None
    unreadable = ()
    end = len(text) - len(body) + (m.end() if m else 0)
    if m is None:
        bad = _unreadable("tried", _CPU_TRIED_RAW.match(body), body)
        unreadable = (bad,) if bad is not None else ()
    host = HostError(None, "not enough memory") if windows else None
    errno = _CPU_ERRNO.match(body[m.end():]) if m else None
    if errno is not None:
        host = HostError(int(errno.group(1)), errno.group(2) or "")
        end += errno.end()
    missing = tuple(f for f in CPU_FIELDS if f == "tried" and tried is None and not unreadable)
    return replace(_empty(Backend.CPU, text), tried=tried, host=host, missing=missing, unreadable=unreadable,
                   message=text[:end].rstrip() if m else text[:1000])


def _decode_one(text: str, backend: Backend | None) -> OomMessage | None:
    """Decode one message; ``text`` starts at its anchor, spacing normalised.  None: prose, not a message."""
    anchor = _ANCHOR.match(text)
    body = text[anchor.end():] if anchor else text
    if backend is Backend.MPS:
        return _decode_mps(text, body)
    if backend is Backend.CPU:
        return _decode_cpu(text, body)
    return _decode_caching(text, backend, body)


def parse_oom_message(text: str | bytes) -> OomMessage:
    """Find and decode the out-of-memory message in ``text`` (a message, a traceback, a whole log).

    CUDA, HIP and XPU caching-allocator messages, MPS heap-allocator messages and the CPU allocator's.  Raises
    :class:`NotAnOomMessageError` when there is none, or only a bare ``CUDA out of memory.`` with no figures.
    Several messages: the one with the most figures is decoded (the last one on ties).  A message cut off mid-way
    decodes what is there, even nothing (:func:`require_figure` refuses that, as ``explain`` does).
    """
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    if not isinstance(text, str):
        raise NotAnOomMessageError(f"not a CUDA out-of-memory message: expected text, got {type(text).__name__}")
    scanned_tail = len(text) > MAX_SCAN_CHARS
    if scanned_tail:
        text = text[-MAX_SCAN_CHARS:]
    starts = list(_ANCHOR.finditer(text))
    decoded: list[OomMessage] = []
    bare: list[str] = []
    for i in range(max(0, len(starts) - MAX_MESSAGES), len(starts)):
        m = starts[i]
        stop = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        backend = _BACKEND_GROUPS.get(next((g for g in m.groups() if g), "").lower())
        window = _normalise(text[m.start(): min(stop, m.start() + WINDOW_CHARS)])
        after = window[len(_normalise(m.group(0))):]
        if _BARE_TAIL.match(text, m.end()) and not _TRIED_PREFIX_RE.match(after):
            bare.append(_normalise(m.group(0)))
            continue
        one = _decode_one(window, backend)
        if one is not None:
            decoded.append(one)
    if not decoded:
        raise NotAnOomMessageError(_bare_reason(bare[-1]) if bare else _not_oom_reason(text))
    best = max(reversed(decoded), key=_filled)
    skipped = max(0, len(starts) - MAX_MESSAGES)  # not decoded, counted as messages
    return replace(best, occurrences=len(decoded) + skipped, scanned_tail=scanned_tail)


def _filled(msg: OomMessage) -> int:
    mps = msg.mps or MpsFigures(None, None, None, None)
    return sum(f is not None for f in (msg.tried, msg.total, msg.free, msg.allocated, msg.reserved,
                                         msg.reserved_unallocated, msg.device_index, mps.allocated,
                                         mps.other_allocations, mps.max_allowed, msg.host)) + (msg.format is not None)


def require_figure(msg: OomMessage) -> OomMessage:
    """``msg`` if it gives at least one size (:attr:`OomMessage.has_figure`); else :class:`NotAnOomMessageError`
    naming what stands where the sizes should and what was expected.

    One rule with the bare ``CUDA out of memory.`` that :func:`parse_oom_message` refuses: a message from which no
    figure can be read -- bare, cut off before its first figure, or garbled (``Tried to allocate banana MiB (GPU x;
    total capacity;``) -- is refused, since nothing in it can be explained.
    """
    if msg.has_figure:
        return msg
    expected = ("expected sizes as torch prints them ('136.00 MiB', '14.75 GiB') after 'Tried to allocate' and in the "
                "device's figures (total capacity, free, allocated, reserved); paste the whole message as torch "
                "printed it, e.g. 'CUDA out of memory. Tried to allocate 136.00 MiB (GPU 0; 14.75 GiB total capacity; "
                "…)'")
    if msg.unreadable:
        found = ", ".join(f"{u.name} {shown(u.text)}" for u in msg.unreadable[:6])
        raise NotAnOomMessageError(f"an out-of-memory message with no readable figure: where sizes should stand it "
                                   f"has {found}; {expected}")
    raise NotAnOomMessageError(f"an out-of-memory message cut off before its first figure "
                               f"({shown(msg.message)}); {expected}")


def _bare_reason(anchor: str) -> str:
    return (f"a bare {anchor + '.'!r} with no figures: the input has the error's first words but not "
            "'Tried to allocate …' nor the device's figures (total capacity, free, allocated, reserved), so there is "
            "nothing to decode; paste the whole message as torch printed it, on the line after 'OutOfMemoryError:', "
            "e.g. 'CUDA out of memory. Tried to allocate 136.00 MiB (GPU 0; 14.75 GiB total capacity; …)'")


def _not_oom_reason(text: str) -> str:
    size = f"{len(text):,} characters"
    if _CUDA_ERROR.search(text):
        return ("not a CUDA out-of-memory message of PyTorch's caching allocator: the input has 'CUDA error: out of "
                "memory', raised by a CUDA call outside the allocator (context creation, cuBLAS/cuDNN workspaces, "
                "NCCL), which carries no figures to decode")
    if _XPU_4GB.search(text):
        return ("not an out-of-memory message: the input has Intel's extension refusing one XPU block larger than "
                "4 GB ('Current platform can NOT allocate memory block with size larger than 4GB'), a limit of the "
                "platform, not of free memory; split the tensor, or allow such blocks for Level Zero "
                "(UR_L0_USE_RELAXED_ALLOCATION_LIMITS=1)")
    return (f"not a CUDA out-of-memory message: no 'CUDA out of memory. Tried to allocate …' in the input ({size}) "
            "— nor the HIP, XPU, MPS ('MPS backend out of memory') or CPU ('DefaultCPUAllocator: can't allocate "
            "memory') wording; paste the error's last lines, e.g. 'CUDA out of memory. Tried to allocate 136.00 MiB "
            "(GPU 0; …'")
