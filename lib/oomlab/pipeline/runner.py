"""Run the numbered notebooks with papermill, then render the HTML report -- staged, so a failed run loses nothing.

:func:`run_pipeline` validates the parameters (:mod:`.params`), executes ``notebooks/NN_*.ipynb`` in order into a
staging folder beside ``out_dir`` (``.<name>.run-*``), checks that each wrote its results JSON (through
:func:`oomlab.report.results.write_results`), renders ``report.html`` there, and only then swaps the run's entries
(:data:`RUN_ENTRIES`) into ``out_dir``, one rename each, the previous run's moved aside until every rename has
succeeded.  A failure anywhere leaves ``out_dir`` exactly as it was and keeps the failed run in ``.<name>.failed``
beside it (the executed notebooks, results so far, and each kernel's own output under ``logs/``).  Whatever else
``out_dir`` holds -- the trace cache ``cache/``, a screenshot -- is never moved.

By default the kernels' own chatter (``[IPKernelApp] WARNING | Kernel is running over TCP …``, torch profiler
``USDT … profiler_start`` lines written to file descriptor 2 by C++ code) goes to those logs, not the terminal;
``verbose=True`` lets it through and echoes every cell's stdout and stderr (warnings included).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager
from traitlets import Unicode
from traitlets.config import Config

from oomlab.core import paths
from oomlab.core.errors import InvalidValueError, PipelineError, ReportError
from oomlab.pipeline.params import OUT_DIR_PARAM, RESULTS_PATH_PARAM, validate_params
from oomlab.report.html import render_report

REPORT_NOTEBOOK = "04_report.ipynb"  # rendered as the report when present, else the first notebook
REPORT_NAME = "report.html"
KERNEL_NAME = "python3"
# What a run owns in out_dir (notebook 03 writes configs/ through its out_dir parameter); the report goes last, so
# a reader who sees the new report finds the new results beside it.  Anything else in out_dir is left alone.
RUN_ENTRIES = ("notebooks", "results", "configs", REPORT_NAME)
LOGS_DIR = "logs"  # in the staging folder: each kernel's own stdout/stderr; kept only with a failed run
_NUMBERED = re.compile(r"^\d\d_.+\.ipynb$")


@dataclass(frozen=True)
class NotebookRun:
    """One notebook the pipeline executed: its name and wall time (kernel start to shutdown)."""

    name: str
    seconds: float


@dataclass(frozen=True)
class PipelineResult:
    """What one pipeline run produced (paths inside ``out_dir``, after the swap)."""

    executed_paths: tuple[Path, ...]  # executed copies of the notebooks, in run order
    results_paths: tuple[Path, ...]  # each notebook's results JSON, same order
    report_path: Path
    seconds: float  # wall time of the whole run
    notebooks: tuple[NotebookRun, ...] = ()  # each notebook's time, same order


def render_notebook_run(run: NotebookRun) -> str:
    """The one line ``run`` prints per notebook: ``01_reproduce_oom.ipynb    12.3 s``."""
    return f"{run.name:<26} {run.seconds:6.1f} s"


class KernelLogManager(AsyncKernelManager):
    """jupyter_client's kernel manager, but the kernel process's own stdout and stderr go to :attr:`log_path`.

    Cell outputs still reach the notebook (ipykernel captures them); what this catches is what the kernel prints
    outside any cell's streams: its start-up warnings and C++ code writing to the file descriptors.  An empty
    :attr:`log_path` inherits the terminal, as jupyter_client does.
    """

    log_path = Unicode("", config=True, help="file the kernel's stdout and stderr are appended to ('' = inherit)")

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        # NB: jupyter_client's documented override point ("override in a subclass to launch kernel subprocesses
        # differently"); the keywords reach subprocess.Popen.
        if not self.log_path:
            return await super()._async_launch_kernel(kernel_cmd, **kw)
        with open(self.log_path, "ab") as log:  # Popen duplicates the descriptor; ours can close at once
            return await super()._async_launch_kernel(kernel_cmd, **{**kw, "stdout": log, "stderr": log})


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
                  progress: bool, cell_timeout: int, kernel_log: Path | None) -> None:
    """Execute one notebook; ``kernel_log`` None lets the kernel print to the terminal and echoes cell output."""
    import papermill
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    declared = papermill.inspect_notebook(str(notebook))
    available = {**params, RESULTS_PATH_PARAM: str(results_path), OUT_DIR_PARAM: str(out_dir)}
    inject = {name: available[name] for name in declared if name in available}
    if kernel_log is None:
        quiet: dict[str, Any] = {"stdout_file": sys.stdout, "stderr_file": sys.stderr}
    else:
        quiet = {"config": Config({KernelLogManager.__name__: {"log_path": str(kernel_log)}})}
    try:
        papermill.execute_notebook(
            str(notebook), str(executed), parameters=inject, kernel_name=KERNEL_NAME,
            progress_bar=progress, execution_timeout=cell_timeout, kernel_manager_class=KernelLogManager,
            # NB: the notebooks folder, as in Jupyter, so relative paths resolve the same both ways;
            # every output goes through the absolute results_path / out_dir.
            cwd=str(notebook.parent), **quiet,
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


def _retarget(folder: Path, old: Path, new: Path) -> None:
    """Write ``new`` for ``old`` in every text file under ``folder``.

    The notebooks ran with the staging folder as their ``out_dir``, so their outputs, results JSON and launch
    files name it ("the files are in …/configs"); once swapped in, they must name the folder they live in.
    NB: the staging name is unique (``mkdtemp``), so a plain replacement cannot hit anything else; the JSON-escaped
    form covers paths JSON writes differently.
    """
    pairs = {(str(old), str(new)), (json.dumps(str(old))[1:-1], json.dumps(str(new))[1:-1])}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
        try:
            text = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # binary (a figure) or unreadable: nothing to rewrite
        changed = text
        for before, after in pairs:
            changed = changed.replace(before, after)
        if changed != text:
            path.write_bytes(changed.encode("utf-8"))  # in place, keeping the file's mode (train.py, say)


class _SwapStuckError(PipelineError):
    """The swap failed and undoing it failed too: ``out_dir`` is *not* as it was."""


def _swap_in(staging: Path, out_dir: Path) -> None:
    """Move the staged run's entries into ``out_dir``, the previous run's aside; on any error undo every rename.

    Each entry is one ``os.rename`` (atomic on one filesystem, and the staging folder sits beside ``out_dir``):
    the old one goes into ``staging/.previous`` first, then the new one takes its name.  The caller deletes the
    staging folder, and with it the previous run, once this returns.
    """
    produced = {p.name for p in staging.iterdir()} - {LOGS_DIR}
    names = [n for n in RUN_ENTRIES if n != REPORT_NAME] + sorted(produced - set(RUN_ENTRIES)) + [REPORT_NAME]
    names = [n for n in names if (out_dir / n).resolve() != paths.cache_dir()]  # the trace cache never moves
    previous = staging / ".previous"
    previous.mkdir()
    created = not out_dir.exists()
    out_dir.mkdir(exist_ok=True)
    done: list[tuple[Path, Path]] = []  # (from, to) of every rename so far, to undo in reverse
    try:
        for name in names:
            for source, target in ((out_dir / name, previous / name), (staging / name, out_dir / name)):
                if source.exists() or source.is_symlink():
                    os.rename(source, target)
                    done.append((source, target))
    except BaseException as err:
        stuck = []
        for source, target in reversed(done):
            try:
                os.rename(target, source)
            except OSError:
                stuck.append(f"{target} -> {source}")
        if created and not stuck:
            out_dir.rmdir()
        if stuck:
            raise _SwapStuckError(f"moving the run into {out_dir} failed ({err}) and could not be undone: move"
                                f" {'; '.join(stuck)} by hand") from err
        raise


def _keep_failed(staging: Path, out_dir: Path) -> Path:
    """Keep the failed run as ``.<name>.failed`` beside ``out_dir`` (replacing the last one); return where it is."""
    kept = out_dir.parent / f".{out_dir.name}.failed"
    try:
        if kept.exists():
            shutil.rmtree(kept)
        os.rename(staging, kept)
    except OSError:
        return staging  # still there, under its staging name
    _retarget(kept, staging, kept)
    return kept


def run_pipeline(
    params: Mapping[str, Any],
    out_dir: str | os.PathLike[str] = paths.OUTPUTS_DIR,
    notebooks_dir: str | os.PathLike[str] = paths.NOTEBOOKS_DIR,
    progress: bool = False,
    cell_timeout: int = 600,
    verbose: bool = False,
    on_notebook: Callable[[NotebookRun], None] | None = None,
) -> PipelineResult:
    """Execute every numbered notebook, render the report, then swap the run into ``out_dir`` (see the module).

    ``progress`` shows papermill's progress bars; ``verbose`` lets the kernels print to the terminal and echoes
    each cell's output; ``on_notebook`` is called with each notebook's :class:`NotebookRun` as it finishes.
    """
    start = time.perf_counter()
    params = validate_params(params)
    out_dir = Path(out_dir).resolve()
    notebooks = notebook_paths(notebooks_dir)
    if not notebooks:
        raise PipelineError(f"no numbered notebooks (NN_*.ipynb) in {Path(notebooks_dir).resolve()}")
    if out_dir.exists() and not out_dir.is_dir():
        raise InvalidValueError(f"output folder {str(out_dir)!r} is a file; give a folder (new or holding a run)")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.run-", dir=out_dir.parent))
    try:
        runs = _run_staged(notebooks, staging, params, progress, cell_timeout, verbose, on_notebook)
        _retarget(staging, staging, out_dir)
        source = next((staging / "notebooks" / r.name for r in runs if r.name == REPORT_NOTEBOOK),
                      staging / "notebooks" / runs[0].name)
        try:
            render_report(source, staging / REPORT_NAME)
        except ReportError as err:
            raise PipelineError(f"rendering the report from {source} failed: {err}") from err
        try:
            _swap_in(staging, out_dir)
        except OSError as err:
            raise PipelineError(f"could not move the finished run into {out_dir}: {err}") from err
    except PipelineError as err:
        kept = _keep_failed(staging, out_dir)
        message = str(err).replace(str(staging), str(kept))
        logs = f", each kernel's own output under {LOGS_DIR}/" if (kept / LOGS_DIR).is_dir() else ""
        left = "" if isinstance(err, _SwapStuckError) else f"; {out_dir} is left as it was"
        raise PipelineError(f"{message}{left} (the failed run is in {kept}{logs})") from err
    except BaseException:  # an interrupt or an unexpected error: out_dir is untouched; keep what ran
        _keep_failed(staging, out_dir)
        raise
    shutil.rmtree(staging, ignore_errors=True)  # the previous run, moved aside, and the kernels' logs
    executed = tuple(out_dir / "notebooks" / r.name for r in runs)
    results = tuple(out_dir / "results" / f"{Path(r.name).stem}.json" for r in runs)
    return PipelineResult(executed, results, out_dir / REPORT_NAME, time.perf_counter() - start, tuple(runs))


def _run_staged(notebooks: list[Path], staging: Path, params: dict[str, Any], progress: bool, cell_timeout: int,
                verbose: bool, on_notebook: Callable[[NotebookRun], None] | None) -> list[NotebookRun]:
    """Run every notebook with ``staging`` as its ``out_dir``; raise :class:`PipelineError` at the first failure."""
    for sub in ("notebooks", "results", *(() if verbose else (LOGS_DIR,))):
        (staging / sub).mkdir()
    runs = []
    for notebook in notebooks:
        notebook = notebook.resolve()
        executed = staging / "notebooks" / notebook.name
        results_path = staging / "results" / f"{notebook.stem}.json"
        kernel_log = None if verbose else staging / LOGS_DIR / f"{notebook.stem}.log"
        began = time.perf_counter()
        _run_notebook(notebook, executed, params, results_path, staging, progress, cell_timeout, kernel_log)
        if not results_path.is_file():
            raise PipelineError(
                f"notebook {notebook.name} ran but wrote no results at {results_path}; it should call"
                f" oomlab.report.results.write_results({RESULTS_PATH_PARAM}, ...) with its parameter;"
                f" the executed notebook is kept at {executed}"
            )
        run = NotebookRun(notebook.name, time.perf_counter() - began)
        runs.append(run)
        if on_notebook is not None:
            on_notebook(run)
    return runs
