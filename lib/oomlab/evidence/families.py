"""Every supported family's budget checked: the committed family agreement matrix.

``python -m oomlab.evidence families`` writes ``lib/oomlab/data/family-agreement.json`` and
``docs/family-agreement.md``.  Per family (:class:`oomlab.core.models.Family`):

* traced rows -- a shipped spec of the family cut to its first :data:`TRACED_LAYERS` decoder layers at full width
  (each whole-model trace then takes seconds), budgeted analytically and traced whole by
  :func:`oomlab.budget.traced.traced_budget` (PyTorch's MemTracker under ``FakeTensorMode``) for each of
  :data:`TRACED_SETUPS`; peak and every component within :data:`TOLERANCE` (2 %);
* a measured row -- the family's tiny config (:data:`oomlab.budget.step.TINY_FAMILY_CONFIGS`: h=128, 2 layers, V=512)
  trained for real on CPU (:func:`oomlab.instruments.measured.measure_steps`, the allocator's own count of the second
  step), within :data:`MEASURED_TOLERANCE` (3 %).

MoE routing, as traced and as budgeted: every expert is resident (weights, gradients and optimizer state of all
experts); transformers 5 runs the experts as one ``grouped_mm`` over the (token, expert) pairs of each token's top-k
-- whatever the router picks, every token goes through exactly ``num_experts_per_tok`` experts, so the activations
saved are those of ``tokens x top-k`` expert rows, independent of which experts they are (the fake tensors' router
picks arbitrary experts; the sizes do not depend on it).  The router logits (tokens x experts) are saved per layer.
Expert parallelism (not modelled) would shard the resident experts' states across GPUs and move the routed tokens
with two all-to-alls per MoE layer; the activations per token stay the same.

Known gaps (rows budgeted and traced but outside the tolerance, listed in the document with their ratios and the
reason) are :data:`KNOWN_GAPS`; they are not hidden and not counted as agreeing.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oomlab.budget.layer_trace import prefix_spec
from oomlab.budget.result import MemCategory, Phase, Source
from oomlab.budget.step import library_versions
from oomlab.core.files import write_text_atomic
from oomlab.core.models import Family, ModelSpec, load_model
from oomlab.core.paths import DATA_DIR, REPO_ROOT
from oomlab.core.setup import TrainingSetup, make_setup
from oomlab.core.units import format_size
from oomlab.evidence.agreement import AgreementRow, compare, describe
from oomlab.evidence.small_scale import SmallCase, compare_small

TOLERANCE = 0.02  # traced rows: peak and every component within 2 % of the traced peak
MEASURED_TOLERANCE = 0.03  # real CPU steps: peak within 3 %
FAMILY_JSON = DATA_DIR / "family-agreement.json"
FAMILY_DOC = REPO_ROOT / "docs" / "family-agreement.md"
GPU = "a100-80gb"  # capacity only; allocated bytes do not depend on it
TRACED_LAYERS = 4  # decoder layers kept of each real config (Gemma-2: two sliding and two global layers)

# the shipped spec each family is traced from (at full width, cut to TRACED_LAYERS)
FAMILY_MODELS: Mapping[Family, str] = {
    Family.LLAMA: "llama-3.1-8b", Family.MISTRAL: "mistral-7b", Family.QWEN2: "qwen2.5-7b", Family.QWEN3: "qwen3-8b",
    Family.GEMMA: "gemma-2b", Family.GEMMA2: "gemma-2-9b", Family.PHI: "phi-2", Family.PHI3: "phi-3-mini-4k",
    Family.GPT_NEOX: "pythia-1.4b", Family.STABLELM: "stablelm-2-1_6b", Family.OLMO2: "olmo-2-7b",
    Family.FALCON: "falcon-7b", Family.MIXTRAL: "mixtral-8x7b", Family.QWEN2_MOE: "qwen1.5-moe-a2.7b",
    Family.QWEN3_MOE: "qwen3-30b-a3b", Family.GRANITEMOE: "granite-3.0-3b-a800m", Family.GPT_OSS: "gpt-oss-20b",
}

# (label, make_setup keywords): the launches traced for every family
TRACED_SETUPS: tuple[tuple[str, Mapping[str, Any]], ...] = (
    ("full, bf16-mixed, AdamW (foreach)", {"method": "full", "precision": "bf16-mixed", "optimizer": "adamw",
                                           "seq": 512, "batch": 2}),
    ("LoRA r8 (attention), pure bf16, checkpointing", {"method": "lora", "precision": "bf16", "optimizer": "adamw",
                                                       "seq": 1024, "batch": 1, "checkpointing": True}),
    ("FSDP2 x4, LoRA r8 all-linear, bf16-mixed, checkpointing",
     {"strategy": "fsdp2", "gpus": 4, "method": "lora", "lora_targets": "all-linear", "precision": "bf16-mixed",
      "seq": 1024, "batch": 1, "checkpointing": True}),
    ("LoRA r8 (attention), fp16-mixed (autocast), AdamW", {"method": "lora", "precision": "fp16-mixed",
                                                          "optimizer": "adamw", "seq": 512, "batch": 2}),
)
LORA_BF16_ROW, FSDP2_ROW, LORA_FP16_ROW = 1, 2, 3  # indices in TRACED_SETUPS

# (family, setup index) -> why it is outside the tolerance
KNOWN_GAPS: Mapping[tuple[Family, int], str] = {
    (f, FSDP2_ROW): "tied embedding under FSDP2: the analytic FSDP2 phases (oomlab.budget.fsdp) model accelerate's "
                    "tail group for an untied LM head; the tied embedding's gathered weight and gradient are not "
                    "placed right yet"
    for f in (Family.GEMMA, Family.GEMMA2, Family.FALCON, Family.GRANITEMOE)
} | {
    (Family.FALCON, LORA_BF16_ROW): "Falcon at micro-batch 1 with checkpointing: the traced peak is inside a "
                                    "recomputed layer's backward, whose gradient temporaries the analytic budget "
                                    "takes as LLaMA's (c (3 i + h) per token); Falcon's parallel attention and GELU "
                                    "MLP at batch 1 hold more there (not derived yet; at batch 2 it agrees)",
    (Family.MIXTRAL, LORA_FP16_ROW): "MoE LoRA over an fp16 base: fp16 experts run transformers' grouped_mm "
                                     "fallback (the native op takes bf16 only), whose backward also computes the "
                                     "frozen experts' weight gradient -- a transient the size of a layer's expert "
                                     "stack that the analytic budget does not model yet (bf16 bases agree)",
}

MEASURED_KNOBS: Mapping[str, Any] = {"precision": "fp32", "optimizer": "adamw", "batch": 2, "seq": 64}
MEASURED_LABEL = "tiny (h128, L2, V512), full, fp32, AdamW, batch 2, seq 64, 2 real CPU steps"


def traced_model(family: Family) -> ModelSpec:
    """The family's shipped spec cut to :data:`TRACED_LAYERS` layers at full width."""
    return prefix_spec(load_model(FAMILY_MODELS[family]), TRACED_LAYERS)


