"""Published measurements against the estimate: peaks measured on real GPUs, each beside oomlab's figure.

``python -m oomlab.evidence published`` estimates every row of ``lib/oomlab/data/published-measurements.json`` (a
published figure copied verbatim with its citation, plus the oomlab setup it maps to), picks the oomlab figure
matching the counter the source read (:data:`FIGURES`) and writes ``docs/published-measurements.md``.  Nothing is
fitted; the only figure searched for is the diagnostic "implied length" of variable-length rows, never an estimate.
Limitation: oomlab budgets one steady step of transformers + peft code; what a run does beyond that is named per
row (:class:`Unmodelled`), and a first-order omission makes the row :attr:`Coverage.APPROXIMATED`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from oomlab.budget.analytic import ALLOCATOR_FRAGMENTATION
from oomlab.budget.api import estimate
from oomlab.budget.result import BudgetResult, MemCategory, Phase
from oomlab.core.choices import Loss
from oomlab.core.errors import InvalidValueError, OomlabError
from oomlab.core.files import write_text_atomic
from oomlab.core.paths import REPO_ROOT
from oomlab.core.units import format_signed_size, format_size
from oomlab.evidence.published_rows import (
    FIGURES,
    SOURCE_PREFIXES,
    Coverage,
    Figure,
    Length,
    MetricKind,
    Moment,
    PublishedRow,
    Reliability,
    SecondaryMetric,
    Unmodelled,
    figure_bytes,
    figure_for,
    load_data,
    load_rows,
)

__all__ = ["compare", "compare_all", "regenerate", "render_markdown", "summarize"]

PUBLISHED_DOC = REPO_ROOT / "docs" / "published-measurements.md"
TRUSTED = (Reliability.HIGH, Reliability.MEDIUM)
# issue 24's targets: QLoRA rows' median |error|, every high/medium-reliability row's |error|, MoE QLoRA rows' |error|
QLORA_MEDIAN_TARGET, TRUSTED_TARGET, MOE_QLORA_TARGET = 0.10, 0.15, 0.15
HF_PEFT_QLORA_SOURCES = ("fms-acceleration", "unsloth-readme-hf-fa2")  # transformers + peft's prepared QLoRA
REGENERATE = ".venv/bin/python -m oomlab.evidence published"


# ------------------------------------------------------------------------------------------------------- compute


@dataclass(frozen=True)
class ImpliedLength:
    """The shortest length at which oomlab's figure reaches the published one (a diagnostic, used nowhere), or
    ``None`` with the reason: the published figure is below oomlab's at length 1, or above it at the chosen one."""

    seq: int | None
    reason: str | None = None


@dataclass(frozen=True)
class Comparison:
    """One published row against its oomlab estimate."""

    row: PublishedRow
    result: BudgetResult | None  # None when oomlab refuses the setup
    refusal: str | None  # oomlab's own message then
    figure: Figure
    estimate_bytes: int | None
    implied: ImpliedLength | None  # for variable-length rows

    @property
    def error(self) -> float | None:
        """Signed relative error, estimate / published - 1 (positive: oomlab says more)."""
        return None if self.estimate_bytes is None else self.estimate_bytes / self.row.value_bytes - 1


@dataclass(frozen=True)
class SecondaryComparison:
    """Another published figure of the same run against the matching oomlab figure."""

    row_id: str
    metric: SecondaryMetric
    figure: Figure
    estimate_bytes: int

    @property
    def error(self) -> float:
        return self.estimate_bytes / self.metric.value_bytes - 1


def _figure_at(row: PublishedRow, figure: Figure, seq: int) -> int:
    return figure_bytes(estimate(**{**row.setup_kwargs, "seq": seq}), figure)


