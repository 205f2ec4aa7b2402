"""Time the analytic budget per setup and the public ``oomlab.estimate(...)`` (name lookup and validation included);
print the medians, the ratio to the 20 us target, the machine's load, and the ratio against accelerate's meta-model
estimate path (``accelerate estimate-memory``: an empty model under ``init_empty_weights``, then
``calculate_maximum_sizes`` and ``estimate_training_usage``) measured in the same run.

    .venv/bin/python benchmarks/bench_budget.py [--repeat 2000] [--accelerate-repeat 3]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time

import oomlab
from oomlab.budget import api
from oomlab.budget.estimator import estimate_setup
from oomlab.core.models import load_model
from oomlab.core.setup import make_setup

TARGET_US = 20.0
MODEL = "llama-13b"
GRID = list(itertools.product(["single", "ddp", "fsdp", "zero2"], ["full", "lora"], ["fp16-mixed", "fp32"],
                              [512, 2048], [False, True]))


def _kwargs(st: str, m: str, p: str, s: int, c: bool) -> dict:
    return {"model": MODEL, "gpu": "t4", "gpus": 4, "strategy": st, "method": m, "precision": p, "seq": s,
            "checkpointing": c}


def _accelerate_paths(repeat: int) -> tuple[float, float]:
    """Seconds (median) of accelerate's estimate: building the empty model and sizing it; sizing a built one."""
    from accelerate import init_empty_weights
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes
    from transformers import AutoModelForCausalLM

    from oomlab.core.quiet import quiet_libraries

    config = load_model(MODEL).hf_config()
    whole, sizing = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        with quiet_libraries(), init_empty_weights():
            model = AutoModelForCausalLM.from_config(config)
        t_built = time.perf_counter()
        total, _largest = calculate_maximum_sizes(model)
        estimate_training_usage(total, "float16")
        t_end = time.perf_counter()
        whole.append(t_end - t)
        sizing.append(t_end - t_built)
    return statistics.median(whole), statistics.median(sizing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--accelerate-repeat", type=int, default=3)
    args = parser.parse_args()
    oomlab.estimate()  # warm: imports, the seed's outside-memory derivation
    setups = [make_setup(**_kwargs(*g)) for g in GRID]
    kwargs = [_kwargs(*g) for g in GRID]
    for kw in kwargs:
        oomlab.estimate(**kw)  # warm each setup's memoised terms
    per_setup, public, cold = [], [], []
    cpu_start = time.process_time()
    for _ in range(max(1, args.repeat // len(setups))):
        for s, kw in zip(setups, kwargs, strict=True):
            t = time.perf_counter()
            estimate_setup(s)
            per_setup.append(time.perf_counter() - t)
            t = time.perf_counter()
            oomlab.estimate(**kw)
            public.append(time.perf_counter() - t)
        kw = kwargs[len(cold) % len(kwargs)]
        api._validated_setup.cache_clear()  # noqa: SLF001 - time a first call: lookup and validation
        t = time.perf_counter()
        oomlab.estimate(**kw)
        cold.append(time.perf_counter() - t)
    cpu_us = (time.process_time() - cpu_start) / (len(per_setup) + len(public) + len(cold)) * 1e6
    med = statistics.median(per_setup) * 1e6
    med_p = statistics.median(public) * 1e6
    med_c = statistics.median(cold) * 1e6
    load = os.getloadavg()[0]
    print(f"load average {load:.2f} on {os.cpu_count()} CPUs (the medians below are noisy when it is above 1)")
    print(f"CPU time of this process per call, both kinds together: {cpu_us:.1f} us (less inflated by the load)")
    print(f"analytic budget of a validated setup (estimate_setup): median {med:.1f} us over {len(per_setup)} runs "
          f"({len(setups)} setups); target {TARGET_US:.0f} us; ratio {med / TARGET_US:.2f}")
    print(f"oomlab.estimate(...) by names, validation memoised: median {med_p:.1f} us over {len(public)} runs; "
          f"ratio {med_p / TARGET_US:.2f}")
    print(f"oomlab.estimate(...) first call of a setup (names looked up, validated): median {med_c:.1f} us over "
          f"{len(cold)} runs; ratio {med_c / TARGET_US:.2f}")
    whole, sizing = _accelerate_paths(args.accelerate_repeat)
    print(f"accelerate estimate-memory path on {MODEL} (init_empty_weights + from_config + calculate_maximum_sizes "
          f"+ estimate_training_usage): median {whole * 1e3:.1f} ms over {args.accelerate_repeat} runs; "
          f"oomlab.estimate is {whole / (med_p * 1e-6):,.0f}x faster")
    print(f"  of which calculate_maximum_sizes + estimate_training_usage on the built meta model: "
          f"{sizing * 1e3:.2f} ms; oomlab.estimate is {sizing / (med_p * 1e-6):,.0f}x faster")


if __name__ == "__main__":
    main()