def traced_setup(family: Family, index: int) -> TrainingSetup:
    knobs = dict(TRACED_SETUPS[index][1])
    attention = "eager" if family in (Family.GEMMA2, Family.GPT_OSS) else "sdpa"  # no SDPA for Gemma-2, gpt-oss
    return make_setup(model=traced_model(family), gpu=GPU, attention=attention, **{"gpus": 1, **knobs})


@dataclass(frozen=True)
class FamilyRow:
    """One family and setup: analytic against the whole-model trace (or a real CPU step)."""

    family: str
    model: str  # the spec (cut) or the tiny config
    setup: str
    source: Source  # traced or measured
    analytic_peak_bytes: int
    reference_peak_bytes: int
    analytic_phase: Phase
    reference_phase: Phase
    worst_component: MemCategory | None  # the category that differs most (None for measured rows: peaks only)
    worst_component_delta: float  # its (analytic - reference) / reference peak
    known_gap: str  # why the row is outside the tolerance ("" when it is expected to agree)
    seconds: float  # wall time of the reference (trace or real steps)

    @property
    def ratio(self) -> float:
        return self.analytic_peak_bytes / self.reference_peak_bytes

    @property
    def tolerance(self) -> float:
        return TOLERANCE if self.source is Source.TRACED else MEASURED_TOLERANCE

    @property
    def agrees(self) -> bool:
        return abs(self.ratio - 1) <= self.tolerance and abs(self.worst_component_delta) <= self.tolerance

    @property
    def worst_component_name(self) -> str:
        """The worst component's name ("" for measured rows), as the JSON and the document write it."""
        return self.worst_component.value if self.worst_component is not None else ""

    def to_json(self) -> dict[str, Any]:
        """The committed row (``family-agreement.json``)."""
        return {"family": self.family, "model": self.model, "setup": self.setup, "source": self.source.value,
                "analytic_peak_bytes": self.analytic_peak_bytes, "reference_peak_bytes": self.reference_peak_bytes,
                "analytic_phase": self.analytic_phase.value, "reference_phase": self.reference_phase.value,
                "worst_component": self.worst_component_name, "worst_component_delta": self.worst_component_delta,
                "known_gap": self.known_gap, "seconds": self.seconds, "ratio": self.ratio}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> FamilyRow:
        return cls(row["family"], row["model"], row["setup"], Source(row["source"]), row["analytic_peak_bytes"],
                   row["reference_peak_bytes"], Phase(row["analytic_phase"]), Phase(row["reference_phase"]),
                   MemCategory(row["worst_component"]) if row["worst_component"] else None,
                   row["worst_component_delta"], row["known_gap"], row["seconds"])


