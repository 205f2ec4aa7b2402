"""Time the CLI's start-up: ``python -m oomlab --help`` in a fresh interpreter, median of several runs.

    .venv/bin/python benchmarks/bench_startup.py [--repeat 15]

Also reports whether torch was imported (it must not be: the parser is built from the core's choices only).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

TARGET_S = 0.5  # --help should answer well under a second; torch alone takes ~0.7 s to import here


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "oomlab", "--help"], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    probe = subprocess.run([sys.executable, "-c", "import sys, oomlab.cli; oomlab.cli.build_parser(); "
                            "print('torch' in sys.modules)"], check=True, capture_output=True, text=True)
    med = statistics.median(times)
    print(f"python -m oomlab --help: median {med:.3f} s over {len(times)} runs (min {min(times):.3f}, "
          f"max {max(times):.3f}); target {TARGET_S} s; ratio {med / TARGET_S:.2f}; "
          f"torch imported by the parser: {probe.stdout.strip()}")


if __name__ == "__main__":
    main()
