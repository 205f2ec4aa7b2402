"""Wall time and peak memory of the whole pipeline (``python -m oomlab run``) on the default case.

    .venv/bin/python benchmarks/bench_pipeline.py [--repeat 2]

Runs once with an empty trace cache (cold) and ``--repeat`` times with the cache warm, each into a temporary
output folder, and prints the median wall time and the peak RSS of the largest process (the papermill kernel
or the driver) against the targets (120 s cold, 30 s warm, 2 GiB), then the run's own per-notebook lines of the
last warm run.  The run is staged beside its output folder and swapped in (:mod:`oomlab.pipeline.runner`); a
failure prints the run's stderr and where the failed run is kept.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_COLD_S, TARGET_WARM_S, TARGET_RSS_MIB = 120.0, 30.0, 2048.0


def run_once(out: Path, cache: Path) -> tuple[float, float, str]:
    env = dict(os.environ, OOMLAB_CACHE_DIR=str(cache))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "oomlab", "run", "--no-progress", "--out", str(out)], env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"pipeline failed:\n{proc.stderr[-3000:]}")
    rss_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return seconds, rss_mib, proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        cold, rss, stdout = run_once(Path(tmp) / "cold", cache)
        warm = []
        for i in range(args.repeat):
            seconds, rss, stdout = run_once(Path(tmp) / f"warm{i}", cache)
            warm.append(seconds)
        shutil.rmtree(cache, ignore_errors=True)
    med = statistics.median(warm)
    print(f"cold (empty trace cache): {cold:.1f} s; target {TARGET_COLD_S:.0f} s; ratio {cold / TARGET_COLD_S:.2f}")
    print(f"warm (cached traces): median {med:.1f} s over {len(warm)}; target {TARGET_WARM_S:.0f} s; "
          f"ratio {med / TARGET_WARM_S:.2f}")
    print(f"peak RSS of the largest process: {rss:.0f} MiB; target {TARGET_RSS_MIB:.0f} MiB; "
          f"ratio {rss / TARGET_RSS_MIB:.2f}")
    print("last warm run, as `run` printed it:")
    print("".join(f"  {line}\n" for line in stdout.splitlines()), end="")


if __name__ == "__main__":
    main()
