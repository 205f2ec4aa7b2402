"""Analytic against traced: the committed matrix that proves the budget.

``python -m oomlab.evidence agreement`` traces every setup of :data:`MATRIX` (PyTorch's MemTracker on fake tensors,
seconds each, cached), computes the analytic budget, and writes ``lib/oomlab/data/agreement.json`` and
``docs/budget-agreement.md``.  Tests check that every ratio is within :data:`TOLERANCE`, that the committed
analytic figures are the current model's, and re-trace a few setups to check the committed traced figures.

Three kinds of rows: traced (:data:`MATRIX`), measured -- DeepSpeed's engine cannot run under the tracer's fake
tensors, so its ZeRO-1/2/3 rows are tiny setups trained for real on CPU gloo processes (:mod:`.deepspeed_measured`,
``docs/deepspeed-small-scale.md``), their peaks set beside today's analytic ones -- and analytic-only full-size setups
(:data:`ANALYTIC_ONLY`) with the reason and what checks them instead.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oomlab.budget.estimator import estimate_setup
from oomlab.budget.result import ALLOCATED, MemCategory, Phase
from oomlab.budget.step import library_versions
from oomlab.budget.traced import traced_budget
from oomlab.core.files import write_text_atomic
from oomlab.core.paths import DATA_DIR, REPO_ROOT
from oomlab.core.setup import TrainingSetup, make_setup
from oomlab.core.units import format_size
from oomlab.evidence import deepspeed_measured

TOLERANCE = 0.02  # the target: every ratio within 2 %
AGREEMENT_JSON = DATA_DIR / "agreement.json"
AGREEMENT_DOC = REPO_ROOT / "docs" / "budget-agreement.md"
GPU = "a100-80gb"  # the GPU does not change allocated bytes; only capacity

# (model, strategy, gpus, method, precision, optimizer, seq, batch, checkpointing, attention)
MATRIX: tuple[tuple, ...] = (
    # one GPU: torch AdamW (foreach) and fused AdamW, every precision, LoRA, eager attention
    ("llama-7b", "single", 1, "full", "fp16-mixed", "adamw", 512, 1, False, "sdpa"),
    ("llama-7b", "single", 1, "full", "fp16-mixed", "adamw-fused", 512, 1, False, "sdpa"),
    ("llama-7b", "single", 1, "full", "fp32", "adamw", 512, 1, False, "sdpa"),
    ("llama-7b", "single", 1, "full", "fp32", "adamw-fused", 512, 1, False, "sdpa"),
    ("llama-7b", "single", 1, "full", "fp16", "adamw", 512, 1, False, "sdpa"),
    ("llama-7b", "single", 1, "full", "bf16-mixed", "adamw-fused", 2048, 1, True, "sdpa"),
    ("llama-7b", "single", 1, "full", "fp16-mixed", "adamw", 2048, 1, True, "sdpa"),
    ("llama-7b", "single", 1, "full", "fp16-mixed", "adamw", 512, 4, False, "sdpa"),
    ("llama-7b", "single", 1, "lora", "fp16-mixed", "adamw", 2048, 1, False, "sdpa"),
    ("llama-7b", "single", 1, "lora", "fp16-mixed", "adamw", 2048, 1, True, "sdpa"),
    ("llama-7b", "single", 1, "lora", "fp16", "adamw", 512, 4, False, "sdpa"),
    ("llama-7b", "single", 1, "lora", "fp32", "adamw", 512, 1, False, "sdpa"),
    ("llama-7b", "single", 1, "lora", "fp16-mixed", "adamw", 512, 4, False, "eager"),
    ("llama-7b", "single", 1, "lora", "bf16-mixed", "adamw-fused", 2048, 2, False, "sdpa"),
    ("llama-13b", "single", 1, "full", "fp16-mixed", "adamw", 2048, 1, False, "sdpa"),
    ("llama-13b", "single", 1, "full", "fp16-mixed", "sgd", 512, 1, False, "sdpa"),
    ("llama-13b", "single", 1, "full", "fp16", "adamw", 512, 1, False, "sdpa"),
    ("llama-13b", "single", 1, "full", "fp32", "adamw", 512, 1, False, "sdpa"),
    ("llama-13b", "single", 1, "lora", "fp16-mixed", "adamw", 2048, 1, False, "sdpa"),
    ("llama-13b", "single", 1, "lora", "fp16-mixed", "adamw", 2048, 1, True, "sdpa"),
    ("llama-13b", "single", 1, "lora", "fp16-mixed", "adamw", 2048, 4, True, "sdpa"),
    ("llama-13b", "single", 1, "lora", "fp16", "adamw", 512, 1, False, "sdpa"),
    ("llama-13b", "single", 1, "lora", "fp32", "adamw", 2048, 1, True, "sdpa"),
    # DDP: a replica per GPU plus its gradient buckets
    ("llama-7b", "ddp", 4, "full", "fp16-mixed", "adamw", 512, 1, False, "sdpa"),
    ("llama-7b", "ddp", 4, "full", "fp16-mixed", "adamw-fused", 512, 1, False, "sdpa"),
    ("llama-7b", "ddp", 4, "lora", "fp16-mixed", "adamw", 2048, 1, False, "sdpa"),
    ("llama-13b", "ddp", 4, "full", "fp16-mixed", "adamw", 2048, 1, False, "sdpa"),
    # accelerate's default FSDP (FSDP1: FullyShardedDataParallel, MixedPrecision, autocast)
    ("llama-7b", "fsdp", 4, "full", "fp16-mixed", "adamw", 512, 1, False, "sdpa"),
    ("llama-7b", "fsdp", 4, "lora", "fp16-mixed", "adamw", 2048, 1, False, "sdpa"),
    ("llama-13b", "fsdp", 4, "full", "fp16-mixed", "adamw", 2048, 1, False, "sdpa"),
    ("llama-13b", "fsdp", 4, "full", "fp16-mixed", "adamw", 2048, 1, True, "sdpa"),
    ("llama-13b", "fsdp", 4, "full", "fp16-mixed", "adamw-fused", 2048, 1, False, "sdpa"),
    ("llama-13b", "fsdp", 4, "lora", "fp16-mixed", "adamw", 2048, 1, True, "sdpa"),
    ("llama-13b", "fsdp", 4, "lora", "fp16-mixed", "adamw", 512, 4, False, "sdpa"),
    ("llama-13b", "fsdp", 8, "full", "bf16-mixed", "adamw-fused", 2048, 1, True, "sdpa"),
    ("mistral-7b", "fsdp", 8, "full", "bf16-mixed", "adamw", 4096, 2, True, "sdpa"),
    # accelerate's fsdp_version 2 (fully_shard, MixedPrecisionPolicy, no autocast) and its CPU offload
    ("llama-7b", "fsdp2", 4, "full", "fp16-mixed", "adamw", 512, 1, False, "sdpa"),
    ("llama-7b", "fsdp2", 4, "lora", "bf16-mixed", "adamw", 2048, 1, False, "sdpa"),
    ("llama-13b", "fsdp2", 4, "full", "fp16-mixed", "adamw", 2048, 1, False, "sdpa"),
    ("llama-13b", "fsdp2", 4, "full", "fp16-mixed", "adamw", 2048, 1, True, "sdpa"),
    ("llama-13b", "fsdp2", 4, "full", "fp16-mixed", "adamw-fused", 2048, 1, True, "sdpa"),
    ("llama-13b", "fsdp2", 4, "lora", "fp16-mixed", "adamw", 2048, 1, True, "sdpa"),
    ("llama-13b", "fsdp2", 8, "full", "bf16-mixed", "adamw-fused", 2048, 2, False, "sdpa"),
    ("mistral-7b", "fsdp2", 8, "full", "bf16-mixed", "adamw", 4096, 2, True, "sdpa"),
    ("llama-13b", "fsdp2-offload", 4, "full", "fp16-mixed", "adamw", 2048, 1, False, "sdpa"),
    ("llama-13b", "fsdp2-offload", 4, "full", "bf16-mixed", "adamw", 2048, 1, True, "sdpa"),
    ("llama-7b", "fsdp2-offload", 4, "lora", "bf16-mixed", "adamw", 2048, 1, False, "sdpa"),
)


class NotTraced(enum.Enum):
    """Why a setup has an analytic figure but no traced one, and what checks it instead."""

    BITSANDBYTES = (
        "bitsandbytes' 4-bit weights and 8-bit optimizer kernels have no FakeTensorMode implementation; checked "
        "instead by real CPU runs of tiny models through the same bitsandbytes code (tests/budget/test_measured.py)"
    )
    DEEPSPEED = (
        "DeepSpeed's engine needs real tensors and processes; it does not run under FakeTensorMode; checked instead by "
        "ZeRO-1/2/3 (and offload) runs of tiny models on CPU gloo processes: the measured rows above, "
        "docs/deepspeed-small-scale.md"
    )
    HOST_IS_DEVICE = (
        "FSDP1's CPUOffload moves the shards between host and device; on a CPU-only machine both are the same "
        "memory, so the trace cannot tell the device's bytes from the host's (FSDP2's CPUOffloadPolicy traces: "
        "see the fsdp2-offload rows)"
    )


ANALYTIC_ONLY: tuple[tuple[tuple, NotTraced], ...] = (
    (("llama-13b", "single", 1, "qlora", "bf16-mixed", "adamw", 2048, 1, True, "sdpa"), NotTraced.BITSANDBYTES),
    (("llama-7b", "single", 1, "qlora", "fp16-mixed", "adamw", 512, 4, False, "sdpa"), NotTraced.BITSANDBYTES),
    (("llama-13b", "ddp", 4, "qlora", "bf16-mixed", "adamw", 2048, 1, True, "sdpa"), NotTraced.BITSANDBYTES),
    (("llama-7b", "single", 1, "full", "bf16-mixed", "adamw-8bit", 512, 1, False, "sdpa"), NotTraced.BITSANDBYTES),
    (("llama-13b", "single", 1, "lora", "fp16-mixed", "adamw-8bit", 2048, 1, True, "sdpa"), NotTraced.BITSANDBYTES),
    *((("llama-13b", strategy, 4, "full", "fp16-mixed", "adamw", 2048, 1, checkpointing, "sdpa"), NotTraced.DEEPSPEED)
      for strategy in ("zero1", "zero2", "zero3", "zero2-offload", "zero3-offload") for checkpointing in (False, True)),
    (("llama-13b", "zero3", 4, "lora", "fp16-mixed", "adamw", 2048, 1, True, "sdpa"), NotTraced.DEEPSPEED),
    (("llama-13b", "fsdp-offload", 4, "full", "fp16-mixed", "adamw", 2048, 1, False, "sdpa"), NotTraced.HOST_IS_DEVICE),
    (("llama-13b", "fsdp-offload", 4, "full", "fp16-mixed", "adamw", 2048, 1, True, "sdpa"), NotTraced.HOST_IS_DEVICE),
)


@dataclass(frozen=True)
class MeasuredRow:
    """A setup run for real at small scale (DeepSpeed on CPU gloo): its measured and analytic allocated peaks."""

    setup: str
    measured_peak_bytes: int
    analytic_peak_bytes: int
    measured_phase: Phase
    analytic_phase: Phase

    @property
    def ratio(self) -> float:
        return self.analytic_peak_bytes / self.measured_peak_bytes

    @property
    def agrees(self) -> bool:
        return abs(self.ratio - 1) <= TOLERANCE

    def to_json(self) -> dict[str, Any]:
        return {"setup": self.setup, "measured_peak_bytes": self.measured_peak_bytes,
                "analytic_peak_bytes": self.analytic_peak_bytes, "measured_phase": self.measured_phase.value,
                "analytic_phase": self.analytic_phase.value, "ratio": self.ratio}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> MeasuredRow:
        return cls(row["setup"], row["measured_peak_bytes"], row["analytic_peak_bytes"], Phase(row["measured_phase"]),
                   Phase(row["analytic_phase"]))


def measured_rows(data: Mapping[str, Any] | None = None) -> list[MeasuredRow]:
    """The DeepSpeed cases of ``docs/deepspeed-small-scale.md``: the largest rank's measured step peak (the most of
    its phases) beside today's analytic one."""
    data = deepspeed_measured.load_committed() if data is None else data
    out = []
    for case, ranks in zip(data["cases"], data["measured"], strict=True):
        if any(r["status"] != "ok" for r in ranks):
            continue
        analytic = deepspeed_measured.analytic_step(case)
        measured = {p: max(deepspeed_measured.measured_peaks(r)[p] for r in ranks) for p in deepspeed_measured.PHASES}
        m_phase, a_phase = max(measured, key=measured.__getitem__), analytic.peak_phase
        gpus = case["knobs"]["gpus"]
        out.append(MeasuredRow(f"tiny LLaMA, {case['label']} ({gpus} gloo process{'es' if gpus > 1 else ''})",
                               measured[m_phase], analytic.phases[a_phase], m_phase, a_phase))
    return out


