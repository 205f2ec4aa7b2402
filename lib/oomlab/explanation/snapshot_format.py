"""PyTorch's memory snapshot (``torch.cuda.memory._dump_snapshot``) read as untrusted input, into typed records.

The format is ``torch.cuda.memory._snapshot``'s (its docstring, torch 2.13 ``torch/cuda/memory.py`` 1027-1127): a
dict of ``segments`` (each a cudaMalloc'd range with its ``blocks``, each block with its ``frames``) and
``device_traces`` (one list of trace entries per device: ``alloc``, ``free_requested``, ``free_completed``,
``segment_alloc``, ``segment_free``, ``oom``, ``snapshot``; an ``oom`` entry carries ``device_free``).  A snapshot is a
pickle a user attached to an issue, so it is read with a restricted unpickler that builds only the plain containers
the format uses (dict, list, tuple, str, int, float, bool, None): a pickle that names any global (a class, a function
such as ``os.system``) or a persistent id is refused naming it, before anything is built from it.  The file is read
bounded (:data:`MAX_SNAPSHOT_BYTES`); a truncated or malformed pickle, or one whose shape is not a snapshot, is an
:class:`SnapshotError` naming what is wrong.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oomlab.core.errors import InvalidValueError
from oomlab.core.user_input import read_user_bytes, shown

__all__ = ["FREED", "MAX_ENTRIES", "MAX_SNAPSHOT_BYTES", "TRACE_ACTIONS", "MemorySnapshot", "SnapshotBlock",
           "SnapshotError", "SnapshotFrame", "SnapshotSegment", "TraceEvent", "load_snapshot", "parse_snapshot",
           "read_snapshot"]

# NB: _dump_snapshot's own docstring warns that files "can easily be in the GB range" with large max_entries; the
# default history (max_entries=sys.maxsize over one step) of a 7B fine-tune is tens of MiB.  512 MiB bounds the read.
MAX_SNAPSHOT_BYTES = 512 * 2**20
# NB: a pickle can reference one object many times for two bytes each; records parsed are bounded apart from bytes
# (a 7B fine-tune's step is about 10^5 trace entries of tens of frames each, with frame lists mostly shared)
MAX_ENTRIES = 20_000_000
# the trace entry actions of torch's TraceEntry (memory.py 1085-1103), those expandable segments add, and the single
# "free" of older snapshots (MemoryViz.js still replays it)
TRACE_ACTIONS = ("alloc", "free", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
                 "segment_unmap", "oom", "snapshot", "user_defined")
FREED = ("free", "free_completed")  # the actions after which a block is free for reuse
BLOCK_STATES = ("active_allocated", "active_pending_free", "active_awaiting_free", "inactive")


class SnapshotError(InvalidValueError):
    """A file that is not a memory snapshot oomlab will read: a refused global, truncated, malformed or too big."""


@dataclass(frozen=True)
class SnapshotFrame:
    """One frame of an allocation's stack, innermost first as torch records them."""

    filename: str
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.line}:{self.name}"


@dataclass(frozen=True)
class SnapshotBlock:
    """A range of a segment at the time of the dump: a live tensor or cached free memory."""

    address: int
    size: int  # bytes (rounded by the allocator)
    requested_size: int  # bytes the caller asked for
    state: str  # one of BLOCK_STATES
    frames: tuple[SnapshotFrame, ...]

    @property
    def active(self) -> bool:
        return self.state != "inactive"


@dataclass(frozen=True)
class SnapshotSegment:
    """One cudaMalloc'd segment at the time of the dump."""

    device: int
    address: int
    total_size: int
    segment_type: str  # "small" or "large"
    blocks: tuple[SnapshotBlock, ...]


@dataclass(frozen=True)
class TraceEvent:
    """One entry of a device's trace (``addr`` is None for ``oom``, whose ``device_free`` is set)."""

    action: str
    addr: int | None
    size: int
    frames: tuple[SnapshotFrame, ...]
    device_free: int | None = None


