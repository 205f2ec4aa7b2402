"""Run the numbered notebooks with papermill, then render the HTML report -- staged, so a failed run loses nothing.

The promise: **no run deletes a user's files.**  A run replaces only what an earlier oomlab run provably wrote.

:func:`run_pipeline` validates the parameters (:mod:`.params`) and the output folder, takes the folder's lock
(``.<name>.lock`` beside it: a second run into the same folder is refused at once), and refuses the run before any
notebook runs unless every path under the entries it replaces (:data:`RUN_ENTRIES`) is listed, with the same
SHA-256, in the manifest the last run left there (:data:`~.ownership.MANIFEST_NAME`, :mod:`.ownership`): a user's
``notebooks/analysis.ipynb``, a result they edited, a folder with no manifest at all (``--out .`` in a project) make
the run stop with a message naming the file, and every file stays byte for byte as it was.  A folder that cannot be
created or written (``/proc``, a read-only or full filesystem) is refused the same way, before any notebook runs.

It reads the user's launch once (:func:`~.params.read_user_setup`: a bad launch is refused here too), records it
as ``results/setup.json`` (:mod:`oomlab.launch.record`) for every notebook to read back typed, then executes
``notebooks/NN_*.ipynb`` in order into a staging folder beside ``out_dir`` (``.<name>.run-*``),
checks that each wrote its results JSON (through :func:`oomlab.report.results.write_results`), renders
``report.html`` and writes the new manifest there, checks the ownership again (the folder may have changed during
the run), and only then swaps the run's entries into ``out_dir``, one rename each, the previous run's moved aside
until every rename has succeeded.  A failure anywhere (a full disk included), a refusal at that last check or a
Ctrl-C (:class:`RunInterrupted`) leaves ``out_dir`` exactly as it was and keeps the failed run in ``.<name>.failed``
beside it (the executed notebooks, results so far, and each kernel's own output under ``logs/``).  Whatever else
``out_dir`` holds -- the trace cache ``cache/``, a screenshot -- is never moved.

By default the kernels' own chatter (``[IPKernelApp] WARNING | Kernel is running over TCP …``, torch profiler
``USDT … profiler_start`` lines written to file descriptor 2 by C++ code) goes to those logs, not the terminal;
``verbose=True`` lets it through and echoes every cell's stdout and stderr (warnings included).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oomlab.core import paths
from oomlab.core.errors import OutputFolderError, PipelineError, ReportError
from oomlab.launch.read import UserLaunch
from oomlab.launch.record import SETUP_RECORD_NAME, write_launch
from oomlab.pipeline.kernel import run_notebook
from oomlab.pipeline.ownership import (
    MANIFEST_NAME,
    Foreign,
    foreign_path,
    manifest_of,
    out_dir_lock,
    read_manifest,
    unwritable,
    write_manifest,
)
from oomlab.pipeline.params import RESULTS_PATH_PARAM, read_user_setup, validate_params
from oomlab.report.html import render_report

REPORT_NOTEBOOK = "04_report.ipynb"  # rendered as the report when present, else the first notebook
REPORT_NAME = "report.html"
# What a run owns in out_dir (notebook 03 writes configs/ through its out_dir parameter); the report goes last, so
# a reader who sees the new report finds the new results beside it.  Anything else in out_dir is left alone.
RUN_ENTRIES = ("notebooks", "results", "configs", REPORT_NAME)
LOGS_DIR = "logs"  # in the staging folder: each kernel's own stdout/stderr; kept only with a failed run
PREVIOUS_DIR = ".previous"  # in the staging folder: the previous run's entries, moved aside during the swap
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


def notebook_paths(notebooks_dir: str | os.PathLike[str] = paths.NOTEBOOKS_DIR) -> list[Path]:
    """The numbered notebooks ``NN_*.ipynb`` in run order (``explore.ipynb`` and others left out)."""
    return sorted(p for p in Path(notebooks_dir).glob("*.ipynb") if _NUMBERED.match(p.name))


class _SwapStuckError(PipelineError):
    """The swap failed and undoing it failed too: ``out_dir`` is *not* as it was."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run: ``out_dir`` is as it was; :attr:`kept` is the partial run (None: no notebook had run)."""

    def __init__(self, kept: Path | None) -> None:
        super().__init__(kept)
        self.kept = kept


