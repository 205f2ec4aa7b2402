"""Validate the budget on a real GPU: train a few steps and compare PyTorch's peaks with the analytic ones.

    python scripts/validate_on_gpu.py [--out DIR] [--steps 3] [--only NAME ...]

For each setup that fits the GPU at hand it builds the model with random weights (no downloads), runs
``--steps`` training steps (forward with loss, backward, optimizer step, zero_grad) and records
``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` over the steady-state steps (after the first)
against the budget's ``allocated_peak_bytes`` / ``per_gpu_peak_bytes`` (the latter with this device's own
non-PyTorch memory).  Writes ``gpu-validation.md`` and ``gpu-validation.json`` to ``--out`` (default: $OUT or
``outputs/``).  Never a test dependency: it needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import date
from pathlib import Path

SETUPS = {
    # name: make_setup keyword arguments (gpu filled in from the device)
    "llama-7b LoRA fp16-mixed seq 512": dict(model="llama-7b", method="lora", precision="fp16-mixed", seq=512),
    "llama-7b LoRA fp16-mixed seq 2048 ckpt": dict(model="llama-7b", method="lora", precision="fp16-mixed",
                                                    seq=2048, checkpointing=True),
    "llama-13b LoRA fp16-mixed seq 2048 ckpt": dict(model="llama-13b", method="lora", precision="fp16-mixed",
                                                     seq=2048, checkpointing=True),
    "~1B full fp16-mixed seq 1024": dict(model="tiny-1b", method="full", precision="fp16-mixed", seq=1024),
    "~1B full bf16 seq 1024 batch 4": dict(model="tiny-1b", method="full", precision="bf16", seq=1024, batch=4),
}
ONE_B = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5504, "num_hidden_layers": 16,
         "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 32000,
         "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}


def run_setup(setup, steps: int) -> tuple[int, int]:
    import torch

    from oomlab.budget.states import trainable_parameters
    from oomlab.budget.step import build_model, make_optimizer, step_dtypes

    torch.cuda.empty_cache()
    model = build_model(setup, "cuda")
    optimizer = make_optimizer(setup, trainable_parameters(model))
    ids = torch.randint(0, setup.model.vocab_size, (setup.batch, setup.seq), device="cuda")
    dtype = step_dtypes(setup).autocast
    for step in range(steps):
        if step == 1:
            torch.cuda.reset_peak_memory_stats()
        with torch.autocast("cuda", dtype=getattr(torch, dtype), enabled=dtype is not None):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        del loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    peaks = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    del model, optimizer
    torch.cuda.empty_cache()
    return peaks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "outputs")))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None, help=f"names from: {', '.join(SETUPS)}")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("validate_on_gpu: no CUDA device here; nothing to validate", file=sys.stderr)
        return 2
    from oomlab.budget.estimator import estimate_setup
    from oomlab.core.models import model_from_config
    from oomlab.core.setup import make_setup

    free, total = torch.cuda.mem_get_info()
    torch.cuda.init()
    outside = total - free - torch.cuda.memory_reserved()  # this device's context and others
    name = torch.cuda.get_device_name()
    rows = []
    for label, kwargs in SETUPS.items():
        if args.only and label not in args.only:
            continue
        kwargs = dict(kwargs)
        if kwargs["model"] == "tiny-1b":
            kwargs["model"] = model_from_config(ONE_B, "llama-1b-like")
        setup = make_setup(gpu="h200", **kwargs)  # capacity is irrelevant to allocated bytes
        analytic = estimate_setup(setup, outside_bytes=outside)
        if analytic.per_gpu_peak_bytes > total:
            rows.append({"setup": label, "skipped": "does not fit this GPU"})
            continue
        start = time.perf_counter()
        allocated, reserved = run_setup(setup, args.steps)
        rows.append({
            "setup": label, "seconds": round(time.perf_counter() - start, 1),
            "max_memory_allocated": allocated, "allocated_peak_bytes": analytic.allocated_peak_bytes,
            "ratio_allocated": analytic.allocated_peak_bytes / allocated,
            "max_memory_reserved_plus_outside": reserved + outside, "per_gpu_peak_bytes": analytic.per_gpu_peak_bytes,
            "ratio_per_gpu": analytic.per_gpu_peak_bytes / (reserved + outside),
        })
        print(rows[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"date": date.today().isoformat(), "gpu": name, "torch": torch.__version__, "outside_bytes": outside}
    (args.out / "gpu-validation.json").write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")
    lines = [f"# Budget against a real GPU ({name}, {meta['date']}, torch {torch.__version__})", "",
             "| setup | max_memory_allocated | analytic allocated | ratio | reserved + outside | analytic per-GPU | "
             "ratio |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['setup']} | skipped: {r['skipped']} | | | | | |")
            continue
        lines.append(f"| {r['setup']} | {r['max_memory_allocated']:,} | {r['allocated_peak_bytes']:,} | "
                     f"{r['ratio_allocated']:.3f} | {r['max_memory_reserved_plus_outside']:,} | "
                     f"{r['per_gpu_peak_bytes']:,} | {r['ratio_per_gpu']:.3f} |")
    (args.out / "gpu-validation.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
