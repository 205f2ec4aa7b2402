"""Time the seed reproduction (full 13B, simulated) and its pieces; print medians and ratios.

    .venv/bin/python benchmarks/bench_reproduce.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

from oomlab.core.dtypes import load_dtype
from oomlab.core.models import load_model
from oomlab.reproduction.allocator import CachingAllocator
from oomlab.reproduction.replay import reproduce
from oomlab.reproduction.walk import unlimited_walk, walk_apply


def median_seconds(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    spec, dtype = load_model("llama-13b"), load_dtype("float16")
    start = time.perf_counter()
    reproduce(device="simulated")
    first = time.perf_counter() - start  # imports, spec loading and the cached unlimited walk
    walk = median_seconds(lambda: walk_apply(spec, dtype, CachingAllocator(1 << 62)), args.repeat)
    warm = median_seconds(lambda: reproduce(device="simulated"), args.repeat)
    steps = len(unlimited_walk("llama-13b", "float16"))
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"first reproduce() (cold, with imports): {first:.2f} s")
    print(f"median whole _apply walk of llama-13b ({steps} tensors): {walk * 1e3:.0f} ms "
          f"({walk / steps * 1e6:.0f} us per tensor)")
    print(f"median warm reproduce(): {warm * 1e3:.0f} ms; cold/warm ratio {first / warm:.1f}")
    print(f"peak RSS: {peak_rss:.0f} MiB")


if __name__ == "__main__":
    main()
