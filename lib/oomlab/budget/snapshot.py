"""The budgeted step written as a PyTorch memory snapshot (``torch.cuda.memory._dump_snapshot``'s format).

:func:`simulate_allocator` runs the step's events (:func:`~oomlab.budget.timeline.step_timeline`) through oomlab's
model of the caching allocator (:class:`~oomlab.reproduction.allocator.CachingAllocator`, on the setup's GPU with
its memory outside PyTorch) and records what torch's ``_record_memory_history`` would: ``segment_alloc`` when the
allocator asks cudaMalloc for a segment, ``alloc``, ``free_requested`` / ``free_completed`` (one stream: together),
``segment_free`` when a retry releases cached segments, and ``oom`` (the rounded request and the free device memory)
where the allocator gives up -- the trace stops there, as the user's step does.  :func:`snapshot_dict` adds the
segments and their blocks at that moment (the dump: at the OOM, else after the step) in torch's layout, so that
``torch.cuda._memory_viz`` (``segsum``, ``trace``, ``trace_plot``) and pytorch.org/memory_viz open it; every frame
names the category and the module (``oomlab-simulated/<category>``), which
:func:`oomlab.explanation.snapshot.categorize` reads back.  :func:`write_snapshot` pickles it (protocol 4, plain
containers only: the opcodes MemoryViz.js's ``unpickle`` reads) where the user names, never over a file oomlab did not
write.

Limitations: addresses are oomlab's (segments laid out one after another from :data:`BASE_ADDRESS`); one device, one
stream; no ``time_us`` beyond the event's number.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oomlab.budget.result import BudgetResult, MemCategory
from oomlab.budget.timeline import StepTensor, StepTimeline, step_timeline
from oomlab.core.errors import InvalidValueError
from oomlab.core.units import MiB, format_size
from oomlab.core.user_input import shown
from oomlab.explanation.snapshot import SIMULATED_PREFIX, SnapshotCategory, simulated_frame_file
from oomlab.explanation.snapshot_format import SnapshotError, load_snapshot, read_snapshot
from oomlab.reproduction.allocator import CachingAllocator, Pool, SimulatedOutOfMemory, round_size

__all__ = ["BASE_ADDRESS", "PICKLE_PROTOCOL", "SNAPSHOT_CATEGORY", "STEP_SNAPSHOT_NAME", "AllocatorReplay",
           "render_replay", "simulate_allocator", "snapshot_bytes", "snapshot_dict", "write_snapshot"]

# One table: the budget's category -> the category a snapshot's frames can tell (explanation.snapshot)
SNAPSHOT_CATEGORY: Mapping[MemCategory, SnapshotCategory] = {
    MemCategory.WEIGHTS: SnapshotCategory.WEIGHTS, MemCategory.MASTER_WEIGHTS: SnapshotCategory.WEIGHTS,
    MemCategory.GRADIENTS: SnapshotCategory.GRADIENTS, MemCategory.OPTIMIZER_STATE: SnapshotCategory.OPTIMIZER_STATE,
    MemCategory.ACTIVATIONS: SnapshotCategory.ACTIVATIONS, MemCategory.LOGITS_LOSS: SnapshotCategory.LOGITS,
    MemCategory.WORKSPACE: SnapshotCategory.TEMPORARIES,
}
BASE_ADDRESS = 0x7F0000000000  # where the first segment starts (a typical CUDA VA); each next one after it
SEGMENT_ALIGN = 2 * MiB  # segments start 2 MiB apart at least (cudaMalloc's granularity for large ranges)
PICKLE_PROTOCOL = 4  # MemoryViz.js's unpickle accepts protocols 2 to 4
STEP_SNAPSHOT_NAME = "step-snapshot.pickle"  # the pipeline's snapshot of the configured step, in the run's results/


@dataclass(frozen=True)
class AllocatorReplay:
    """The step through the allocator model: the trace entries, the dump's segments, where it stopped."""

    timeline: StepTimeline
    trace: tuple[dict[str, Any], ...]  # torch TraceEntry dicts
    segments: tuple[dict[str, Any], ...]  # torch Segment dicts at the dump
    oom_event: int | None  # index into timeline.events of the allocation that failed (None: the step fits)
    oom_size_bytes: int | None
    device_free_bytes: int | None


