"""Ctrl-C while a notebook runs, at each moment it can land: the interrupt reaches the runner as KeyboardInterrupt at
once and no kernel outlives it -- also while the kernel is still starting, where nbclient's own SIGINT handler on its
event loop used to swallow the interrupt (its clean-up found no kernel yet; the kernel then started and ran its cell
to the end, the command hanging until it did)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from oomlab.pipeline import kernel
from tests.pipeline.test_pipeline import make_notebook

pytestmark = pytest.mark.heavy  # starts Jupyter kernels

MARKER = "oomlab-interrupt-test-cell"


def _run(tmp_path: Path) -> None:
    nb = make_notebook(tmp_path / "01_slow.ipynb", "Slow", [f"import time  # {MARKER}\ntime.sleep(300)"])
    (tmp_path / "run" / "notebooks").mkdir(parents=True)
    (tmp_path / "run" / "results").mkdir()
    kernel.run_notebook(nb, tmp_path / "run" / "notebooks" / nb.name, {}, tmp_path / "run" / "results" / "setup.json",
                        tmp_path / "run" / "results" / "01_slow.json", tmp_path / "run", False, 600,
                        tmp_path / "run" / "kernel.log")


def _interrupt_when(event: threading.Event) -> threading.Thread:
    """SIGINT to this process (the main thread gets it, as from a terminal) once ``event`` is set."""
    def send() -> None:
        if event.wait(120):
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def _live_kernels() -> list[int]:
    """The pids of kernel processes still running (a killed one is reaped within a second)."""
    pids = {p.pid for k in list(kernel._KERNELS) if (p := getattr(k.provisioner, "process", None)) is not None}
    time.sleep(1)
    return sorted(pid for pid in pids if Path(f"/proc/{pid}").exists()
                  and "State:\tZ" not in Path(f"/proc/{pid}/status").read_text())


def test_ctrl_c_while_the_kernel_starts_stops_at_once_and_starts_no_kernel(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    starting = threading.Event()
    launched = []
    launch = kernel.KernelLogManager._async_launch_kernel

    async def slow_launch(self, kernel_cmd, **kw):  # the start-up a busy machine has: seconds before Popen
        import asyncio

        starting.set()
        await asyncio.sleep(3)
        launched.append(True)
        return await launch(self, kernel_cmd, **kw)

    monkeypatch.setattr(kernel.KernelLogManager, "_async_launch_kernel", slow_launch)
    _interrupt_when(starting)
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path)
    assert time.monotonic() - began < 60
    assert _live_kernels() == []  # the launch after the interrupt raised before any Popen


def test_ctrl_c_in_a_running_cell_kills_its_kernel(tmp_path: Path) -> None:
    running = threading.Event()
    def poll() -> None:
        for _ in range(1200):
            if _cell_started(tmp_path):
                running.set()
                return
            time.sleep(0.1)

    threading.Thread(target=poll, daemon=True).start()
    _interrupt_when(running)
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path)
    assert time.monotonic() - began < 100
    assert _live_kernels() == []
    executed = (tmp_path / "run" / "notebooks" / "01_slow.ipynb").read_text()
    assert "interrupted (Ctrl-C)" in executed  # the running cell says why it stopped


def _cell_started(tmp_path: Path) -> bool:
    """The slow cell has started: papermill wrote its start time into the executed notebook."""
    import nbformat

    path = tmp_path / "run" / "notebooks" / "01_slow.ipynb"
    try:
        nb = nbformat.read(path, as_version=4)
    except (OSError, ValueError):
        return False
    return any(MARKER in c.source and c.metadata.get("papermill", {}).get("start_time") for c in nb.cells)
