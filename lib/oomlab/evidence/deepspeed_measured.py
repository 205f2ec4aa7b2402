"""DeepSpeed ZeRO-1/2/3 measured at small scale on CPU against the analytic budget: the committed
``docs/deepspeed-small-scale.md`` and the data it is rendered from (``lib/oomlab/data/deepspeed-small-scale.json``).

:data:`CASES` are tiny LLaMA setups (:func:`oomlab.budget.step.tiny_setup`) trained for two steps by
:mod:`oomlab.instruments.deepspeed_run`.  Per case the largest rank's figures are set beside the analytic ones:

* model-state tensors (structural bytes read off DeepSpeed's objects, wherever they live -- on this CPU the "GPU" and
  the "host" are one allocator);
* the CPU allocator's peak in each phase of the second step, and the bytes live after it.  The analytic side is
  :func:`oomlab.budget.estimator.estimate_setup`'s phase totals plus, for offloading cases, the host bytes of
  :func:`oomlab.budget.deepspeed.host_offload_bytes` (the same allocator here).

``python -m oomlab.evidence deepspeed-measured`` runs the cases again (about four minutes on two shared cores,
2026-12-06; results cached under
``outputs/cache`` by the library versions) and rewrites both files.  Tests re-check the committed measurements
against today's analytic figures and that the doc is rendered from the data.
"""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oomlab.budget import deepspeed_layout as layout
from oomlab.budget.deepspeed import (
    FP32,
    buffer_bytes,
    host_offload_bytes,
    model_dtype_bytes,
    partition_12,
    state_bytes,
    zero_states,
)
from oomlab.budget.deepspeed_config import settings_for
from oomlab.budget.estimator import estimate_setup
from oomlab.budget.result import Phase
from oomlab.budget.step import library_versions
from oomlab.core import paths
from oomlab.core.files import write_text_atomic
from oomlab.core.paths import DATA_DIR, REPO_ROOT
from oomlab.core.units import format_size
from oomlab.instruments.deepspeed_run import PHASES, STEPS, case_settings, case_setup, phase_mark, run_world

MEASURED_JSON = DATA_DIR / "deepspeed-small-scale.json"
MEASURED_DOC = REPO_ROOT / "docs" / "deepspeed-small-scale.md"
TOLERANCE = 0.02  # every measured figure within 2 % of the analytic one (as the agreement matrix)
SCALARS = 4096  # NB: bytes of scalars neither side models (loss scaler, norms, step counters, per rank)
BASE = {"precision": "bf16-mixed", "optimizer": "adamw-fused", "batch": 2, "seq": 64}


def _case(label: str, strategy: str, gpus: int, settings: Mapping[str, Any] | None = None, **extra: Any
          ) -> dict[str, Any]:
    flags = {k: extra.pop(k) for k in ("zero_init", "patch_fp16", "trainer_optim") if k in extra}
    return {"label": label, "knobs": {**BASE, "strategy": strategy, "gpus": gpus, **extra},
            "settings": dict(settings or {}), **flags}


DS_DEFAULTS = {"reduce_bucket_size": 500_000_000, "stage3_prefetch_bucket_size": 50_000_000,
               "stage3_param_persistence_threshold": 100_000}
CASES: tuple[dict[str, Any], ...] = (
    _case("ZeRO-3, 1 rank (nothing gathered)", "zero3", 1),
    _case("ZeRO-1", "zero1", 2),
    _case("ZeRO-2", "zero2", 2),
    _case("ZeRO-3", "zero3", 2),
    _case("ZeRO-2 fp16 (capability check patched)", "zero2", 2, precision="fp16-mixed", patch_fp16=True),
    _case("ZeRO-2 overlap_comm (two buckets)", "zero2", 2, {"overlap_comm": True}),
    _case("ZeRO-1 bf16 + fp32 grad accumulation (BF16_Optimizer)", "zero1", 2, {"grad_accum_fp32": True}),
    _case("ZeRO-3 built under zero.Init", "zero3", 2, zero_init=True),
    _case("ZeRO-3 with DeepSpeed's own defaults (no 'auto')", "zero3", 2, DS_DEFAULTS),
    _case("ZeRO-2 checkpointing", "zero2", 2, checkpointing=True),
    _case("ZeRO-3 checkpointing", "zero3", 2, checkpointing=True),
    _case("ZeRO-2 LoRA r8", "zero2", 2, method="lora"),
    _case("ZeRO-3 LoRA r8", "zero3", 2, method="lora"),
    _case("zero2-offload (optimizer on the host)", "zero2-offload", 2),
    _case("zero3-offload (optimizer and parameters on the host)", "zero3-offload", 2),
    _case("ZeRO-1, 4 ranks", "zero1", 4),
    _case("ZeRO-2, 4 ranks", "zero2", 4),
    _case("ZeRO-3, 4 ranks", "zero3", 4),
    # no optimizer block: the HF Trainer's create_optimizer with optim="adamw_torch" (foreach, as on CUDA)
    _case("ZeRO-1, the Trainer's adamw_torch", "zero1", 2, {"optimizer_source": "trainer"}, optimizer="adamw",
          trainer_optim="adamw_torch"),
    _case("ZeRO-2, the Trainer's adamw_torch", "zero2", 2, {"optimizer_source": "trainer"}, optimizer="adamw",
          trainer_optim="adamw_torch"),
    _case("ZeRO-3, the Trainer's adamw_torch", "zero3", 2, {"optimizer_source": "trainer"}, optimizer="adamw",
          trainer_optim="adamw_torch"),
    _case("ZeRO-2, the Trainer's adamw_torch_fused", "zero2", 2, {"optimizer_source": "trainer"},
          trainer_optim="adamw_torch_fused"),
)


