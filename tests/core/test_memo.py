"""core.memo.BoundedMemo: a module's memo never holds more than its bound (issue 21: ten unbounded memo dicts)."""

from __future__ import annotations

import pytest

from oomlab.budget import activations, analytic, deepspeed, deepspeed_config, inventory, layer_trace
from oomlab.core.memo import BoundedMemo
from oomlab.remedies import placement


def test_drops_the_least_recently_set() -> None:
    memo: BoundedMemo[int, str] = BoundedMemo(3)
    for key in range(5):
        memo[key] = str(key)
    assert list(memo) == [2, 3, 4] and memo.get(0) is None and memo[4] == "4"
    memo[2] = "again"  # set again: the most recent
    memo[5] = "5"
    assert list(memo) == [4, 2, 5]


def test_bound_must_hold_an_entry() -> None:
    with pytest.raises(ValueError, match="maxsize 0"):
        BoundedMemo(0)


@pytest.mark.parametrize("memo", [
    activations._INVENTORIES, activations._SUMS, activations._TRACES, analytic._OUTSIDE, analytic._LAUNCH_NOTES,
    deepspeed._ZERO, deepspeed_config._RESOLVED, inventory._STATES, layer_trace._MEMO, placement._SIZE_MEMO,
])
def test_every_module_memo_is_bounded(memo) -> None:
    assert isinstance(memo, BoundedMemo) and memo.maxsize <= 4096