def matrix_setup(row: tuple) -> TrainingSetup:
    model, strategy, gpus, method, precision, optimizer, seq, batch, checkpointing, attention = row
    return make_setup(model=model, gpu=GPU, gpus=gpus, strategy=strategy, method=method, precision=precision,
                      optimizer=optimizer, seq=seq, batch=batch, checkpointing=checkpointing, attention=attention)


def _allocated(components: Mapping[MemCategory, int]) -> dict[MemCategory, int]:
    return {c: int(components.get(c, 0)) for c in ALLOCATED if components.get(c, 0)}


def _components_json(components: Mapping[MemCategory, int]) -> dict[str, int]:
    return {c.value: v for c, v in components.items()}


@dataclass(frozen=True)
class AgreementRow:
    """One setup: the analytic and traced allocated peaks, their phases and their components at the peak."""

    setup: str  # short description
    analytic_peak_bytes: int
    traced_peak_bytes: int
    analytic_phase: Phase
    traced_phase: Phase
    analytic_components: Mapping[MemCategory, int]  # the analytic figures of the traced peak's phase (allocated only)
    traced_components: Mapping[MemCategory, int]  # the same categories at the traced peak

    @property
    def ratio(self) -> float:
        return self.analytic_peak_bytes / self.traced_peak_bytes

    @property
    def component_deltas(self) -> dict[MemCategory, float]:
        """Per category: (analytic - traced) / traced peak."""
        cats = [c for c in ALLOCATED if c in self.analytic_components or c in self.traced_components]
        return {c: (self.analytic_components.get(c, 0) - self.traced_components.get(c, 0)) / self.traced_peak_bytes
                for c in cats}

    @property
    def worst_component(self) -> tuple[MemCategory, float]:
        """The category whose analytic and traced bytes differ most, as a fraction of the traced peak."""
        return max(self.component_deltas.items(), key=lambda kv: abs(kv[1]))

    @property
    def agrees(self) -> bool:
        return abs(self.ratio - 1) <= TOLERANCE and abs(self.worst_component[1]) <= TOLERANCE

    def to_json(self) -> dict[str, Any]:
        """The committed row (``agreement.json``; the matrix key is added beside it)."""
        name, delta = self.worst_component
        return {"setup": self.setup, "analytic_peak_bytes": self.analytic_peak_bytes,
                "traced_peak_bytes": self.traced_peak_bytes, "analytic_phase": self.analytic_phase.value,
                "traced_phase": self.traced_phase.value,
                "analytic_components": _components_json(self.analytic_components),
                "traced_components": _components_json(self.traced_components), "ratio": self.ratio,
                "worst_component": [name.value, delta]}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> AgreementRow:
        return cls(row["setup"], row["analytic_peak_bytes"], row["traced_peak_bytes"], Phase(row["analytic_phase"]),
                   Phase(row["traced_phase"]), {MemCategory(k): v for k, v in row["analytic_components"].items()},
                   {MemCategory(k): v for k, v in row["traced_components"].items()})


