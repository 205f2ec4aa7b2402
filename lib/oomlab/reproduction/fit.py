"""Where ``model.to("cuda")`` fails, as a function of the memory held outside PyTorch: exactly, for every value.

``Module._apply`` only allocates, so until capacity binds the allocator's state does not depend on the memory
outside PyTorch: the walk against a finite device is the unlimited walk, cut at the first copy that needs a new
segment (``cudaMalloc``) larger than what is left. (Nothing can be released on the retry either: every cached block
is the tail of a segment split for a live tensor.) The failure at each segment-creating copy ``k`` therefore happens
for exactly the outside bytes ``X`` with ``R[k-1] + segment[k] > capacity - X >= R[k-1]`` (``R``: reserved), an
interval, and these intervals tile ``[0, capacity]``. :func:`failure_points` lists them from one unlimited walk;
:func:`matching_outside` keeps the outside bytes whose message prints chosen figures as torch formats them. That is
the scan at one-byte granularity, without one walk per value; the tests check it against the allocator itself at
the interval ends.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from oomlab.core.errors import InvalidValueError
from oomlab.core.seed import SeedFigures
from oomlab.core.size_ranges import format_interval, printed_interval
from oomlab.core.units import format_size
from oomlab.reproduction.walk import WalkStep

__all__ = ["FailurePoint", "Figure", "OutsideInterval", "failure_at", "failure_points", "matching_outside",
           "seed_text"]


class Figure(enum.Enum):
    """A figure of the torch <= 2.0 OOM message, named as the message labels it."""

    TRIED = "Tried to allocate"  # the segment asked of cudaMalloc
    TOTAL = "total capacity"  # the device's memory
    ALLOCATED = "already allocated"  # the allocator's allocated bytes
    FREE = "free"  # cudaMemGetInfo's free bytes
    RESERVED = "reserved in total by PyTorch"  # the allocator's segments


@dataclass(frozen=True)
class FailurePoint:
    """One copy of the walk that can fail (it needs a new segment), and the outside bytes for which it does."""

    index: int  # the copy's position in the walk
    name: str  # the tensor, e.g. "model.layers.23.mlp.gate_proj.weight"
    tried_bytes: int  # the segment it asks for
    allocated_bytes: int  # allocated before the copy: what the message prints
    reserved_bytes: int  # reserved before the copy
    capacity_bytes: int
    outside_low_bytes: int  # smallest outside memory for which this copy fails
    outside_high_bytes: int  # largest: the copy is reached (with less outside memory it fits)

    def free_bytes(self, outside_bytes: int) -> int:
        """Device free memory at the failure with ``outside_bytes`` held outside PyTorch."""
        return self.capacity_bytes - outside_bytes - self.reserved_bytes

    def printed(self, figure: Figure, outside_bytes: int | None = None) -> str:
        """The figure as torch prints it (``FREE`` needs the outside memory)."""
        if figure is Figure.FREE:
            if outside_bytes is None:
                raise InvalidValueError("the free figure depends on the memory outside PyTorch; pass outside_bytes")
            return format_size(self.free_bytes(outside_bytes))
        return format_size({Figure.TRIED: self.tried_bytes, Figure.TOTAL: self.capacity_bytes,
                            Figure.ALLOCATED: self.allocated_bytes, Figure.RESERVED: self.reserved_bytes}[figure])

    def outside_for_free(self, printed_free: str) -> tuple[int, int] | None:
        """The outside bytes within this point's interval for which ``free`` prints as ``printed_free``."""
        low, high = printed_interval(printed_free)
        lo = max(self.outside_low_bytes, self.capacity_bytes - self.reserved_bytes - high)
        hi = min(self.outside_high_bytes, self.capacity_bytes - self.reserved_bytes - low)
        return (lo, hi) if lo <= hi else None


