"""The small-scale checks' cache: a damaged entry is a miss, measured again and rewritten (issue 20: a cache file of
`[]` broke notebook 03 on every later run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlab.evidence.checks_cache import _cache_path, cached_verification
from oomlab.remedies.verification import Check, CheckUnit

NAMES = ("toy",)


def _checks(calls: list[int]):
    def toy() -> list[Check]:
        calls.append(1)
        return [Check("toy remedy", "bytes", 1.0, 1.0, next(iter(CheckUnit)))]
    return {"toy": toy}


@pytest.mark.parametrize("damage", [b"[]", b"{", b"\xff\xfe", b"{}", b'{"checks": 3}', b"null"])
def test_damaged_entry_is_a_miss(damage: bytes, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("OOMLAB_CACHE_DIR", str(tmp_path))
    calls: list[int] = []
    first = cached_verification(NAMES, _checks(calls))
    assert calls == [1] and not first.from_cache
    assert cached_verification(NAMES, _checks(calls)).from_cache and calls == [1]  # a good entry is read back
    path = _cache_path(NAMES)
    path.write_bytes(damage)
    again = cached_verification(NAMES, _checks(calls))
    assert calls == [1, 1] and not again.from_cache
    assert cached_verification(NAMES, _checks(calls)).from_cache  # rewritten