@dataclass(frozen=True)
class AnalyticOnlyRow:
    """A setup in the matrix that is not traced, with its analytic peak and why."""

    setup: str
    analytic_peak_bytes: int
    analytic_phase: Phase
    reason: NotTraced

    def to_json(self) -> dict[str, Any]:
        """The committed row (the matrix key is added beside it)."""
        return {"setup": self.setup, "analytic_peak_bytes": self.analytic_peak_bytes,
                "analytic_phase": self.analytic_phase.value, "reason": self.reason.name}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> AnalyticOnlyRow:
        return cls(row["setup"], row["analytic_peak_bytes"], Phase(row["analytic_phase"]), NotTraced[row["reason"]])


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
    return AgreementRow(describe(setup), analytic.step_allocated_peak_bytes, traced.step_allocated_peak_bytes,
                        analytic.peak_phase, traced.peak_phase,
                        _allocated(analytic.phases[traced.peak_phase]), _allocated(traced.components))


def analytic_only(row: tuple, reason: NotTraced) -> AnalyticOnlyRow:
    analytic = estimate_setup(matrix_setup(row))
    return AnalyticOnlyRow(describe(analytic.setup), analytic.allocated_peak_bytes, analytic.peak_phase, reason)


def run_matrix(rows: Iterable[tuple] = MATRIX) -> list[AgreementRow]:
    return [compare(matrix_setup(row)) for row in rows]


