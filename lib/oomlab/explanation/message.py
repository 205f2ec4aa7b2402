"""Read a CUDA out-of-memory message into figures with their rounding (the traceback: :mod:`.frames`).

PyTorch prints two formats (``c10/cuda/CUDACachingAllocator.cpp``):

* torch ≤ 2.0: ``CUDA out of memory. Tried to allocate X (GPU n; T total capacity; A already allocated;
  F free; [L allowed; ]R reserved in total by PyTorch)`` — releases before 1.5 ended ``C cached)``, C being
  reserved − allocated (kept as ``reserved_unallocated``; those releases also printed the request, not the segment).
* torch ≥ 2.1: ``CUDA out of memory. Tried to allocate X. GPU n has a total capacity of T of which F is free.
  [Including non-PyTorch memory, this process has U memory in use. | Process PID has U memory in use. …]
  [L allowed; ]Of the allocated memory A is allocated by PyTorch, [with P allocated in private pools
  (e.g., CUDA Graphs), ]and R is reserved by PyTorch but unallocated.`` — some releases spell
  ``total capacty``; ROCm builds say ``HIP out of memory``; the newest ``Out of memory``.

Every figure is torch's ``format_size`` (2 decimals), so a printed figure stands for an interval of
bytes: :class:`PrintedSize` keeps the text, the value and that interval.

Parsing never backtracks badly: every quantifier is bounded, each field is searched for in a window
of at most :data:`WINDOW_CHARS` characters after the message's start, and inputs longer than
:data:`MAX_SCAN_CHARS` are scanned in their last :data:`MAX_SCAN_CHARS` characters only (an OOM
message ends a log; ``OomMessage.scanned_tail`` says when this happened).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from fractions import Fraction

from oomlab.core.choices import MessageFormat
from oomlab.core.errors import NotAnOomMessageError
from oomlab.core.units import GiB, KiB, MiB, format_size, parse_size

MAX_SCAN_CHARS = 4_000_000  # longer inputs: only the tail is scanned
WINDOW_CHARS = 3_000  # one message (with its hint) is < 1,000 characters
MAX_MESSAGES = 64  # at most this many occurrences are decoded; the best one is kept
_NUDGES = 8  # steps allowed to move an interval end onto format_size's boundary

FORMAT_OLD = MessageFormat.OLD.value
FORMAT_NEW = MessageFormat.NEW.value

_UNIT_BYTES = {"bytes": 1, "byte": 1, "b": 1, "kib": KiB, "mib": MiB, "gib": GiB, "tib": 1024**4,
               "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}
_SIZE = r"(\d{1,30}(?:\.\d{1,12})?)\s{0,3}(bytes|byte|[KMGT]i?B|B)\b"


# ------------------------------------------------------------------------------------------ figures


@dataclass(frozen=True)
class PrintedSize:
    """One figure as printed, the bytes it denotes, and every byte count that prints the same."""

    text: str  # as printed, normalised spacing: "14.16 GiB"
    value_bytes: int  # the value the printed decimals denote
    low_bytes: int  # smallest byte count that prints as `text`
    high_bytes: int  # largest byte count that prints as `text`
    canonical: bool  # True when torch's format_size can print exactly this text

    @property
    def interval(self) -> list[int]:
        return [self.low_bytes, self.high_bytes]


def _unit_range(unit: int) -> tuple[int, int]:
    """The byte counts torch's format_size prints in ``unit`` (boundaries inclusive below)."""
    if unit == 1:
        return 0, 1024
    if unit == KiB:
        return 1025, MiB
    if unit == MiB:
        return MiB + 1, GiB
    if unit == GiB:
        return GiB + 1, 1 << 80
    return 0, 1 << 80


