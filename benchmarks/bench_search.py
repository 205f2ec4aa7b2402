"""Time the hardware search (every GPU type x 1, 2, 4, 8 GPUs x every remedy the plan could recommend, the
throughput-cap micro-batch search of each candidate budgeted and the full searches of each row's winner); print the
medians of warm runs, the ratio to the 2 s target, the machine's load, and the rankings' winners.

    .venv/bin/python benchmarks/bench_search.py [--repeat 5] [--model llama-2-70b] [--method ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from oomlab.remedies.hardware import search_hardware

TARGET_S = 2.0
CASES = (("llama-2-70b", ()), ("llama-2-70b", ("qlora",)), ("llama-13b", ("lora",)))  # () = every method


def _winner(option) -> str:
    if option is None:
        return "nothing fits"
    cost = option.usd_per_million_tokens
    price = "unpriced" if cost is None else f"${cost:.3f}/M tokens"
    return (f"{option.label}: {option.remedy.name}, {option.tokens_per_s:,.0f} tokens/s, {price}, "
            f"largest micro-batch {option.remedy.max_batch}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--model", default=None, help="one model instead of the three cases")
    parser.add_argument("--method", action="append", default=[], help="with --model: the methods (default every)")
    args = parser.parse_args()
    cases = ((args.model, tuple(args.method)),) if args.model else CASES
    for model, methods in cases:
        search = search_hardware(model, methods or None)  # warm: imports, outside-memory derivations, specs
        times, cpu = [], []
        for _ in range(args.repeat):
            t, c = time.perf_counter(), time.process_time()
            search = search_hardware(model, methods or None)
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        med = statistics.median(times)
        load = os.getloadavg()[0]
        rows = len(search.options)
        cands = sum(o.candidates for o in search.options)
        budgeted = sum(o.budgeted for o in search.options)
        print(f"{model} {'/'.join(methods) or 'every method'}: {rows} rows (GPU types x counts), {cands} candidate "
              f"remedies, {budgeted} budgeted before the bound stopped")
        print(f"  warm: median {med:.3f} s over {len(times)} runs (min {min(times):.3f} s); target {TARGET_S:.0f} s; "
              f"ratio {med / TARGET_S:.2f}; load average {load:.2f} on {os.cpu_count()} CPUs")
        print(f"  CPU time of this process: median {statistics.median(cpu):.3f} s (what a quiet machine's wall time "
              "would be, roughly, when the load is high)")
        print(f"  cheapest per token: {_winner(search.cheapest)}")
        print(f"  fastest:            {_winner(search.fastest)}")
        print(f"  fewest GPUs:        {_winner(search.fewest_gpus)}")
        print(f"  pareto front:       {', '.join(o.label for o in search.pareto)}")


if __name__ == "__main__":
    main()
