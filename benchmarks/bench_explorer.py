"""Time one explorer update (estimate, largest micro-batch search, PNG bar, verdict); print the median and the
ratio to the 50 ms target.  Each update is one control change, as a user makes it.

    .venv/bin/python benchmarks/bench_explorer.py [--repeat 200]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

from oomlab.explorer import build_explorer

TARGET_MS = 50.0

# Control changes cycled through, ending where they start so that every one changes a value; valid setups and
# invalid ones (bf16 on a T4 shows the error as the verdict).
CHANGES = [
    ("gpu", "a100-80gb"), ("method", "lora"), ("gpus", 8), ("strategy", "fsdp"), ("checkpointing", True),
    ("precision", "bf16-mixed"), ("batch", 4), ("seq", 4096), ("lora_rank", 64), ("optimizer", "adamw-8bit"),
    ("gpu", "t4"), ("method", "qlora"), ("precision", "fp16-mixed"), ("host_ram_bytes", 64.0), ("model", "llama-2-70b"),
    ("strategy", "single"), ("method", "full"), ("model", "llama-13b"), ("gpus", 4), ("checkpointing", False),
    ("batch", 1), ("seq", 2048), ("lora_rank", 8), ("optimizer", "adamw"), ("host_ram_bytes", 192.0),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    start = time.perf_counter()
    explorer = build_explorer()
    first_s = time.perf_counter() - start  # imports matplotlib, builds the figure and the widgets
    timings, phases = [], {"valid": [], "invalid": []}
    for name, value in itertools.islice(itertools.cycle(CHANGES), args.repeat):
        previous = explorer.exploration
        t = time.perf_counter()
        explorer.controls[name].value = value  # the observer runs the update synchronously
        elapsed = time.perf_counter() - t
        if explorer.exploration is previous:
            raise RuntimeError(f"setting {name}={value!r} changed nothing; the benchmark's cycle is wrong")
        timings.append(elapsed)
        phases["invalid" if explorer.exploration.error else "valid"].append(elapsed)
    med = statistics.median(timings) * 1e3
    worst = max(timings) * 1e3
    print(f"explorer update (one control change): median {med:.1f} ms over {len(timings)} changes, "
          f"max {worst:.1f} ms; target {TARGET_MS:.0f} ms; ratio {med / TARGET_MS:.2f}")
    for kind, values in phases.items():
        if values:
            print(f"  {kind} setups: median {statistics.median(values) * 1e3:.1f} ms over {len(values)}")
    print(f"first build (imports, figure, widgets): {first_s:.2f} s")


if __name__ == "__main__":
    main()