def _frames(t: StepTensor) -> list[dict[str, Any]]:
    phase = "between steps" if t.phase is None else t.phase.value
    return [{"filename": simulated_frame_file(SNAPSHOT_CATEGORY[t.category]), "line": 0,
             "name": f"{t.category.value} of {t.module}"},
            {"filename": SIMULATED_PREFIX + "phase", "line": 0, "name": phase}]


class _Layout:
    """Addresses for the allocator model's segments, and its blocks read segment by segment.

    NB: reads :class:`CachingAllocator`'s internal block lists (``_segments``, ``_live``, ``_free``): the allocator
    has no public view of its segments yet.
    """

    def __init__(self, allocator: CachingAllocator) -> None:
        self.allocator = allocator
        self.base: dict[int, int] = {}
        self.next = BASE_ADDRESS

    def segments(self) -> dict[int, tuple[int, Pool]]:
        return self.allocator.segments()

    def address(self, segment: int, offset: int = 0) -> int:
        if segment not in self.base:
            size = self.allocator.segments()[segment][0]
            self.base[segment] = self.next
            self.next += -(-size // SEGMENT_ALIGN) * SEGMENT_ALIGN
        return self.base[segment] + offset

    def block_of(self, handle: int) -> Any:
        return self.allocator.live_blocks()[handle]

    def dump(self, frames_of: Mapping[int, list[dict[str, Any]]]) -> tuple[dict[str, Any], ...]:
        """Every segment with its blocks in address order, as torch's ``_snapshot`` lays them out."""
        segments = self.allocator.segments()
        blocks: dict[int, list[dict[str, Any]]] = {s: [] for s in segments}
        for handle, b in self.allocator.live_blocks().items():
            blocks[b.segment].append({"address": self.address(b.segment, b.offset), "size": b.size,
                                      "requested_size": b.requested, "state": "active_allocated",
                                      "frames": frames_of[handle]})
        for b in self.allocator.free_blocks():
            blocks[b.segment].append({"address": self.address(b.segment, b.offset), "size": b.size,
                                      "requested_size": 0, "state": "inactive", "frames": []})
        out = []
        for seg, (size, pool) in sorted(segments.items(), key=lambda kv: self.address(kv[0])):
            bs = sorted(blocks[seg], key=lambda b: b["address"])
            allocated = sum(b["size"] for b in bs if b["state"] == "active_allocated")
            out.append({"device": 0, "address": self.address(seg), "total_size": size, "allocated_size": allocated,
                        "active_size": allocated, "requested_size": sum(b["requested_size"] for b in bs),
                        "stream": 0, "segment_type": pool.value, "segment_pool_id": (0, 0), "is_expandable": False,
                        "frames": [], "blocks": bs})
        return tuple(out)


def simulate_allocator(result: BudgetResult, timeline: StepTimeline | None = None) -> AllocatorReplay:
    """The step's events through the allocator model on the setup's GPU (see the module docstring)."""
    timeline = timeline or step_timeline(result)
    outside = min(result.components.get(MemCategory.OUTSIDE_PYTORCH, 0), result.capacity_bytes)
    allocator = CachingAllocator(result.capacity_bytes, outside)
    layout = _Layout(allocator)
    handles: dict[int, int] = {}  # tensor handle -> allocator handle
    frames_of: dict[int, list[dict[str, Any]]] = {}  # allocator handle -> frames
    trace: list[dict[str, Any]] = []

    def entry(action: str, addr: int, size: int, frames: list[dict[str, Any]]) -> None:
        trace.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": len(trace),
                      "frames": frames})

    def segment_changes(before: dict[int, tuple[int, Pool]]) -> None:
        after = layout.segments()
        for seg in sorted(set(before) - set(after)):
            entry("segment_free", layout.address(seg), before[seg][0], [])
        for seg in sorted(set(after) - set(before)):
            entry("segment_alloc", layout.address(seg), after[seg][0], [])

    for index, event in enumerate(timeline.events):
        t = event.tensor
        if not event.alloc:
            handle = handles.pop(t.handle)
            block = layout.block_of(handle)
            addr, frames = layout.address(block.segment, block.offset), frames_of.pop(handle)
            allocator.free(handle)
            entry("free_requested", addr, t.size_bytes, frames)
            entry("free_completed", addr, t.size_bytes, frames)
            continue
        before = layout.segments()
        try:
            handle = allocator.malloc(t.size_bytes)
        except SimulatedOutOfMemory as oom:
            segment_changes(before)
            trace.append({"action": "oom", "size": round_size(t.size_bytes), "device_free": oom.snapshot.free_bytes,
                          "stream": 0, "time_us": len(trace), "frames": _frames(t)})
            return AllocatorReplay(timeline, tuple(trace), layout.dump(frames_of), index,
                                   round_size(t.size_bytes), oom.snapshot.free_bytes)
        segment_changes(before)
        handles[t.handle] = handle
        frames_of[handle] = _frames(t)
        block = layout.block_of(handle)
        entry("alloc", layout.address(block.segment, block.offset), t.size_bytes, frames_of[handle])
    return AllocatorReplay(timeline, tuple(trace), layout.dump(frames_of), None, None, None)


