"""``oomlab check`` shown: a plain-text answer, and a Markdown reply a maintainer can paste under the user's GitHub
issue (verdict, the launch path the traceback proves, the per-GPU table, the fix and its launch, the assumptions)."""

from __future__ import annotations

from collections.abc import Callable

from oomlab.core.choices import plain
from oomlab.core.markdown import markdown_table, md_code, md_code_block, md_text
from oomlab.core.units import format_size
from oomlab.launch.check import CheckResult, FailsAt
from oomlab.launch.paths import ROWS
from oomlab.launch.prose import launch_name, traceback_proves
from oomlab.launch.user import setup_rows
from oomlab.remedies.ladder import ALLOCATOR_ADVICE
from oomlab.remedies.throughput import speed_words

MAX_UNMODELLED_SHOWN = 8


def verdict(result: CheckResult, text: Callable[[str], str] = str) -> str:
    """The answer in one sentence (``text`` writes the user's model name: :func:`md_text` for Markdown)."""
    s = result.launch.setup
    cap = format_size(s.gpu.total_memory_bytes)
    where = (f"{text(s.model.name)} as launched ({launch_name(s)}, micro-batch {s.batch}, {s.seq} tokens) on "
             f"{s.gpus} × {s.gpu.display_name}")
    if result.fails_at is FailsAt.LOAD:
        return (f"{where} fails while loading, before the first step: {ROWS[result.load.path].short} needs "
                f"{format_size(result.load.per_gpu_bytes or 0)} per GPU of {cap}.")
    if result.fails_at is FailsAt.LOAD_HOST_RAM:
        return (f"{where} fails while loading, before the first step, on the host: its processes need "
                f"{format_size(result.load.host_per_node_bytes)} of host RAM per node, "
                f"{format_size(result.host_ram_bytes)} there ({result.load.host.detail}).")
    if result.fails_at is FailsAt.STEP and result.budget.loading_peaks:  # torchtune 0.1's QLoRA init
        return (f"{where} fails while loading the model, before the first step: "
                f"{format_size(result.budget.per_gpu_peak_bytes)} per GPU of {cap}.")
    if result.fails_at is FailsAt.STEP:
        return (f"{where} loads, then fails in the training step's {plain(result.phase)} phase: "
                f"{format_size(result.budget.per_gpu_peak_bytes)} per GPU of {cap}.")
    if result.fails_at is FailsAt.HOST_RAM:
        return (f"{where} fits the GPUs ({format_size(result.budget.per_gpu_peak_bytes)} per GPU of {cap}) but not "
                f"the host: it needs {format_size(result.budget.host_ram_bytes)} of host RAM, "
                f"{format_size(result.host_ram_bytes)} there.")
    v = result.decision.verdict
    margin = v.margin.bytes_for(v.evaluation.per_gpu_peak_bytes)
    at = "while loading the model" if result.budget.loading_peaks else "at the step's peak"
    if v.tight:
        return (f"{where} is tight: {format_size(result.budget.per_gpu_peak_bytes)} per GPU of {cap} {at}, "
                f"inside the {format_size(margin)} margin this setup class needs ({v.margin.words}).")
    return (f"{where} fits: {format_size(result.budget.per_gpu_peak_bytes)} per GPU of {cap} {at}, "
            f"with the {format_size(margin)} margin ({v.margin.words}).")


def traceback_sentence(result: CheckResult) -> str:
    """What a ``Module._apply → convert → t.to`` traceback would prove, and whether this launch is one of those (or
    cannot fail there): ``check`` reads no traceback, so nothing is said to have run."""
    return traceback_proves(result.launch, "A traceback ending in `Module._apply` → `convert` → `t.to` with most of "
                            "a replica allocated", "its launcher", hypothetical=True)


def per_gpu_rows(result: CheckResult) -> list[tuple[str, str]]:
    rows = []
    if result.load.per_gpu_bytes is not None:
        rows.append((f"load ({result.load.path.value})", format_size(result.load.per_gpu_bytes)))
    b = result.budget
    if b.load is not None:  # loading's own peak (torchtune 0.1's QLoRA init: oomlab.budget.nf4_init)
        rows.append(("load (torchtune's QLoRA init)", format_size(b.load.need_bytes)))
    rows.append((f"training step peak ({b.peak_phase.value})", format_size(sum(b.components.values()))))
    rows += [(f"  {k.value}", format_size(v)) for k, v in b.components.items() if v]
    rows.append(("capacity", format_size(b.capacity_bytes)))
    return rows


