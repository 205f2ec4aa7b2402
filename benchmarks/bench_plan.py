"""Time the whole plan for the seed's case (hundreds of setups, searches, knob table, device_map placements);
print the median and the ratio to the 2 s target, and the cold time of a fresh process (imports included).

    .venv/bin/python benchmarks/bench_plan.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from oomlab.remedies.plan import make_plan

TARGET_S = 2.0
COLD = ("import time; t = time.perf_counter(); from oomlab.remedies.plan import make_plan; "
        "p = make_plan(); print(time.perf_counter() - t, len(p.remedies))")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    first = time.perf_counter()
    plan = make_plan()  # imports torch/transformers/accelerate, derives the outside memory, builds the meta model
    first = time.perf_counter() - first
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        make_plan()
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    searched = sum(1 for r in plan.remedies if r.max_batch or r.max_seq)
    print(f"plan of llama-13b on 4 x t4: {len(plan.remedies)} remedies budgeted and searched ({searched} fit at "
          f"some micro-batch or length), {len(plan.dropped)} dropped, {len(plan.knobs)} knob rows")
    print(f"warm (imports done): median {med:.3f} s over {len(times)} runs; target {TARGET_S:.0f} s; "
          f"ratio {med / TARGET_S:.2f}")
    print(f"first call in this process: {first:.2f} s")
    cold = subprocess.run([sys.executable, "-c", COLD], capture_output=True, text=True, check=True)
    seconds = float(cold.stdout.split()[0])
    print(f"cold (fresh process, imports included): {seconds:.2f} s; ratio {seconds / TARGET_S:.2f}")


if __name__ == "__main__":
    main()
