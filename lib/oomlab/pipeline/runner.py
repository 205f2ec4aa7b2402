"""Run the numbered notebooks with papermill, then render the HTML report.

:func:`run_pipeline` validates the parameters (:mod:`.params`), executes ``notebooks/NN_*.ipynb`` in order into
``outputs/notebooks/``, checks that each wrote its results JSON (through
:func:`oomlab.report.results.write_results`), and writes ``outputs/report.html`` atomically.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oomlab.core import paths
from oomlab.core.errors import PipelineError, ReportError
from oomlab.pipeline.params import OUT_DIR_PARAM, RESULTS_PATH_PARAM, validate_params
from oomlab.report.html import render_report

REPORT_NOTEBOOK = "04_report.ipynb"  # rendered as the report when present, else the first notebook
REPORT_NAME = "report.html"
KERNEL_NAME = "python3"
_NUMBERED = re.compile(r"^\d\d_.+\.ipynb$")


@dataclass(frozen=True)
class PipelineResult:
    """What one pipeline run produced."""

    executed_paths: tuple[Path, ...]  # executed copies of the notebooks, in run order
    results_paths: tuple[Path, ...]  # each notebook's results JSON, same order
    report_path: Path
    seconds: float  # wall time of the whole run


def notebook_paths(notebooks_dir: str | os.PathLike[str] = paths.NOTEBOOKS_DIR) -> list[Path]:
    """The numbered notebooks ``NN_*.ipynb`` in run order (``explore.ipynb`` and others left out)."""
    return sorted(p for p in Path(notebooks_dir).glob("*.ipynb") if _NUMBERED.match(p.name))


def _first_line(source: str) -> str:
    lines = [line.strip() for line in source.splitlines() if line.strip()]
    return lines[0] if lines else "<empty cell>"


def _failing_cell(executed: Path) -> tuple[int, str] | None:
    """Index in the *source* notebook and source of the cell that failed or was running, if known.

    Papermill marks a raising cell ``metadata.papermill.exception``; after a timeout or a dead kernel
    the failing cell is the last one that started.  The injected-parameters cell and papermill's
    error-marker cells are not in the source notebook, so they are skipped when counting.
    """
    import nbformat

    try:
        nb = nbformat.read(executed, as_version=4)
    except (OSError, ValueError):
        return None
    own = [c for c in nb.cells
           if not {"injected-parameters", "papermill-error-cell-tag"} & set(c.metadata.get("tags", []))]
    started = None
    for index, cell in enumerate(own):
        meta = cell.metadata.get("papermill", {})
        if meta.get("exception") is True:
            return index, cell.source
        if cell.cell_type == "code" and meta.get("start_time"):
            started = (index, cell.source)
    return started


def _mark_interrupted(executed: Path, error: str) -> None:
    """Record a timeout or dead kernel in the kept notebook, as an error output on the running cell."""
    import nbformat

    try:
        nb = nbformat.read(executed, as_version=4)
    except (OSError, ValueError):
        return
    running = [
        c for c in nb.cells if c.cell_type == "code" and c.metadata.get("papermill", {}).get("start_time")
    ]
    if not running:
        return
    cell = running[-1]
    ename, _, evalue = error.partition(": ")
    cell.outputs.append(nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[error]))
    cell.metadata.papermill["exception"] = True
    cell.metadata.papermill["status"] = "failed"
    nbformat.write(nb, executed)


def _failure(notebook: Path, executed: Path, error: str) -> PipelineError:
    cell = _failing_cell(executed)
    where = "" if cell is None else f" at cell {cell[0]} ({_first_line(cell[1])!r})"
    return PipelineError(
        f"notebook {notebook.name} failed{where}: {error}; the executed notebook is kept at {executed}"
    )


def _run_notebook(notebook: Path, executed: Path, params: dict[str, Any], results_path: Path, out_dir: Path,
                  progress: bool, cell_timeout: int) -> None:
    import papermill
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    declared = papermill.inspect_notebook(str(notebook))
    available = {**params, RESULTS_PATH_PARAM: str(results_path), OUT_DIR_PARAM: str(out_dir)}
    inject = {name: available[name] for name in declared if name in available}
    try:
        papermill.execute_notebook(
            str(notebook), str(executed), parameters=inject, kernel_name=KERNEL_NAME,
            progress_bar=progress, execution_timeout=cell_timeout,
            # NB: the notebooks folder, as in Jupyter, so relative paths resolve the same both ways;
            # every output goes through the absolute results_path / out_dir.
            cwd=str(notebook.parent),
        )
    except PapermillExecutionError as err:
        raise _failure(notebook, executed, f"{err.ename}: {err.evalue}") from err
    except CellTimeoutError as err:
        # nbclient raises this past execution_timeout; papermill passes it through unwrapped.
        error = f"CellTimeoutError: cell execution timed out after {cell_timeout} s"
        _mark_interrupted(executed, error)
        raise _failure(notebook, executed, error) from err
    except DeadKernelError as err:
        error = f"DeadKernelError: {err}"
        _mark_interrupted(executed, error)
        raise _failure(notebook, executed, error) from err


def run_pipeline(
    params: Mapping[str, Any],
    out_dir: str | os.PathLike[str] = paths.OUTPUTS_DIR,
    notebooks_dir: str | os.PathLike[str] = paths.NOTEBOOKS_DIR,
    progress: bool = True,
    cell_timeout: int = 600,
) -> PipelineResult:
    """Execute every numbered notebook into ``out_dir/notebooks``, then write ``out_dir/report.html``."""
    start = time.perf_counter()
    params = validate_params(params)
    out_dir = Path(out_dir).resolve()
    notebooks = notebook_paths(notebooks_dir)
    if not notebooks:
        raise PipelineError(f"no numbered notebooks (NN_*.ipynb) in {Path(notebooks_dir).resolve()}")
    (out_dir / "notebooks").mkdir(parents=True, exist_ok=True)
    (out_dir / "results").mkdir(parents=True, exist_ok=True)
    executed_paths, results_paths = [], []
    for notebook in notebooks:
        notebook = notebook.resolve()
        executed = out_dir / "notebooks" / notebook.name
        results_path = out_dir / "results" / f"{notebook.stem}.json"
        results_path.unlink(missing_ok=True)  # a stale file must not pass for this run's results
        _run_notebook(notebook, executed, params, results_path, out_dir, progress, cell_timeout)
        if not results_path.is_file():
            raise PipelineError(
                f"notebook {notebook.name} ran but wrote no results at {results_path}; it should call"
                f" oomlab.report.results.write_results({RESULTS_PATH_PARAM}, ...) with its parameter;"
                f" the executed notebook is kept at {executed}"
            )
        executed_paths.append(executed)
        results_paths.append(results_path)
    source = next((p for p in executed_paths if p.name == REPORT_NOTEBOOK), executed_paths[0])
    try:
        report = render_report(source, out_dir / REPORT_NAME)
    except ReportError as err:
        raise PipelineError(f"rendering the report from {source} failed: {err}") from err
    return PipelineResult(tuple(executed_paths), tuple(results_paths), report, time.perf_counter() - start)