def output_folder(out_dir: str | os.PathLike[str]) -> Path:
    """``out_dir`` made absolute, or :class:`OutputFolderError` for what cannot be one (before anything is made)."""
    if os.fspath(out_dir) == "":
        raise OutputFolderError("output folder '' is empty; give a folder path: a new folder, or one holding an"
                                " earlier oomlab run (default outputs/)")
    path = Path(out_dir).resolve()
    if path.exists() and not path.is_dir():
        raise OutputFolderError(f"output folder {str(path)!r} is a file; give a folder (new or holding a run)")
    if path.parent == path:
        raise OutputFolderError(f"output folder {str(path)!r} is a filesystem root; give a folder inside it")
    return path


def _replaced(out_dir: Path, names: list[str]) -> list[str]:
    """The entries of ``names`` a swap into ``out_dir`` replaces: all but the trace cache, which never moves."""
    return [n for n in names if (out_dir / n).resolve() != paths.cache_dir()]


def _swap_names(staging: Path, out_dir: Path) -> list[str]:
    """What the swap moves, in order: the run's entries (the report last, so a reader who sees the new report finds
    the new results beside it), with anything else the staged run produced before the report."""
    produced = {p.name for p in staging.iterdir()} - {LOGS_DIR, PREVIOUS_DIR, MANIFEST_NAME}
    names = [n for n in RUN_ENTRIES if n != REPORT_NAME] + sorted(produced - set(RUN_ENTRIES)) + [REPORT_NAME]
    return _replaced(out_dir, names)


def _refusal(out_dir: Path, foreign: Foreign, consequence: str) -> str:
    return (f"output folder {out_dir} holds {foreign.path}, {foreign.why}; a run replaces {foreign.entry} whole, so"
            f" {consequence}: choose another --out, or move {foreign.entry} out of {out_dir}")


def _foreign(out_dir: Path, names: list[str]) -> Foreign | None:
    """The first path under ``names`` in ``out_dir`` that the last run's manifest does not vouch for."""
    manifest, missing = read_manifest(out_dir)
    return foreign_path(out_dir, names, manifest, missing)


def _check_writable(out_dir: Path) -> None:
    """Refuse a folder a run could not write or swap into, before any notebook runs: a read-only filesystem, one
    with no space left, or ``out_dir`` (or an entry the swap renames) without write permission."""
    parent = out_dir.parent
    try:
        info = os.statvfs(parent)
        if info.f_flag & os.ST_RDONLY:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(parent))
        if info.f_bavail == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(parent))
        moved = [out_dir / n for n in _replaced(out_dir, [*RUN_ENTRIES, MANIFEST_NAME])
                 if (out_dir / n).is_dir() and not (out_dir / n).is_symlink()]
        for folder in ([out_dir] if out_dir.exists() else []) + moved:
            if not os.access(folder, os.W_OK | os.X_OK):
                raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(folder))
    except OSError as err:
        raise unwritable(out_dir, err) from err