def printed_size(number: str, unit_text: str) -> PrintedSize:
    """The interval of byte counts behind a printed ``number unit`` (``"14.16"``, ``"GiB"``).

    For torch's own output (two decimals, binary units) the interval is exact: the smallest and
    largest integers for which :func:`oomlab.units.format_size` gives the same text (its ``.2f``
    rounds ties to even, so a boundary can fall either side; both are checked).  Other spellings
    (``"14 GB"``, one decimal) get the interval their printed precision allows and ``canonical=False``.
    """
    unit_key = unit_text.lower()
    unit = _UNIT_BYTES[unit_key]
    text = f"{number} {'bytes' if unit == 1 else unit_text}"
    value = parse_size(f"{number}{'' if unit == 1 else unit_key}")
    decimals = len(number.partition(".")[2])
    exact = Fraction(number) * unit
    half = Fraction(unit, 2 * 10**decimals) if decimals or unit > 1 else Fraction(0)
    low, high = max(0, math.ceil(exact - half)), max(0, math.floor(exact + half))
    if unit == 1:
        return PrintedSize(text, value, low, high, decimals == 0 and value <= 1024)
    if unit not in (KiB, MiB, GiB) or decimals != 2:
        return PrintedSize(text, value, low, high, False)
    unit_low, unit_high = _unit_range(unit)
    low, high = max(low, unit_low), min(high, unit_high)
    for _ in range(_NUDGES):  # onto format_size's own boundaries (ties, float rounding of huge values)
        if low > high or format_size(low) == text:
            break
        low += 1
    for _ in range(_NUDGES):
        if low > high or format_size(high) == text:
            break
        high -= 1
    if low > high or format_size(low) != text or format_size(high) != text:
        return PrintedSize(text, value, max(0, math.ceil(exact - half)), max(0, math.floor(exact + half)), False)
    for _ in range(_NUDGES):
        if low <= unit_low or format_size(low - 1) != text:
            break
        low -= 1
    for _ in range(_NUDGES):
        if high >= unit_high or format_size(high + 1) != text:
            break
        high += 1
    return PrintedSize(text, min(max(value, low), high), low, high, True)


# ------------------------------------------------------------------------------------------ message

_ANCHOR = re.compile(r"(?:(CUDA|HIP)\s{1,8}out\s{1,8}of\s{1,8}memory|(Out)\s{1,8}of\s{1,8}memory(?=\.\s{0,8}Tried))",
                     re.IGNORECASE)
_TRIED = re.compile(r"\A\.?\s{0,8}Tried\s{1,8}to\s{1,8}allocate\s{1,8}" + _SIZE)
_FIELDS_OLD = {
    "device": re.compile(r"\(\s{0,3}GPU\s{1,3}(\d{1,6})\s{0,3};"),
    "total": re.compile(_SIZE + r"\s{1,3}total\s{1,3}capacity\s{0,3};"),
    "allocated": re.compile(_SIZE + r"\s{1,3}already\s{1,3}allocated"),
    "free": re.compile(_SIZE + r"\s{1,3}free\s{0,3};"),
    "allowed": re.compile(_SIZE + r"\s{1,3}allowed\s{0,3};"),
    "reserved": re.compile(_SIZE + r"\s{1,3}reserved\s{1,3}in\s{1,3}total\s{1,3}by\s{1,3}PyTorch"),
    # torch before 1.5 printed the cache (reserved − allocated) as "X cached)"
    "reserved_unallocated": re.compile(_SIZE + r"\s{1,3}cached\s{0,3}\)"),
}
_FIELDS_NEW = {
    "device": re.compile(r"GPU\s{1,3}(\d{1,6})\s{1,3}has\s{1,3}a\s{1,3}total\s{1,3}capac"),
    "total": re.compile(r"total\s{1,3}capaci?ty\s{1,3}of\s{1,3}" + _SIZE),
    "free": re.compile(r"of\s{1,3}which\s{1,3}" + _SIZE + r"\s{1,3}is\s{1,3}free"),
    "in_use": re.compile(r"this\s{1,3}process\s{1,3}has\s{1,3}" + _SIZE + r"\s{1,3}memory\s{1,3}in\s{1,3}use"),
    "allowed": re.compile(_SIZE + r"\s{1,3}allowed\s{0,3};"),
    "allocated": re.compile(r"Of\s{1,3}the\s{1,3}allocated\s{1,3}memory\s{1,3}" + _SIZE + r"\s{1,3}is\s{1,3}allocated"),
    "private_pools": re.compile(r"with\s{1,3}" + _SIZE + r"\s{1,3}allocated\s{1,3}in\s{1,3}private\s{1,3}pools"),
    "reserved_unallocated": re.compile(
        _SIZE + r"\s{1,3}is\s{1,3}reserved\s{1,3}by\s{1,3}PyTorch\s{1,3}but\s{1,3}unallocated"),
}
_PROCESS = re.compile(r"Process\s{1,3}(\d{1,10})\s{1,3}has\s{1,3}" + _SIZE + r"\s{1,3}memory\s{1,3}in\s{1,3}use")
_NEW_MARKERS = re.compile(r"has\s{1,3}a\s{1,3}total\s{1,3}capac|is\s{1,3}allocated\s{1,3}by\s{1,3}PyTorch|"
                          r"reserved\s{1,3}by\s{1,3}PyTorch\s{1,3}but|of\s{1,3}which")
