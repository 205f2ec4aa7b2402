"""Time the analytic budget per setup; print the median and the ratio to the 20 us target.

    .venv/bin/python benchmarks/bench_budget.py [--repeat 2000]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

from oomlab.budget.analytic import estimate_setup
from oomlab.budget.estimate import estimate
from oomlab.core.setup import make_setup

TARGET_US = 20.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    estimate()  # warm: imports, the seed's outside-memory derivation
    grid = list(itertools.product(["single", "ddp", "fsdp", "zero2"], ["full", "lora"], ["fp16-mixed", "fp32"],
                                  [512, 2048], [False, True]))
    setups = [make_setup(model="llama-13b", gpu="t4", gpus=4, strategy=st, method=m, precision=p, seq=s,
                         checkpointing=c) for st, m, p, s, c in grid]
    per_setup, with_validation = [], []
    for _ in range(max(1, args.repeat // len(setups))):
        for s in setups:
            t = time.perf_counter()
            estimate_setup(s)
            per_setup.append(time.perf_counter() - t)
        t = time.perf_counter()
        estimate(model="llama-13b", gpu="t4", gpus=4, strategy="fsdp", method="lora", checkpointing=True)
        with_validation.append(time.perf_counter() - t)
    med = statistics.median(per_setup) * 1e6
    med_v = statistics.median(with_validation) * 1e6
    print(f"analytic budget of a validated setup: median {med:.1f} us over {len(per_setup)} runs "
          f"({len(setups)} setups); target {TARGET_US:.0f} us; ratio {med / TARGET_US:.2f}")
    print(f"estimate(...) including name lookup and validation: median {med_v:.1f} us")


if __name__ == "__main__":
    main()
