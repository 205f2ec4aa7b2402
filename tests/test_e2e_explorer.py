"""End to end: JupyterLab serves a copy of the notebooks, chromium opens explore.ipynb and runs it, a control
changes, and the verdict and the bar change in the page."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from oomlab.core.gpus import load_gpu
from oomlab.core.paths import NOTEBOOKS_DIR
from oomlab.core.units import format_size

pytestmark = pytest.mark.heavy  # JupyterLab in chromium: `pytest -m "not heavy"` leaves it out

SERVER_START_TIMEOUT_S = 90
SERVER_STOP_TIMEOUT_S = 20
PAGE_TIMEOUT_MS = 60_000
RUN_TIMEOUT_MS = 120_000  # the kernel starts and imports oomlab, matplotlib and ipywidgets
# Hide the "receive official Jupyter news?" toast that otherwise covers the page; never fetch news.
SETTINGS_OVERRIDES = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}}


@dataclass(frozen=True)
class Lab:
    """A running JupyterLab server."""

    url: str  # http://127.0.0.1:PORT
    token: str
    root: Path  # the temporary copy of the notebooks it serves
    log: Path  # the server's stdout and stderr


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _api(lab_url: str, token: str, path: str, method: str = "GET") -> Any:
    request = urllib.request.Request(f"{lab_url}{path}", method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        body = response.read()
    return json.loads(body) if body else None


def _wait_until_ready(proc: subprocess.Popen, url: str, token: str, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with code {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            _api(url, token, "/api/status")
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.25)
    raise RuntimeError(f"jupyter lab did not answer within {SERVER_START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen, url: str, token: str) -> None:
    """Shut the kernels down through the API, then the server (its process group), killing it if it hangs."""
    if proc.poll() is None:
        try:
            for kernel in _api(url, token, "/api/kernels"):
                _api(url, token, f"/api/kernels/{kernel['id']}", method="DELETE")
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            pass  # the server is going anyway; SIGTERM makes it shut its kernels down too
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=SERVER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """JupyterLab on 127.0.0.1 (a free port, a token, no browser) over a temporary copy of notebooks/."""
    base = tmp_path_factory.mktemp("lab")
    root = base / "notebooks"
    shutil.copytree(NOTEBOOKS_DIR, root)
    app_settings = base / "app-settings"
    app_settings.mkdir()
    (app_settings / "overrides.json").write_text(json.dumps(SETTINGS_OVERRIDES))
    env = {
        **os.environ,
        "JUPYTERLAB_SETTINGS_DIR": str(base / "user-settings"),  # not the user's own settings
        "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces"),  # no restored layout
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
        "MPLBACKEND": "Agg",
    }
    port, token = _free_port(), secrets.token_hex(16)
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable, "-m", "jupyterlab", "--no-browser",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        f"--LabApp.app_settings_dir={app_settings}",
        "--LabApp.expose_app_in_browser=True",  # window.jupyterapp: run all cells through a command
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")
    log = base / "server.log"
    with log.open("w") as log_file:
        proc = subprocess.Popen(command, cwd=root, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            _wait_until_ready(proc, url, token, log)
            yield Lab(url=url, token=token, root=root, log=log)
        finally:
            _stop(proc, url, token)


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page, closed after the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    try:
        yield page
    finally:
        context.close()


def _bar_snapshot(page: Any) -> tuple[str, bytes]:
    """The bar image's src and its pixels, once it has loaded."""
    bar = page.locator(".oomlab-explorer img.oomlab-bar")
    bar.wait_for(state="visible")
    page.wait_for_function("() => { const img = document.querySelector('.oomlab-explorer img.oomlab-bar');"
                           " return img && img.complete && img.naturalWidth > 0; }")
    return bar.get_attribute("src") or "", bar.screenshot()


def test_explorer_runs_in_jupyterlab_and_follows_the_controls(lab: Lab, page: Any) -> None:
    """Open explore.ipynb, run all cells, switch method and GPU: the verdict and the bar change in the page."""
    from playwright.sync_api import expect

    page.goto(f"{lab.url}/lab/tree/explore.ipynb?token={lab.token}")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                           " && window.jupyterapp.shell.currentWidget.sessionContext")
    page.evaluate("""async () => {
        const panel = window.jupyterapp.shell.currentWidget;
        await panel.context.ready;
        await panel.sessionContext.ready;
        await window.jupyterapp.commands.execute('notebook:run-all-cells');
    }""")
    verdict = page.locator(".oomlab-explorer .oomlab-verdict")
    expect(verdict).to_contain_text("Does not fit on 4 x Tesla T4", timeout=RUN_TIMEOUT_MS)
    before_text = verdict.inner_text()
    before_src, before_png = _bar_snapshot(page)

    page.locator(".oomlab-explorer").get_by_role("button", name="lora", exact=True).click()
    expect(verdict).not_to_have_text(before_text)
    lora_text = verdict.inner_text()
    assert "Does not fit on 4 x Tesla T4" in lora_text  # half weights alone exceed a T4

    a100 = load_gpu("a100-80gb")
    gpu_select = page.locator('.oomlab-explorer .widget-dropdown:has(label:text-is("GPU")) select')
    gpu_select.select_option(label=f"{a100.display_name} ({format_size(a100.total_memory_bytes)})")
    expect(verdict).to_contain_text(f"Fits on 4 x {a100.display_name}")
    expect(verdict).to_contain_text("Largest micro-batch that fits: ")

    page.wait_for_function("(src) => document.querySelector('.oomlab-explorer img.oomlab-bar').src !== src",
                           arg=before_src)
    after_src, after_png = _bar_snapshot(page)
    page.locator(".oomlab-explorer").screenshot(path=lab.root.parent / "explorer.png")  # for a look (tmp dir)
    assert after_src != before_src
    assert after_png != before_png
