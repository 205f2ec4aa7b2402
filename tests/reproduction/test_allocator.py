"""The caching-allocator model follows c10/cuda/CUDACachingAllocator.cpp (torch 2.0.x)."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.units import GiB, MiB
from oomlab.reproduction.allocator import (
    CachingAllocator,
    OOMSnapshot,
    Pool,
    SimulatedOutOfMemory,
    get_allocation_size,
    pool_for,
    render_oom_message,
    round_size,
    should_split,
)


@pytest.mark.parametrize(
    ("size", "rounded"),
    [(0, 512), (1, 512), (512, 512), (513, 1024), (10240, 10240), (141557760, 141557760), (141557761, 141558272)],
)
def test_round_size(size: int, rounded: int) -> None:
    """Requests round up to 512-byte multiples, at least 512."""
    assert round_size(size) == rounded


@pytest.mark.parametrize(
    ("rounded", "segment"),
    [
        (512, 2 * MiB),  # small pool: 2 MiB segments
        (MiB, 2 * MiB),  # exactly 1 MiB is still small
        (MiB + 512, 20 * MiB),  # 1-10 MiB: a 20 MiB segment
        (10 * MiB - 512, 20 * MiB),
        (10 * MiB, 10 * MiB),  # from 10 MiB: rounded up to 2 MiB
        (50 * MiB, 50 * MiB),  # a 5120 x 5120 fp16 projection: exact
        (141557760, 136 * MiB),  # the seed's 135 MiB tensor asks for 136 MiB
        (327680000, 314 * MiB),  # llama-13b's fp16 embedding (312.5 MiB)
    ],
)
def test_get_allocation_size(rounded: int, segment: int) -> None:
    """The segment asked of cudaMalloc ("Tried to allocate")."""
    assert get_allocation_size(rounded) == segment


@pytest.mark.parametrize(
    ("block", "size", "pool", "split"),
    [
        (2 * MiB, 512, Pool.SMALL, True),  # small pool splits when >= 512 bytes remain
        (1024, 512, Pool.SMALL, True),
        (1024, 1024, Pool.SMALL, False),
        (136 * MiB, 135 * MiB, Pool.LARGE, False),  # exactly 1 MiB left: not split (needs > 1 MiB)
        (314 * MiB, 312.5 * MiB, Pool.LARGE, True),  # 1.5 MiB left: split
        (20 * MiB, 2 * MiB, Pool.LARGE, True),
    ],
)
def test_should_split(block: int, size: float, pool: Pool, split: bool) -> None:
    """Small blocks split at >= 512 B remaining, large ones at > 1 MiB."""
    assert should_split(block, int(size), pool) is split


def test_should_split_respects_max_split_size() -> None:
    """Requests at or above max_split_size are never split."""
    assert should_split(100 * MiB, 40 * MiB, Pool.LARGE, max_split_size=32 * MiB) is False


def test_pool_for_boundary() -> None:
    """1 MiB is the last small request."""
    assert pool_for(MiB) is Pool.SMALL and pool_for(MiB + 512) is Pool.LARGE


def test_unsplit_block_counts_whole_as_allocated() -> None:
    """A 135 MiB tensor in a 136 MiB segment counts 136 MiB allocated: the 1 MiB rest is not split off."""
    alloc = CachingAllocator(16 * GiB)
    alloc.malloc(141557760)
    stats = alloc.stats()
    assert (stats.allocated_bytes, stats.reserved_bytes, stats.requested_bytes) == (136 * MiB, 136 * MiB, 141557760)


def test_split_block_leaves_cached_remainder() -> None:
    """The 312.5 MiB embedding splits its 314 MiB segment; 1.5 MiB stays cached."""
    alloc = CachingAllocator(16 * GiB)
    alloc.malloc(327680000)
    stats = alloc.stats()
    assert stats.allocated_bytes == 327680000
    assert stats.reserved_bytes == 314 * MiB
    assert stats.inactive_split_bytes == 314 * MiB - 327680000


def test_small_requests_share_a_2mib_segment() -> None:
    """Two 1 MiB requests fill one small segment; a third opens another."""
    alloc = CachingAllocator(16 * GiB)
    for _ in range(2):
        alloc.malloc(MiB)
    assert alloc.reserved_bytes == 2 * MiB
    alloc.malloc(MiB)
    assert alloc.reserved_bytes == 4 * MiB


def test_freed_block_is_reused_best_fit() -> None:
    """A freed block serves the next request that fits, without a new segment."""
    alloc = CachingAllocator(16 * GiB)
    a = alloc.malloc(50 * MiB)
    alloc.malloc(100 * MiB)
    alloc.free(a)
    alloc.malloc(40 * MiB)
    assert alloc.reserved_bytes == 150 * MiB
    assert alloc.allocated_bytes == 140 * MiB


def test_oom_releases_cached_segments_then_retries() -> None:
    """Before raising, the allocator frees unused cached segments and tries again."""
    alloc = CachingAllocator(100 * MiB)
    a = alloc.malloc(60 * MiB)
    alloc.free(a)  # 60 MiB cached, 40 MiB free on the device
    alloc.malloc(80 * MiB)
    stats = alloc.stats()
    assert stats.reserved_bytes == 80 * MiB and stats.num_alloc_retries == 1


def test_oom_message_figures() -> None:
    """The raised message carries the segment size and the statistics at the failure."""
    alloc = CachingAllocator(1 * GiB, outside_bytes=100 * MiB)
    alloc.malloc(800 * MiB)
    with pytest.raises(SimulatedOutOfMemory) as info:
        alloc.malloc(135 * MiB)
    snap = info.value.snapshot
    assert (snap.tried_bytes, snap.free_bytes, snap.reserved_bytes) == (136 * MiB, 124 * MiB, 800 * MiB)
    assert info.value.message.startswith(
        "CUDA out of memory. Tried to allocate 136.00 MiB (GPU 0; 1024.00 MiB total capacity; "
        "800.00 MiB already allocated; 124.00 MiB free; 800.00 MiB reserved in total by PyTorch)"
    )


def test_memory_fraction_caps_reserved_and_is_printed() -> None:
    """set_per_process_memory_fraction: reserved may not pass the cap; the old message says 'allowed'."""
    alloc = CachingAllocator(1 * GiB, memory_fraction=0.5)
    with pytest.raises(SimulatedOutOfMemory, match=r"512.00 MiB allowed; 0 bytes reserved"):
        alloc.malloc(600 * MiB)


SNAP = OOMSnapshot(
    tried_bytes=136 * MiB, request_bytes=135 * MiB, device_index=0, total_bytes=15835398144,
    free_bytes=42792387, allocated_bytes=15201153024, reserved_bytes=15204352000, allowed_bytes=None,
    outside_pytorch_bytes=588253757,
)


def test_render_old_format_is_the_seeds() -> None:
    """torch<=2.0 format, word for word."""
    assert render_oom_message(SNAP, "torch<=2.0") == (
        "CUDA out of memory. Tried to allocate 136.00 MiB (GPU 0; 14.75 GiB total capacity; 14.16 GiB already "
        "allocated; 40.81 MiB free; 14.16 GiB reserved in total by PyTorch) If reserved memory is >> allocated "
        "memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management "
        "and PYTORCH_CUDA_ALLOC_CONF"
    )


def test_render_new_format() -> None:
    """torch>=2.1 format: total/free first, then process use, allocated and reserved-but-unallocated."""
    text = render_oom_message(SNAP, "torch>=2.1")
    assert text.startswith(
        "CUDA out of memory. Tried to allocate 136.00 MiB. GPU 0 has a total capacity of 14.75 GiB of which "
        "40.81 MiB is free. Including non-PyTorch memory, this process has 14.71 GiB memory in use. Of the "
        "allocated memory 14.16 GiB is allocated by PyTorch, and 3.05 MiB is reserved by PyTorch but unallocated."
    )


def test_render_unknown_format() -> None:
    """An unknown format lists the known ones."""
    expected = r"unknown message format 'torch3'; known: new, old, torch<=2.0, torch>=2.1"
    with pytest.raises(UnknownNameError, match=expected):
        render_oom_message(SNAP, "torch3")


def test_invalid_outside_memory() -> None:
    """Memory outside PyTorch must fit in the GPU."""
    with pytest.raises(InvalidValueError, match="invalid memory outside PyTorch"):
        CachingAllocator(GiB, outside_bytes=2 * GiB)


def test_double_free_is_an_error() -> None:
    """Freeing a handle twice names the handle."""
    alloc = CachingAllocator(GiB)
    h = alloc.malloc(10)
    alloc.free(h)
    with pytest.raises(InvalidValueError, match=f"unknown or already freed allocation handle {h}"):
        alloc.free(h)


sizes = st.integers(min_value=0, max_value=64 * MiB)
ops = st.lists(st.tuples(st.booleans(), sizes, st.integers(min_value=0, max_value=1000)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_statistics_invariants(operations: list[tuple[bool, int, int]]) -> None:
    """requested <= allocated <= reserved; segments are whole 2 MiB units; freeing all returns to zero."""
    alloc = CachingAllocator(512 * MiB, outside_bytes=3 * MiB)
    live: list[int] = []
    for is_malloc, size, pick in operations:
        if is_malloc or not live:
            try:
                live.append(alloc.malloc(size))
            except SimulatedOutOfMemory as oom:
                assert oom.snapshot.tried_bytes > oom.snapshot.free_bytes
                assert re.search(r"Tried to allocate [\d.]+ [KMG]iB", oom.message)
        else:
            alloc.free(live.pop(pick % len(live)))
        stats = alloc.stats()
        assert stats.requested_bytes <= stats.allocated_bytes <= stats.reserved_bytes
        assert stats.reserved_bytes % (2 * MiB) == 0
        assert stats.reserved_bytes <= 512 * MiB - 3 * MiB
        assert stats.inactive_split_bytes >= 0
    for handle in live:
        alloc.free(handle)
    assert alloc.stats().allocated_bytes == 0
    alloc.empty_cache()
    assert alloc.reserved_bytes == 0


@given(st.integers(min_value=0, max_value=1 << 40))
def test_rounding_invariants(size: int) -> None:
    """round_size and get_allocation_size only ever round up, by less than one unit."""
    rounded = round_size(size)
    assert rounded >= size and rounded % 512 == 0 and rounded - size < 512 + (size == 0) * 512
    segment = get_allocation_size(rounded)
    assert segment >= rounded and segment % (2 * MiB) == 0
    if rounded >= 10 * MiB:
        assert segment - rounded < 2 * MiB
