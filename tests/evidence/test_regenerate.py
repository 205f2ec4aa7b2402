"""``python -m oomlab.evidence NAME`` reads its arguments: ``--help`` lists each generator with what it rewrites and
how long it takes, and does none of it (no committed file rewritten, nothing cached, no generator imported); an
unknown NAME or flag returns 2, named, before any work; a known NAME runs that generator's ``regenerate``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from oomlab.core.paths import DATA_DIR, REPO_ROOT
from oomlab.evidence import regenerate as ev

# generator name -> a committed file its help names
GENERATORS = {
    "agreement": "docs/budget-agreement.md",
    "families": "docs/family-agreement.md",
    "published": "docs/published-measurements.md",
    "small-scale": "docs/small-scale-measured.md",
    "deepspeed-measured": "docs/deepspeed-small-scale.md",
    "deepspeed-estimators": "docs/deepspeed-estimators.md",
    "margins": "lib/oomlab/data/margins.json",
    "trainers": "docs/trainers-small-scale.md",
    "nf4-events": "lib/oomlab/data/torchao-nf4-events.json",
}


def _committed() -> dict[Path, tuple[int, int]]:
    """Every committed document and data file, with its size and modification time."""
    files = [*(REPO_ROOT / "docs").glob("*.md"), *DATA_DIR.glob("*.json")]
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in files}


def _run_without_work(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """``main(argv)``, asserting it wrote no committed file and cached nothing."""
    monkeypatch.setenv("OOMLAB_CACHE_DIR", str(tmp_path / "cache"))
    before = _committed()
    code = ev.main(argv)
    assert _committed() == before
    assert not (tmp_path / "cache").exists()
    return code


def test_the_generators_are_the_committed_documents() -> None:
    """One generator per committed document, each rewriting the files its help names (all under the checkout)."""
    assert {g.name: g.writes[-1] for g in ev.GENERATORS} == GENERATORS
    assert all((REPO_ROOT / path).is_file() for g in ev.GENERATORS for path in g.writes)


def test_help_lists_every_generator_and_does_none_of_it(tmp_path, monkeypatch, capsys) -> None:
    """``--help`` prints the usage and, per name, what it rewrites and roughly how long; returns 0, writes nothing."""
    assert _run_without_work(["--help"], tmp_path, monkeypatch) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("usage: python -m oomlab.evidence")
    for name, doc in GENERATORS.items():
        assert f" {name} " in out and doc in out
    assert " all every generator above" in out and "minute" in out and "second" in out


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_a_generators_help_describes_its_run(name: str, tmp_path, monkeypatch, capsys) -> None:
    """``NAME --help`` says what that run regenerates and how long it takes, and does none of it."""
    assert _run_without_work([name, "--help"], tmp_path, monkeypatch) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith(f"usage: python -m oomlab.evidence {name}")
    assert GENERATORS[name] in out and ("minute" in out or "second" in out)


def test_an_unknown_name_is_refused_with_the_choices(tmp_path, monkeypatch, capsys) -> None:
    """An unknown NAME returns 2 and stderr names it and every valid choice, before any work."""
    assert _run_without_work(["agreemnt"], tmp_path, monkeypatch) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'agreemnt'" in err
    assert all(name in err for name in [*GENERATORS, "all"])


@pytest.mark.parametrize("argv", [["published", "--no-such-flag"], ["published", "--no-cache"], []])
def test_a_bad_command_line_is_refused(argv: list[str], tmp_path, monkeypatch, capsys) -> None:
    """A flag the generator does not take (--no-cache is deepspeed-measured's), or no NAME at all, returns 2."""
    assert _run_without_work(argv, tmp_path, monkeypatch) == 2
    assert "usage: python -m oomlab.evidence" in capsys.readouterr().err


def test_deepspeed_measured_offers_no_cache(capsys) -> None:
    """deepspeed-measured's one option, --no-cache, is in its help and in ``all``'s."""
    assert ev.main(["deepspeed-measured", "--help"]) == 0
    assert "--no-cache" in capsys.readouterr().out
    assert ev.main(["all", "--help"]) == 0
    assert "--no-cache" in capsys.readouterr().out


def test_a_name_runs_its_generator_with_the_parsed_flags(monkeypatch) -> None:
    """A known NAME calls its module's ``regenerate`` (deepspeed-measured with ``use_cache``) and returns its status;
    ``all`` runs every one, in order, and returns 1 when any disagreed."""
    seen = []

    def fake_run(generator: ev.Generator, args) -> int:
        seen.append((generator.name, getattr(args, "no_cache", None)))
        return 1 if generator.name == "families" else 0

    monkeypatch.setattr(ev, "run", fake_run)
    assert ev.main(["deepspeed-measured", "--no-cache"]) == 0
    assert ev.main(["families"]) == 1
    assert seen == [("deepspeed-measured", True), ("families", None)]
    seen.clear()
    assert ev.main(["all"]) == 1
    assert [name for name, _ in seen] == [g.name for g in ev.GENERATORS]
    assert dict(seen)["deepspeed-measured"] is False


def test_help_imports_no_generator() -> None:
    """``python -m oomlab.evidence --help`` answers without importing torch or any generator module."""
    code = ("import runpy, sys; sys.argv = ['x', '--help']\n"
            "try:\n    runpy.run_module('oomlab.evidence', run_name='__main__')\nexcept SystemExit as e:\n"
            "    assert e.code == 0\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('oomlab.evidence.')),"
            " file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "usage: python -m oomlab.evidence" in proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == "['oomlab.evidence.regenerate']", proc.stderr
