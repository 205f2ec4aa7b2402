"""The small-scale checks' results kept on disk (under :func:`oomlab.core.paths.cache_dir`), keyed by the checks'
names, the library versions, :data:`VERIFY_VERSION` and the source of the figures they compare, so a notebook can
read them back and say when they were measured."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from oomlab.budget.step import library_versions
from oomlab.core import paths
from oomlab.core.files import write_text_atomic
from oomlab.remedies.verification import Check, Verification

__all__ = ["VERIFY_VERSION", "cached_verification"]

VERIFY_VERSION = 2  # bump when what a verification records changes


def _model_sources() -> list[Path]:
    """The source files whose figures a verification records: the budget, the instruments (the measurement and the
    gloo worker), the throughput model and the checks."""
    package = paths.PACKAGE_DIR
    return sorted([*(package / "budget").glob("*.py"), *(package / "instruments").glob("*.py"),
                   package / "remedies" / "throughput.py", package / "evidence" / "checks.py"])


def _cache_path(names: tuple[str, ...]) -> Path:
    """Keyed by the checks, the library versions and the analytic model's source (its figures are cached too)."""
    model_source = hashlib.sha256(b"".join(p.read_bytes() for p in _model_sources())).hexdigest()
    payload = json.dumps({"names": names, "versions": library_versions(), "v": VERIFY_VERSION,
                          "model_source": model_source}, sort_keys=True)
    return paths.cache_dir() / f"verify-{hashlib.sha256(payload.encode()).hexdigest()[:16]}.json"


def cached_verification(names: tuple[str, ...], checks: Mapping[str, Callable[[], list[Check]]], *,
                        use_cache: bool = True, run: bool = True) -> Verification:
    """Run the named ``checks`` (or read them from the cache); ``run=False`` only reads the cache."""
    path = _cache_path(names)
    if use_cache and path.is_file():
        try:
            return replace(Verification.from_dict(json.loads(path.read_text())), from_cache=True)
        except (ValueError, KeyError, TypeError, AttributeError):
            pass  # a damaged entry (`[]`, truncated, not UTF-8) is a miss: measured again and rewritten below
    if not run:
        return Verification((), "", False, tuple(f"{n}: not run (no cached result; run with trace=True)"
                                                 for n in names))
    measured: list[Check] = []
    for name in names:
        measured.extend(checks[name]())
    result = Verification(tuple(measured), datetime.now(timezone.utc).isoformat(timespec="seconds"), False, ())
    write_text_atomic(path, json.dumps(result.to_dict(), indent=2))
    return result
