"""A snapshot's memory over time: live bytes by category after each trace entry, its phases and its OOM.

:func:`memory_timeline` replays one device's trace from the state before its first entry (the dump's blocks with every
entry undone, as :func:`oomlab.explanation.snapshot.explain_snapshot` does) and records, after each ``alloc`` and
``free_completed``, the live bytes of each :class:`~oomlab.explanation.snapshot.SnapshotCategory`.  Phases are marked
where the frames name them (a snapshot oomlab simulated carries an ``oomlab-simulated/phase`` frame per tensor; a
real one has none, and is drawn unmarked): an allocation starts or continues its phase, a free stays in the phase of
the allocation before it (a free's frames are its tensor's allocation's, as torch records them).  The figures draw
it (:mod:`oomlab.report.figures`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from oomlab.explanation.snapshot import SIMULATED_PREFIX, SnapshotCategory, categorize
from oomlab.explanation.snapshot_format import FREED, MemorySnapshot, SnapshotFrame

__all__ = ["PHASE_FRAME", "MemoryTimeline", "memory_timeline"]

PHASE_FRAME = SIMULATED_PREFIX + "phase"  # the frame file whose name is the phase of a simulated tensor


@dataclass(frozen=True)
class MemoryTimeline:
    """Live bytes by category after each allocation or free of one device's trace."""

    points: tuple[Mapping[SnapshotCategory, int], ...]
    phases: tuple[tuple[str, int, int], ...]  # (phase, first point, last point + 1); empty when no frame names one
    oom_point: int | None  # the point the OOM followed (None: no OOM in the trace)
    oom_size_bytes: int | None
    reserved_bytes: tuple[int, ...]  # the segments' total after each point

    @property
    def peak_bytes(self) -> int:
        return max((sum(p.values()) for p in self.points), default=0)


def _phase(frames: tuple[SnapshotFrame, ...]) -> str | None:
    return next((f.name for f in frames if f.filename == PHASE_FRAME), None)


def memory_timeline(snapshot: MemorySnapshot, device: int = 0) -> MemoryTimeline:
    """The device's trace as a :class:`MemoryTimeline` (empty without a trace)."""
    trace = snapshot.device_traces[device] if device < len(snapshot.device_traces) else ()
    live: dict[int, tuple[int, tuple[SnapshotFrame, ...]]] = {}
    segments: dict[int, int] = {}
    for seg in snapshot.segments:
        if seg.device == device:
            segments[seg.address] = seg.total_size
            live.update({b.address: (b.requested_size, b.frames) for b in seg.blocks if b.active})
    for e in reversed(trace):  # undo every entry: the state before the first
        if e.action == "alloc":
            live.pop(e.addr, None)
        elif e.action in FREED:
            live[e.addr] = (e.size, e.frames)
        elif e.action in ("segment_alloc", "segment_map"):
            segments.pop(e.addr, None)
        elif e.action in ("segment_free", "segment_unmap"):
            segments[e.addr] = e.size
    totals = {c: 0 for c in SnapshotCategory}
    for size, frames in live.values():
        totals[categorize(frames)] += size
    points: list[Mapping[SnapshotCategory, int]] = []
    reserved: list[int] = []
    phases: list[tuple[str, int, int]] = []
    oom_point = oom_size = None
    for e in trace:
        if e.action in ("segment_alloc", "segment_map"):
            segments[e.addr] = e.size
        elif e.action in ("segment_free", "segment_unmap"):
            segments.pop(e.addr, None)
        elif e.action == "oom" and oom_point is None:
            oom_point, oom_size = len(points) - 1, e.size
        if e.action != "alloc" and e.action not in FREED:
            continue
        if e.action == "alloc":
            live[e.addr] = (e.size, e.frames)
            totals[categorize(e.frames)] += e.size
        elif e.addr in live:
            size, frames = live.pop(e.addr)
            totals[categorize(frames)] -= size
        points.append({c: b for c, b in totals.items() if b})
        reserved.append(sum(segments.values()))
        phase = _phase(e.frames) if e.action == "alloc" else (phases[-1][0] if phases else None)
        if phase is not None:
            if phases and phases[-1][0] == phase:
                phases[-1] = (phase, phases[-1][1], len(points))
            else:
                phases.append((phase, len(points) - 1, len(points)))
    return MemoryTimeline(tuple(points), tuple(phases), oom_point, oom_size, tuple(reserved))