def traced_row(family: Family, index: int) -> FamilyRow:
    setup = traced_setup(family, index)
    start = time.perf_counter()
    row: AgreementRow = compare(setup)
    name, delta = row.worst_component
    return FamilyRow(family.value, setup.model.name, describe(setup), Source.TRACED, row.analytic_peak_bytes,
                     row.traced_peak_bytes, row.analytic_phase, row.traced_phase, name, delta,
                     KNOWN_GAPS.get((family, index), ""), time.perf_counter() - start)


def measured_row(family: Family) -> FamilyRow:
    start = time.perf_counter()
    small = compare_small(SmallCase(family.value, {"family": family, **MEASURED_KNOBS}))
    return FamilyRow(family.value, small.case.setup.model.name, MEASURED_LABEL, Source.MEASURED,
                     small.analytic_peak_bytes, small.measured_peak_bytes, small.analytic_peak_phase,
                     small.measured.peak_phase, None, 0.0, "", time.perf_counter() - start)


def compute_rows(families: tuple[Family, ...] = tuple(Family), *, measured: bool = True) -> list[FamilyRow]:
    rows = []
    for family in families:
        rows += [traced_row(family, i) for i in range(len(TRACED_SETUPS))]
        if measured:
            rows.append(measured_row(family))
    return rows