@dataclass(frozen=True)
class MemorySnapshot:
    """A whole snapshot: the segments at the dump and each device's trace."""

    segments: tuple[SnapshotSegment, ...]
    device_traces: tuple[tuple[TraceEvent, ...], ...]
    simulated_by: str | None = None  # oomlab's marker in a snapshot it wrote (the setup it simulates), else None

    def devices(self) -> tuple[int, ...]:
        """Devices with a trace or a segment, in order."""
        found = {s.device for s in self.segments} | {i for i, t in enumerate(self.device_traces) if t}
        return tuple(sorted(found))


class _PlainUnpickler(pickle.Unpickler):
    """Builds plain containers only: every global and persistent id is refused (nothing is imported or called)."""

    def find_class(self, module: str, name: str) -> Any:
        raise SnapshotError(f"the snapshot names the global {shown(f'{module}.{name}')}; a memory snapshot holds only "
                            "dicts, lists, tuples, strings, numbers, booleans and None, so it is refused unread")

    def persistent_load(self, pid: Any) -> Any:
        raise SnapshotError(f"the snapshot holds a persistent id ({_brief(pid)}); a memory snapshot has none, so it "
                            "is refused unread")


def load_snapshot(data: bytes, what: str = "the snapshot") -> Any:
    """The plain object a snapshot pickle holds (:class:`_PlainUnpickler`): a global or a persistent id is refused,
    and so is a truncated or malformed pickle, each with a :class:`SnapshotError` naming ``what``."""
    if len(data) > MAX_SNAPSHOT_BYTES:
        raise SnapshotError(f"{what} has {len(data):,} bytes; at most {MAX_SNAPSHOT_BYTES:,} are read")
    if not data:
        raise SnapshotError(f"{what} is empty; give the file torch.cuda.memory._dump_snapshot wrote")
    stream = io.BytesIO(data)
    try:
        raw = _PlainUnpickler(stream).load()
    except SnapshotError as err:
        raise SnapshotError(f"{what}: {err}") from None
    except (EOFError, pickle.UnpicklingError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            OverflowError, MemoryError, RecursionError, UnicodeDecodeError) as err:
        ending = "truncated" if isinstance(err, EOFError) or "truncated" in str(err) else "not a valid pickle"
        raise SnapshotError(f"{what} is {ending} ({type(err).__name__}: {shown(str(err))}); give the whole file "
                            "torch.cuda.memory._dump_snapshot wrote") from None
    if stream.tell() != len(data):
        raise SnapshotError(f"{what} has {len(data) - stream.tell():,} bytes after the pickle's end; give the file "
                            "torch.cuda.memory._dump_snapshot wrote, unchanged")
    return raw


def read_snapshot(path: str | os.PathLike[str], what: str = "--snapshot") -> MemorySnapshot:
    """The snapshot in the file ``path``: read bounded, unpickled plain (:func:`load_snapshot`), then checked."""
    name = f"{what} {shown(str(path))}"
    return parse_snapshot(load_snapshot(read_user_bytes(path, what, max_bytes=MAX_SNAPSHOT_BYTES), name), name)


# ----------------------------------------------------------------------------------------------------- the shape