def versions() -> dict[str, str]:
    import deepspeed

    return {**library_versions(), "deepspeed": str(deepspeed.__version__)}


# ------------------------------------------------------------------------------------------------ measuring


def _summary(record: dict[str, Any]) -> dict[str, Any]:
    """What one rank's record keeps: the second step's phase peaks, the bytes live after it, the structures."""
    if record["status"] != "ok":
        return {"status": record["status"], "error": record["error"]}
    phases = record["phases"]
    return {"status": "ok", "peaks": {p.value: phases[phase_mark(STEPS, p)]["peak"] for p in PHASES},
            "after_step": phases[f"s{STEPS}_done"]["start"], "load_peak": phases["initialize"]["peak"],
            "built": phases["build"]["end"], "after_backward": record["after_backward"],
            "after_step_structure": record["after_step"], "losses": record["losses"]}


def measure(cases: Sequence[dict[str, Any]] = CASES, use_cache: bool = True) -> list[list[dict[str, Any]]]:
    """Every case run for real (cached under outputs/cache by the versions and the cases); per case its ranks."""
    key = hashlib.sha256(json.dumps({"cases": list(cases), "versions": versions(), "v": 2},
                                    sort_keys=True).encode()).hexdigest()[:16]
    cache = paths.cache_dir() / f"deepspeed-small-{key}.json"
    if use_cache and cache.is_file():
        return json.loads(cache.read_text())
    out: list[list[dict[str, Any]] | None] = [None] * len(cases)
    for world in sorted({c["knobs"]["gpus"] for c in cases}):
        chosen = [i for i, c in enumerate(cases) if c["knobs"]["gpus"] == world]
        for i, ranks in zip(chosen, run_world(world, [cases[i] for i in chosen]), strict=True):
            out[i] = [_summary(r) for r in ranks]
    write_text_atomic(cache, json.dumps(out))
    return out  # type: ignore[return-value]


def measured_peaks(rank: Mapping[str, Any]) -> dict[Phase, int]:
    """One rank's summary: the second step's peak in each phase (the JSON keys them by the phases' values)."""
    return {p: rank["peaks"][p.value] for p in PHASES}


# ------------------------------------------------------------------------------------------------ comparing


def analytic_structure(case: Mapping[str, Any]) -> dict[str, int]:
    """Each DeepSpeed tensor's bytes on the largest rank, wherever it lives (on this CPU host and device are one)."""
    setup, settings = case_setup(case), case_settings(case)
    ds, lp, z = settings_for(setup, settings), model_dtype_bytes(setup), zero_states(setup, settings)
    out = {"buffers": buffer_bytes(setup)}
    if setup.strategy.zero_stage == 3:
        part = layout.stage3_partition(setup, ds.sub_group_size, ds.stage3_param_persistence_threshold)
        grad = FP32 if ds.grad_accum_fp32 else lp
        out.update(partitions=lp * part.all_params, master=FP32 * part.trained,
                   optimizer=state_bytes(setup, part.trained), gradients=grad * part.trained,
                   persistent=z.persistent_gathered, bucket=z.bucket)
        if setup.strategy.offloads_optimizer:
            out["fp32_gradients"] = FP32 * part.trained  # one fp32 buffer per sub-group (stage3.py:1336-1342)
        return out
    part12 = partition_12(setup, ds)
    frozen = z.weights - lp * part12.aligned - buffer_bytes(setup)
    out.update(partitions=lp * part12.aligned + frozen, master=FP32 * part12.partition,
               optimizer=state_bytes(setup, part12.partition), bucket=z.bucket)
    if setup.strategy.offloads_optimizer:
        out["fp32_gradients"] = FP32 * part12.partition  # the host's fp32 gradient partition (:934-941)
    else:
        out["gradients"] = z.gradients
    if z.full_gradients:  # ZeRO-1: every half gradient when the epilogue starts reducing them
        out["full_gradients"] = z.full_gradients
    return out


