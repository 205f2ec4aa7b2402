"""largest_true finds the edge of a monotone predicate."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomlab.core.search import largest_true


@given(st.integers(1, 10_000), st.integers(0, 12_000), st.integers(1, 50))
def test_finds_the_edge(high: int, edge: int, low: int) -> None:
    """The answer is the largest x <= high with x <= edge, or None when low is already past the edge."""
    low = min(low, high)
    calls = []

    def fits(x: int) -> bool:
        calls.append(x)
        return x <= edge

    expected = None if low > edge else min(edge, high)
    assert largest_true(fits, low, high) == expected
    assert all(low <= x <= high for x in calls)


@pytest.mark.parametrize(("edge", "answer"), [(0, None), (1, 1), (4096, 4096), (5000, 4096), (37, 37)])
def test_table(edge: int, answer: int) -> None:
    """Boundaries: the first value, exactly the cap, beyond the cap, an odd edge."""
    assert largest_true(lambda x: x <= edge, 1, 4096) == answer