def implied_length(row: PublishedRow, figure: Figure) -> ImpliedLength:
    """Bisect the sequence length in ``[1, chosen]`` for the first one whose figure reaches the published value
    (every figure is non-decreasing in the length)."""
    low, high = 1, int(row.setup_kwargs["seq"])
    if _figure_at(row, figure, low) >= row.value_bytes:
        return ImpliedLength(None, "below oomlab at seq 1")
    if _figure_at(row, figure, high) < row.value_bytes:
        return ImpliedLength(None, f"above oomlab at seq {high}")
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if _figure_at(row, figure, mid) >= row.value_bytes else (mid, high)
    return ImpliedLength(high)


def compare(row: PublishedRow) -> Comparison:
    """Estimate one row and pick the figure matching its counter."""
    figure = figure_for(row.compared_as)
    try:
        result = estimate(**row.setup_kwargs)
    except OomlabError as err:
        return Comparison(row, None, str(err), figure, None, None)
    implied = implied_length(row, figure) if row.length is Length.VARIABLE else None
    return Comparison(row, result, None, figure, figure_bytes(result, figure), implied)


def compare_all(rows: Iterable[PublishedRow] | None = None) -> list[Comparison]:
    return [compare(r) for r in (load_rows() if rows is None else rows)]


def secondary_comparisons(comparisons: Iterable[Comparison]) -> list[SecondaryComparison]:
    return [SecondaryComparison(c.row.id, m, f, figure_bytes(c.result, f)) for c in comparisons if c.result
            for m in c.row.secondary for f in (figure_for(m.kind, m.moment),)]


@dataclass(frozen=True)
class ErrorSummary:
    """Median absolute and worst signed error over a group of estimated rows."""

    label: str
    count: int
    median_abs_error: float
    worst: Comparison  # the row with the largest |error|


def summarize(comparisons: Sequence[Comparison], label: str,
              keep: Callable[[Comparison], bool] = lambda c: True) -> ErrorSummary | None:
    """The group's summary (suspect rows and rows not estimated never count), or ``None`` if it is empty."""
    group = [c for c in comparisons if c.error is not None and c.row.reliability is not Reliability.SUSPECT
             and keep(c)]
    if not group:
        return None
    worst = max(group, key=lambda c: abs(c.error))
    return ErrorSummary(label, len(group), statistics.median(abs(c.error) for c in group), worst)


def summaries(comparisons: Sequence[Comparison]) -> list[ErrorSummary]:
    """The doc's headline groups, then one per source."""
    groups = [
        ("all estimated rows", lambda c: True),
        ("high-reliability rows", lambda c: c.row.reliability is Reliability.HIGH),
        ("high- and medium-reliability rows", lambda c: c.row.reliability in TRUSTED),
        ("QLoRA rows", lambda c: c.row.setup_kwargs["method"] == "qlora"),
        ("modelled rows (no first-order feature missing)", lambda c: c.row.coverage is Coverage.MODELLED),
        ("fixed-length rows", lambda c: c.row.length is Length.FIXED),
        *((f"source {s}", lambda c, s=s: c.row.source == s) for s in SOURCE_PREFIXES),
    ]
    return [s for label, keep in groups if (s := summarize(comparisons, label, keep)) is not None]


@dataclass(frozen=True)
class Delta:
    """Two rows of one source that differ in one setting (same data, seed and code): the published difference against
    oomlab's, which cancels what both share (the length, the framework, the allocator policy)."""

    before: Comparison
    after: Comparison
    change: str

    @property
    def published_bytes(self) -> int:
        return self.after.row.value_bytes - self.before.row.value_bytes

    @property
    def estimate_bytes(self) -> int:
        return self.after.estimate_bytes - self.before.estimate_bytes


def deltas(comparisons: Iterable[Comparison]) -> list[Delta]:
    """The committed pairs (``deltas`` in the data file), each of two estimated rows compared on one figure."""
    by_id = {c.row.id: c for c in comparisons}
    out = [Delta(by_id[before], by_id[after], change) for before, after, change in load_data()["deltas"]]
    for d in out:
        if d.before.figure is not d.after.figure or None in (d.before.estimate_bytes, d.after.estimate_bytes):
            raise InvalidValueError(f"delta {d.before.row.id} → {d.after.row.id} needs two estimated rows compared "
                                    "on one figure")
    return out