def describe(result: BudgetResult) -> str:
    """The setup a simulated snapshot stands for, in one line (its ``oomlab_simulated`` marker)."""
    s = result.setup
    return (f"oomlab {result.source.value} budget: {s.model.name} on {s.gpus} x {s.gpu.name}, {s.strategy.value}, "
            f"{s.method.value}, {s.precision.value}, {s.optimizer.value}, batch {s.batch} x {s.seq}"
            + (", checkpointing" if s.checkpointing else ""))


def snapshot_dict(result: BudgetResult, replay: AllocatorReplay | None = None) -> dict[str, Any]:
    """The snapshot torch's ``_snapshot()`` would return for the simulated step (one device)."""
    replay = replay or simulate_allocator(result)
    return {"segments": list(replay.segments), "device_traces": [list(replay.trace)],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "expandable_segments": False},
            "external_annotations": [], "oomlab_simulated": describe(result)}


def snapshot_bytes(result: BudgetResult, replay: AllocatorReplay | None = None) -> bytes:
    """:func:`snapshot_dict` pickled (protocol :data:`PICKLE_PROTOCOL`)."""
    return pickle.dumps(snapshot_dict(result, replay), protocol=PICKLE_PROTOCOL)


def _ours(path: Path) -> bool:
    """Is ``path`` a regular file holding a snapshot oomlab simulated (its marker), so it may be replaced?"""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        return read_snapshot(path).simulated_by is not None
    except (SnapshotError, InvalidValueError):
        return False


def write_snapshot(result: BudgetResult, path: str | os.PathLike[str],
                   replay: AllocatorReplay | None = None) -> Path:
    """Write the simulated step's snapshot to ``path`` (atomically); return it.  An existing file is replaced only
    when it is a snapshot oomlab wrote; anything else there (a user's real snapshot, a folder, a link) is refused."""
    path = Path(path).expanduser()
    if path.exists() or path.is_symlink():
        if not _ours(path):
            raise InvalidValueError(
                f"--snapshot {shown(str(path))} exists and is not a snapshot oomlab wrote; oomlab never overwrites "
                "files it did not write: give a new file name, or move that file away")
    if not path.parent.is_dir():
        raise InvalidValueError(f"--snapshot {shown(str(path))}: the folder {shown(str(path.parent))} does not exist")
    data = snapshot_bytes(result, replay)
    load_snapshot(data, "the written snapshot")  # what we write, we read back
    tmp = path.with_name(f".{path.name}.oomlab-tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise InvalidValueError(f"--snapshot {shown(str(path))} cannot be written: {err.strerror or err}") from err
    return path



def render_replay(replay: AllocatorReplay) -> str:
    """Where the allocator model gave up on the step, in one sentence (or that it did not)."""
    if replay.oom_event is None:
        return (f"The step fits the allocator model: all {len(replay.timeline.events)} allocations and frees succeed, "
                f"{len(replay.segments)} segments reserved at the end.")
    t = replay.timeline.events[replay.oom_event].tensor
    where = "the model states held between steps" if t.phase is None else f"the {t.phase.value} phase"
    return (f"The allocator model gives up at event {replay.oom_event + 1} of {len(replay.timeline.events)}: "
            f"{format_size(t.size_bytes)} of {t.category.value} for {t.module}, in {where}, with "
            f"{format_size(replay.device_free_bytes or 0)} free on the device.")