def _assumptions(result: CheckResult) -> list[str]:
    out = list(result.launch.assumptions)
    n = len(result.launch.unmodelled)
    if n:
        out.append(f"{n} keys/flags read but not modelled (listed with --json), those that could "
                   "change memory most first: "
                   + "; ".join(str(u) for u in result.launch.unmodelled[:3]))
    out += [note for note in result.budget.notes if note.startswith(("outside PyTorch", "allocator overhead"))]
    out.append(result.host_ram.text)
    return out


def render_check(result: CheckResult) -> str:
    """The plain-text answer."""
    lines = [verdict(result), "", "setup (origin of each field):"]
    rows = setup_rows(result.launch)
    wide = max((len(name) for name, _, _ in rows), default=0)  # the longest field name sets the column
    lines += [f"  {name:<{wide}} {value:<28} {origin}" for name, value, origin in rows]
    if result.message is not None:
        lines += ["", f"the message: {result.message.sentence}"]
    host = f"; host RAM {result.load.host.detail}" if result.load.host is not None else ""
    lines += ["", f"load: {result.load.detail}{host}", "", "per GPU:"]
    lines += [f"  {label:<36} {value:>12}" for label, value in per_gpu_rows(result)]
    fix = result.smallest_fix
    if result.decision.verdict.tight or result.decision.tight:
        lines += ["", f"inside the margin: {ALLOCATOR_ADVICE}"]
    if not result.decision.verdict.fits:
        lines.append("")
        if fix is None:
            lines.append("nothing on the ladder fits with the margin (see python -m oomlab plan)")
        else:
            lines.append("least disruptive fix: " + ", ".join(f"{k} -> {v}" for k, v in fix.changes)
                         + f" ({format_size(fix.per_gpu_peak_bytes)} per GPU, {result.decision.fixed.word})")
            lines += [f"  {h}" for h in fix.how]
            befores = (result.decision.configured, *(s.setup for s in result.decision.steps[:-1]))
            lines += [f"  {step.rung.value}: {speed_words(before, step.setup)}" for before, step in
                      zip(befores, result.decision.steps, strict=True)]
            lines.append(f"  launch: {fix.launch}")
            for changed in fix.files:  # the user's own files with the fix: + changed or added, - removed
                lines += ["", f"  {changed.path} ({changed.kind.value}, {changed.changed_lines} line(s) changed):"]
                lines += [f"    {line}" for line in changed.hunks()]
    if result.launch.unmodelled:
        lines += ["", f"not modelled ({len(result.launch.unmodelled)}, those that could change memory most "
                  "first):"]
        lines += [f"  {u}" for u in result.launch.unmodelled[:MAX_UNMODELLED_SHOWN]]
        if len(result.launch.unmodelled) > MAX_UNMODELLED_SHOWN:
            lines.append(f"  ... and {len(result.launch.unmodelled) - MAX_UNMODELLED_SHOWN} more (--json)")
    return "\n".join(lines)


def render_markdown(result: CheckResult) -> str:
    """A short GitHub reply: verdict, launch path, per-GPU table, fix with its launch command, assumptions."""
    out = [f"**Verdict.** {verdict(result, md_text)}", ""]
    if result.message is not None:
        out += [f"**The message.** {md_text(result.message.sentence)}", ""]
    out += [f"**Launch path.** {traceback_sentence(result)}", "",
           markdown_table(("per GPU", ""), [(label.strip(), value) for label, value in per_gpu_rows(result)],
                          right=(1,))]
    fix = result.smallest_fix
    out.append("")
    if result.decision.verdict.fits:
        out.append("**Fix.** None needed.")
    elif fix is None:
        out.append("**Fix.** Nothing on the ladder fits with the margin; `python -m oomlab plan` ranks every remedy.")
    else:
        out.append("**Fix.** " + "; ".join(md_text(h) for h in fix.how)
                   + f" — {format_size(fix.per_gpu_peak_bytes)} per GPU at the step's peak, and it loads.")
        out += ["", md_code_block(fix.launch)]
        for changed in fix.files:
            out += ["", f"{md_code(changed.path)}, changed lines marked `+` (was `-`):", "",
                    md_code_block("\n".join(changed.hunks()), "diff")]
    out += ["", "**Assumptions.**"] + [f"- {md_text(a)}" for a in _assumptions(result)]
    return "\n".join(out)
