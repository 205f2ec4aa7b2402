"""A model of PyTorch's CUDA caching allocator (``c10/cuda/CUDACachingAllocator.cpp``, torch 2.0.x).

The rules are read from that file, single stream, no CUDA graphs:

* ``round_size``: requests are rounded up to a multiple of 512 bytes (``kMinBlockSize``).
* Pools: a rounded size ``<= 1 MiB`` (``kSmallSize``) is served from the small pool, anything larger
  from the large pool.
* ``get_allocation_size`` (the segment asked of ``cudaMalloc``, and the "Tried to allocate" figure of
  the OOM message): 2 MiB (``kSmallBuffer``) for small requests, 20 MiB (``kLargeBuffer``) for
  requests under 10 MiB (``kMinLargeAlloc``), else the size rounded up to 2 MiB (``kRoundLarge``).
* ``get_free_block``: best fit, the smallest cached free block of the pool that is big enough
  (with the ``max_split_size`` limits on oversize blocks).
* ``should_split``: a small-pool block is split when at least 512 bytes remain; a large-pool block
  when the request is under ``max_split_size`` and *more than* 1 MiB would remain.  Otherwise the
  whole block is handed out and counted as allocated.
* On failure: free cached oversize blocks, then release every fully free cached segment
  (``release_cached_blocks``) and retry once; only then raise.
* ``set_per_process_memory_fraction`` caps reserved memory (``allowed_memory_maximum``); device free
  memory is the capacity minus what other users of the GPU hold minus the reserved segments.

Statistics follow the allocator's ``DeviceStats``: ``allocated_bytes`` sums block sizes (rounded, and
whole unsplit blocks), ``reserved_bytes`` sums segments, ``requested_bytes`` sums the sizes asked for.
"""

from __future__ import annotations

import bisect
import enum
import itertools
from dataclasses import dataclass, field

from oomlab.core.choices import MessageFormat
from oomlab.core.choices import message_format as message_format_of
from oomlab.core.errors import InvalidValueError
from oomlab.core.units import MiB, format_size

K_MIN_BLOCK_SIZE = 512  # kMinBlockSize: all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 * MiB  # kSmallSize: largest "small" allocation
K_SMALL_BUFFER = 2 * MiB  # kSmallBuffer: "small" allocations are packed in 2 MiB blocks
K_LARGE_BUFFER = 20 * MiB  # kLargeBuffer: "large" allocations may be packed in 20 MiB blocks
K_MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: allocations between 1 and 10 MiB may use kLargeBuffer
K_ROUND_LARGE = 2 * MiB  # kRoundLarge: round up large allocations to 2 MiB

