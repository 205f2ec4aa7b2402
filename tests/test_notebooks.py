"""Committed notebooks: no outputs, an H1 first, a literal-only parameters cell second, no def/class."""

import ast
from pathlib import Path

import nbformat
import pytest

from oomlab.paths import NOTEBOOKS_DIR

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
