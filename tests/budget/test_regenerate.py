"""The ``python -m oomlab.budget.<generator>`` commands read their arguments: ``--help`` says what the run regenerates
and returns 0 without doing it (no committed file rewritten, nothing cached); an unknown argument returns 2, named."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from oomlab.budget.regenerate import doc_main
from oomlab.core.paths import DATA_DIR, REPO_ROOT

# generator module -> a committed file its help names ("" for small_scale: it prints the document)
GENERATORS = {
    "agreement": "docs/budget-agreement.md",
    "families": "docs/family-agreement.md",
    "published": "docs/published-measurements.md",
    "small_scale": "docs/small-scale-measured.md",
    "deepspeed_measured": "docs/deepspeed-small-scale.md",
    "deepspeed_estimators": "docs/deepspeed-estimators.md",
}


def _committed() -> dict[Path, tuple[int, int]]:
    """Every committed document and data file, with its size and modification time."""
    files = [*(REPO_ROOT / "docs").glob("*.md"), *DATA_DIR.glob("*.json")]
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in files}


def _run_without_work(name: str, argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """``main(argv)`` of the generator ``name``, asserting it wrote no committed file and cached nothing."""
    monkeypatch.setenv("OOMLAB_CACHE_DIR", str(tmp_path / "cache"))
    before = _committed()
    code = importlib.import_module(f"oomlab.budget.{name}").main(argv)
    assert _committed() == before
    assert not (tmp_path / "cache").exists()
    return code


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_help_describes_the_run_and_does_none_of_it(name: str, tmp_path, monkeypatch, capsys) -> None:
    """``main(["--help"])`` prints the usage and what it regenerates, returns 0, writes no file and caches nothing."""
    assert _run_without_work(name, ["--help"], tmp_path, monkeypatch) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith(f"usage: python -m oomlab.budget.{name}")
    assert GENERATORS[name] in out and ("minute" in out or "second" in out)


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_unknown_argument_is_refused_by_name(name: str, tmp_path, monkeypatch, capsys) -> None:
    """An argument the generator does not take returns 2 and is named on stderr, before any work."""
    assert _run_without_work(name, ["--no-such-flag"], tmp_path, monkeypatch) == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_deepspeed_measured_offers_no_cache(capsys) -> None:
    """deepspeed_measured's one option, --no-cache, is in its help."""
    from oomlab.budget import deepspeed_measured

    assert deepspeed_measured.main(["--help"]) == 0
    assert "--no-cache" in capsys.readouterr().out


def test_doc_main_runs_with_the_parsed_flags(capsys) -> None:
    """Without --help the run is called with the parsed flags and its status is returned; the help names the files
    the run rewrites, relative to the repository."""
    seen = []
    run = lambda args: seen.append(args.no_cache) or 3  # noqa: E731
    flags = {"--no-cache": "ignore the cache"}
    assert doc_main("oomlab.budget.x", "Regenerates x.", (DATA_DIR / "x.json",), run, ["--no-cache"], flags) == 3
    assert doc_main("oomlab.budget.x", "Regenerates x.", (), run, [], flags) == 3
    assert seen == [True, False]
    assert doc_main("oomlab.budget.x", "Regenerates x.", (DATA_DIR / "x.json",), run, ["-h"], flags) == 0
    assert "Rewrites lib/oomlab/data/x.json." in " ".join(capsys.readouterr().out.split()) and len(seen) == 2
