"""Time full-size traces of llama-13b (seq 2048, batch 1): full fp16-mixed AdamW, LoRA, FSDP over 4 ranks.

Prints the median seconds per trace (cache bypassed), the peak RSS of this process, each trace's peak and
phase, and the ratios of the medians to the full fine-tune's.

    .venv/bin/python benchmarks/bench_trace.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

from oomlab.budget.traced import trace_step
from oomlab.core.setup import make_setup
from oomlab.core.units import format_size

SETUPS = {
    "full fp16-mixed adamw": {},
    "lora r8 qkvo": {"method": "lora"},
    "fsdp world 4": {"strategy": "fsdp", "gpus": 4},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--model", default="llama-13b")
    args = parser.parse_args()
    medians = {}
    for label, knobs in SETUPS.items():
        setup = make_setup(model=args.model, gpu="a100-80gb", seq=2048, batch=1, **knobs)
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            result = trace_step(setup, use_cache=False)
            times.append(time.perf_counter() - start)
        medians[label] = statistics.median(times)
        print(f"{label:24s} median {medians[label]:6.1f} s  peak {format_size(result.peak_bytes):>11s} "
              f"in {result.peak_phase.value}")
    base = medians["full fp16-mixed adamw"]
    print("ratios to the full fine-tune:", ", ".join(f"{k} {v / base:.2f}" for k, v in medians.items()))
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