@dataclass(frozen=True)
class AnalyticStep:
    """A case's analytic step: each phase's total and the bytes held after the step, the host's offloaded bytes added
    to both (on this CPU host and device are one allocator)."""

    phases: Mapping[Phase, int]  # in PHASES order
    after_step_bytes: int

    @property
    def peak_phase(self) -> Phase:
        return max(self.phases, key=self.phases.__getitem__)


def analytic_step(case: Mapping[str, Any]) -> AnalyticStep:
    """The analytic phase totals (+ the host's offloaded bytes: one allocator here) and the bytes held after a step."""
    setup, settings = case_setup(case), case_settings(case)
    result = estimate_setup(setup, 0, settings)
    host = host_offload_bytes(setup, settings)
    z = zero_states(setup, settings)
    permanent = z.offload_temps + (z.bucket if z.bucket_permanent else 0)
    return AnalyticStep({p: sum(result.phases[p].values()) + host for p in PHASES},
                        z.weights + z.master + z.optimizer + z.held_gradients + permanent + host)


@dataclass(frozen=True)
class Row:
    """One figure of one case: the largest rank's measurement beside the analytic bytes."""

    case: str
    quantity: str
    measured: int
    analytic: int

    @property
    def ratio(self) -> float:
        return self.analytic / self.measured if self.measured else (1.0 if not self.analytic else float("inf"))

    @property
    def agrees(self) -> bool:
        return abs(self.measured - self.analytic) <= max(SCALARS, TOLERANCE * self.measured)


STRUCTURE = ("partitions", "persistent", "master", "optimizer", "full_gradients", "gradients", "fp32_gradients",
             "bucket", "buffers")


def compare(cases: Sequence[Mapping[str, Any]], measured: Sequence[Sequence[Mapping[str, Any]]]) -> list[Row]:
    """Rows for every case and figure (the largest rank's measurement)."""
    rows = []
    for case, ranks in zip(cases, measured, strict=True):
        ok = [r for r in ranks if r["status"] == "ok"]
        if len(ok) != len(ranks):
            continue
        expected = analytic_step(case)
        for phase in PHASES:
            rows.append(Row(case["label"], f"{phase.value} peak", max(measured_peaks(r)[phase] for r in ok),
                            expected.phases[phase]))
        rows.append(Row(case["label"], "live after the step", max(r["after_step"] for r in ok),
                        expected.after_step_bytes))
        structure = analytic_structure(case)
        for name in STRUCTURE:
            if name not in structure:
                continue
            source = "after_step_structure" if name in ("persistent", "partitions", "master", "optimizer") else \
                "after_backward"
            got = max(r[source].get(name, 0) for r in ok)
            rows.append(Row(case["label"], name, got, structure[name]))
    return rows


# ------------------------------------------------------------------------------------------------- the files


def load_committed() -> dict[str, Any]:
    return json.loads(MEASURED_JSON.read_text())


