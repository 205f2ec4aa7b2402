"""A bounded memo: what a module remembers between calls, never more than a stated number of entries."""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")

MEMO_ENTRIES = 4096  # setups a session budgets, many times over; a long-lived explorer stays bounded


class BoundedMemo(OrderedDict[K, V]):
    """A dict of at most ``maxsize`` entries: setting one past that drops the least recently set (a module-level memo
    of a long-lived process -- the explorer, a notebook kernel -- never grows without bound)."""

    def __init__(self, maxsize: int = MEMO_ENTRIES) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize {maxsize}: a memo holds at least one entry")
        super().__init__()
        self.maxsize = maxsize

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.maxsize:
            self.popitem(last=False)
