"""The failure as a function of the memory outside PyTorch: exact intervals, checked against the allocator itself."""

import pytest

from oomlab.core.dtypes import load_dtype
from oomlab.core.errors import InvalidValueError
from oomlab.core.gpus import load_gpu
from oomlab.core.models import load_model
from oomlab.core.seed import seed_figures
from oomlab.core.units import GiB, MiB, format_size
from oomlab.reproduction.allocator import CachingAllocator, get_allocation_size, round_size
from oomlab.reproduction.fit import Figure, failure_at, failure_points, matching_outside
from oomlab.reproduction.outside import seed_outside_bytes
from oomlab.reproduction.traced_walk import walk_apply
from oomlab.reproduction.walk import unlimited_walk

T4 = load_gpu("t4").total_memory_bytes
SEED_LOW, SEED_HIGH = 488_439_809, 631_046_144  # outside bytes reproducing tried, allocated and reserved


@pytest.fixture(scope="module")
def points():
    return failure_points(unlimited_walk("llama-13b", "float16"), T4)


def real_failure(outside_bytes: int, capacity: int = T4) -> tuple[str, ...] | None:
    """(failing tensor, tried, allocated, reserved, free) as printed, from the allocator model's own walk."""
    allocator = CachingAllocator(capacity, outside_bytes)
    mode, _, error = walk_apply(load_model("llama-13b"), load_dtype("float16"), allocator)
    if error is None:
        return None
    name, _, _, _, nbytes = mode.failure
    return (name, format_size(get_allocation_size(round_size(nbytes))), format_size(allocator.allocated_bytes),
            format_size(allocator.reserved_bytes), format_size(allocator.free_device_bytes))


def predicted(points, outside_bytes: int) -> tuple[str, ...] | None:
    p = failure_at(points, outside_bytes)
    if p is None:
        return None
    return (p.name, *(p.printed(f, outside_bytes) for f in (Figure.TRIED, Figure.ALLOCATED, Figure.RESERVED,
                                                            Figure.FREE)))


def test_seed_range_is_one_interval_of_136_mib(points) -> None:
    """Tried, allocated and reserved print as the seed's for 465.81 – 601.81 MiB outside PyTorch, one 136 MiB span."""
    (interval,) = matching_outside(points, seed_figures())
    assert (interval.low_bytes, interval.high_bytes) == (SEED_LOW, SEED_HIGH)
    assert interval.printed == "465.81 MiB – 601.81 MiB"
    assert interval.width_bytes == 136 * MiB
    assert [p.name for p in interval.points] == ["model.layers.23.mlp.gate_proj.weight"]


def test_range_contains_the_value_derived_from_the_free_figure(points) -> None:
    """The reproduction's 561.00 MiB (total - reserved - free) lies inside, and so does the five-figure window."""
    (interval,) = matching_outside(points, seed_figures())
    assert seed_outside_bytes() in interval
    (window,) = matching_outside(points, seed_figures(), tuple(Figure))
    assert seed_outside_bytes() in window and window.printed == "561.00 MiB – 561.01 MiB"
    assert (window.low_bytes, window.high_bytes) == (588_248_515, 588_259_000)


@pytest.mark.parametrize("outside_bytes, matches", [
    (SEED_LOW, True),  # the smallest outside memory that still fails at layer 23's gate_proj
    (SEED_LOW - 1, False),  # one byte less: gate_proj fits, up_proj fails (14.29 GiB allocated)
    (SEED_HIGH, True),  # the largest: o_proj of layer 23 just fits
    (SEED_HIGH + 1, False),  # one byte more: o_proj fails (50.00 MiB)
])
def test_range_ends_against_the_allocator(outside_bytes: int, matches: bool) -> None:
    """The allocator model itself, walked with the interval's ends and one byte beyond, agrees with the interval."""
    _, tried, allocated, reserved, _ = real_failure(outside_bytes)
    figs = seed_figures()
    assert ((tried, allocated, reserved) == (figs.tried, figs.allocated, figs.reserved)) is matches


@pytest.mark.parametrize("outside_bytes", [
    0,  # nothing outside PyTorch: fails at layer 24
    SEED_LOW - 1,
    seed_outside_bytes(),
    3 * GiB + 12_345,
    T4 - 50 * MiB,  # fails within the first layer
    T4,  # nothing left: the embedding's segment fails
])
def test_failure_at_agrees_with_a_full_walk(points, outside_bytes: int) -> None:
    """The tensor and all four printed figures, predicted without a walk, are the allocator's own."""
    assert predicted(points, outside_bytes) == real_failure(outside_bytes)


def test_no_failure_when_the_model_fits() -> None:
    """On a 40 GiB device with 1 GiB outside PyTorch the 24.24 GiB model fits: no failure point is hit."""
    pts = failure_points(unlimited_walk("llama-13b", "float16"), 40 * GiB)
    assert failure_at(pts, GiB) is None and real_failure(GiB, 40 * GiB) is None


def test_intervals_tile_the_outside_memory(points) -> None:
    """Consecutive failure points cover adjacent outside-memory intervals, from the full capacity downwards."""
    assert points[0].outside_high_bytes == T4 and points[0].name == "model.embed_tokens.weight"
    for earlier, later in zip(points, points[1:], strict=False):
        assert later.outside_high_bytes == earlier.outside_low_bytes - 1
    assert points[-1].outside_low_bytes == 0


def test_reserved_alone_picks_the_point(points) -> None:
    """Matching only the reserved figure (or only allocated) gives the same interval as matching all three."""
    figs = seed_figures()
    three = matching_outside(points, figs)
    assert matching_outside(points, figs, (Figure.RESERVED,)) == three
    assert matching_outside(points, figs, (Figure.ALLOCATED,)) == three
    assert len(matching_outside(points, figs, (Figure.TRIED,))) == 24  # 136 MiB asks are everywhere


def test_free_figure_needs_the_outside_memory(points) -> None:
    """Asking for the free figure without the outside memory is an error that says what to pass."""
    with pytest.raises(InvalidValueError, match="pass outside_bytes"):
        points[0].printed(Figure.FREE)
