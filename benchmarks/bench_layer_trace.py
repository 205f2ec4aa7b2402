"""Time the one-layer inventory against the whole-model trace, for a 13B and a 70B model (seq 2048, batch 1).

One-layer path: :func:`oomlab.budget.layer_trace.trace_layers` (a 2-layer prefix at full width, six fake-tensor
forwards, the fit), cache bypassed -- what a budget of any family costs the first time. Whole-model trace:
:func:`oomlab.budget.traced.trace_step` (the full step, every layer, under MemTracker on fake tensors), cache bypassed.
Both on fake tensors at full width. Also prints the whole-model saved-tensor accounting beside the one-layer
prediction (the 0.5 % check at full size).

    .venv/bin/python benchmarks/bench_layer_trace.py [--repeat 3] [--models llama-13b llama-2-70b]
"""

from __future__ import annotations

import argparse
import statistics
import time

from oomlab.budget import activations as act
from oomlab.budget.layer_trace import predicted_saved, trace_layers, whole_model_saved
from oomlab.budget.traced import trace_step
from oomlab.core.setup import make_setup
from oomlab.core.units import format_size


def _median(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["llama-13b", "llama-2-70b"])
    parser.add_argument("--precision", default="bf16-mixed")
    args = parser.parse_args()
    for name in args.models:
        setup = make_setup(gpus=1, model=name, gpu="a100-80gb", seq=2048, batch=1, precision=args.precision)
        probe = act.probe(setup)
        one, trace = _median(lambda probe=probe, setup=setup: trace_layers(setup.model, probe, use_cache=False),
                             args.repeat)
        whole, step = _median(lambda setup=setup: trace_step(setup, use_cache=False), args.repeat)
        predicted = sum(predicted_saved(trace, setup.batch, setup.seq).values())
        saved = sum(whole_model_saved(setup.model, probe, setup.batch, setup.seq).values())
        print(f"{name} ({setup.model.num_parameters / 1e9:.1f} B, {setup.model.num_hidden_layers} layers, "
              f"{args.precision}, seq 2048, batch 1): one-layer path median {one:.2f} s, whole-model trace median "
              f"{whole:.2f} s, ratio {whole / one:.1f}x; saved tensors predicted {format_size(predicted)} vs "
              f"whole-model {format_size(saved)} ({(predicted - saved) / saved:+.4%}); trace peak "
              f"{format_size(step.peak_bytes)} in {step.peak_phase.value}", flush=True)


if __name__ == "__main__":
    main()
