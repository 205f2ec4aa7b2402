"""Every ``oomlab.…`` path the documentation names resolves: README.md, docs/*.md, the notebooks and the library's
own docstrings (a name in backticks, a Sphinx role, or a ``python -m`` command). Issue 9 moved every module once;
a moved module must not leave its old path behind in prose."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import oomlab

REPO = Path(oomlab.__file__).resolve().parents[2]
NAMED = re.compile(r"`~?(oomlab(?:\.[A-Za-z_]\w*)+)`")  # `oomlab.x.y`, :func:`~oomlab.x.y`
COMMAND = re.compile(r"python -m (oomlab(?:\.[A-Za-z_]\w*)+)")


def documents() -> list[Path]:
    lib = [p for p in (REPO / "lib" / "oomlab").rglob("*.py") if "templates" not in p.parts]
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "notebooks").glob("*.ipynb")),
            *sorted(lib)]


def resolves(name: str) -> bool:
    """The longest importable module prefix of ``name``, then attributes for the rest."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_named_oomlab_path_resolves() -> None:
    named = {(p.relative_to(REPO).as_posix(), m) for p in documents() for rx in (NAMED, COMMAND)
             for m in rx.findall(p.read_text())}
    assert len(named) > 50  # the documentation does name the library's paths
    assert sorted(f"{where}: {name}" for where, name in named if not resolves(name)) == []
