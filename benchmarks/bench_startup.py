"""Time the CLI's start-up: ``python -m oomlab --help`` in a fresh interpreter, median of several runs.

    .venv/bin/python benchmarks/bench_startup.py [--repeat 15] [--before REV]

Also reports whether torch was imported (it must not be: the parser is built from the core's choices only).
``--before REV`` times the ``lib/`` of an earlier commit the same way, beside the tree's (``git archive`` into a
temporary folder, run with the same interpreter), and prints the ratio: ``--before fa62028~1`` is the flat layout
before the subpackages, whose ``--help`` imported torch.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

TARGET_S = 0.5  # --help should answer well under a second; torch alone takes ~0.7 s to import here
REPO = Path(__file__).resolve().parents[1]


def time_help(lib: Path, repeat: int) -> tuple[list[float], str]:
    """Wall times of ``python -m oomlab --help`` with ``lib`` first on the path, and whether its parser loads torch."""
    env = {**os.environ, "PYTHONPATH": str(lib), "HF_HUB_OFFLINE": "1"}
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "oomlab", "--help"], check=True, capture_output=True, env=env,
                       cwd=tempfile.gettempdir())
        times.append(time.perf_counter() - start)
    probe = subprocess.run([sys.executable, "-c", "import sys, runpy; sys.argv = ['oomlab', '--help']\n"
                            "try:\n    runpy.run_module('oomlab', run_name='__main__')\nexcept SystemExit:\n    pass\n"
                            "print('torch' in sys.modules, file=sys.stderr)"],
                           capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    return times, probe.stderr.strip().splitlines()[-1]


def line(label: str, times: list[float], torch: str) -> str:
    med = statistics.median(times)
    return (f"{label}: python -m oomlab --help: median {med:.3f} s over {len(times)} runs (min {min(times):.3f}, "
            f"max {max(times):.3f}); target {TARGET_S} s; ratio {med / TARGET_S:.2f}; torch imported: {torch}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--before", metavar="REV", help="also time the lib/ of this earlier commit")
    args = parser.parse_args()
    now, torch_now = time_help(REPO / "lib", args.repeat)
    print(line("this tree", now, torch_now))
    if args.before:
        with tempfile.TemporaryDirectory() as tmp:
            archive = subprocess.run(["git", "-C", str(REPO), "archive", args.before, "lib"], check=True,
                                     capture_output=True).stdout
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                tar.extractall(tmp, filter="data")
            then, torch_then = time_help(Path(tmp) / "lib", args.repeat)
        print(line(f"lib/ at {args.before}", then, torch_then))
        print(f"ratio before / now: {statistics.median(then) / statistics.median(now):.1f}")


if __name__ == "__main__":
    main()