def render_markdown(data: Mapping[str, Any]) -> str:
    cases, measured = data["cases"], data["measured"]
    rows = compare(cases, measured)
    worst = max(rows, key=lambda r: abs(r.ratio - 1))
    failed = [(c["label"], next(r["error"] for r in ranks if r["status"] != "ok"))
              for c, ranks in zip(cases, measured, strict=True) if any(r["status"] != "ok" for r in ranks)]
    lines = [
        "# DeepSpeed ZeRO-1/2/3 at small scale: measured on CPU against the analytic budget", "",
        "Generated by `python -m oomlab.evidence deepspeed-measured` (`oomlab.evidence.deepspeed_measured`); versions: "
        + ", ".join(f"{k} {v}" for k, v in sorted(data["versions"].items())) + f"; {data['machine']}.", "",
        "Each case trains a tiny LLaMA (h=128, i=344, 2 layers, 4 heads, V=512, micro-batch 2 × 64 tokens, bf16 "
        "unless the label says otherwise) for two steps through `deepspeed.initialize` → `engine(...)` → "
        "`engine.backward` → `engine.step` on gloo processes (`DS_ACCELERATOR=cpu`, "
        "`deepspeed.init_distributed(\"gloo\")`). Measured: the CPU allocator (`torch.profiler`, "
        "`profile_memory=True`, from before the model is built, events replayed) in each phase of the **second** "
        "step, and DeepSpeed's own tensors read off the engine; the largest rank's figure. Analytic: "
        "`estimate_setup`'s phase totals and `oomlab.budget.deepspeed`'s terms for the same setup (offloaded "
        "states added: on this CPU the host and the \"GPU\" are one allocator). A row agrees within "
        f"{TOLERANCE:.0%} or {SCALARS:,} bytes (scalars: loss scaler, norms, step counters).", "",
        f"{len(rows)} figures over {len(cases) - len(failed)} cases; all agree: "
        f"{'yes' if all(r.agrees for r in rows) else 'no'}; largest difference {worst.ratio:.4f} "
        f"({worst.case}, {worst.quantity}).", "",
        "| case | figure | measured | analytic | analytic / measured |", "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r.case} | {r.quantity} | {format_size(r.measured)} ({r.measured:,} B) | "
                     f"{format_size(r.analytic)} ({r.analytic:,} B) | {r.ratio:.4f} |")
    if failed:
        lines += ["", "## Cases that did not run here", "", *(f"- {label}: `{error}`" for label, error in failed)]
    zinit = next((c, m) for c, m in zip(cases, measured, strict=True) if c.get("zero_init"))
    plain = next(m for c, m in zip(cases, measured, strict=True) if c["label"] == "ZeRO-3")
    lines += ["", "## Loading under `zero.Init`", "",
              f"Built by transformers under `deepspeed.zero.Init` (an `HfDeepSpeedConfig` alive), the model holds "
              f"{max(r['built'] for r in zinit[1]):,} bytes per rank at the end of construction (its bf16 partitions "
              f"and the fp32 rotary buffers) against {max(r['built'] for r in plain):,} for the same model built "
              "normally in fp32 and handed to `deepspeed.initialize`, which casts it and moves it whole before "
              "partitioning: a full replica is never materialised on a device under `zero.Init`.", "",
              DOC_FOOTER]
    return "\n".join(lines) + "\n"


DOC_FOOTER = """## What a GPU run would differ in

- The optimizer: these runs hand DeepSpeed torch's `AdamW(fused=True)` as the client optimizer (no JIT build);
  a DeepSpeed JSON with `"optimizer": {"type": "AdamW"}` builds `FusedAdam` on a GPU
  (`deepspeed/runtime/engine.py:2402-2408`) and `DeepSpeedCPUAdam` under offload (`:2384-2400`). Memory is the same:
  both keep two fp32 moments of the partition (`ops/adam/fused_adam.py:155-157`) and update in place. The
  "Trainer's adamw_torch" cases have the HF Trainer's own `create_optimizer` build the optimizer, as it does for a
  JSON without an optimizer block (`transformers/integrations/deepspeed.py:586-589`; two parameter groups, decay and
  no decay), with `foreach=True` -- what torch picks on CUDA (`torch/optim/optimizer.py:161-186`), not on CPU: its
  step allocates `exp_avg_sq_sqrt`, one fp32 copy of the group's partition (`torch/optim/adam.py:762`), the
  difference between their optimizer peaks and the `adamw_torch_fused` case's.
- Collectives: NCCL reduces and gathers in place; gloo stages copies inside its ops, which the measurement leaves out
  (`oomlab.instruments.deepspeed_run`).
- Offload: pinned host memory on CUDA (`pin_memory` is a no-op on the CPU accelerator); here host and device bytes
  add up in one allocator, so the offload rows check the sizes, not where they live.
- fp16: this CPU's oneDNN has no fp16, and DeepSpeed refuses it (`ValueError: Type fp16 is not supported on your
  device.`, `runtime/engine.py:2003-2004`); the fp16 case patches only that capability check.
- The CPU accelerator JIT-builds its `deepspeed_shm_comm` op on first use (about 30-60 s, cached in
  `~/.cache/torch_extensions`)."""


def build_data(use_cache: bool = True) -> dict[str, Any]:
    return {"versions": versions(), "machine": f"{platform.machine()} CPU, gloo", "cases": list(CASES),
            "measured": measure(CASES, use_cache)}




def regenerate(use_cache: bool = True) -> int:  # pragma: no cover - writes the committed files
    """Rewrite ``deepspeed-small-scale.json`` and ``deepspeed-small-scale.md``; 0 when every figure agrees."""
    data = build_data(use_cache=use_cache)
    write_text_atomic(MEASURED_JSON, json.dumps(data, indent=1) + "\n")
    markdown = render_markdown(data)
    write_text_atomic(MEASURED_DOC, markdown)
    print(markdown)
    return 0 if all(r.agrees for r in compare(data["cases"], data["measured"])) else 1