# -------------------------------------------------------------------------------------------------------- render


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _implied(c: Comparison) -> str:
    return "fixed" if c.implied is None else str(c.implied.seq or c.implied.reason)


def _setup_cells(row: PublishedRow) -> list[str]:
    s = row.setup_kwargs
    targets = ",".join(t.removesuffix("_proj") for t in s.get("lora_targets", ()))
    method = s["method"] + (f" r{s['lora_rank']} {targets}" if s["method"] != "full" else "")
    gpu = s["gpu"] if s.get("gpus", 1) == 1 else f"{s['gpus']}× {s['gpu']} {s['strategy']}"
    return [s["model"], gpu, method, s["precision"], s["optimizer"], f"{s['batch']} × {s['seq']}",
            "yes" if s["checkpointing"] else "no"]


def _metric_cell(row: PublishedRow) -> str:
    return row.metric_kind.value if row.compared_as is row.metric_kind else f"unknown (as {row.compared_as.value})"


def _gap_lines(comparisons: Sequence[Comparison], secondary: Sequence[SecondaryComparison],
               moves: Sequence[Delta]) -> list[str]:
    by_id = {c.row.id: c for c in comparisons}
    move = {(d.before.row.id, d.after.row.id): d for d in moves}
    chunked = [c for c in comparisons if c.result is not None and c.result.setup.loss.chunked]
    lines = ["Rows whose run chunks its head and loss, estimated with that loss (`setup.loss`, "
             "`oomlab.budget.loss_kernels`) and with transformers' standard loss over whole logits (what modelling "
             "the chunking moved):", "",
             "| id | loss | oomlab's logits and loss at its peak | error | error with the standard loss |",
             "|---|---|---:|---:|---:|"]
    for c in chunked:
        standard = figure_bytes(estimate(**{**c.row.setup_kwargs, "loss": Loss.STANDARD.value}), c.figure)
        lines.append(f"| {c.row.id} | {c.result.setup.loss.value} | "
                     f"{format_size(c.result.components.get(MemCategory.LOGITS_LOSS, 0))} | {_pct(c.error)} | "
                     f"{_pct(standard / c.row.value_bytes - 1)} |")
    peft = [s for s in secondary if s.metric.moment is Moment.AFTER_OPTIMIZER_STEP]
    gap = statistics.median(s.metric.value_bytes - s.estimate_bytes for s in peft)
    first = by_id[peft[0].row_id].result.setup
    per_sample = gap / (first.batch * first.model.vocab_size * 2)
    chain = [move[("torchtune-readme-flags-3b-packed", "torchtune-readme-flags-3b-compile")],
             move[("torchtune-readme-flags-3b-compile", "torchtune-readme-flags-3b-chunkedce")]]
    dtype = move[("torchtune-tutorial-llama2-7b-lora-all-r8", "torchtune-tutorial-llama2-7b-lora-all-r64")]
    quant = move[("torchtune-readme-flags-3b-lora", "torchtune-readme-flags-3b-qlora")]
    lit = {m: [c.error for c in comparisons if c.row.source == "litgpt-confighub" and c.error is not None
               and c.row.reliability is not Reliability.SUSPECT and c.row.setup_kwargs["method"] == m]
           for m in ("lora", "qlora")}
    init = next(s for s in secondary if s.metric.moment is Moment.AFTER_MODEL_INIT)
    init_weights = by_id[init.row_id].result.phases[Phase.OPTIMIZER][MemCategory.WEIGHTS]
    reserved = [c.error for c in comparisons if c.error is not None and c.row.length is Length.VARIABLE
                and c.row.compared_as is MetricKind.RESERVED]
    ac = by_id["torchtune-readme-flags-3b-ac"]
    foreach_result = estimate(**{**ac.row.setup_kwargs, "optimizer": "adamw"})
    foreach, sqrt_copy = figure_bytes(foreach_result, ac.figure), foreach_result.components[MemCategory.WORKSPACE]
    return lines + [
        "",
        f"1. **Unmodelled memory savings make the overestimates.** In torchtune's ablation, torch.compile saves "
        f"{format_size(-chain[0].published_bytes)}; oomlab changes by {format_size(chain[0].estimate_bytes)}, as it "
        "does not model compile (nor paged optimizer state). Chunked cross-entropy "
        f"(compiled per chunk) saves {format_size(-chain[1].published_bytes)}; oomlab's chunked-compiled loss saves "
        f"{format_size(-chain[1].estimate_bytes)}. Rows missing a first-order feature are *approximated*: their "
        "error says what the missing features are worth, not how far oomlab's model of what it does model is off.",
        f"2. **peft's LoRA adapters are fp32; torchtune's and litgpt's are bf16**, budgeted so where the versions "
        "name the framework (`oomlab.budget.frameworks`): 8 bytes of weight, gradient and AdamW state per adapter "
        "parameter (plus foreach AdamW's bf16 temporary) where peft's need 16. torchtune's tutorial rank 8 → 64 on "
        f"every projection adds {format_signed_size(dtype.published_bytes)}; oomlab adds "
        f"{format_signed_size(dtype.estimate_bytes)}.",
        f"3. **QLoRA's load can set the peak, at the framework's versions.** Right after model init torchtune's QLoRA "
        f"tutorial already reserves {format_size(init.metric.value_bytes)}: its torchtune 0.1 pins torchao 0.1, whose "
        "to_nf4 quantizes a weight unchunked (64 bytes per element at its peak), and the init quantizes every base "
        "weight three times on the GPU (built, cloned per layer, loaded). Replaying torchao 0.1's recorded "
        "allocations in torchtune 0.1.0's init order through oomlab's caching-allocator model "
        f"(`oomlab.budget.nf4_init`) leaves {format_size(init.estimate_bytes)} reserved ({_pct(init.error)}); the "
        f"weights alone are {format_size(init_weights)}, and the step reuses that cache. litgpt's rows, budgeted as "
        "its loop runs under Lightning Fabric (`oomlab.budget.frameworks`: the previous micro-batch's fp32 logits "
        "-- and under bitsandbytes 0.42.0 every 4-bit input its graph keeps -- held into the next forward, the "
        "4-bit head's fp16 and bf16 dequantized copies, a separate head where Llama-3.2 ties it, NF4 without double "
        "quantization, "
        f"PagedAdamW), are {_pct(min(lit['qlora']))} … {_pct(max(lit['qlora']))} (QLoRA) and "
        f"{_pct(min(lit['lora']))} … {_pct(max(lit['lora']))} (LoRA): their gap was litgpt's loop, not loading "
        "(litgpt quantizes one weight at a time as it loads). Where loading does not matter, the quantized "
        f"weights are right: torchtune's LoRA → QLoRA saves {format_size(-quant.published_bytes)}, oomlab "
        f"{format_size(-quant.estimate_bytes)}.",
        f"4. **The static part is right; the step's outputs are not held in oomlab's optimizer phase.** Right after "
        f"optimizer.step() PEFT's runs hold a median {format_size(gap)} more than oomlab's weights, gradients and "
        f"optimizer state (table above) -- as much as bf16 logits of {first.batch} × {per_sample:.0f} tokens, if the "
        "loop still references its outputs then (not verified). It does not move these peaks (set in backward), "
        "but oomlab assumes the outputs are freed before the optimizer step.",
        f"5. **Reserved peaks depend on the allocator policy.** The same PEFT full fine-tuning reserves "
        f"{format_signed_size(move[('peft-metamathqa-2025-full', 'peft-metamathqa-2026-full')].published_bytes)} "
        "more in 2026 (empty_cache() every 10 steps) than in 2025 (every step), which oomlab's fixed allocator "
        f"overhead ({ALLOCATOR_FRAGMENTATION:.0%} of transient bytes) cannot tell apart; reserved rows of variable "
        f"length are {_pct(statistics.median(reserved))} (median) even at their length bound.",
        f"6. **An unstated optimizer, read from a measurement.** torchtune's '+ activation checkpointing' row "
        f"({format_size(ac.row.value_bytes)}) is below what a foreach AdamW step allocates there "
        f"({format_size(foreach)}: weights, gradients, both states and one full sqrt copy of them) by "
        f"{format_size(foreach - ac.row.value_bytes)}, most of that copy ({format_size(sqrt_copy)}); the README's "
        "command would give foreach, yet the run stepped without the temporary, so its chain is mapped as fused "
        f"AdamW ({format_size(ac.estimate_bytes)}). The baseline's 4,096-token bound says nothing of Alpaca's lengths.",
        _upcast_line(comparisons),
    ]