_OLD_MARKERS = re.compile(r"\(\s{0,3}GPU\s{1,3}\d|total\s{1,3}capacity\s{0,3};|already\s{1,3}allocated|"
                          r"reserved\s{1,3}in\s{1,3}total")
_CUDA_ERROR = re.compile(r"CUDA\s{1,3}error\s{0,3}:\s{0,3}out\s{1,3}of\s{1,3}memory", re.IGNORECASE)

OLD_FIELDS = ("tried", "device", "total", "allocated", "free", "reserved")
NEW_FIELDS = ("tried", "device", "total", "free", "allocated", "reserved_unallocated")


@dataclass(frozen=True)
class ProcessMemory:
    """A ``Process PID has U memory in use`` clause (another process, or this one seen from a container)."""

    pid: int
    memory: PrintedSize


@dataclass(frozen=True)
class OomMessage:
    """The figures of one CUDA OOM message; a figure the message lacks is ``None`` and named in ``missing``."""

    format: str | None  # FORMAT_OLD, FORMAT_NEW, or None when cut off before anything tells them apart
    backend: str  # "CUDA", "HIP" (ROCm), or "" for the newest builds' plain "Out of memory"
    device_index: int | None
    tried: PrintedSize | None  # the segment asked of cudaMalloc
    total: PrintedSize | None  # device capacity
    free: PrintedSize | None  # cudaMemGetInfo free
    allocated: PrintedSize | None  # old: already allocated; new: allocated by PyTorch (private pools included)
    reserved: PrintedSize | None  # old format only: reserved in total by PyTorch
    reserved_unallocated: PrintedSize | None  # new format; old format before 1.5 ("cached")
    in_use: PrintedSize | None  # new format: this process's memory in use, non-PyTorch included
    private_pools: PrintedSize | None  # new format: allocated in private pools (CUDA Graphs)
    allowed: PrintedSize | None  # set_per_process_memory_fraction cap
    processes: tuple[ProcessMemory, ...]  # new format: "Process PID has U memory in use"
    hint: str | None  # "max_split_size_mb" or "expandable_segments": the advice the message printed
    missing: tuple[str, ...]  # figures of this format that the text lacks (cut off, or edited)
    message: str  # the message as decoded, spacing normalised
    occurrences: int  # OOM messages found in the input (the best-filled one, the last on ties, is decoded)
    scanned_tail: bool  # True when the input exceeded MAX_SCAN_CHARS and only its tail was scanned

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


def _normalise(text: str) -> str:
    return " ".join(text.split())


_TRIED_PREFIX = ". Tried to allocate"
_MESSAGE_ENDS = ("PYTORCH_CUDA_ALLOC_CONF", "environment-variables)", "alloc-conf)", "reserved in total by PyTorch)",
                 "cached)", "but unallocated.")