_OLD_HINT = (
    " If reserved memory is >> allocated memory try setting max_split_size_mb to avoid"
    " fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)
_NEW_HINT = (
    " If reserved but unallocated memory is large try setting"
    " PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for"
    " Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)


class Pool(enum.Enum):
    """Which of the allocator's two block pools serves a request."""

    SMALL = "small"  # requests of at most 1 MiB, carved from 2 MiB segments
    LARGE = "large"  # everything else, one or more blocks per segment


def round_size(size: int) -> int:
    """``round_size``: round a request up to a multiple of 512 bytes (at least 512).

    NB: ignores ``roundup_power2_divisions`` (off by default in PYTORCH_CUDA_ALLOC_CONF).
    """
    if size < 0:
        raise InvalidValueError(f"invalid allocation size {size}; sizes must be >= 0")
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def pool_for(rounded_size: int) -> Pool:
    """The pool a rounded request is served from (``size <= kSmallSize`` → small)."""
    return Pool.SMALL if rounded_size <= K_SMALL_SIZE else Pool.LARGE


def get_allocation_size(rounded_size: int) -> int:
    """``get_allocation_size``: the segment size asked of cudaMalloc for a (rounded) request."""
    if rounded_size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if rounded_size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((rounded_size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


def should_split(block_size: int, rounded_size: int, pool: Pool, max_split_size: int | None = None) -> bool:
    """``should_split``: whether the rest of a block is split off as a new free block."""
    remaining = block_size - rounded_size
    if pool is Pool.SMALL:
        return remaining >= K_MIN_BLOCK_SIZE
    limit = max_split_size if max_split_size is not None else float("inf")
    return rounded_size < limit and remaining > K_SMALL_SIZE


@dataclass
class Block:
    """A range of a segment: allocated or cached-free."""

    segment: int  # id of the cudaMalloc'd segment it belongs to
    offset: int  # byte offset inside the segment
    size: int  # bytes (rounded)
    pool: Pool
    allocated: bool = False
    requested: int = 0  # bytes the caller asked for (0 when free)
    prev: Block | None = field(default=None, repr=False)
    next: Block | None = field(default=None, repr=False)

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def key(self) -> tuple[int, int, int]:
        # The allocator's BlockComparator: (stream, size, address); one stream here.
        return (self.size, self.segment, self.offset)


@dataclass(frozen=True)
class AllocatorStats:
    """A snapshot of the allocator's aggregate statistics, in bytes."""

    allocated_bytes: int  # memory_allocated(): sum of allocated block sizes
    reserved_bytes: int  # memory_reserved(): sum of segment sizes
    requested_bytes: int  # sum of the sizes callers asked for (before rounding)
    active_bytes: int  # same as allocated here (no streams)
    inactive_split_bytes: int  # free blocks inside segments that are partly in use
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    num_segments: int
    num_alloc_retries: int
    num_ooms: int

    @property
    def fragmentation_bytes(self) -> int:
        """Reserved but not allocated (cached) bytes."""
        return self.reserved_bytes - self.allocated_bytes


@dataclass(frozen=True)
class OOMSnapshot:
    """Everything the allocator prints when it gives up: the figures of the OOM message."""

    tried_bytes: int  # the cudaMalloc request (get_allocation_size), not the tensor
    request_bytes: int  # the tensor's own size in bytes
    device_index: int
    total_bytes: int  # device capacity
    free_bytes: int  # cudaMemGetInfo free at the failure
    allocated_bytes: int
    reserved_bytes: int
    allowed_bytes: int | None  # set_per_process_memory_fraction cap, if any
    outside_pytorch_bytes: int  # memory held on the GPU outside this allocator

    @property
    def in_use_bytes(self) -> int:
        """What the torch >= 2.1 message calls this process's memory in use (total - free)."""
        return self.total_bytes - self.free_bytes


class SimulatedOutOfMemory(Exception):
    """The allocator model could not serve a request; carries the message's figures."""

    def __init__(self, snapshot: OOMSnapshot, message: str) -> None:
        super().__init__(message)
        self.snapshot = snapshot
        self.message = message


def render_oom_message(snap: OOMSnapshot, fmt: str | MessageFormat = MessageFormat.OLD) -> str:
    """The ``CUDA out of memory`` message PyTorch prints, in the ≤2.0 or the ≥2.1 format."""
    allowed = f"{format_size(snap.allowed_bytes)} allowed; " if snap.allowed_bytes is not None else ""
    if message_format_of(fmt) is MessageFormat.OLD:
        return (
            f"CUDA out of memory. Tried to allocate {format_size(snap.tried_bytes)} "
            f"(GPU {snap.device_index}; {format_size(snap.total_bytes)} total capacity; "
            f"{format_size(snap.allocated_bytes)} already allocated; {format_size(snap.free_bytes)} free; "
            f"{allowed}{format_size(snap.reserved_bytes)} reserved in total by PyTorch)" + _OLD_HINT
        )
    return (
        f"CUDA out of memory. Tried to allocate {format_size(snap.tried_bytes)}. "
        f"GPU {snap.device_index} has a total capacity of {format_size(snap.total_bytes)} of which "
        f"{format_size(snap.free_bytes)} is free. Including non-PyTorch memory, this process has "
        f"{format_size(snap.in_use_bytes)} memory in use. {allowed}Of the allocated memory "
        f"{format_size(snap.allocated_bytes)} is allocated by PyTorch, and "
        f"{format_size(snap.reserved_bytes - snap.allocated_bytes)} is reserved by PyTorch but "
        f"unallocated." + _NEW_HINT
    )


class CachingAllocator:
    """One device's caching allocator, on a GPU of ``capacity_bytes`` shared with ``outside_bytes``.

    ``malloc`` returns a handle; ``free`` returns the block to the cache.  Failures raise
    :class:`SimulatedOutOfMemory` with the OOM message PyTorch would print.
    """

    def __init__(
        self,
        capacity_bytes: int,
        outside_bytes: int = 0,
        *,
        device_index: int = 0,
        memory_fraction: float | None = None,
        max_split_size: int | None = None,
        message_format: str | MessageFormat = MessageFormat.OLD,
    ) -> None:
        if capacity_bytes <= 0:
            raise InvalidValueError(f"invalid capacity {capacity_bytes}; must be > 0 bytes")
        if not 0 <= outside_bytes <= capacity_bytes:
            raise InvalidValueError(
                f"invalid memory outside PyTorch {outside_bytes}; must be between 0 and the capacity "
                f"{capacity_bytes} bytes"
            )
        if memory_fraction is not None and not 0.0 < memory_fraction <= 1.0:
            raise InvalidValueError(f"invalid memory fraction {memory_fraction}; must be in (0, 1]")
        self.capacity_bytes = capacity_bytes
        self.outside_bytes = outside_bytes
        self.device_index = device_index
        self.max_split_size = max_split_size
        self.message_format = message_format_of(message_format)
        # allowed_memory_maximum = total * fraction (size_t truncation)
        self.allowed_bytes = None if memory_fraction is None else int(capacity_bytes * memory_fraction)
        self._free: dict[Pool, list[tuple[tuple[int, int, int], Block]]] = {Pool.SMALL: [], Pool.LARGE: []}
        self._segments: dict[int, tuple[int, Pool]] = {}  # id -> (size, pool)
        self._live: dict[int, Block] = {}
        self._ids = itertools.count()
        self._segment_ids = itertools.count()
        self._allocated = 0
        self._reserved = 0
        self._requested = 0
        self._peak_allocated = 0
        self._peak_reserved = 0
        self._retries = 0
        self._ooms = 0

    # ------------------------------------------------------------------------------------ queries

    @property
    def reserved_bytes(self) -> int:
        return self._reserved

    @property
    def allocated_bytes(self) -> int:
        return self._allocated

    def segments(self) -> dict[int, tuple[int, Pool]]:
        """Every segment cudaMalloc'd: id -> (size, pool) (a copy)."""
        return dict(self._segments)

    def live_blocks(self) -> dict[int, Block]:
        """Every allocated block by its handle (a copy of the mapping; blocks are the allocator's own)."""
        return dict(self._live)

    def free_blocks(self) -> list[Block]:
        """Every cached free block, both pools."""
        return [b for pool in self._free.values() for _, b in pool]

    @property
    def free_device_bytes(self) -> int:
        """What cudaMemGetInfo would report free on the device."""
        return self.capacity_bytes - self.outside_bytes - self.reserved_bytes

    def stats(self) -> AllocatorStats:
        reserved = self.reserved_bytes
        fully_free_segments = self._fully_free_segments()
        cached = sum(b.size for pool in self._free.values() for _, b in pool)
        inactive_split = cached - sum(self._segments[s][0] for s in fully_free_segments)
        return AllocatorStats(
            allocated_bytes=self._allocated,
            reserved_bytes=reserved,
            requested_bytes=self._requested,
            active_bytes=self._allocated,
            inactive_split_bytes=inactive_split,
            peak_allocated_bytes=self._peak_allocated,
            peak_reserved_bytes=self._peak_reserved,
            num_segments=len(self._segments),
            num_alloc_retries=self._retries,
            num_ooms=self._ooms,
        )

    # ------------------------------------------------------------------------------------ malloc

    def malloc(self, size: int) -> int:
        """Allocate ``size`` bytes; returns a handle for :meth:`free`."""
        if size < 0:
            raise InvalidValueError(f"invalid allocation size {size}; sizes must be >= 0")
        rounded = round_size(size)
        pool = pool_for(rounded)
        alloc_size = get_allocation_size(rounded)
        block = self._get_free_block(pool, rounded)
        if block is None:
            block = self._alloc_block(pool, alloc_size)
        if block is None:
            # release_available_cached_blocks / release_cached_blocks, then one more try
            self._retries += 1
            self._release_cached_blocks()
            block = self._alloc_block(pool, alloc_size)
        if block is None:
            self._ooms += 1
            snap = OOMSnapshot(
                tried_bytes=alloc_size,
                request_bytes=size,
                device_index=self.device_index,
                total_bytes=self.capacity_bytes,
                free_bytes=self.free_device_bytes,
                allocated_bytes=self._allocated,
                reserved_bytes=self.reserved_bytes,
                allowed_bytes=self.allowed_bytes,
                outside_pytorch_bytes=self.outside_bytes,
            )
            raise SimulatedOutOfMemory(snap, render_oom_message(snap, self.message_format))

        if should_split(block.size, rounded, pool, self.max_split_size):
            rest = Block(block.segment, block.offset + rounded, block.size - rounded, pool)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = rounded
            self._insert_free(rest)
        block.allocated = True
        block.requested = size
        handle = next(self._ids)
        self._live[handle] = block
        self._allocated += block.size
        self._requested += size
        self._peak_allocated = max(self._peak_allocated, self._allocated)
        return handle

    def free(self, handle: int) -> None:
        """Return a block to the cache, merging it with free neighbours in its segment."""
        try:
            block = self._live.pop(handle)
        except KeyError as err:
            raise InvalidValueError(f"unknown or already freed allocation handle {handle}") from err
        self._allocated -= block.size
        self._requested -= block.requested
        block.allocated = False
        block.requested = 0
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._remove_free(neighbour)
                if neighbour is block.prev:
                    block.offset = neighbour.offset
                    block.prev = neighbour.prev
                    if neighbour.prev is not None:
                        neighbour.prev.next = block
                else:
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
                block.size += neighbour.size
        self._insert_free(block)

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: release every fully free segment."""
        self._release_cached_blocks()

    # ---------------------------------------------------------------------------------- internals

    def _insert_free(self, block: Block) -> None:
        bisect.insort(self._free[block.pool], (block.key(), block))

    def _remove_free(self, block: Block) -> None:
        pool = self._free[block.pool]
        j = bisect.bisect_left(pool, (block.key(),))
        if j < len(pool) and pool[j][1] is block:
            del pool[j]

    def _get_free_block(self, pool: Pool, rounded: int) -> Block | None:
        blocks = self._free[pool]
        i = bisect.bisect_left(blocks, ((rounded, -1, -1),))
        if i == len(blocks):
            return None
        block = blocks[i][1]
        limit = self.max_split_size
        if limit is not None:
            # Do not return an oversize block for a small request, nor a far too big one.
            if rounded < limit <= block.size:
                return None
            if rounded >= limit and block.size >= rounded + K_LARGE_BUFFER:
                return None
        del blocks[i]
        return block

    def _alloc_block(self, pool: Pool, alloc_size: int) -> Block | None:
        if self.allowed_bytes is not None and self.reserved_bytes + alloc_size > self.allowed_bytes:
            return None
        if alloc_size > self.free_device_bytes:
            return None
        segment = next(self._segment_ids)
        self._segments[segment] = (alloc_size, pool)
        self._reserved += alloc_size
        self._peak_reserved = max(self._peak_reserved, self.reserved_bytes)
        return Block(segment, 0, alloc_size, pool)

    def _fully_free_segments(self) -> list[int]:
        return [
            b.segment for pool in self._free.values() for _, b in pool if not b.is_split
        ]

    def _release_cached_blocks(self) -> None:
        for pool in self._free.values():
            keep = [(k, b) for k, b in pool if b.is_split]
            for _, b in pool:
                if not b.is_split:
                    self._reserved -= self._segments.pop(b.segment)[0]
            pool[:] = keep
