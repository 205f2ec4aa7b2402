"""Explain a PyTorch memory snapshot: what was live when the allocator gave up, by category, and how fragmented.

:func:`explain_snapshot` finds the last ``oom`` entry of a device's trace (its ``size`` is the rounded request that
failed, its ``device_free`` what CUDA still reported free), rebuilds the live tensors and the segments at that moment
-- from the blocks at the dump, undoing every later trace entry, as memory_viz's own ``simulate_memory`` does -- and
sorts each live tensor into a :class:`SnapshotCategory` from its allocation's frames (:data:`FRAME_RULES`).  A trace
with no ``oom`` is read at its peak of live bytes; a snapshot without a trace (recorded with ``enabled="state"``) at
its dump.

Limitations: the frames decide the category, so a tensor allocated where no rule recognises the stack is "not
attributed"; gradients are told from backward temporaries only by an ``AccumulateGrad`` frame (C++ stacks,
``_record_memory_history(stacks="all")``, the default); live bytes are the sizes requested (the trace's), while
``allocated_bytes`` counts blocks as the allocator does (the dump's block sizes, a traced request rounded to 512
bytes); expandable segments (``segment_map``) are counted as whole segments.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from oomlab.core.choices import Choice
from oomlab.core.units import format_size
from oomlab.explanation.snapshot_format import (
    FREED,
    MemorySnapshot,
    SnapshotError,
    SnapshotFrame,
    TraceEvent,
    read_snapshot,
)
from oomlab.reproduction.allocator import round_size

__all__ = ["FRAME_RULES", "SIMULATED_PREFIX", "LiveTensor", "SnapshotCategory", "SnapshotExplanation", "categorize",
           "explain_snapshot", "render_snapshot_explanation", "simulated_frame_file"]

TOP_ALLOCATIONS = 10  # the largest live tensors the explanation lists
SHOWN_FRAMES = 4  # frames shown per tensor (the Python ones first)


class SnapshotCategory(Choice):
    """What a live tensor of a snapshot is, as its allocation's frames tell (coarser than the budget's categories:
    a stack cannot tell master weights from weights, nor an autocast copy from another temporary)."""

    WEIGHTS = "weights"  # allocated loading or moving the model (Module._apply / .to, from_pretrained, load_state_dict)
    GRADIENTS = "gradients"  # .grad accumulated by autograd (AccumulateGrad)
    OPTIMIZER_STATE = "optimizer state"  # created by an optimizer's _init_group (Adam moments, momentum buffers)
    ACTIVATIONS = "activations"  # allocated inside a forward (saved for backward unless freed)
    LOGITS = "logits"  # the loss's inputs and gradients: cross_entropy, log_softmax, transformers' loss_utils
    TEMPORARIES = "temporaries"  # backward's and the optimizer step's working tensors
    UNATTRIBUTED = "not attributed"  # no rule recognises the stack


SIMULATED_PREFIX = "oomlab-simulated/"  # the frames oomlab writes into a simulated snapshot: the category by file


def simulated_frame_file(category: SnapshotCategory) -> str:
    """The frame file name a snapshot oomlab writes gives a tensor of ``category`` (read back by :func:`categorize`)."""
    return SIMULATED_PREFIX + category.name.lower()


def _in(frames: tuple[SnapshotFrame, ...], file_part: str = "", names: tuple[str, ...] = ()) -> bool:
    return any(file_part in f.filename and (not names or any(n in f.name for n in names)) for f in frames)


# (category, what the rule looks for, the test), tried in order: the first that matches decides
FRAME_RULES: tuple[tuple[SnapshotCategory, str, Callable[[tuple[SnapshotFrame, ...]], bool]], ...] = (
    (SnapshotCategory.OPTIMIZER_STATE, "torch/optim/ _init_group (state created lazily by the first step)",
     lambda fs: _in(fs, "torch/optim/", ("_init_group",))),
    (SnapshotCategory.TEMPORARIES, "any other torch/optim/ frame (foreach / fused step temporaries)",
     lambda fs: _in(fs, "torch/optim/")),
    (SnapshotCategory.GRADIENTS, "autograd's AccumulateGrad (a parameter's .grad)",
     lambda fs: _in(fs, "", ("AccumulateGrad", "accumulate_grad", "accumulateGrad"))),
    (SnapshotCategory.LOGITS, "the loss: cross_entropy, log_softmax, transformers' loss_utils",
     lambda fs: _in(fs, "", ("cross_entropy", "log_softmax", "ForCausalLMLoss")) or _in(fs, "loss_utils.py")),
    (SnapshotCategory.TEMPORARIES, "autograd's backward (torch/autograd/, Tensor.backward)",
     lambda fs: _in(fs, "torch/autograd/") or _in(fs, "torch/_tensor.py", ("backward",))),
    (SnapshotCategory.WEIGHTS, "loading or moving the model (Module._apply / to / cuda, from_pretrained, "
     "load_state_dict, accelerate's set_module_tensor_to_device)",
     lambda fs: _in(fs, "torch/nn/modules/module.py", ("_apply", "to", "cuda", "load_state_dict", "_load_from"))
     or _in(fs, "", ("from_pretrained", "set_module_tensor_to_device", "_load_state_dict_into", "load_state_dict"))),
    (SnapshotCategory.ACTIVATIONS, "a forward (torch/nn/modules/, a model's forward, checkpoint's recomputation)",
     lambda fs: _in(fs, "torch/nn/modules/") or _in(fs, "torch/utils/checkpoint.py") or _in(fs, "", ("forward",))),
)


def categorize(frames: tuple[SnapshotFrame, ...]) -> SnapshotCategory:
    """The category of a tensor allocated under ``frames``: oomlab's own simulated frame names it; otherwise the
    first of :data:`FRAME_RULES` that matches, else :attr:`SnapshotCategory.UNATTRIBUTED`."""
    for f in frames:
        if f.filename.startswith(SIMULATED_PREFIX):
            key = f.filename[len(SIMULATED_PREFIX):].upper()
            if key in SnapshotCategory.__members__:
                return SnapshotCategory[key]
    for category, _, test in FRAME_RULES:
        if test(frames):
            return category
    return SnapshotCategory.UNATTRIBUTED


@dataclass(frozen=True)
class LiveTensor:
    """One allocation live at the moment explained."""

    address: int
    size_bytes: int  # requested
    block_bytes: int  # as the allocator counts it (the dump's block size, else the request rounded)
    category: SnapshotCategory
    frames: tuple[SnapshotFrame, ...]

    def shown_frames(self, limit: int = SHOWN_FRAMES) -> list[str]:
        """The first ``limit`` Python frames (innermost first), else the first frames of any kind."""
        python = [str(f) for f in self.frames if f.filename.endswith(".py") or f.filename.startswith(SIMULATED_PREFIX)]
        return (python or [str(f) for f in self.frames])[:limit]


@dataclass(frozen=True)
class SnapshotExplanation:
    """A snapshot read at one moment: the OOM (or the trace's peak, or the dump) of one device."""

    device: int
    moment: str  # "oom", "peak" or "dump": which moment is explained
    event_index: int | None  # the trace entry of that moment (None: the dump)
    oom_size_bytes: int | None  # the failed request (rounded), None without an OOM
    device_free_bytes: int | None  # what CUDA reported free at the OOM
    categories: Mapping[SnapshotCategory, int]  # live requested bytes by category
    reserved_bytes: int
    allocated_bytes: int
    largest_free_block_bytes: int
    live: tuple[LiveTensor, ...] = field(repr=False)  # largest first
    simulated_by: str | None = None  # a snapshot oomlab wrote: the setup it simulates

    @property
    def live_bytes(self) -> int:
        return sum(self.categories.values())

    @property
    def cached_free_bytes(self) -> int:
        """Reserved but not allocated: the allocator's cache (and rounding)."""
        return self.reserved_bytes - self.allocated_bytes

    @property
    def fragmented(self) -> bool | None:
        """At an OOM: the cache held enough for the request but no single block did (None without an OOM)."""
        if self.oom_size_bytes is None:
            return None
        return self.cached_free_bytes >= self.oom_size_bytes > self.largest_free_block_bytes

    def top_allocations(self, top: int = TOP_ALLOCATIONS) -> tuple[LiveTensor, ...]:
        return self.live[:top]

    def to_dict(self) -> dict[str, Any]:
        oom = None if self.oom_size_bytes is None else {"size_bytes": self.oom_size_bytes,
                                                        "device_free_bytes": self.device_free_bytes}
        return {
            "device": self.device, "moment": self.moment, "event_index": self.event_index, "oom": oom,
            "categories": {c.value: b for c, b in self.categories.items()},
            "live_bytes": self.live_bytes, "reserved_bytes": self.reserved_bytes,
            "allocated_bytes": self.allocated_bytes, "largest_free_block_bytes": self.largest_free_block_bytes,
            "fragmented": self.fragmented, "simulated_by": self.simulated_by,
            "top_allocations": [{"size_bytes": t.size_bytes, "address": t.address, "category": t.category.value,
                                 "frames": t.shown_frames()} for t in self.top_allocations()],
        }


# ------------------------------------------------------------------------------------------------------ replay


@dataclass
class _State:
    live: dict[int, tuple[int, int, tuple[SnapshotFrame, ...]]]  # address -> (requested, block bytes, frames)
    segments: dict[int, int]  # address -> size

    def undo(self, e: TraceEvent) -> None:
        if e.action == "alloc":
            self.live.pop(e.addr, None)
        elif e.action in FREED:
            self.live[e.addr] = (e.size, round_size(e.size), e.frames)
        elif e.action in ("segment_alloc", "segment_map"):
            self.segments.pop(e.addr, None)
        elif e.action in ("segment_free", "segment_unmap"):
            self.segments[e.addr] = e.size

    def apply(self, e: TraceEvent) -> None:
        if e.action == "alloc":
            self.live[e.addr] = (e.size, round_size(e.size), e.frames)
        elif e.action in FREED:
            self.live.pop(e.addr, None)
        elif e.action in ("segment_alloc", "segment_map"):
            self.segments[e.addr] = e.size
        elif e.action in ("segment_free", "segment_unmap"):
            self.segments.pop(e.addr, None)

    def live_bytes(self) -> int:
        return sum(v[0] for v in self.live.values())

    def live_bytes_of(self, e: TraceEvent) -> int:
        """The live bytes at ``e``'s address (0 when none is live there)."""
        held = self.live.get(e.addr) if e.addr is not None else None
        return 0 if held is None else held[0]


def _dump_state(snapshot: MemorySnapshot, device: int) -> _State:
    state = _State({}, {})
    for seg in snapshot.segments:
        if seg.device != device:
            continue
        state.segments[seg.address] = seg.total_size
        for b in seg.blocks:
            if b.active:
                state.live[b.address] = (b.requested_size, b.size, b.frames)
    return state


def _largest_gap(state: _State) -> int:
    """The largest free range inside a segment: what the allocator could hand out without a new segment."""
    starts = sorted(state.live)
    best = 0
    for base, size in state.segments.items():
        at, end = base, base + size
        i = bisect.bisect_left(starts, base)
        while i < len(starts) and starts[i] < end:
            best = max(best, starts[i] - at)
            at = max(at, starts[i] + state.live[starts[i]][1])
            i += 1
        best = max(best, end - at)
    return best


def _device(snapshot: MemorySnapshot, device: int | None) -> int:
    devices = snapshot.devices()
    if device is None:
        with_oom = [d for d in devices if d < len(snapshot.device_traces)
                    and any(e.action == "oom" for e in snapshot.device_traces[d])]
        return (with_oom or list(devices) or [0])[0]
    if device not in devices:
        raise SnapshotError(f"the snapshot has no device {device}; devices with a trace or a segment: "
                            f"{', '.join(map(str, devices)) or 'none'}")
    return device


def explain_snapshot(snapshot: MemorySnapshot | str | os.PathLike[str], device: int | None = None) -> \
        SnapshotExplanation:
    """``snapshot`` (a path, read by :func:`read_snapshot`) at its last OOM, else its trace's peak, else its dump;
    ``device``: which device's (None: the first with an OOM, else the first)."""
    if not isinstance(snapshot, MemorySnapshot):
        snapshot = read_snapshot(snapshot)
    device = _device(snapshot, device)
    trace = snapshot.device_traces[device] if device < len(snapshot.device_traces) else ()
    state = _dump_state(snapshot, device)
    oom_at = next((i for i in range(len(trace) - 1, -1, -1) if trace[i].action == "oom"), None)
    if not trace:
        moment, index = "dump", None
    else:
        for e in reversed(trace):  # back to the start of the trace
            state.undo(e)
        if oom_at is not None:
            moment, index = "oom", oom_at
        else:
            moment, index, replay = "peak", 0, _State(dict(state.live), dict(state.segments))
            best = now = replay.live_bytes()
            for i, e in enumerate(trace):
                before = replay.live_bytes_of(e)
                replay.apply(e)
                now += replay.live_bytes_of(e) - before
                if now > best:
                    best, index = now, i + 1
        for e in trace[:index]:
            state.apply(e)
    live = sorted((LiveTensor(addr, req, block, categorize(frames), frames)
                   for addr, (req, block, frames) in state.live.items()), key=lambda t: (-t.size_bytes, t.address))
    categories = {c: 0 for c in SnapshotCategory}
    for t in live:
        categories[t.category] += t.size_bytes
    oom = trace[oom_at] if oom_at is not None else None
    return SnapshotExplanation(
        device=device, moment=moment, event_index=index, oom_size_bytes=None if oom is None else oom.size,
        device_free_bytes=None if oom is None else oom.device_free,
        categories={c: b for c, b in categories.items() if b}, reserved_bytes=sum(state.segments.values()),
        allocated_bytes=sum(t.block_bytes for t in live), largest_free_block_bytes=_largest_gap(state),
        live=tuple(live), simulated_by=snapshot.simulated_by)


# ----------------------------------------------------------------------------------------------------- display


def fragmentation_sentence(e: SnapshotExplanation) -> str:
    """What the cache could and could not do for the failed request."""
    cached, largest = format_size(e.cached_free_bytes), format_size(e.largest_free_block_bytes)
    if e.oom_size_bytes is None:
        return f"{cached} reserved but not allocated; the largest free block in a segment is {largest}."
    need = format_size(e.oom_size_bytes)
    if e.fragmented:
        return (f"fragmentation: {cached} was cached but the largest free block was {largest}, less than the "
                f"{need} asked for; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets segments grow instead.")
    total = e.cached_free_bytes + (e.device_free_bytes or 0)
    if total < e.oom_size_bytes:
        return (f"not fragmentation: the cache ({cached}) and CUDA's free memory "
                f"({format_size(e.device_free_bytes or 0)}) together hold less than the {need} asked for; the step "
                "needs less memory, not a different allocator setting.")
    return (f"{cached} cached, the largest free block {largest}, {format_size(e.device_free_bytes or 0)} free in "
            f"CUDA, against {need} asked for (a new segment of the rounded size did not fit).")


def render_snapshot_explanation(e: SnapshotExplanation, top: int = TOP_ALLOCATIONS) -> str:
    """The explanation as text: the moment, live bytes by category, fragmentation, the largest live tensors."""
    if e.moment == "oom":
        head = (f"Device {e.device}: out of memory at trace entry {e.event_index}: {format_size(e.oom_size_bytes)} "
                f"requested, {format_size(e.device_free_bytes)} free in CUDA.")
    elif e.moment == "peak":
        head = f"Device {e.device}: no OOM in the trace; its peak of live memory, at trace entry {e.event_index}."
    else:
        head = f"Device {e.device}: no trace recorded; the segments at the dump."
    lines = [head]
    if e.simulated_by:
        lines.append(f"(a snapshot oomlab simulated: {e.simulated_by})")
    lines += [f"  live {format_size(e.live_bytes)}, allocated {format_size(e.allocated_bytes)}, reserved "
              f"{format_size(e.reserved_bytes)}", "", "Live memory by category (from the allocation frames):"]
    for c, b in sorted(e.categories.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {c.value:<16} {format_size(b):>12}")
    lines += ["", "Fragmentation: " + fragmentation_sentence(e), "", f"Largest live tensors (of {len(e.live)}):"]
    for t in e.top_allocations(top):
        lines.append(f"  {format_size(t.size_bytes):>12}  {t.category.value}")
        lines += [f"      {f}" for f in t.shown_frames()]
    return "\n".join(lines) + "\n"
