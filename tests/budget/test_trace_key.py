"""The trace cache key and the fingerprint of the source that decides a trace (oomlab.budget.traced)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from oomlab.budget import traced
from oomlab.core.setup import make_setup


def test_trace_sources_follow_the_tracers_imports() -> None:
    """The roots and what they import from oomlab.budget; not the analytic formulas (they only read a trace)."""
    sources = traced.trace_sources()
    assert set(traced.TRACE_SOURCE_ROOTS) <= set(sources)
    assert "result" in sources  # tracker.py imports MemCategory, Phase from it
    assert not {"analytic", "agreement", "api", "workspace", "fsdp", "states", "activations"} & set(sources)
    assert list(sources) == sorted(sources)


def test_fingerprint_is_stable() -> None:
    assert traced.source_fingerprint() == traced.source_fingerprint()
    assert len(traced.source_fingerprint()) == 64


def test_fingerprint_changes_with_any_traced_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-character change in any of the sources gives another fingerprint (a copy of the package is edited)."""
    folder = Path(traced.__file__).parent
    copy = tmp_path / "budget"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(traced, "__file__", str(copy / "traced.py"))
    before = traced.source_fingerprint()
    for name in traced.trace_sources():
        path = copy / f"{name}.py"
        original = path.read_text()
        path.write_text(original + "\n# edited\n")
        assert traced.source_fingerprint() != before, name
        path.write_text(original)
    assert traced.source_fingerprint() == before
    (copy / "analytic.py").write_text((copy / "analytic.py").read_text() + "\n# edited\n")
    assert traced.source_fingerprint() == before  # not a trace's source


def test_cache_key_uses_the_fingerprint_only_behind_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the flag the key is as before (no re-trace); with it, the key changes when the source does."""
    s = make_setup("llama-7b", "a100-80gb", gpus=1)
    monkeypatch.delenv(traced.SOURCE_KEY_FLAG, raising=False)
    plain = traced.cache_key(s)
    monkeypatch.setattr(traced, "source_fingerprint", lambda: "a" * 64)
    assert traced.cache_key(s) == plain
    monkeypatch.setenv(traced.SOURCE_KEY_FLAG, "1")
    keyed = traced.cache_key(s)
    assert keyed != plain
    monkeypatch.setattr(traced, "source_fingerprint", lambda: "b" * 64)
    assert traced.cache_key(s) != keyed
