"""The largest value a monotone predicate accepts: doubling, then bisection (micro-batch and length searches)."""

from __future__ import annotations

from collections.abc import Callable


def largest_true(fits: Callable[[int], bool], low: int, high: int) -> int | None:
    """The largest ``x`` in ``[low, high]`` with ``fits(x)``, for ``fits`` true up to some point, then false.

    ``None`` when even ``low`` does not fit.  About ``2 log2(answer / low)`` calls.
    """
    if not fits(low):
        return None
    good, bad = low, None
    probe = low
    while bad is None:
        probe = min(probe * 2, high)
        if probe == good:
            return good
        if fits(probe):
            good = probe
            if probe == high:
                return high
        else:
            bad = probe
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good
