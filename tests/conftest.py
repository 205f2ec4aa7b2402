"""Shared fixtures for the browser tests: Debian's chromium, driven through Playwright's Python API.

``chromium_path`` finds the browser (``$OOMLAB_CHROMIUM``, then ``chromium`` / ``chromium-browser`` on PATH);
when it is missing and the tests run as root it installs Debian's ``chromium`` with apt-get, else it skips
with the reason.  Playwright never downloads a browser here (no ``playwright install``): it launches this
executable.  ``browser`` is one headless Playwright ``Browser`` per test module; open pages with
``browser.new_page()`` and close them in the test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

# Every property test draws the same examples on every run and machine (no database of past failures replayed in a
# later run): a failure reproduces, and a test passes or fails for its code, never for its luck.
settings.register_profile("oomlab", derandomize=True, database=None)
settings.load_profile("oomlab")

CHROMIUM_NAMES = ("chromium", "chromium-browser")
APT_TIMEOUT_S = 900  # apt-get update + install of chromium and its libraries
LAUNCH_TIMEOUT_MS = 60_000
# Headless in a container as root, and nothing fetched behind the test's back.
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def find_chromium() -> str | None:
    """The chromium executable: ``$OOMLAB_CHROMIUM`` if set, else the first of CHROMIUM_NAMES on PATH."""
    configured = os.environ.get("OOMLAB_CHROMIUM")
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def install_chromium() -> str:
    """Install Debian's chromium with apt-get (root only); returns why not when it cannot."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "not root, so apt-get cannot install it (run: sudo apt-get install -y chromium)"
    if shutil.which("apt-get") is None:
        return "apt-get is not available to install Debian's chromium"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
        try:
            proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return f"{' '.join(command)} did not finish in {APT_TIMEOUT_S} s"
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            return f"{' '.join(command)} failed with exit code {proc.returncode}: {tail[0]}"
    return ""


SLOW_ENV = "OOMLAB_SLOW"


def slow_selected(config: pytest.Config) -> bool:
    """Slow tests run when asked for: ``-m`` names ``slow`` (``-m slow``, ``-m "slow and not x"``) or OOMLAB_SLOW=1."""
    expression = config.getoption("-m") or ""
    return os.environ.get(SLOW_ENV) == "1" or ("slow" in expression and "not slow" not in expression)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests marked ``slow`` unless they are selected (plain ``pytest`` stays minutes, not hours)."""
    if slow_selected(config):
        return
    skip = pytest.mark.skip(reason=f"slow: run with `pytest -m slow` or {SLOW_ENV}=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """Path of a chromium executable, installed from Debian when missing; skips where that is impossible."""
    found = find_chromium()
    if found is None and not os.environ.get("OOMLAB_CHROMIUM"):
        why = install_chromium()
        found = find_chromium()
        if found is None:
            pytest.skip(f"browser test needs chromium, which was not found on PATH and could not be installed: "
                        f"{why or 'apt-get installed no chromium executable'}")
    if found is None:
        pytest.skip(f"OOMLAB_CHROMIUM={os.environ['OOMLAB_CHROMIUM']!r} is not an executable file")
    return found


@pytest.fixture(scope="module")
def browser(chromium_path: str) -> Iterator[Any]:
    """One headless Playwright Browser on that chromium per test module; closed, and Playwright stopped, after.

    Module scope: Playwright's sync API keeps its own event loop, which must not outlive the browser tests
    into modules that run asyncio (nbclient)."""
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    try:
        launched = playwright.chromium.launch(executable_path=chromium_path, headless=True, args=list(CHROMIUM_ARGS),
                                              timeout=LAUNCH_TIMEOUT_MS)
    except BaseException:
        playwright.stop()
        raise
    try:
        yield launched
    finally:
        try:
            launched.close()
        finally:
            playwright.stop()