def load_committed() -> dict[str, Any]:
    return json.loads(AGREEMENT_JSON.read_text())


def _components_cell(components: Mapping[MemCategory, int]) -> str:
    return "<br>".join(f"{c.value} {format_size(value)}" for c, value in components.items())


def render_markdown(rows: list[AgreementRow], untraced: list[AnalyticOnlyRow], versions: dict[str, str],
                    measured: list[MeasuredRow] | None = None) -> str:
    worst = max(rows, key=lambda r: abs(r.ratio - 1))
    worst_part = max(rows, key=lambda r: abs(r.worst_component[1]))
    worst_name, worst_delta = worst_part.worst_component
    strategies = sorted({r.setup.split(", ")[1].split("x")[0] for r in rows})
    lines = [
        "# Analytic budget against PyTorch's own memory tracking",
        "",
        "Allocated peak per GPU of one steady-state training step (`torch.cuda.max_memory_allocated`), from "
        "`oomlab.budget.analytic` (analytic) and from `torch.distributed._tools.mem_tracker.MemTracker` / "
        "`FSDPMemTracker` under `FakeTensorMode` on CPU at full size (traced), each launch traced as users run it: "
        "`single`/`ddp` mixed precision under accelerate's autocast wrap; `fsdp` through accelerate's FSDP1 "
        "plugin (`FullyShardedDataParallel`, `MixedPrecision`, its autocast wrap) on a fake process group; "
        "`fsdp2`/`fsdp2-offload` through accelerate's `fsdp2_prepare_model` (`fully_shard`, "
        "`MixedPrecisionPolicy`, `CPUOffloadPolicy`); `adamw` is torch's foreach AdamW, `adamw-fused` "
        "`AdamW(fused=True)`. DDP adds its gradient buckets, measured on real gloo at small scale to equal the "
        "gradient bytes.",
        "",
        "Components are compared in the phase of the traced peak (the analytic budget's figures for that phase, "
        "so two phases whose peaks tie within a fraction of a percent do not compare unlike moments); a row agrees "
        f"when the peak ratio and every component's difference (as a fraction of the traced peak) are within "
        f"{TOLERANCE:.0%}.",
        "",
        "Regenerate with `.venv/bin/python -m oomlab.evidence agreement` (versions: "
        + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) + ").",
        "",
        f"{len(rows)} traced setups ({', '.join(strategies)}); worst peak ratio {worst.ratio:.4f} ({worst.setup}); "
        f"worst component {worst_name.value} {worst_delta:+.2%} of the peak "
        f"({worst_part.setup}).",
        "",
        "| setup | analytic | traced | ratio | phase (analytic / traced) | worst component | components (analytic) "
        "| components (traced) |",
        "|---|---:|---:|---:|---|---|---|---|",
    ]
    for r in rows:
        name, delta = r.worst_component
        lines.append(f"| {r.setup} | {format_size(r.analytic_peak_bytes)} | {format_size(r.traced_peak_bytes)} | "
                     f"{r.ratio:.4f} | {r.analytic_phase.value} / {r.traced_phase.value} | {name.value} {delta:+.2%} | "
                     f"{_components_cell(r.analytic_components)} | {_components_cell(r.traced_components)} |")
    measured = measured or []
    lines += ["", f"## {len(measured)} setups measured at small scale (DeepSpeed ZeRO on CPU gloo)", "",
              "DeepSpeed's engine cannot run under the tracer's fake tensors; these tiny setups trained for real "
              "through `deepspeed.initialize` (`docs/deepspeed-small-scale.md`, every tensor and phase there): the "
              "largest rank's allocated peak of the second step, measured by the CPU allocator, beside today's "
              "analytic peak (offloaded states added: one allocator on a CPU).", "",
              "| setup | analytic | measured | ratio | phase (analytic / measured) |", "|---|---:|---:|---:|---|"]
    for m in measured:
        lines.append(f"| {m.setup} | {format_size(m.analytic_peak_bytes)} | {format_size(m.measured_peak_bytes)} | "
                     f"{m.ratio:.4f} | {m.analytic_phase.value} / {m.measured_phase.value} |")
    lines += ["", f"## {len(untraced)} setups budgeted analytically only", "",
              "| setup | analytic | phase | why not traced |", "|---|---:|---|---|"]
    for u in untraced:
        lines.append(f"| {u.setup} | {format_size(u.analytic_peak_bytes)} | {u.analytic_phase.value} | "
                     f"{u.reason.value} |")
    return "\n".join(lines) + "\n"


