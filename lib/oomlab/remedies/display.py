"""Remedies for readers: the ranked table, the knob table, the device-map placement, the CLI text and the answer in
words -- each written once, from the result objects (the report rebuilds them from its results JSON)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from oomlab.budget.result import Fit
from oomlab.core.choices import Method, Strategy
from oomlab.core.gpus import load_gpu
from oomlab.core.markdown import md_text
from oomlab.core.seed import SEED_DTYPE, is_seed_case
from oomlab.core.units import format_signed_size, format_size
from oomlab.core.words import count
from oomlab.remedies.knobs import KnobChange
from oomlab.remedies.placement import DeviceMapPlacement, layer_index
from oomlab.remedies.plan import Outcome, Plan
from oomlab.remedies.remedy import Remedy, format_tokens_per_s, launcher
from oomlab.remedies.verdict import VerdictFacts, render_verdict

REMEDY_HEADERS = ("#", "remedy", "launched by", "fits", "per-GPU peak", "headroom", "host RAM", "max micro-batch",
                  "max seq (batch 1)", "tokens/s", "why")
COMPACT_REMEDY_HEADERS = REMEDY_HEADERS[:8] + ("tokens/s",)  # the report's table: no max seq, no reason


def remedy_rows(configured: Remedy, remedies: Sequence[Remedy], top: int = 15, *, compact: bool = False
                ) -> list[tuple[Any, ...]]:
    """The user's configuration, then the ``top`` ranked remedies, as display rows (``compact``: the report's)."""
    rows = []
    for i, r in enumerate([configured, *remedies[:top]]):
        row = ("as configured" if i == 0 else str(i), r.name,  # the # column names the user's row
               launcher(r.route, r.strategy, r.framework), "yes" if r.fits else "no",
               format_signed_size(r.per_gpu_peak_bytes), format_signed_size(r.headroom_bytes),
               format_signed_size(r.host_ram_bytes), "-" if r.max_batch is None else str(r.max_batch))
        if compact:
            rows.append((*row, format_tokens_per_s(r.tokens_per_s)))
        else:
            rows.append((*row, "-" if r.max_seq is None else str(r.max_seq), format_tokens_per_s(r.tokens_per_s),
                         r.reason))
    return rows


KNOB_HEADERS = ("change", "per-GPU peak", "host RAM", "fits", "why")


def knob_change_text(row: KnobChange) -> str:
    """``method → lora + checkpointing → true``."""
    return " + ".join(f"{k} → {v}" for k, v in row.changes)


def knob_rows(knobs: Sequence[KnobChange]) -> list[tuple[Any, ...]]:
    return [(knob_change_text(row), format_signed_size(row.per_gpu_peak_bytes),
             format_signed_size(row.host_ram_bytes), "yes" if row.fits else "no", row.reason) for row in knobs]


PLACEMENT_HEADERS = ("GPU", "decoder layers", "other modules", "fp16 weights", "training peak")


def placement_rows(placement: DeviceMapPlacement) -> list[tuple[Any, ...]]:
    rows = []
    for g in placement.gpus:
        layers = f"{g.layers[0]}–{g.layers[-1]} ({len(g.layers)})" if g.layers else "none"
        others = ", ".join(m for m in g.modules if layer_index(m) is None) or "-"
        rows.append((g.device, layers, others, format_size(g.weight_bytes), format_size(g.peak_bytes)))
    return rows


def configured_words(model: str, gpu: str, gpus: int) -> str:
    """How the plan names the configuration it starts from: the user's (the seed report's case), else as given."""
    return "the user's configuration" if is_seed_case(model, SEED_DTYPE, gpu, gpus) else "the configuration as given"


def heading(plan: Plan) -> str:
    """Notebook 03's question for the case at hand, as a Markdown line: which configuration trains this model on
    these GPUs, and what the configuration as given does."""
    gpu = load_gpu(plan.gpu).display_name
    configured = plan.configured
    who = configured_words(plan.model, plan.gpu, plan.gpus)
    run = (f"{configured.strategy.value if configured.strategy is not Strategy.SINGLE else 'one process'}, "
           f"{configured.method.value} fine-tuning, {configured.precision.value}, {configured.optimizer.value}")
    state = Fit.of(configured.fits).value + (" (notebook 01 reproduced why)"
                                             if configured.fails_at_load and not configured.fits else "")
    return (f"**Which configuration trains {md_text(plan.model)} on {plan.nodes * plan.gpus} × {gpu}?** "
            f"{who.capitalize()} ({run}) {state}.")


def verdict(plan: Plan) -> str:
    """The plan's outcome in one Markdown sentence (:func:`~oomlab.remedies.verdict.render_verdict` of its facts)."""
    return render_verdict(VerdictFacts.of(plan))


