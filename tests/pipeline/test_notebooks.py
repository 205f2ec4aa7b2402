"""Committed notebooks: no outputs, an H1 first, a literal-only parameters cell second, no def/class."""

import ast
from pathlib import Path

import nbformat
import pytest

from oomlab.core.paths import NOTEBOOKS_DIR
from oomlab.explorer import Choices
from oomlab.pipeline.params import OUT_DIR_PARAM, PARAMETERS, RESULTS_PATH_PARAM, SETUP_PATH_PARAM
from oomlab.pipeline.runner import notebook_paths

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
        if name in (RESULTS_PATH_PARAM, OUT_DIR_PARAM, SETUP_PATH_PARAM):
            assert value == "", name
        elif name in PARAMETERS:
            assert same_literal(value, PARAMETERS[name].default), (path.name, name, value)
        else:
            default = getattr(Choices, name)
            default = ",".join(default) if isinstance(default, tuple) else default  # a tuple is typed "a,b"
            assert path.name == "explore.ipynb" and same_literal(value, default), (path.name, name, value)


def same_literal(value: object, default: object) -> bool:
    """Equal in value and in type: ``gpus = 4.0`` or ``checkpointing = 0`` equal the default but are not it."""
    return value == default and type(value) is type(default)


@pytest.mark.parametrize(("value", "default", "same"), [
    (4, 4, True), (4.0, 4, False),  # a float where the registry holds an int
    (False, False, True), (0, False, False),  # an int where it holds a bool (0 == False in Python)
    (None, None, True), ("t4", "t4", True), (1, True, False),
])
def test_same_literal_compares_the_type_too(value: object, default: object, same: bool) -> None:
    """The check the notebooks' literals go through refuses a literal of the wrong type."""
    assert same_literal(value, default) is same


def parameters_cell_names(path: Path) -> set[str]:
    nb = nbformat.read(path, as_version=4)
    return {node.targets[0].id for node in ast.parse(nb.cells[1].source).body}


def test_every_registry_parameter_is_declared_by_a_notebook() -> None:
    """The runner injects only the names a parameters cell declares, so a registry parameter no notebook declares
    would be ignored silently."""
    declared = set().union(*(parameters_cell_names(p) for p in notebook_paths()))  # the ones run, not explore
    assert sorted(set(PARAMETERS) - declared) == []


def test_papermill_parses_every_parameter_line() -> None:
    """papermill's parser reads each line of every parameters cell (a comment holding '==' made it skip the line:
    "Unable to parse line", the parameter then undeclared and never injected)."""
    import papermill

    for path in notebook_paths():
        declared = set(papermill.inspect_notebook(str(path)))
        assert parameters_cell_names(path) <= declared, (path.name, parameters_cell_names(path) - declared)
