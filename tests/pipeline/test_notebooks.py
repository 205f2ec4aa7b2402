"""Committed notebooks: no outputs, an H1 first, a literal-only parameters cell second, no def/class."""

import ast
from pathlib import Path

import nbformat
import pytest

from oomlab.core.paths import NOTEBOOKS_DIR
from oomlab.explorer import Choices
from oomlab.pipeline.params import OUT_DIR_PARAM, PARAMETERS, RESULTS_PATH_PARAM

NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))


def test_numbered_notebooks_exist() -> None:
    """The pipeline's first notebook is there."""
    assert (NOTEBOOKS_DIR / "01_reproduce_oom.ipynb") in NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path: Path) -> None:
    """No outputs or execution counts are committed."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, cell.source[:60]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_title_then_literal_parameters(path: Path) -> None:
    """Cell 1 is an H1 with the question; cell 2 is tagged parameters and assigns literals only."""
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    params = nb.cells[1]
    assert "parameters" in params.metadata.get("tags", [])
    for node in ast.parse(params.source).body:
        assert isinstance(node, ast.Assign), ast.dump(node)
        ast.literal_eval(node.value)  # raises on anything but a literal


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_definitions_in_notebooks(path: Path) -> None:
    """Functions and classes belong in the library."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            source = "\n".join(line for line in cell.source.splitlines() if not line.startswith("%"))
            for node in ast.walk(ast.parse(source)):
                assert not isinstance(node, ast.FunctionDef | ast.ClassDef | ast.Lambda), path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_parameter_literals_are_the_registrys_defaults(path: Path) -> None:
    """Every literal of a parameters cell equals the registry's default (the explorer's own controls, its Choices)."""
    nb = nbformat.read(path, as_version=4)
    for node in ast.parse(nb.cells[1].source).body:
        name, value = node.targets[0].id, ast.literal_eval(node.value)
        if name in (RESULTS_PATH_PARAM, OUT_DIR_PARAM):
            assert value == "", name
        elif name in PARAMETERS:
            assert value == PARAMETERS[name].default, (path.name, name)
        else:
            default = getattr(Choices, name)
            default = ",".join(default) if isinstance(default, tuple) else default  # a tuple is typed "a,b"
            assert path.name == "explore.ipynb" and value == default, (path.name, name)
