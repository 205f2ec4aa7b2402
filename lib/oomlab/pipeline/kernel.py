"""Execute one notebook with papermill in its own kernel, the kernel's own chatter in a log file, and turn a failure
(a raising cell, a timeout, a dead kernel) into one :class:`~oomlab.core.errors.PipelineError` naming the cell.
:mod:`.runner` stages, checks and swaps the run around it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager
from traitlets import Unicode
from traitlets.config import Config

from oomlab.core.errors import PipelineError
from oomlab.pipeline.params import OUT_DIR_PARAM, RESULTS_PATH_PARAM, SETUP_PATH_PARAM

KERNEL_NAME = "python3"
# after Ctrl-C kills the kernel, how long papermill may take to notice and write the executed notebook
KILLED_KERNEL_WAIT_S = 30
_STOP = threading.Event()  # set by Ctrl-C: a kernel that has not started yet never does
_KERNELS: weakref.WeakSet[KernelLogManager] = weakref.WeakSet()  # every kernel started, for Ctrl-C to kill


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
        if _STOP.is_set():
            raise RuntimeError("interrupted (Ctrl-C) before the kernel started")
        _KERNELS.add(self)
        if not self.log_path:
            return await super()._async_launch_kernel(kernel_cmd, **kw)
        with open(self.log_path, "ab") as log:  # Popen duplicates the descriptor; ours can close at once
            return await super()._async_launch_kernel(kernel_cmd, **{**kw, "stdout": log, "stderr": log})

    def kill_now(self) -> None:
        """SIGKILL the kernel's process group (jupyter_client starts each kernel in its own session), from any
        thread; a kernel not (yet, or any longer) running is left be."""
        process = getattr(self.provisioner, "process", None)
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:
            with contextlib.suppress(OSError):
                process.kill()


def _interruptible(execute: Any) -> None:
    """Run ``execute()`` (papermill, with its kernel) in a worker thread and wait for it in this one.

    nbclient installs its own SIGINT handler on its event loop while a kernel starts and runs; a Ctrl-C that lands
    while the kernel is still starting is lost there (nbclient's clean-up finds no kernel yet; the kernel then starts
    and runs its cell to the end).  In a worker thread nbclient installs none, so Ctrl-C always reaches this thread as
    :class:`KeyboardInterrupt`: the kernels are killed, a kernel not yet started never starts, papermill is given
    :data:`KILLED_KERNEL_WAIT_S` to write the executed notebook, and the interrupt goes on to the runner."""
    outcome: list[BaseException] = []
    done = threading.Event()  # NB: not Thread.join/is_alive: a join interrupted by Ctrl-C leaves the thread marked
    # finished while it runs on (CPython's tstate lock, python/cpython#90882), and the next join returns at once

    def work() -> None:
        try:
            execute()
        except BaseException as err:  # handed to the waiting thread, which raises it as its own
            outcome.append(err)
        finally:  # the event loop jupyter_core made for this thread (asyncio.set_event_loop): closed with it
            with contextlib.suppress(RuntimeError):
                asyncio.get_event_loop_policy().get_event_loop().close()
            done.set()

    _STOP.clear()
    worker = threading.Thread(target=work, name="oomlab-notebook", daemon=True)
    worker.start()
    try:
        while not done.wait(0.1):
            pass
    except KeyboardInterrupt:
        _STOP.set()
        for kernel in list(_KERNELS):
            kernel.kill_now()
        done.wait(KILLED_KERNEL_WAIT_S)
        raise
    if outcome:
        raise outcome[0]


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


@contextlib.contextmanager
def _papermill_log_to(path: Path | None) -> Iterator[None]:
    """Papermill's and nbclient's log records (``logging.getLogger("papermill")``: "Kernel died while waiting for
    execute reply." when Ctrl-C reaches the kernel) go to ``path`` instead of the terminal; None leaves them be
    (``--verbose``).  The failure itself is reported once, by the runner."""
    if path is None:
        yield
        return
    logger = logging.getLogger("papermill")
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
        handler.close()


def run_notebook(notebook: Path, executed: Path, params: dict[str, Any], setup_path: Path, results_path: Path,
                  out_dir: Path, progress: bool, cell_timeout: int, kernel_log: Path | None) -> None:
    """Execute ``notebook`` into ``executed``; ``kernel_log`` None lets the kernel print to the terminal and echoes
    cell output.

    The kernel runs in ``executed``'s folder and every path it is given is relative to it (``out_dir = ".."``,
    ``results_path = "../results/01_….json"``): what the notebooks write names the run's own folder wherever it is
    moved -- the staging folder, ``out_dir`` after the swap, a copy -- and an executed notebook opened in Jupyter
    from there runs the same."""
    import papermill
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    declared = papermill.inspect_notebook(str(notebook))
    here = executed.parent
    available = {**params, **{name: os.path.relpath(path, here) for name, path in
                              ((SETUP_PATH_PARAM, setup_path), (RESULTS_PATH_PARAM, results_path),
                               (OUT_DIR_PARAM, out_dir))}}
    inject = {name: available[name] for name in declared if name in available}
    if kernel_log is None:
        quiet: dict[str, Any] = {"stdout_file": sys.stdout, "stderr_file": sys.stderr}
    else:
        quiet = {"config": Config({KernelLogManager.__name__: {"log_path": str(kernel_log)}})}
    try:
        with _papermill_log_to(kernel_log):
            _interruptible(lambda: papermill.execute_notebook(
                str(notebook), str(executed), parameters=inject, kernel_name=KERNEL_NAME,
                progress_bar=progress, execution_timeout=cell_timeout, kernel_manager_class=KernelLogManager,
                # NB: the executed notebook's folder, as Jupyter would run it from there: the injected paths are
                # relative to it (the user's own paths, launch_dir, are absolute: params made them so)
                cwd=str(here), **quiet,
            ))
    except KeyboardInterrupt:
        _mark_interrupted(executed, "KeyboardInterrupt: the run was interrupted (Ctrl-C); its kernel was killed")
        raise
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
    finally:
        _own_name(executed)


def _own_name(executed: Path) -> None:
    """Papermill records the path it wrote to (``metadata.papermill.output_path``: the staging folder); the executed
    notebook names itself instead, as the injected paths are relative to it."""
    import nbformat

    try:
        nb = nbformat.read(executed, as_version=4)
    except (OSError, ValueError):
        return  # not written (papermill failed before it) or unreadable: nothing names the staging folder
    if "output_path" in nb.metadata.get("papermill", {}):
        nb.metadata.papermill["output_path"] = executed.name
        nbformat.write(nb, executed)