def render_markdown(rows: list[FamilyRow], versions: Mapping[str, str]) -> str:
    """The committed document, from the rows (a test renders the committed JSON and compares)."""
    checked = [r for r in rows if not r.known_gap]
    worst = max(checked, key=lambda r: abs(r.ratio - 1))
    families = sorted({r.family for r in rows})
    lines = [
        "# Every family's budget against PyTorch's own tracking and real steps",
        "",
        f"{len(families)} decoder-only families. Traced rows: a shipped spec of the family cut to its first "
        f"{TRACED_LAYERS} decoder layers at full width (so that each whole-model trace takes seconds; the one-layer "
        "inventory the budget uses scales to any depth, checked against whole-model traces in "
        "`tests/budget/test_layer_trace.py`), budgeted by `oomlab.budget.analytic` and traced whole by "
        "`oomlab.budget.traced` (MemTracker / FSDPMemTracker under `FakeTensorMode`, on CPU). A traced row agrees "
        f"when the allocated peak and every component at the traced peak's phase are within {TOLERANCE:.0%} of the "
        "traced peak. Measured rows: the family's tiny config trained for real on CPU (the allocator's count of the "
        f"second step), peak within {MEASURED_TOLERANCE:.0%}.",
        "",
        "MoE (Mixtral, Qwen2-MoE, Qwen3-MoE): every expert resident; transformers 5's `grouped_mm` experts run each "
        "token through exactly its top-k experts, so the saved activations are those of tokens x top-k expert rows "
        "whichever experts the router picks (the fake tensors' routing is arbitrary; the sizes do not depend on it); "
        "router logits saved per layer. Expert parallelism is not modelled: it would shard the experts' states and "
        "add two all-to-alls per MoE layer, activations per token unchanged. Gemma-2 runs eager attention "
        "(transformers has no SDPA for it: it cannot soft-cap).",
        "",
        "Regenerate with `.venv/bin/python -m oomlab.evidence families` (versions: "
        + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) + ").",
        "",
        f"{len(rows)} rows, {len(checked)} checked: {sum(r.agrees for r in checked)} agree; worst peak ratio "
        f"{worst.ratio:.4f} ({worst.family}, {worst.setup}); {len(rows) - len(checked)} known gaps (below).",
        "",
        "| family | model | setup | source | analytic | reference | ratio | phase (analytic / reference) "
        "| worst component | agrees |",
        "|---|---|---|---|---:|---:|---:|---|---|---|",
    ]
    for r in rows:
        component = f"{r.worst_component_name} {r.worst_component_delta:+.2%}" if r.worst_component is not None else "-"
        verdict = "yes" if r.agrees else ("known gap" if r.known_gap else "NO")
        lines.append(f"| {r.family} | {r.model} | {r.setup} | {r.source.value} | "
                     f"{format_size(r.analytic_peak_bytes)} | {format_size(r.reference_peak_bytes)} | {r.ratio:.4f} | "
                     f"{r.analytic_phase.value} / {r.reference_phase.value} | {component} | {verdict} |")
    gaps = [r for r in rows if r.known_gap]
    if gaps:
        lines += ["", "## Known gaps", "", "| family | setup | ratio | why |", "|---|---|---:|---|"]
        lines += [f"| {r.family} | {r.setup} | {r.ratio:.4f} | {r.known_gap} |" for r in gaps]
    return "\n".join(lines) + "\n"


def rows_from_json(data: Mapping[str, Any]) -> list[FamilyRow]:
    return [FamilyRow.from_json(row) for row in data["rows"]]


def committed_data(rows: list[FamilyRow], versions: Mapping[str, str]) -> dict[str, Any]:
    """What ``family-agreement.json`` holds (a test rebuilds the committed file from its own rows)."""
    return {"tolerance": TOLERANCE, "measured_tolerance": MEASURED_TOLERANCE, "traced_layers": TRACED_LAYERS,
            "versions": dict(versions), "gpu": GPU, "rows": [r.to_json() for r in rows]}


def load_committed() -> dict[str, Any]:
    return json.loads(FAMILY_JSON.read_text())




def regenerate() -> int:
    """Rewrite ``family-agreement.json`` and ``family-agreement.md``; 0 when every row but the known gaps agrees."""
    rows = compute_rows()
    versions = library_versions()
    write_text_atomic(FAMILY_JSON, json.dumps(committed_data(rows, versions), indent=2) + "\n")
    write_text_atomic(FAMILY_DOC, render_markdown(rows, versions))
    bad = [r for r in rows if not r.agrees and not r.known_gap]
    for r in bad:
        print(f"outside the tolerance: {r.family}: {r.setup} ({r.ratio:.4f}, {r.worst_component_name} "
              f"{r.worst_component_delta:+.2%})", file=sys.stderr)
    print(f"wrote {FAMILY_JSON} and {FAMILY_DOC}: {len(rows)} rows, {len(bad)} outside the tolerance")
    return 1 if bad else 0
