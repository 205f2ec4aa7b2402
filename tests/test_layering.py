"""The house by stage: imports run one way only (core → reproduction → explanation → budget → instruments → remedies →
launch → evidence → report → pipeline, with cli and the explorer (explorer, exploration) on top), no import cycles, no
private names imported across modules -- checked on the source (AST), function-level imports included."""

from __future__ import annotations

import ast
import importlib
import json
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import oomlab

# budget is the estimator (analytic, and traced on fake tensors: estimate()'s two sources); the instruments run a real
# step and measure it, on budget's model builder; launch reads the user's files into a setup (with budget's DeepSpeed
# reader) and checks it with remedies' knobs, so it comes after remedies; the evidence (measured or traced beside
# analytic, the remedies' checks, the launch files' CPU runs, the doc generators) comes after everything it evaluates;
# the report and the pipeline start from the setup and need no evidence (notebooks import it directly)
STAGES = ("core", "reproduction", "explanation", "budget", "instruments", "remedies", "launch", "evidence", "report",
          "pipeline")
# the modules on top, by module name (a stray ``oomlab.x.cli`` or a new subpackage is not one of them)
TOP = ("oomlab", "oomlab.cli", "oomlab.exploration", "oomlab.explorer", "oomlab.__main__")
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


def resolve(here: str, is_package: bool, module: str | None, level: int) -> str:
    """The absolute name ``from {'.' * level}{module} import ...`` means inside module ``here`` (a package's
    ``__init__`` is its package; a plain module's package is its parent)."""
    if not level:
        return module or ""
    package = here.split(".") if is_package else here.split(".")[:-1]
    base = package[:len(package) - (level - 1)]
    if level - 1 >= len(package):
        raise ValueError(f"{here}: relative import beyond the top package (level {level})")
    return ".".join(base + ([module] if module else []))