@dataclass(frozen=True)
class OutsideInterval:
    """Outside-PyTorch bytes ``[low, high]`` (both included) and the failure points they cover."""

    low_bytes: int
    high_bytes: int
    points: tuple[FailurePoint, ...]

    @property
    def width_bytes(self) -> int:
        return self.high_bytes - self.low_bytes + 1

    def __contains__(self, outside_bytes: object) -> bool:
        return isinstance(outside_bytes, int) and self.low_bytes <= outside_bytes <= self.high_bytes

    @property
    def printed(self) -> str:
        """``"465.81 MiB – 601.81 MiB"``."""
        return format_interval((self.low_bytes, self.high_bytes))


def failure_points(steps: Sequence[WalkStep], capacity_bytes: int) -> tuple[FailurePoint, ...]:
    """Every copy of an unlimited walk that can fail on a device of ``capacity_bytes``, with its outside interval.

    Outside memory from ``0`` to ``capacity_bytes`` is covered once: values above the first point's interval do not
    occur (the first copy needs a segment), values below the last point's interval let the whole walk succeed.
    """
    if capacity_bytes <= 0:
        raise InvalidValueError(f"invalid capacity {capacity_bytes}; must be > 0 bytes")
    points = []
    allocated = reserved = 0
    for step in steps:
        if step.reserved_bytes > reserved:  # this copy needed a new segment
            tried = step.reserved_bytes - reserved
            high = capacity_bytes - reserved
            if high < 0:
                break
            points.append(FailurePoint(step.index, step.name, tried, allocated, reserved, capacity_bytes,
                                       max(0, capacity_bytes - step.reserved_bytes + 1), min(high, capacity_bytes)))
        allocated, reserved = step.allocated_bytes, step.reserved_bytes
    return tuple(points)


def failure_at(points: Sequence[FailurePoint], outside_bytes: int) -> FailurePoint | None:
    """The copy that fails with ``outside_bytes`` held outside PyTorch (``None``: the walk succeeds)."""
    lows = [-p.outside_low_bytes for p in points]  # the intervals descend along the walk; negated, they ascend
    i = bisect.bisect_left(lows, -outside_bytes)  # the first point whose interval starts at or below outside_bytes
    if i < len(points) and outside_bytes <= points[i].outside_high_bytes:
        return points[i]
    return None


def seed_text(figures: SeedFigures, figure: Figure) -> str:
    """A figure of the seed message as printed."""
    return {Figure.TRIED: figures.tried, Figure.TOTAL: figures.total, Figure.ALLOCATED: figures.allocated,
            Figure.FREE: figures.free, Figure.RESERVED: figures.reserved}[figure]


def matching_outside(points: Sequence[FailurePoint], figures: SeedFigures,
                     which: Iterable[Figure] = (Figure.TRIED, Figure.ALLOCATED, Figure.RESERVED)
                     ) -> tuple[OutsideInterval, ...]:
    """The outside-PyTorch bytes for which the failure prints every figure in ``which`` as the seed does.

    Adjacent matching points merge into one interval. ``FREE`` narrows each point to the bytes whose free memory
    prints as the seed's; ``TOTAL`` keeps everything or nothing.
    """
    wanted = tuple(which)
    pieces: list[tuple[int, int, FailurePoint]] = []
    for p in points:
        if any(p.printed(f) != seed_text(figures, f) for f in wanted if f is not Figure.FREE):
            continue
        span = p.outside_for_free(figures.free) if Figure.FREE in wanted else (p.outside_low_bytes,
                                                                                 p.outside_high_bytes)
        if span is not None:
            pieces.append((*span, p))
    pieces.sort(key=lambda piece: piece[0])
    merged: list[OutsideInterval] = []
    for low, high, p in pieces:
        if merged and low <= merged[-1].high_bytes + 1:
            last = merged.pop()
            merged.append(OutsideInterval(last.low_bytes, max(high, last.high_bytes), (*last.points, p)))
        else:
            merged.append(OutsideInterval(low, high, (p,)))
    return tuple(merged)