def _field(raw: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any = ...) -> Any:
    if key not in raw:
        if default is not ...:
            return default
        raise SnapshotError(f"{where} has no {key!r}; a torch memory snapshot's has one")
    value = raw[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise SnapshotError(f"{where}: {key!r} is {_brief(value)}; expected {names}")
    return value


def _brief(value: Any) -> str:
    """A value as an error shows it: a scalar's text (bounded), a container's type only (never its repr: it may nest a
    million levels deep)."""
    if value is None or isinstance(value, str | int | float | bool):
        return f"{type(value).__name__} {shown(value)}"
    return type(value).__name__


def _size(raw: Mapping[str, Any], key: str, where: str, default: Any = ...) -> int:
    value = _field(raw, key, int, where, default)
    if value is not None and value < 0:
        raise SnapshotError(f"{where}: {key!r} is {value}; sizes are >= 0")
    return value


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise SnapshotError(f"{where} is {type(value).__name__}, not a dict; give a torch memory snapshot")
    return value


def _sequence(value: Any, where: str) -> list[Any] | tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise SnapshotError(f"{where} is {type(value).__name__}, not a list; give a torch memory snapshot")
    return value


class _Reader:
    """One parse: frame lists shared in the pickle (memo references) become one shared tuple, and the entries read
    (blocks, trace entries, frames) are counted against :data:`MAX_ENTRIES`, so a small pickle that references one
    list millions of times cannot expand into gigabytes of records."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.entries = 0
        self.shared: dict[int, tuple[SnapshotFrame, ...]] = {}  # id of a frame list (alive while raw is) -> tuple

    def count(self, n: int = 1) -> None:
        self.entries += n
        if self.entries > MAX_ENTRIES:
            raise SnapshotError(f"{self.what} holds more than {MAX_ENTRIES:,} blocks, trace entries and frames; "
                                "record a shorter history (_record_memory_history(max_entries=...))")

    def frames(self, raw: Any, where: str) -> tuple[SnapshotFrame, ...]:
        if id(raw) in self.shared:
            return self.shared[id(raw)]
        frames = []
        for i, f in enumerate(_sequence(raw, where)):
            f = _mapping(f, f"{where}[{i}]")
            frames.append(SnapshotFrame(str(_field(f, "filename", str, where, "?")),
                                        int(_field(f, "line", int, where, 0)), str(_field(f, "name", str, where, "?"))))
        self.count(len(frames))
        self.shared[id(raw)] = out = tuple(frames)
        return out

    def block(self, raw: Any, where: str) -> SnapshotBlock:
        self.count()
        b = _mapping(raw, where)
        state = _field(b, "state", str, where)
        if state not in BLOCK_STATES:
            raise SnapshotError(f"{where}: unknown block state {shown(state)}; known: {', '.join(BLOCK_STATES)}")
        size = _size(b, "size", where)
        frames = b.get("frames")
        if frames is None and isinstance(b.get("history"), list) and b["history"]:  # torch <= 2.0's block history
            frames = _mapping(b["history"][0], f"{where}.history[0]").get("frames", [])
        return SnapshotBlock(_size(b, "address", where, 0), size, _size(b, "requested_size", where, size), state,
                             self.frames(frames or [], f"{where}.frames"))

    def segment(self, raw: Any, where: str) -> SnapshotSegment:
        s = _mapping(raw, where)
        blocks = tuple(self.block(b, f"{where}.blocks[{i}]")
                       for i, b in enumerate(_sequence(_field(s, "blocks", list, where), f"{where}.blocks")))
        return SnapshotSegment(_size(s, "device", where, 0), _size(s, "address", where),
                               _size(s, "total_size", where), str(_field(s, "segment_type", str, where, "large")),
                               blocks)

    def event(self, raw: Any, where: str) -> TraceEvent:
        self.count()
        e = _mapping(raw, where)
        action = _field(e, "action", str, where)
        if action not in TRACE_ACTIONS:
            raise SnapshotError(f"{where}: unknown trace action {shown(action)}; known: {', '.join(TRACE_ACTIONS)}")
        frames = self.frames(e.get("frames") or [], f"{where}.frames")
        if action == "oom":
            return TraceEvent(action, None, _size(e, "size", where), frames, _size(e, "device_free", where))
        return TraceEvent(action, _size(e, "addr", where, 0), _size(e, "size", where, 0), frames)


def parse_snapshot(raw: Any, what: str = "the snapshot") -> MemorySnapshot:
    """The :class:`MemorySnapshot` of the plain object ``raw``; a shape that is not torch's is refused naming where,
    and so is one of more than :data:`MAX_ENTRIES` blocks, trace entries and frames."""
    reader = _Reader(what)
    top = _mapping(raw, what)
    segments = tuple(reader.segment(s, f"{what}: segments[{i}]")
                     for i, s in enumerate(_sequence(_field(top, "segments", list, what), "segments")))
    traces = tuple(tuple(reader.event(e, f"{what}: device_traces[{d}][{i}]")
                         for i, e in enumerate(_sequence(t, "trace")))
                   for d, t in enumerate(_sequence(_field(top, "device_traces", list, what, []), "device_traces")))
    marker = top.get("oomlab_simulated")
    return MemorySnapshot(segments, traces, marker if isinstance(marker, str) else None)