def _is_moe(c: Comparison) -> bool:
    return c.result is not None and any(layout.experts for layout in c.result.setup.model.layer_layouts)


def target_lines(comparisons: Sequence[Comparison]) -> list[str]:
    """Issue 24's targets, each with whether today's rows meet it and the rows that do not."""
    counted = [c for c in comparisons if c.error is not None and c.row.reliability is not Reliability.SUSPECT]
    qlora = [c for c in counted if c.row.setup_kwargs["method"] == "qlora"]
    trusted_over = [c for c in counted if c.row.reliability in TRUSTED and abs(c.error) > TRUSTED_TARGET]
    moe = [c for c in qlora if _is_moe(c)]
    median = statistics.median(abs(c.error) for c in qlora) if qlora else None
    moe_ok = all(abs(c.error) <= MOE_QLORA_TARGET for c in moe)
    trusted_qlora = [c for c in qlora if c.row.reliability in TRUSTED]
    trusted_median = statistics.median(abs(c.error) for c in trusted_qlora) if trusted_qlora else None

    def met(ok: bool) -> str:
        return "met" if ok else "**not met**"

    def over(rows: Sequence[Comparison]) -> str:
        return "; ".join(f"{c.row.id} {_pct(c.error)}" for c in rows) or "none"

    moe_status = met(moe_ok) if moe else "**not assessed**: no published MoE QLoRA peak with its settings yet"
    return [
        "| target | today | status | rows outside it |", "|---|---|---|---|",
        f"| QLoRA rows: median abs. error ≤ {QLORA_MEDIAN_TARGET:.0%} | "
        f"{'-' if median is None else f'{median:.1%}'} of {len(qlora)} | "
        f"{met(median is not None and median <= QLORA_MEDIAN_TARGET)} | "
        f"{over([c for c in qlora if abs(c.error) > QLORA_MEDIAN_TARGET])} |",
        f"| ... the high/medium-reliability QLoRA rows only | "
        f"{'-' if trusted_median is None else f'{trusted_median:.1%}'} of {len(trusted_qlora)} | "
        f"{met(trusted_median is not None and trusted_median <= QLORA_MEDIAN_TARGET)} | "
        f"{over([c for c in trusted_qlora if abs(c.error) > QLORA_MEDIAN_TARGET])} |",
        f"| every high/medium-reliability row within {TRUSTED_TARGET:.0%} | "
        f"{len(trusted_over)} of {sum(c.row.reliability in TRUSTED for c in counted)} outside | "
        f"{met(not trusted_over)} | {over(trusted_over)} |",
        f"| MoE QLoRA rows within {MOE_QLORA_TARGET:.0%} at the versions they ran | {len(moe)} rows | "
        f"{moe_status} | "
        f"{over([c for c in moe if abs(c.error) > MOE_QLORA_TARGET])} |",
    ]