def micro_batches(max_batch: int) -> str:
    """The micro-batches that fit, worded: "micro-batch 1 only" rather than "micro-batch up to 1"."""
    return "micro-batch 1 only" if max_batch == 1 else f"micro-batch up to {max_batch}"


def otherwise_sentence(rec: Remedy, rank: int, note: str, esc: Callable[[str], str] = str) -> str:
    """The recommended fix in one sentence, after the configuration as given did not fit (the report's answer);
    ``rank``: its row in the ranked table, ``note``: why it is not the first row; ``esc`` escapes user text."""
    return (f"**Otherwise, yes:** {esc(rec.name)} fits at {format_size(rec.per_gpu_peak_bytes)} per GPU "
            f"({format_size(rec.headroom_bytes)} headroom, {micro_batches(rec.max_batch)}, about "
            f"{format_tokens_per_s(rec.tokens_per_s)} tokens/s estimated) — the recommended fix below."
            + (f" It is not the table's first row: {esc(note)}." if rank != 1 else ""))


def render_plan(plan: Plan, top: int = 15) -> str:
    """Plain text for the CLI: the user's configuration, the ranked remedies, the knob table, the assumptions."""
    at = f"micro-batch {plan.configured.setup.batch}" if plan.configured.setup is not None else "the micro-batch"
    lines = [f"{plan.model} on {plan.nodes * plan.gpus} x {plan.gpu}, seq {plan.seq}, host RAM "
             f"{format_size(plan.host_ram_bytes)}: {len(plan.fitting)} of {len(plan.remedies)} remedies fit at the "
             f"configured {at} ({len(plan.dropped)} dropped)"
             + (f"; the ladder's fix (row 1) changes {', '.join(s.rung.value for s in plan.decision.steps)}"
                if plan.fix is not None else ""), ""]
    for row in remedy_rows(plan.configured, plan.shown, top):
        idx, name, launch, fits, peak, head, host, mb, ms, tps, why = row
        lines.append(f"{idx:>4}  {name}")
        lines.append(f"      launched by {launch}")
        lines.append(f"      fits {fits}; per-GPU peak {peak}; headroom {head}; host RAM {host}; max micro-batch "
                     f"{mb}; max seq {ms}; tokens/s {tps}")
        lines.append(f"      {why}")
    who = configured_words(plan.model, plan.gpu, plan.gpus).removesuffix(" configuration").removesuffix(
        " as given")
    lines += ["", f"the configuration that determines the result ({who}, one or two knobs changed):"]
    for change, peak, _host, fits, why in knob_rows(plan.knobs):
        lines.append(f"  {change:<52} {peak:>12}  {fits:<3}  {why}")
    rec = plan.recommended
    none = "as configured (nothing to change)" if plan.outcome is Outcome.FITS else "none"
    lines += ["", f"verdict: {plan.outcome.value}", f"recommended: {rec.name if rec else none}"
              + (f" ({plan.recommendation_note})" if rec else "")]
    if rec and rec.config_files:
        lines.append("  launch files: " + ", ".join(rec.config_files) + " (python -m oomlab plan --write-configs)")
    lines += ["", "dropped:"] + [f"  {r.name}: {r.reason}" for r in plan.dropped[:5]]
    if len(plan.dropped) > 5:
        lines.append(f"  ... and {len(plan.dropped) - 5} more with the same reasons")
    lines += ["", "notes:"] + [f"  - {n}" for n in plan.notes] if plan.notes else []
    lines += ["", "assumptions:"] + [f"  - {a}" for a in plan.assumptions] + [f"  - {plan.seq_note}"]
    return "\n".join(lines)


