"""What "Tried to allocate" means: the segment asked of cudaMalloc, so a range of request (tensor) sizes."""

from __future__ import annotations

import math

from oomlab.explanation.printed import PrintedSize
from oomlab.reproduction.allocator import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    get_allocation_size,
    round_size,
)


def request_range(tried: PrintedSize) -> tuple[tuple[int, int], ...]:
    """Request sizes (bytes, inclusive intervals) whose cudaMalloc segment prints as ``tried``.

    ``get_allocation_size``: a rounded request ≤ 1 MiB gets a 2 MiB segment, one under 10 MiB a
    20 MiB segment, a larger one its size rounded up to 2 MiB — so a printed X ≥ 10 MiB means a
    request in (X − 2 MiB, X].  "20.00 MiB" is two ranges: (1 MiB, 10 MiB) and (18 MiB, 20 MiB].
    An interval that holds no segment size at all (torch before 1.5 printed the request itself) is
    returned as is.
    """
    low, high = tried.low_bytes, tried.high_bytes
    ranges: list[tuple[int, int]] = []
    if low <= K_SMALL_BUFFER <= high:
        ranges.append((1, K_SMALL_SIZE))
    if low <= K_LARGE_BUFFER <= high:
        ranges.append((K_SMALL_SIZE + 1, K_MIN_LARGE_ALLOC - K_MIN_BLOCK_SIZE))
    first = max(K_ROUND_LARGE * math.ceil(max(low, K_MIN_LARGE_ALLOC) / K_ROUND_LARGE), K_MIN_LARGE_ALLOC)
    last = K_ROUND_LARGE * (high // K_ROUND_LARGE)
    if first <= last:
        ranges.append((max(first - K_ROUND_LARGE, K_MIN_LARGE_ALLOC - K_MIN_BLOCK_SIZE) + 1, last))
    ranges.sort()
    merged: list[tuple[int, int]] = []
    for r in ranges:
        if merged and r[0] <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], r[1]))
        else:
            merged.append(r)
    return tuple(merged) if merged else ((low, high),)


def is_segment_interval(tried: PrintedSize) -> bool:
    """Whether some size get_allocation_size can return prints as ``tried``."""
    low, high = tried.low_bytes, tried.high_bytes
    if low <= K_SMALL_BUFFER <= high or low <= K_LARGE_BUFFER <= high:
        return True
    first = K_ROUND_LARGE * math.ceil(max(low, K_MIN_LARGE_ALLOC) / K_ROUND_LARGE)
    return first <= high


def segment_bytes(nbytes: int) -> int:
    return get_allocation_size(round_size(nbytes))
