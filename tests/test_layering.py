"""The house by stage: imports run one way only (core → reproduction → explanation → budget → remedies → launch →
report → pipeline, with cli and explorer on top), no import cycles, no private names imported across modules --
checked on the source (AST), function-level imports included."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import oomlab

# launch reads the user's files into a setup (with budget's DeepSpeed reader) and checks it with remedies' knobs, so it
# comes after remedies; the report and the pipeline start from it
STAGES = ("core", "reproduction", "explanation", "budget", "remedies", "launch", "report", "pipeline")
TOP = ("cli", "explorer", "__main__", "__init__")
PACKAGE = Path(oomlab.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def stage_of(module: str) -> int:
    """Rank of a module's stage: its place in STAGES, or past the end for the top (cli, explorer, the package)."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in STAGES:
        return STAGES.index(parts[1])
    return len(STAGES)


def imports(path: Path) -> list[tuple[str, tuple[str, ...], int]]:
    """``(imported module, names, line)`` for every import statement in the file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, (), node.lineno) for alias in node.names if alias.name.startswith("oomlab")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("oomlab") and not node.level:
            found.append((node.module, tuple(alias.name for alias in node.names), node.lineno))
    return found


def sources() -> list[Path]:
    """The package's modules (the launch template under templates/ is data written for users, not a module)."""
    return sorted(p for p in PACKAGE.rglob("*.py") if "templates" not in p.relative_to(PACKAGE).parts)


def edges() -> dict[str, set[str]]:
    """module -> the oomlab modules it imports (``from pkg import mod`` counts as importing ``pkg.mod``)."""
    known = {module_name(p) for p in sources()}
    graph: dict[str, set[str]] = {}
    for path in sources():
        here = module_name(path)
        targets = graph.setdefault(here, set())
        for module, names, _ in imports(path):
            subs = {f"{module}.{n}" for n in names if f"{module}.{n}" in known}
            targets |= subs or {module}
    return graph


def test_every_import_follows_the_stage_order() -> None:
    """No module imports a later stage (a stage may import itself and every earlier one)."""
    wrong = []
    for path in sources():
        here = module_name(path)
        for module, _, line in imports(path):
            if stage_of(module) > stage_of(here):
                wrong.append(f"{here}:{line} imports {module}")
    assert wrong == []


def test_no_import_cycles() -> None:
    """The module import graph (function-level imports included) has no cycle."""
    graph = edges()
    state: dict[str, int] = {}
    cycles: list[str] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt):], nxt]) if nxt in path else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_no_private_names_cross_modules() -> None:
    """``from oomlab.x import _private`` appears nowhere (tests and notebooks use the public names too)."""
    wrong = [f"{module_name(p)}:{line} imports {n} from {m}" for p in sources() for m, names, line in imports(p)
             for n in names if n.startswith("_") and n != "__version__"]
    assert wrong == []


def test_every_module_is_in_a_stage_or_on_top() -> None:
    """A module of the package lives in one of the stage subpackages, or is cli/explorer/the entry points."""
    stray = [module_name(p) for p in sources()
             if stage_of(module_name(p)) == len(STAGES) and p.stem not in TOP]
    assert stray == []


def test_no_module_is_much_over_500_lines() -> None:
    """About 500 lines is a sign to split (a little slack for long docstrings)."""
    long = {module_name(p): n for p in sources() if (n := len(p.read_text().splitlines())) > 560}
    assert long == {}


@pytest.mark.parametrize("name", ["estimate", "reproduce", "explain"])
def test_top_level_functions_stay_callable_after_every_import(name: str) -> None:
    """``oomlab.reproduce`` & co. stay functions once every submodule is imported (a submodule of the same name
    used to shadow them: TypeError "'module' object is not callable")."""
    for info in pkgutil.walk_packages(oomlab.__path__, "oomlab."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    assert callable(getattr(oomlab, name)) and not isinstance(getattr(oomlab, name), type(oomlab))


def test_reproduce_after_importing_the_pipeline() -> None:
    """The reported defect, as a user hits it: ``import oomlab.pipeline`` then ``oomlab.reproduce()``."""
    code = ("import oomlab, oomlab.pipeline.runner, oomlab.pipeline.params; "
            "r = oomlab.reproduce(device='simulated'); print(r.raised)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr


@pytest.mark.parametrize("code", [
    "import oomlab",
    "import oomlab.pipeline.params",
    "import oomlab.cli; oomlab.cli.build_parser()",
])
def test_light_imports_load_no_torch(code: str) -> None:
    """``import oomlab``, the parameter registry and the CLI's parser load no torch (``--help`` answers at once)."""
    proc = subprocess.run([sys.executable, "-c", f"{code}; import sys; print('torch' in sys.modules)"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr


def test_help_loads_no_torch() -> None:
    """``python -m oomlab --help`` prints the usage without importing torch."""
    code = ("import runpy, sys; sys.argv = ['oomlab', '--help']\n"
            "try:\n    runpy.run_module('oomlab', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "usage: python -m oomlab" in proc.stdout and proc.stderr.strip().endswith("False"), proc.stderr
