"""Analytic against traced: the committed matrix that proves the budget.

``python -m oomlab.budget.agreement`` traces every setup of :data:`MATRIX` (PyTorch's MemTracker on fake tensors,
seconds each, cached), computes the analytic budget, and writes ``lib/oomlab/data/agreement.json`` and
``docs/budget-agreement.md``.  Tests check that every ratio is within :data:`TOLERANCE`, that the committed
analytic figures are the current model's, and re-trace a few setups to check the committed traced figures.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from oomlab.budget.analytic import estimate_setup
from oomlab.budget.step import library_versions
from oomlab.budget.traced import traced_budget
from oomlab.core.files import write_text_atomic
from oomlab.core.paths import DATA_DIR, REPO_ROOT
from oomlab.core.setup import TrainingSetup, make_setup
from oomlab.core.units import format_size

TOLERANCE = 0.02  # the target: every ratio within 2 %
AGREEMENT_JSON = DATA_DIR / "agreement.json"
AGREEMENT_DOC = REPO_ROOT / "docs" / "budget-agreement.md"
GPU = "a100-80gb"  # the GPU does not change allocated bytes; only capacity

# (model, strategy, gpus, method, precision, optimizer, seq, batch, checkpointing, attention)
MATRIX: tuple[tuple, ...] = (
    ("llama-7b", "single", 1, "full", "fp16-mixed", "adamw", 512, 1, False, "sdpa"),
    ("llama-7b", "single", 1, "full", "fp32", "adamw", 512, 1, False, "sdpa"),
    ("llama-7b", "single", 1, "full", "fp16", "adamw", 512, 1, False, "sdpa"),
    ("llama-7b", "single", 1, "full", "fp16-mixed", "adamw", 2048, 1, True, "sdpa"),
    ("llama-7b", "single", 1, "full", "fp16-mixed", "adamw", 512, 4, False, "sdpa"),
    ("llama-7b", "single", 1, "lora", "fp16-mixed", "adamw", 2048, 1, False, "sdpa"),
    ("llama-7b", "single", 1, "lora", "fp16-mixed", "adamw", 2048, 1, True, "sdpa"),
    ("llama-7b", "single", 1, "lora", "fp16", "adamw", 512, 4, False, "sdpa"),
    ("llama-7b", "single", 1, "lora", "fp32", "adamw", 512, 1, False, "sdpa"),
    ("llama-7b", "single", 1, "lora", "fp16-mixed", "adamw", 512, 4, False, "eager"),
    ("llama-7b", "fsdp", 4, "full", "fp16-mixed", "adamw", 512, 1, False, "sdpa"),
    ("llama-7b", "fsdp", 4, "lora", "fp16-mixed", "adamw", 2048, 1, False, "sdpa"),
    ("llama-7b", "ddp", 4, "full", "fp16-mixed", "adamw", 512, 1, False, "sdpa"),
    ("llama-7b", "ddp", 4, "lora", "fp16-mixed", "adamw", 2048, 1, False, "sdpa"),
    ("llama-13b", "single", 1, "full", "fp16-mixed", "adamw", 2048, 1, False, "sdpa"),
    ("llama-13b", "ddp", 4, "full", "fp16-mixed", "adamw", 2048, 1, False, "sdpa"),
    ("llama-13b", "single", 1, "lora", "fp16-mixed", "adamw", 2048, 1, False, "sdpa"),
    ("llama-13b", "single", 1, "lora", "fp16-mixed", "adamw", 2048, 1, True, "sdpa"),
    ("llama-13b", "single", 1, "lora", "fp16-mixed", "adamw", 2048, 4, True, "sdpa"),
    ("llama-13b", "single", 1, "lora", "fp16", "adamw", 512, 1, False, "sdpa"),
    ("llama-13b", "single", 1, "full", "fp16", "adamw", 512, 1, False, "sdpa"),
    ("llama-13b", "single", 1, "full", "fp32", "adamw", 512, 1, False, "sdpa"),
    ("llama-13b", "single", 1, "full", "fp16-mixed", "sgd", 512, 1, False, "sdpa"),
    ("llama-13b", "single", 1, "lora", "fp32", "adamw", 2048, 1, True, "sdpa"),
    ("llama-13b", "fsdp", 4, "full", "fp16-mixed", "adamw", 2048, 1, False, "sdpa"),
    ("llama-13b", "fsdp", 4, "full", "fp16-mixed", "adamw", 2048, 1, True, "sdpa"),
    ("llama-13b", "fsdp", 4, "lora", "fp16-mixed", "adamw", 2048, 1, True, "sdpa"),
    ("llama-13b", "fsdp", 4, "lora", "fp16-mixed", "adamw", 512, 4, False, "sdpa"),
)


def matrix_setup(row: tuple) -> TrainingSetup:
    model, strategy, gpus, method, precision, optimizer, seq, batch, checkpointing, attention = row
    return make_setup(model=model, gpu=GPU, gpus=gpus, strategy=strategy, method=method, precision=precision,
                      optimizer=optimizer, seq=seq, batch=batch, checkpointing=checkpointing, attention=attention)


@dataclass(frozen=True)
class AgreementRow:
    """One setup: the analytic and traced allocated peaks and their ratio."""

    setup: str  # short description
    analytic_peak_bytes: int
    traced_peak_bytes: int
    analytic_phase: str
    traced_phase: str

    @property
    def ratio(self) -> float:
        return self.analytic_peak_bytes / self.traced_peak_bytes


def describe(setup: TrainingSetup) -> str:
    parts = [setup.model.name, f"{setup.strategy.value}x{setup.world_size}" if setup.world_size > 1
             else setup.strategy.value, setup.method.value, setup.precision.value, setup.optimizer.value,
             f"seq {setup.seq}", f"batch {setup.batch}"]
    if setup.checkpointing:
        parts.append("checkpointing")
    if setup.attention.value != "sdpa":
        parts.append(setup.attention.value)
    return ", ".join(parts)


def compare(setup: TrainingSetup) -> AgreementRow:
    """Analytic and traced budgets of one setup (the trace is cached)."""
    analytic = estimate_setup(setup)
    traced = traced_budget(setup)
    return AgreementRow(describe(setup), analytic.allocated_peak_bytes, traced.allocated_peak_bytes,
                        analytic.peak_phase.value, traced.peak_phase.value)


def run_matrix(rows: Iterable[tuple] = MATRIX) -> list[AgreementRow]:
    return [compare(matrix_setup(row)) for row in rows]


def load_committed() -> dict[str, Any]:
    return json.loads(AGREEMENT_JSON.read_text())


def render_markdown(rows: list[AgreementRow], versions: dict[str, str]) -> str:
    worst = max(rows, key=lambda r: abs(r.ratio - 1))
    lines = [
        "# Analytic budget against PyTorch's own memory tracking",
        "",
        "Allocated peak per GPU of one steady-state training step (`torch.cuda.max_memory_allocated`), from "
        "`oomlab.budget.analytic` (analytic) and from `torch.distributed._tools.mem_tracker.MemTracker` / "
        "`FSDPMemTracker` "
        "under `FakeTensorMode` on CPU at full size (traced; DDP adds its gradient buckets, measured on real gloo "
        "at small scale to equal the gradient bytes).",
        "",
        "Regenerate with `.venv/bin/python -m oomlab.budget.agreement` (versions: "
        + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) + ").",
        "",
        f"{len(rows)} setups; target |ratio - 1| <= {TOLERANCE:.0%}; worst: {worst.ratio:.4f} ({worst.setup}).",
        "",
        "| setup | analytic | traced | ratio | phase (analytic / traced) |",
        "|---|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(f"| {r.setup} | {format_size(r.analytic_peak_bytes)} | {format_size(r.traced_peak_bytes)} | "
                     f"{r.ratio:.4f} | {r.analytic_phase} / {r.traced_phase} |")
    return "\n".join(lines) + "\n"


def worst_row(committed: dict[str, Any]) -> dict[str, Any]:
    """The committed row whose ratio is farthest from 1."""
    return max(committed["rows"], key=lambda r: abs(r["ratio"] - 1))


def main(argv: list[str] | None = None) -> int:
    rows = run_matrix()
    versions = library_versions()
    data = {"tolerance": TOLERANCE, "versions": versions, "gpu": GPU,
            "rows": [{**asdict(r), "ratio": r.ratio, "key": list(m)} for r, m in zip(rows, MATRIX, strict=True)]}
    write_text_atomic(AGREEMENT_JSON, json.dumps(data, indent=2) + "\n")
    Path(AGREEMENT_DOC).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(AGREEMENT_DOC, render_markdown(rows, versions))
    print(render_markdown(rows, versions))
    return 0 if all(abs(r.ratio - 1) <= TOLERANCE for r in rows) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