def _decode_one(text: str, backend: str) -> OomMessage | None:
    """Decode one message; ``text`` starts at its anchor, spacing normalised.  None: prose, not a message."""
    anchor = _ANCHOR.match(text)
    body = text[anchor.end():] if anchor else text
    tried_match = _TRIED.match(body)
    if tried_match is None:
        stub = body[:40].strip()
        if stub and not (_TRIED_PREFIX.startswith(stub) or stub.startswith((_TRIED_PREFIX, _TRIED_PREFIX[2:]))):
            return None  # "CUDA out of memory" in a sentence, not an allocator message
    tried = _size_from(tried_match) if tried_match else None
    rest = body[tried_match.end():] if tried_match else ""
    if rest.lstrip().startswith("(") or _OLD_MARKERS.search(rest):
        fmt: str | None = FORMAT_OLD
    elif rest.startswith(".") or _NEW_MARKERS.search(rest):
        fmt = FORMAT_NEW
    else:
        fmt = None
    found: dict[str, PrintedSize] = {}
    device: int | None = None
    processes: tuple[ProcessMemory, ...] = ()
    if fmt is not None:
        for name, pattern in (_FIELDS_OLD if fmt == FORMAT_OLD else _FIELDS_NEW).items():
            m = pattern.search(rest)
            if m is None:
                continue
            if name == "device":
                device = int(m.group(1))
            else:
                found[name] = _size_from(m)
        if fmt == FORMAT_NEW:
            processes = tuple(ProcessMemory(int(m.group(1)), _size_from(m, 2)) for m in _PROCESS.finditer(rest))
    expected = OLD_FIELDS if fmt == FORMAT_OLD else NEW_FIELDS if fmt == FORMAT_NEW else ("tried", "format")
    have = set(found) | ({"tried"} if tried else set()) | ({"device"} if device is not None else set())
    if fmt == FORMAT_OLD and "reserved_unallocated" in found:
        have.add("reserved")  # the pre-1.5 "cached" figure stands in for it
    hint = ("expandable_segments" if "expandable_segments" in rest
            else "max_split_size_mb" if "max_split_size_mb" in rest else None)
    ends = [text.find(marker) + len(marker) for marker in _MESSAGE_ENDS if marker in text]
    return OomMessage(
        format=fmt, backend=backend, device_index=device, tried=tried,
        total=found.get("total"), free=found.get("free"), allocated=found.get("allocated"),
        reserved=found.get("reserved"), reserved_unallocated=found.get("reserved_unallocated"),
        in_use=found.get("in_use"), private_pools=found.get("private_pools"), allowed=found.get("allowed"),
        processes=processes, hint=hint, missing=tuple(f for f in expected if f not in have),
        message=text[: max(ends)] if ends else text[:1000], occurrences=1, scanned_tail=False,
    )


def parse_oom_message(text: str | bytes) -> OomMessage:
    """Find and decode the CUDA OOM message in ``text`` (a message, a traceback, a whole log).

    Raises :class:`NotAnOomMessageError` when there is none.  Several messages: the one with the most
    figures is decoded (the last one on ties).  A message cut off mid-way decodes what is there.
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
    for i in range(max(0, len(starts) - MAX_MESSAGES), len(starts)):
        m = starts[i]
        stop = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        backend = {"cuda": "CUDA", "hip": "HIP"}.get((m.group(1) or "").lower(), "")
        one = _decode_one(_normalise(text[m.start(): min(stop, m.start() + WINDOW_CHARS)]), backend)
        if one is not None:
            decoded.append(one)
    if not decoded:
        raise NotAnOomMessageError(_not_oom_reason(text))
    best = max(reversed(decoded), key=_filled)
    skipped = max(0, len(starts) - MAX_MESSAGES)  # not decoded, counted as messages
    return replace(best, occurrences=len(decoded) + skipped, scanned_tail=scanned_tail)


def _filled(msg: OomMessage) -> int:
    return sum(f is not None for f in (msg.tried, msg.total, msg.free, msg.allocated, msg.reserved,
                                         msg.reserved_unallocated, msg.device_index)) + (msg.format is not None)


def _not_oom_reason(text: str) -> str:
    size = f"{len(text):,} characters"
    if _CUDA_ERROR.search(text):
        return ("not a CUDA out-of-memory message of PyTorch's caching allocator: the input has 'CUDA error: out of "
                "memory', raised by a CUDA call outside the allocator (context creation, cuBLAS/cuDNN workspaces, "
                "NCCL), which carries no figures to decode")
    return (f"not a CUDA out-of-memory message: no 'CUDA out of memory. Tried to allocate …' in the input ({size}); "
            "paste the error's last lines, e.g. 'CUDA out of memory. Tried to allocate 136.00 MiB (GPU 0; …'")


def interval_sub(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return a[0] - b[1], a[1] - b[0]

def format_interval(iv: tuple[int, int]) -> str:
    lo, hi = iv
    if format_size(max(lo, 0)) == format_size(max(hi, 0)):
        return format_size(max(lo, 0))
    return f"{format_size(max(lo, 0))}–{format_size(max(hi, 0))}"