def worst_row(committed: dict[str, Any]) -> dict[str, Any]:
    """The committed row whose ratio is farthest from 1."""
    return max(committed["rows"], key=lambda r: abs(r["ratio"] - 1))


def committed_data(rows: list[AgreementRow], untraced: list[AnalyticOnlyRow], measured: list[MeasuredRow],
                   versions: Mapping[str, str]) -> dict[str, Any]:
    """What ``agreement.json`` holds, rows in :data:`MATRIX` / :data:`ANALYTIC_ONLY` order (a test rebuilds the
    committed file from its own rows)."""
    return {
        "tolerance": TOLERANCE, "versions": dict(versions), "gpu": GPU,
        "rows": [{**r.to_json(), "key": list(m)} for r, m in zip(rows, MATRIX, strict=True)],
        "measured": [m.to_json() for m in measured],
        "analytic_only": [{**u.to_json(), "key": list(m)} for u, (m, _) in zip(untraced, ANALYTIC_ONLY, strict=True)],
    }




def regenerate() -> int:
    """Rewrite ``agreement.json`` and ``budget-agreement.md``; 0 when every row agrees."""
    rows = run_matrix()
    untraced = [analytic_only(row, reason) for row, reason in ANALYTIC_ONLY]
    measured = measured_rows()
    versions = library_versions()
    write_text_atomic(AGREEMENT_JSON, json.dumps(committed_data(rows, untraced, measured, versions), indent=2) + "\n")
    Path(AGREEMENT_DOC).parent.mkdir(parents=True, exist_ok=True)
    markdown = render_markdown(rows, untraced, versions, measured)
    write_text_atomic(AGREEMENT_DOC, markdown)
    print(markdown)
    return 0 if all(r.agrees for r in rows) and all(m.agrees for m in measured) else 1