def imports_in(source: str, here: str, is_package: bool = False) -> list[tuple[str, tuple[str, ...], int]]:
    """``(imported module, names, line)`` for every oomlab import statement in ``source`` (the module ``here``), at
    any depth; relative imports resolved to the absolute module they name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, (), node.lineno) for alias in node.names if alias.name.startswith("oomlab")]
        elif isinstance(node, ast.ImportFrom):
            module = resolve(here, is_package, node.module, node.level)
            if module == "oomlab" or module.startswith("oomlab."):
                found.append((module, tuple(alias.name for alias in node.names), node.lineno))
    return found


def imports(path: Path) -> list[tuple[str, tuple[str, ...], int]]:
    """``(imported module, names, line)`` for every oomlab import statement in the file, at any depth."""
    return imports_in(path.read_text(), module_name(path), path.stem == "__init__")


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
    stray = [module_name(p) for p in sources() if is_stray(module_name(p))]
    assert stray == []


def is_stray(module: str) -> bool:
    """A module that is neither in a stage nor one of the modules on top."""
    return stage_of(module) == len(STAGES) and module not in TOP and not module.startswith("oomlab.cli.")


@pytest.mark.parametrize(("module", "stray"), [
    ("oomlab", False), ("oomlab.cli", False), ("oomlab.explorer", False), ("oomlab.exploration", False),
    ("oomlab.__main__", False),
    ("oomlab.budget", False),  # a stage's __init__
    ("oomlab.remedies.plan", False),
    ("oomlab.tools", True),  # a new subpackage's __init__: not "__init__" on top
    ("oomlab.tools.cli", True),  # a cli.py below a new subpackage: not the cli
    ("oomlab.cli.budget", False),  # one command's module of the cli package
    ("oomlab.helpers", True),
])
def test_top_is_matched_by_module_name(module: str, stray: bool) -> None:
    """Only oomlab, oomlab.cli, oomlab.explorer (+ oomlab.exploration, what it shows) and oomlab.__main__ are on top,
    matched by name, not file stem."""
    assert is_stray(module) is stray


@pytest.mark.parametrize(("source", "here", "is_package", "expected"), [
    ("from ..budget import estimate", "oomlab.remedies.plan", False, [("oomlab.budget", ("estimate",), 1)]),
    ("from . import knobs", "oomlab.remedies.plan", False, [("oomlab.remedies", ("knobs",), 1)]),
    ("from .knobs import x", "oomlab.remedies", True, [("oomlab.remedies.knobs", ("x",), 1)]),
    ("from ...report.story import _p", "oomlab.budget.deep.x", False, [("oomlab.report.story", ("_p",), 1)]),
    ("from oomlab.core import units", "oomlab.budget.x", False, [("oomlab.core", ("units",), 1)]),
    ("from os import path", "oomlab.budget.x", False, []),
])
def test_relative_imports_are_resolved(source: str, here: str, is_package: bool,
                                       expected: list[tuple[str, tuple[str, ...], int]]) -> None:
    """``from ..budget import x`` counts as importing oomlab.budget, so the order, cycle and private-name tests see
    it (a later stage reached relatively is caught like an absolute import)."""
    assert imports_in(source, here, is_package) == expected


def test_a_relative_import_beyond_the_package_is_refused() -> None:
    """``from ...x import y`` two packages above a top-level module names nothing: refused, not skipped."""
    with pytest.raises(ValueError, match="relative import beyond the top package"):
        imports_in("from ...x import y", "oomlab.budget.display")


def test_a_relative_import_of_a_later_stage_is_caught() -> None:
    """The stage-order rule applied to a relative import: budget reaching ``..report`` is a later stage."""
    (module, _, _), = imports_in("from ..report import story", "oomlab.budget.display")
    assert stage_of(module) > stage_of("oomlab.budget.display")


def test_no_module_is_much_over_500_lines() -> None:
    """About 500 lines is a sign to split (issue 9): none is over 500."""
    long = {module_name(p): n for p in sources() if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}


@pytest.mark.parametrize("name", ["estimate", "reproduce", "explain", "plan", "check"])
def test_top_level_functions_stay_callable_after_every_import(name: str) -> None:
    """``oomlab.reproduce`` & co. stay functions once every submodule is imported (a submodule of the same name
    used to shadow them: TypeError "'module' object is not callable")."""
    for info in pkgutil.walk_packages(oomlab.__path__, "oomlab."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    assert callable(getattr(oomlab, name)) and not isinstance(getattr(oomlab, name), type(oomlab))


@pytest.mark.parametrize("stage", STAGES)
def test_no_stage_export_is_named_like_one_of_its_modules(stage: str) -> None:
    """A name a stage's ``__init__`` exports is none of its modules' names: importing that module would rebind the
    package attribute to the module (why ``estimate`` lives in ``budget/api.py``)."""
    package = importlib.import_module(f"oomlab.{stage}")
    modules = {info.name for info in pkgutil.iter_modules(package.__path__)}
    assert package.__all__ and sorted(set(package.__all__) & modules) == []


def test_stage_exports_resolve_and_reach_no_later_stage() -> None:
    """Every name of every stage's ``__all__`` resolves; resolving stages in order, in a fresh interpreter, loads no
    module of a later stage (an ``__init__`` of a lower stage imports no higher one)."""
    code = ("import importlib, json, sys\n"
            f"stages = {STAGES!r}\n"
            "found = {}\n"
            "for rank, stage in enumerate(stages):\n"
            "    package = importlib.import_module('oomlab.' + stage)\n"
            "    missing = [n for n in package.__all__ if getattr(package, n, None) is None]\n"
            "    later = sorted(m for m in sys.modules if m.split('.')[0] == 'oomlab' and len(m.split('.')) > 1\n"
            "                   and m.split('.')[1] in stages[rank + 1:])\n"
            "    found[stage] = [missing, later]\n"
            "print(json.dumps(found))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {stage: [[], []] for stage in STAGES}


def test_importing_every_stage_loads_none_of_their_modules() -> None:
    """``import oomlab.<stage>`` loads the package alone (its exports load on first use): no module more than
    ``import oomlab`` loads, and no torch."""
    code = ("import sys, oomlab\n"
            "before = set(sys.modules)\n"
            f"for stage in {STAGES!r}:\n"
            "    __import__('oomlab.' + stage)\n"
            "print(sorted(set(sys.modules) - before), 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == f"{sorted(f'oomlab.{s}' for s in STAGES if s != 'core')} False"


def test_budget_estimate_is_the_function() -> None:
    """``from oomlab.budget import estimate`` is the function (``oomlab.estimate``), and ``oomlab.budget.api`` the
    module that defines it, whatever was imported before."""
    import oomlab.budget.api as api
    from oomlab.budget import estimate

    assert callable(estimate) and not isinstance(estimate, type(oomlab))
    assert estimate is api.estimate is oomlab.estimate and estimate.__module__ == "oomlab.budget.api"


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


def test_docstrings_name_the_stage_order() -> None:
    """The package docstring lists the stages in STAGES' order, and each stage's ``__init__`` says its number
    (``Stage 6`` is launch: a docstring written before launch came would skip it)."""
    named = [n for n in re.findall(r"``(\w+)``", oomlab.__doc__ or "") if n in STAGES]
    assert tuple(named) == STAGES
    for rank, stage in enumerate(STAGES[1:], start=1):
        doc = importlib.import_module(f"oomlab.{stage}").__doc__ or ""
        assert doc.startswith(f"Stage {rank}: "), (stage, doc[:40])
