"""Screenshots of the seed's report in headless Chromium, at a desktop and a phone width, for docs/screenshots/.

    .venv/bin/python scripts/screenshot_report.py                  # runs the seed's pipeline in a temporary folder
    .venv/bin/python scripts/screenshot_report.py --report outputs/report.html

Debian's chromium (``$OOMLAB_CHROMIUM``, else ``chromium`` / ``chromium-browser`` on PATH) through Playwright, launched
as the browser tests launch it (tests/conftest.py): no browser download, nothing fetched.  Each section of the report
named in :data:`SECTIONS` is scrolled to the top of the window and shot at each width in :data:`VIEWPORTS`; the
script fails (exit 1) when the page fetches anything, logs an error, or is wider than a phone's screen.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "docs" / "screenshots"
# (name, width, height, device scale factor)
VIEWPORTS = (("desktop", 1280, 900, 1), ("phone", 390, 844, 2))
# (file stem, the heading the shot starts at; None: the top of the page)
SECTIONS = (
    ("answer", None),
    ("remedies", "The remedies, ranked"),
    ("fix", "The recommended fix"),
    ("assumptions", "Assumptions and limits"),
)
CHROMIUM_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync")


def find_chromium() -> str:
    configured = os.environ.get("OOMLAB_CHROMIUM")
    found = configured or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found or not os.access(found, os.X_OK):
        sys.exit("screenshot_report: no chromium (set OOMLAB_CHROMIUM or: apt-get install -y chromium)")
    return found


def seed_report(folder: Path) -> Path:
    """Run the seed's pipeline (every parameter at its default) into ``folder``; the report's path."""
    from oomlab.core.paths import NOTEBOOKS_DIR
    from oomlab.pipeline.params import parse_params
    from oomlab.pipeline.runner import run_pipeline

    run_pipeline(parse_params([]), out_dir=folder, notebooks_dir=NOTEBOOKS_DIR, progress=True)
    return folder / "report.html"


def shoot(report: Path, out_dir: Path) -> list[Path]:
    """Every section at every width; the files written."""
    from playwright.sync_api import sync_playwright

    out_dir.mkdir(parents=True, exist_ok=True)
    written, problems = [], []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=find_chromium(), headless=True, args=list(CHROMIUM_ARGS))
        try:
            for name, width, height, scale in VIEWPORTS:
                page = browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=scale)
                fetched, errors = [], []
                page.on("request", lambda r, f=fetched: f.append(r.url) if not r.url.startswith(("file:", "data:"))
                        else None)
                page.on("console", lambda m, e=errors: e.append(m.text) if m.type == "error" else None)
                page.goto(report.as_uri(), wait_until="load")
                wide = page.evaluate("document.documentElement.scrollWidth")
                if wide > width:
                    problems.append(f"{name}: the page is {wide} px wide in a {width} px window")
                for stem, heading in SECTIONS:
                    if heading is None:
                        page.evaluate("window.scrollTo(0, 0)")
                    else:
                        target = page.get_by_role("heading", name=heading).first
                        target.evaluate("e => e.scrollIntoView({block: 'start'})")
                    path = out_dir / f"{name}-{stem}.png"
                    page.screenshot(path=str(path))
                    written.append(path)
                problems += [f"{name}: fetched {url}" for url in fetched] + [f"{name}: console: {e}" for e in errors]
                page.close()
        finally:
            browser.close()
    if problems:
        sys.exit("screenshot_report: " + "; ".join(problems))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", type=Path, help="a rendered report.html (default: run the seed's pipeline)")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help=f"where the PNGs go (default: {OUT_DIR})")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.report is not None:
        if not args.report.is_file():
            parser.error(f"--report {args.report}: no such file")
        paths = shoot(args.report.resolve(), args.out)
    else:
        with tempfile.TemporaryDirectory(prefix="oomlab-screenshots-") as tmp:
            paths = shoot(seed_report(Path(tmp) / "out"), args.out)
    for path in paths:
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