def _swap_in(staging: Path, out_dir: Path, names: list[str]) -> None:
    """Move the staged run's entries ``names`` into ``out_dir``, the previous run's aside; on any error undo every
    rename.

    Each entry is one ``os.rename`` (atomic on one filesystem, and the staging folder sits beside ``out_dir``):
    the old one goes into ``staging/.previous`` first, then the new one takes its name.  The manifest goes last.
    The caller deletes the staging folder, and with it the previous run, once this returns.
    """
    previous = staging / PREVIOUS_DIR
    previous.mkdir()
    created = not out_dir.exists()
    out_dir.mkdir(exist_ok=True)
    done: list[tuple[Path, Path]] = []  # (from, to) of every rename so far, to undo in reverse
    try:
        for name in [*names, MANIFEST_NAME]:
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
    Raises :class:`OutputFolderError` before any notebook runs for a folder a run may not write (a user's files in
    its entries, another run's lock, an unwritable folder), :class:`PipelineError` for a failed run and
    :class:`RunInterrupted` for a Ctrl-C; ``out_dir`` is then as it was.
    """
    start = time.perf_counter()
    swapped = False
    try:
        params = validate_params(params)
        launch = read_user_setup(params)  # once per run: every notebook reads this record (results/setup.json)
        out_dir = output_folder(out_dir)
        notebooks = notebook_paths(notebooks_dir)
        if not notebooks:
            raise PipelineError(f"no numbered notebooks (NN_*.ipynb) in {Path(notebooks_dir).resolve()}")
        try:
            out_dir.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise unwritable(out_dir, err) from err
        with out_dir_lock(out_dir):
            foreign = _foreign(out_dir, _replaced(out_dir, list(RUN_ENTRIES)))
            if foreign is not None:
                raise OutputFolderError(_refusal(out_dir, foreign, "nothing was run and nothing changed"))
            _check_writable(out_dir)
            try:
                staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.run-", dir=out_dir.parent))
            except OSError as err:
                raise unwritable(out_dir, err) from err
            runs = _run_and_swap(notebooks, staging, out_dir, params, launch, progress, cell_timeout, verbose,
                                 on_notebook)
            swapped = True
    except KeyboardInterrupt as err:
        if swapped or isinstance(err, RunInterrupted):
            raise
        raise RunInterrupted(None) from err
    shutil.rmtree(staging, ignore_errors=True)  # the previous run, moved aside, and the kernels' logs
    executed = tuple(out_dir / "notebooks" / r.name for r in runs)
    results = tuple(out_dir / "results" / f"{Path(r.name).stem}.json" for r in runs)
    return PipelineResult(executed, results, out_dir / REPORT_NAME, time.perf_counter() - start, tuple(runs))


def _run_and_swap(notebooks: list[Path], staging: Path, out_dir: Path, params: dict[str, Any], launch: UserLaunch,
                  progress: bool, cell_timeout: int, verbose: bool,
                  on_notebook: Callable[[NotebookRun], None] | None) -> list[NotebookRun]:
    """Run, render and write the manifest in ``staging``, check the ownership again, then swap into ``out_dir``; on
    any failure keep the staged run as ``.<name>.failed`` and say so."""
    try:
        try:
            runs = _run_staged(notebooks, staging, params, launch, progress, cell_timeout, verbose, on_notebook)
            source = next((staging / "notebooks" / r.name for r in runs if r.name == REPORT_NOTEBOOK),
                          staging / "notebooks" / runs[0].name)
            try:
                render_report(source, staging / REPORT_NAME)
            except ReportError as err:
                raise PipelineError(f"rendering the report from {source} failed: {err}") from err
            names = _swap_names(staging, out_dir)
            write_manifest(staging, manifest_of(staging, names))
        except OSError as err:  # a full disk while writing the run
            where = f": {err.filename}" if err.filename else ""
            raise PipelineError(f"writing the run failed ({err.strerror or err}{where})") from err
        foreign = _foreign(out_dir, names)  # again: the folder may have changed during the run
        if foreign is not None:
            raise OutputFolderError(_refusal(out_dir, foreign, "the finished run was not moved in"))
        try:
            _swap_in(staging, out_dir, names)
        except OSError as err:
            raise PipelineError(f"could not move the finished run into {out_dir}: {err}") from err
    except OutputFolderError as err:
        kept = _keep_failed(staging, out_dir)
        raise OutputFolderError(f"{err}; {out_dir} is left as it was (the finished run is in {kept})") from err
    except PipelineError as err:
        kept = _keep_failed(staging, out_dir)
        message = str(err).replace(str(staging), str(kept))
        logs = f", each kernel's own output under {LOGS_DIR}/" if (kept / LOGS_DIR).is_dir() else ""
        left = "" if isinstance(err, _SwapStuckError) else f"; {out_dir} is left as it was"
        raise PipelineError(f"{message}{left} (the failed run is in {kept}{logs})") from err
    except KeyboardInterrupt as err:
        raise RunInterrupted(_keep_failed(staging, out_dir)) from err
    except BaseException:  # an unexpected error: out_dir is untouched; keep what ran
        _keep_failed(staging, out_dir)
        raise
    return runs


def _run_staged(notebooks: list[Path], staging: Path, params: dict[str, Any], launch: UserLaunch, progress: bool,
                cell_timeout: int, verbose: bool,
                on_notebook: Callable[[NotebookRun], None] | None) -> list[NotebookRun]:
    """Record ``launch`` in ``results/``, then run every notebook with ``staging`` as its ``out_dir``; raise
    :class:`PipelineError` at the first failure."""
    for sub in ("notebooks", "results", *(() if verbose else (LOGS_DIR,))):
        (staging / sub).mkdir()
    setup_path = write_launch(staging / "results" / SETUP_RECORD_NAME, launch)
    runs = []
    for notebook in notebooks:
        notebook = notebook.resolve()
        executed = staging / "notebooks" / notebook.name
        results_path = staging / "results" / f"{notebook.stem}.json"
        kernel_log = None if verbose else staging / LOGS_DIR / f"{notebook.stem}.log"
        began = time.perf_counter()
        run_notebook(notebook, executed, params, setup_path, results_path, staging, progress, cell_timeout,
                      kernel_log)
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