def summarize(plan: Plan) -> str:
    """The answer in plain words (Markdown), every figure from the plan."""
    configured, rec = plan.configured, plan.recommended
    gpu = load_gpu(plan.gpu)
    who = configured_words(plan.model, plan.gpu, plan.gpus)
    example = f", e.g. bf16 on the {gpu.display_name}" if not gpu.bf16 else ""
    lines = [
        f"**{who.capitalize()} {Fit.NO.value}.** {configured.reason}." if not configured.fits else
        f"**{who.capitalize()} {Fit.FITS.value}**: {configured.reason}.",
        verdict(plan),
        f"Of {len(plan.remedies)} configurations budgeted ({len(plan.dropped)} more dropped because the "
        f"{gpu.display_name} or the libraries cannot run them{example}), {len(plan.fitting)} fit on "
        f"{plan.nodes * plan.gpus} × {gpu.display_name} with {format_size(plan.host_ram_bytes)} of host RAM ("
        + ("given" if not plan.host_ram_assumed else f"an assumption: {plan.host_ram_source}; set `host_ram` to "
           "your machine's") + ").",
        *plan.notes,
    ]
    full = [r for r in plan.fitting if r.method is Method.FULL]
    sound_full = [r for r in full if r.recommendable]
    if not sound_full:
        closest = min((r for r in plan.remedies if r.method is Method.FULL and not any(
            c.harmful for c in r.caveats)), key=lambda r: r.per_gpu_peak_bytes or 0, default=None)
        if closest is not None:
            outcome = Fit.of(closest.fits, closest.gpu_fits).value
            lines.append(f"**Full fine-tuning {outcome}** with fp32 master weights and AdamW: the closest, "
                         f"{closest.name}, {closest.reason}." + (
                             f" {len(full)} full fine-tuning variants fit only by dropping master weights or AdamW."
                             if full else ""))
    if rec is not None:
        lines.append(
            f"**Recommended: {rec.name}.** {rec.reason}; host RAM {format_size(rec.host_ram_bytes or 0)}; up to "
            f"micro-batch {rec.max_batch} at {plan.seq} tokens, or {rec.max_seq} tokens at micro-batch 1; about "
            f"{format_tokens_per_s(rec.tokens_per_s)} tokens/s under the stated assumptions. It "
            + "; it ".join(c.text for c in rec.caveats) + "." + (f" Why this one: {plan.recommendation_note}."
                                                                  if rec is not plan.shown[0] else ""))
    knobs_fit = [k for k in plan.knobs if k.fits and len(k.changes) == 1]
    if knobs_fit:
        lines.append(f"Single changes to {who} that make it fit: " + "; ".join(
            f"{knob_change_text(k)} ({format_signed_size(k.per_gpu_peak_bytes)} per GPU)" for k in knobs_fit) + ".")
    else:
        pairs = [k for k in plan.knobs if k.fits]
        lines.append(f"No single change to {who} makes it fit; "
                     + (f"{len(pairs)} pairs do, e.g. " + "; ".join(
                         f"{knob_change_text(k)} ({format_signed_size(k.per_gpu_peak_bytes)})" for k in pairs[:4])
                        + "." if pairs else "no pair does either."))
    dm = plan.device_map
    if dm is not None:
        lines.append(f"accelerate's `device_map=\"auto\"` splits the layers over {count(len(dm.gpus), 'GPU')} "
                     f"(most loaded: {format_size(dm.per_gpu_peak_bytes)}), but runs them one at a time: "
                     f"{count(len(dm.gpus), 'GPU')} {'train' if len(dm.gpus) > 1 else 'trains'} at one "
                     "GPU's speed.")
    return "\n\n".join(lines)
