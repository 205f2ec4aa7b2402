"""The activation budget's memos return what they were given for: an inventory's sums are never another's, even once
its id is reused (an evicted inventory freed, a new tuple at the same address)."""

from oomlab.budget import activations as act
from oomlab.budget.activations import SavedTensor


def test_sums_follow_the_inventory_not_its_id() -> None:
    """A freed inventory's id may be reused: its sums must not be (this made one budget depend on the tests before)."""
    first = tuple(SavedTensor(f"a{i}", i) for i in range(3))
    assert act._sums(first) == (3, 0)
    key = id(first)
    del first  # freed: CPython may give the next tuple of the same size its address
    for _ in range(1000):
        other = tuple(SavedTensor(f"b{i}", 10 * i) for i in range(3))
        if id(other) == key:
            break
    assert act._sums(other) == (30, 0)
    act._SUMS[id(other)] = ((), (999, 999))  # a stale entry under the same id, for another tuple
    assert act._sums(other) == (30, 0)