def _stack(row: PublishedRow) -> str:
    given = row.setup_kwargs.get("versions") or {}
    return ", ".join(f"{name} {release}" for name, release in sorted(given.items())) or "installed"


def _upcast_line(comparisons: Sequence[Comparison]) -> str:
    """The HF + peft QLoRA rows with and without peft's fp32 upcast (the same rows estimated before peft 0.4.0)."""
    rows = [c for c in comparisons if c.error is not None and c.row.source in HF_PEFT_QLORA_SOURCES
            and c.row.setup_kwargs["method"] == "qlora"]
    without = [figure_bytes(estimate(**{**c.row.setup_kwargs, "versions": {**c.row.setup_kwargs["versions"],
                                                                            "peft": "0.3.0"}}), c.figure)
               / c.row.value_bytes - 1 for c in rows]
    low, high = min(c.error for c in rows), max(c.error for c in rows)
    return (f"7. **QLoRA as peft prepares it.** The Hugging Face + peft QLoRA rows (fms-acceleration's "
            f"baseline-peft-bnb and unsloth's HF + FA2 baseline, {len(rows)} rows, Mixtral's included) read "
            f"{_pct(low)} … {_pct(high)} with prepare_model_for_kbit_training's fp32 upcast (fp32 embedding, norms and "
            "head; an fp32 residual stream and checkpointed inputs) and "
            f"{_pct(min(without))} … {_pct(max(without))} without it (the same rows estimated at peft 0.3.0). "
            "torchtune and litgpt run no peft preparation, and their QLoRA gaps stay.")


def render_markdown(comparisons: Sequence[Comparison]) -> str:
    """docs/published-measurements.md from the comparisons (every figure in it computed here)."""
    secondary, moves = secondary_comparisons(comparisons), deltas(comparisons)
    lines = [
        "# Published measurements against the estimate", "",
        f"{len(comparisons)} peak-memory figures measured on real GPUs and published with their settings (PEFT's "
        "MetaMathQA benchmark, torchtune's README tables, tutorials and PR #961, litgpt's config hub, PEFT's "
        "FSDP/DeepSpeed docs, unsloth's README for its Hugging Face + FA2 baseline, fms-acceleration's reference "
        "benchmarks), each compared with oomlab's "
        "analytic estimate of the setup it maps to. Sources, "
        "commits and the researcher's caveats: `lib/oomlab/data/published-measurements.json` (each row's "
        "`published` part is copied verbatim). Nothing is fitted to these rows; the error is estimate / published "
        "− 1 (positive: oomlab says more).", "",
        f"Regenerate with `{REGENERATE}` (a test checks this file is current).", "",
        "Each published counter is compared with the oomlab figure that counts the same bytes:", "",
        "| published counter | read at | oomlab figure |", "|---|---|---|",
        *(f"| {k.value} | {m.value} | {f.value} |" for (k, m), f in FIGURES.items()), "",
        "*reserved peak* = allocated peak + allocator overhead; *per-GPU peak* adds the memory outside PyTorch "
        "(nvidia-smi); *active* is compared with the allocated peak, from which it differs only by blocks freed "
        "while another stream still uses them. A counter the source does not name is compared as the kind the "
        "row gives, with its reason (row notes below). Variable-length rows (batches padded to their longest "
        "sample) are estimated at the stated truncation limit, an upper bound; *implied seq* is the length at "
        "which oomlab would equal the published figure (a diagnostic only).", "",
        "## Summary", "",
        "| rows | n | median abs. error | worst error | worst row |", "|---|---:|---:|---:|---|",
        *(f"| {s.label} | {s.count} | {s.median_abs_error:.1%} | {_pct(s.worst.error)} | {s.worst.row.id} |"
          for s in summaries(comparisons)), "",
        "Suspect rows are shown but counted in no statistic. *Modelled* rows miss only second-order features; "
        "*approximated* ones miss a first-order feature (see the gaps below).", "",
        "Each row is estimated at the releases it ran (the *stack* column, `setup.versions` in the data file; "
        "`oomlab.core.versions`): a torchtune or litgpt row names its framework, which runs no peft preparation; "
        "litgpt's rows ran bitsandbytes 0.42.0, whose `MatMul4Bit` kept each 4-bit projection's input, and are "
        "budgeted as litgpt's own model and loop under Lightning Fabric (`oomlab.budget.frameworks`).", "",
        "## Issue 24's targets", "", *target_lines(comparisons), "",
        "## Every estimated row", "",
        "| id | model | GPU | method | precision | optimizer | batch × seq | ckpt | stack | metric | published | "
        "oomlab (figure) | error | implied seq | reliability | coverage | not modelled |",
        "|---|---|---|---|---|---|---|---|---|---|---:|---:|---:|---:|---|---|---|",
    ]
    for c in (c for c in comparisons if c.estimate_bytes is not None):
        r = c.row
        lines.append("| " + " | ".join([r.id, *_setup_cells(r), _stack(r), _metric_cell(r), format_size(r.value_bytes),
                                          f"{format_size(c.estimate_bytes)} ({c.figure.value})", _pct(c.error),
                                          _implied(c), r.reliability.value, r.coverage.value,
                                          ", ".join(f"`{u.value}`" for u in r.unmodelled)]) + " |")
    lines += ["", "## Not estimated", "", "| id | metric | published | why | oomlab says |", "|---|---|---:|---|---|",
              *(f"| {c.row.id} | {_metric_cell(c.row)} | {format_size(c.row.value_bytes)} | "
              f"{c.row.not_estimated_because} | {c.refusal} |" for c in comparisons if c.estimate_bytes is None)]
    lines += ["", "## Other figures of the same runs", "", "| id | published metric | read at | published | "
              "oomlab (figure) | error |", "|---|---|---|---:|---:|---:|"]
    lines += [f"| {s.row_id} | {s.metric.name} | {s.metric.moment.value} | {format_size(s.metric.value_bytes)} | "
              f"{format_size(s.estimate_bytes)} ({s.figure.value}) | {_pct(s.error)} |" for s in secondary]
    lines += ["", "## Differences between rows of one source", "",
              "Two rows that differ in one setting share everything else (data order, seed, code, length), so their "
              "difference cancels the length and framework questions.", "",
              "| from | to | change | published | oomlab | oomlab − published |", "|---|---|---|---:|---:|---:|"]
    lines += [f"| {d.before.row.id} | {d.after.row.id} | {d.change} | {format_signed_size(d.published_bytes)} | "
              f"{format_signed_size(d.estimate_bytes)} | "
              f"{format_signed_size(d.estimate_bytes - d.published_bytes)} |" for d in moves]
    lines += ["", "## Systematic gaps", "", *_gap_lines(comparisons, secondary, moves),
              "", "## What the `not modelled` keys mean", "", "| key | first-order | what oomlab does not model |",
              "|---|---|---|"]
    lines += [f"| `{u.value}` | {'yes' if u.first_order else 'no'} | {u.text} |" for u in Unmodelled]
    lines += ["", "## Row notes", ""]
    lines += [f"- **{r.id}** ([source]({r.source_url})): {r.note} Measured: {r.metric_text}"
              + (f" Compared as {r.compared_as.value}: {r.compared_as_because}." if r.compared_as_because else "")
              for r in (c.row for c in comparisons)]
    return "\n".join(lines) + "\n"




def regenerate() -> int:
    """Compare every published row and write docs/published-measurements.md."""
    comparisons = compare_all()
    write_text_atomic(PUBLISHED_DOC, render_markdown(comparisons))
    for s in summaries(comparisons)[:4]:
        print(f"{s.label}: {s.count} rows, median |error| {s.median_abs_error:.1%}, worst {_pct(s.worst.error)} "
              f"({s.worst.row.id})")
    print(f"wrote {PUBLISHED_DOC}")
    return 0
