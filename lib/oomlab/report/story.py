"""The final report's story, told from the results JSON the earlier notebooks wrote (nothing recomputed).

Every function takes the loaded results (:func:`load_results`) and returns Markdown, table rows or a figure.
Text that comes from the user (model paths, messages, names) reaches Markdown only through
:func:`oomlab.core.markdown.md_text` / :func:`~oomlab.core.markdown.md_code` (Markdown written by the earlier stages
escapes its own user text the same way), and HTML only through :func:`esc`; the report template then cleans every
cell (:mod:`oomlab.report.sanitize`).
"""

from __future__ import annotations

import contextlib
import html
import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from oomlab.budget.display import configured_sentence, training_words
from oomlab.budget.result import MemCategory, outside_figure, outside_note
from oomlab.budget.snapshot import STEP_SNAPSHOT_NAME
from oomlab.core.choices import Method, Strategy
from oomlab.core.gpus import load_gpu
from oomlab.core.markdown import md_code, md_text
from oomlab.core.seed import is_seed_case
from oomlab.core.units import format_signed_size, format_size
from oomlab.core.user_input import shell_words
from oomlab.core.words import agree, count
from oomlab.explanation.snapshot_format import read_snapshot
from oomlab.launch.paths import ROWS, path_of, path_table
from oomlab.launch.prose import launch_section
from oomlab.launch.read import UserLaunch
from oomlab.remedies.display import COMPACT_REMEDY_HEADERS, knob_change_text, knob_rows, otherwise_sentence
from oomlab.remedies.display import remedy_rows as plan_remedy_rows
from oomlab.remedies.knobs import KnobChange
from oomlab.remedies.plan import Outcome
from oomlab.remedies.remedy import Remedy
from oomlab.remedies.verdict import VerdictFacts, render_verdict
from oomlab.remedies.verification import Verification, verify_rows
from oomlab.report.figures import BarRow, RemedyBar, plot_budget_bars, plot_remedies
from oomlab.report.results import NOTEBOOK_RESULTS
from oomlab.report.timeline import plot_memory_timeline, snapshot_series
from oomlab.reproduction import summary
from oomlab.reproduction.honesty import render_honesty_record
from oomlab.reproduction.result import FigureComparison, ReproduceResult


def esc(value: Any) -> str:
    """Escape text for HTML (a ``<pre>`` block, an HTML element inside Markdown)."""
    return html.escape(str(value), quote=True)


def _gpu_name(r: dict[str, Any]) -> str:
    return load_gpu(r["budget"]["case"]["gpu"]).display_name


def model_name(model: str) -> str:
    """How the report names a model: a shipped spec by its name; a ``config.json`` path by the model it describes.

    That is the config's ``_name_or_path`` (what ``save_pretrained`` records) when the file is there and gives one,
    else the folder holding ``config.json`` (``…/my-llama/config.json`` -> ``my-llama``), else the file's stem; the
    full path stays in the parameters table.
    """
    text = str(model)
    if not text.endswith(".json") and "/" not in text and "\\" not in text:
        return text  # a shipped spec's name
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / "config.json"
    with contextlib.suppress(OSError, ValueError):
        recorded = json.loads(path.read_text()).get("_name_or_path")
        if isinstance(recorded, str) and recorded.strip() and len(recorded) <= 100:
            return Path(recorded.strip()).name if recorded.strip().startswith(("/", ".", "~")) else recorded.strip()
    if path.name == "config.json" and path.parent.name:
        return path.parent.name
    return path.stem


def title(r: dict[str, Any]) -> str:
    case = r["budget"]["case"]
    return f"## Can {md_text(model_name(case['model']))} train on {case['gpus']} × {md_text(_gpu_name(r))}?"


def seed_table_rows(r: dict[str, Any]) -> list[list[str]]:
    """The figure-by-figure comparison with the user's message, for the user's case only."""
    return seed_rows(r) if is_seed_story(r) else []


def is_seed_story(r: dict[str, Any]) -> bool:
    c = r["reproduce"]["case"]
    return is_seed_case(c["model"], c["dtype"], c["gpu"])


def answer(r: dict[str, Any]) -> str:
    """The answer in one paragraph: as configured, and otherwise."""
    rep, bud, plan = r["reproduce"]["reproduce"], r["budget"], r["plan"]
    case = bud["case"]
    gpu = md_text(_gpu_name(r))
    configured = bud["configured"]
    parts = []
    path = ROWS[path_of(Strategy(configured["strategy"]), Method(configured["method"]),
                        hf_trainer=(r["reproduce"].get("launch") or {}).get("hf_trainer", True))]
    framework = configured.get("framework", "transformers")  # torchtune / litgpt: their own loading
    loading = path.short if framework == "transformers" else f"{framework}'s own model build and load"
    if rep["raised"] and (not path.full_replica or framework != "transformers"):
        parts.append(
            f"**Loading as configured avoids the failing move:** a full {md_text(rep['dtype'])} replica of "
            f"{md_text(model_name(rep['model']))} would not fit one {gpu} (`model.to('cuda')` raises "
            f"{md_code(rep['exception'])} after {rep['moved_fraction']:.0%} of the parameters: the weights alone need "
            f"{format_size(rep['model_reserved_bytes'])} of {format_size(rep['total_bytes'])}), but the configured "
            f"launch ({md_text(configured['strategy'])}: {md_text(loading)}) does not move one."
        )
    elif rep["raised"]:
        parts.append(
            f"**As configured, no.** Moving a full {md_text(rep['dtype'])} replica of "
            f"{md_text(model_name(rep['model']))} to one {gpu} already fails: `model.to('cuda')` raises "
            f"{md_code(rep['exception'])} after "
            f"{rep['moved_fraction']:.0%} of the parameters, because the weights alone need "
            f"{format_size(rep['model_reserved_bytes'])} and a GPU offers {format_size(rep['total_bytes'])}."
        )
    else:
        parts.append(
            f"**Loading works:** a {md_text(rep['dtype'])} replica of {md_text(model_name(rep['model']))} "
            f"({format_size(rep['model_reserved_bytes'])}) fits one {gpu} of {format_size(rep['total_bytes'])}."
        )
    training = training_words(md_text(configured["strategy"]), md_text(configured["method"]),
                              md_text(configured["precision"]), md_text(configured["optimizer"]), configured["batch"],
                              configured["seq"])
    parts.append(configured_sentence(training, configured["per_gpu_peak_bytes"], configured["headroom_bytes"],
                                     configured["fits"], case["gpus"]))
    load = configured.get("load")
    if load and load["need_bytes"] >= configured["per_gpu_peak_bytes"]:  # loading sets the peak, not the step
        parts.append(f"That peak is loading's, not the step's: {md_text(load['what'].removeprefix('loading: '))}.")
    verdict = plan.get("verdict") or {}
    if configured["fits"] and verdict.get("configured_tight"):
        parts.append(f"That is inside the margin this setup class needs ({md_text(verdict['margin'])}).")
    rec = plan.get("recommended")
    if rec:
        rank = plan.get("recommended_rank", 1)
        parts.append(otherwise_sentence(Remedy.from_dict(rec), rank, plan["recommendation_note"] if rank != 1 else "",
                                        md_text))
    elif plan.get("outcome") == Outcome.HOST_RAM.value or not configured["fits"]:
        parts.append(render_verdict(VerdictFacts.from_dict(plan["verdict"])) if plan.get("verdict") else
                     "**No configuration oomlab knows fits these GPUs** (see the remedies below).")
    if plan.get("host_ram_assumed"):
        parts.append(f"Host RAM is an assumption: {format_size(plan['host_ram_bytes'])} per node "
                     f"({md_text(plan['host_ram_source'])}); set `host_ram` to your machine's.")
    return " ".join(parts)


def deciding_configuration(r: dict[str, Any]) -> str:
    """Which knobs decide the result, from the knob table."""
    knobs = _knobs(r)
    singles = [k for k in knobs if len(k.changes) == 1 and k.fits]
    pairs = [k for k in knobs if len(k.changes) == 2 and k.fits]

    def name(k: KnobChange) -> str:
        return md_text(knob_change_text(k))

    if r["budget"]["configured"]["fits"]:
        return "The configuration as given fits; the table shows how each knob moves the per-GPU peak."
    if singles:
        return ("A single change makes it fit: " + "; ".join(
            f"*{name(k)}* ({format_signed_size(k.per_gpu_peak_bytes)})" for k in singles) + ".")
    if pairs:
        return ("No single knob makes it fit; these pairs do: "
                + "; ".join(f"*{name(k)}* ({format_signed_size(k.per_gpu_peak_bytes)})" for k in pairs) + ".")
    return "Neither one knob nor a pair of knobs makes it fit."


def _knobs(r: dict[str, Any]) -> list[KnobChange]:
    return [KnobChange.from_dict(k) for k in r["plan"]["knobs"]]


def knob_table_rows(r: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The knob table, as notebook 03 shows it (:func:`oomlab.remedies.display.knob_rows`)."""
    return knob_rows(_knobs(r))


REMEDY_HEADERS = COMPACT_REMEDY_HEADERS


def remedy_rows(r: dict[str, Any], top: int = 10) -> list[tuple[Any, ...]]:
    """The ranked remedies as notebook 03 shows them, compact (:func:`oomlab.remedies.display.remedy_rows`)."""
    plan = r["plan"]
    return plan_remedy_rows(Remedy.from_dict(plan["configured"]), [Remedy.from_dict(x) for x in plan["remedies"]], top,
                            compact=True)


def remedy_bars(r: dict[str, Any], top: int = 10) -> list[RemedyBar]:
    """The rows of the ranked table (the user's configuration, then the ``top`` remedies) as bars, the recommended fix
    marked (and added after them when it ranks lower)."""
    plan = r["plan"]
    recommended = (plan.get("recommended") or {}).get("name")
    ranked = [(f"{i} · {x['name']}", x) for i, x in enumerate(plan["remedies"], start=1)
              if x.get("per_gpu_peak_bytes") is not None]
    shown = ranked[:top]
    if recommended and all(x["name"] != recommended for _, x in shown):
        shown += [(label, x) for label, x in ranked[top:] if x["name"] == recommended][:1]
    configured = plan["configured"]
    rows = ([("as configured · " + configured["name"], configured)]
            if configured.get("per_gpu_peak_bytes") is not None else []) + shown
    bars, marked = [], False
    for label, x in rows:
        chosen = not marked and x is not configured and x["name"] == recommended  # the configured row is never the fix
        marked = marked or chosen
        bars.append(RemedyBar(label, int(x["per_gpu_peak_bytes"]),
                              int(x["per_gpu_peak_bytes"]) + int(x["headroom_bytes"]), bool(x["fits"]), chosen))
    return bars


def plot_remedy_bars(r: dict[str, Any]) -> Any:
    """The remedies figure beside the ranked table: per-GPU peak against capacity, the recommended fix marked."""
    return plot_remedies(remedy_bars(r))


SEED_HEADERS = list(summary.SEED_HEADERS)


def seed_rows(r: dict[str, Any]) -> list[list[str]]:
    return summary.seed_rows(FigureComparison(c["figure"], c["seed"], c["reproduced"])
                             for c in r["reproduce"]["seed_comparison"])


def reproduction(r: dict[str, Any]) -> str:
    rep = r["reproduce"]["reproduce"]
    if not rep["raised"]:
        return (f"`model.to('cuda')` of {md_text(model_name(rep['model']))} in {md_text(rep['dtype'])} on one "
                f"{md_text(rep['gpu'])} succeeded on the {md_text(rep['device'])} device: "
                f"{format_size(rep['allocated_bytes'])} allocated, {format_size(rep['free_bytes'])} left.")
    ft = rep["failing_tensor"] or {}
    match = ""
    honesty = r["reproduce"].get("honesty")
    if is_seed_story(r) and honesty:
        same = sum(c["matches"] for c in r["reproduce"]["seed_comparison"])
        counts = honesty["counts"]
        shown = len(r["reproduce"]["seed_comparison"])
        match = (f" {same} of the message's {count(shown, 'figure')} {'prints' if same == 1 else 'print'} as the "
                 f"user's; of those, {counts['input']} {'is an input' if counts['input'] == 1 else 'are inputs'}, "
                 f"{counts['fitted']} {agree(counts['fitted'], 'is')} fitted and {counts['predicted']} "
                 f"{agree(counts['predicted'], 'is')} predicted (below).")
    return (f"PyTorch's own `Module._apply` raised {md_code(rep['exception'])} on the {md_text(rep['device'])} "
            f"device while copying {md_code(ft.get('name', '?'))} ({'×'.join(map(str, ft.get('shape', [])))}, "
            f"{md_text(ft.get('dtype', '?'))}).{match}")


def honesty(r: dict[str, Any], launch: UserLaunch | None = None) -> str:
    """What the match is worth (the user's case: the figures' roles, the outside range, the layout finding), then how
    the weights reach the GPUs under ``launch`` (the run's setup record, read back typed), each rendered here from
    the typed results by the function notebook 01 displays with."""
    h = r["reproduce"].get("honesty")
    parts = [render_honesty_record(h)] if h else []
    account = r["reproduce"].get("launch")  # notebook 01's launch facts: the replica's dtype, the other launches
    if launch is not None and account:
        parts.append(launch_section(launch, ReproduceResult.from_dict(r["reproduce"]["reproduce"]),
                                    account["replica_dtype"], path_table(),
                                    [tuple(row) for row in account["other_launches"]]))
    return "\n\n".join(parts)


def message(r: dict[str, Any]) -> str:
    """The reproduced message, as an escaped code block."""
    text = r["reproduce"]["reproduce"]["message"]
    return f"<pre>{esc(text)}</pre>" if text else ""


def decoded(r: dict[str, Any]) -> str:
    """``oomlab explain``'s verdict on the user's message (or, for another case, the reproduced one)."""
    explained = r["reproduce"].get("explain")
    if not explained:
        return "No out-of-memory message to decode: moving the model to the GPU succeeded."
    label = r["reproduce"].get("explain_label") or "the message"
    # NB: the verdict is plain text (the terminal's): every character of it is shown as it is
    return f"Decoding {md_text(label)}:\n\n" + "\n\n".join(md_text(p) for p in explained["verdict"].split("\n\n"))


def plot_variants(r: dict[str, Any]) -> Any:
    """The budget notebook's stacked bars, redrawn from its results JSON (the same figure function)."""
    return plot_budget_bars([BarRow.from_dict(v) for v in r["budget"]["variants"]])


def accuracy(r: dict[str, Any]) -> str:
    """How far the estimate is from real GPUs for the user's setup class (the published peaks that set the margin),
    not the trace agreement (which checks the arithmetic on fake tensors, not a GPU)."""
    decision = r["plan"].get("decision")
    if not decision:
        return ""
    m = decision["verdict"]["margin"]
    if not m["rows"]:
        return (f"**Accuracy on real GPUs.** No trusted published peak measures a {m['method']} run, so the margin "
                f"kept is the widest of the other classes ({m['fraction']:.0%}).")
    return (f"**Accuracy on real GPUs.** For {m['method']} runs, the largest excess of a trusted published peak "
            f"over oomlab's estimate is {m['underestimate']:.1%} ({md_text(m['worst_row'])}, of "
            f"{count(m['rows'], 'trusted row')} in docs/published-measurements.md); with {m['fragmentation']:.0%} for "
            f"fragmentation, every verdict here keeps a {m['fraction']:.0%} margin, and a fit inside it reads "
            "\"tight\".")


def plot_step_timeline(r: dict[str, Any], run_dir: str | Path = ".") -> Any:
    """The configured step over time, drawn from the memory snapshot the budget notebook wrote into the run's folder
    (``results/step-snapshot.pickle``, read with the restricted reader) against one GPU's capacity; None when the run
    wrote none."""
    path = Path(run_dir) / "results" / STEP_SNAPSHOT_NAME
    if not path.is_file():
        return None
    configured = r["budget"]["configured"]
    outside = int(configured["components"].get(MemCategory.OUTSIDE_PYTORCH.value, 0))
    series = snapshot_series(read_snapshot(path), int(configured["capacity_bytes"]), outside)
    return plot_memory_timeline(series, f"{model_name(configured['model'])}: one training step over time")


def evidence_of_budget(r: dict[str, Any]) -> str:
    agreement = r["budget"]["agreement"]
    small = r["budget"].get("small_scale") or []
    text = (f"{accuracy(r)}\n\nThe arithmetic was checked against PyTorch's `MemTracker` on fake tensors (no GPU) on "
            f"{count(agreement['setups'], 'full-size setup')}: the worst analytic/traced ratio is "
            f"{agreement['worst_ratio']:.4f} "
            f"({md_text(agreement['worst_setup'])}), within the ±{agreement['tolerance']:.0%} target.")
    if small:
        ratios = [row["ratio"] for row in small]
        text += (f" Tiny models trained for real on CPU agree to within {max(abs(x - 1) for x in ratios):.1%} "
                 f"({count(len(small), 'setup')} measured for this report).")
    return text




def verification_rows(r: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Every small-scale check notebook 03 recorded, as it shows them
    (:func:`oomlab.remedies.verification.verify_rows`)."""
    return [row for group in r["plan"]["verification"].values() for row in verify_rows(Verification.from_dict(group))]


def recommended_fix(r: dict[str, Any]) -> str:
    plan = r["plan"]
    rec = plan.get("recommended")
    if not rec and plan.get("outcome") == Outcome.FITS.value:
        return ("It fits as configured, with the margin this setup class needs: nothing to change — launch it as "
                "written.")
    if not rec:
        return "No remedy fits, so there is nothing to launch."
    steps = (plan.get("decision") or {}).get("steps") or []
    rungs = "\n".join(f"- **{md_text(s['rung'])}** — {md_text(s['kind'])}: {md_text(s['cost'])}; modelled speed "
                      f"{s['speed_ratio']:.2f}× the step before it"
                      + (f" ({md_text('; '.join(s['slower_by']))})" if s["slower_by"] else "") for s in steps)
    ladder = ("\n\nThe least disruptive change that fits with the margin, rung by rung (each kept only if the fit "
              f"needs it):\n\n{rungs}\n\n") if steps else " "
    head = (f"**{md_text(rec['name'])}** — per-GPU peak {format_size(rec['per_gpu_peak_bytes'])}, host RAM "
            f"{format_size(rec['host_ram_bytes'])}.{ladder}")
    framework = (r.get("budget") or {}).get("configured", {}).get("framework", "transformers")
    if plan.get("own_launch"):  # the user's own torchtune command with every change (oomlab.launch.check)
        return (head + f"oomlab writes no launch file for {md_text(framework)}; your launch with every change, as "
                f"{md_text(framework)} reads it (keep the margin):\n\n"
                f"<pre>{esc(shell_lines(plan['own_launch'], overrides=True))}</pre>")
    if not plan.get("launch_command") and framework != "transformers":  # torchtune's or litgpt's own launcher
        return (head + f"oomlab writes no launch file for {md_text(framework)} (its `train.py` is a transformers + "
                f"peft script): make the changes above in your own {md_text(framework)} launch -- an upgrade as a "
                "`pip install` of the release named, the rest as that framework's config overrides -- and keep the "
                "margin.")
    if not plan.get("launch_command"):  # pure half, device_map, a framework's chunked loss: no file of oomlab's runs it
        return (head + "oomlab writes no launch file for this remedy (its `train.py` runs one process per GPU with "
                "fp32 trained weights and transformers' own head and loss): make the changes above in your own "
                "launch, and keep the margin.")
    return (head + f"The files are in {md_code(plan['config_dir'])} (the training script `train.py`, `LAUNCH.md` with "
            f"every command); run there:\n\n<pre>{esc(shell_lines(plan['launch_command']))}</pre>")


def shell_lines(command: str, width: int = 48, overrides: bool = False) -> str:
    """A long shell command as continued lines (`` \\`` at each end), broken only before an option (kept with its
    value; with ``overrides``, also before a ``key=value`` / ``~key`` word, torchtune's), so a narrow screen never
    wraps it inside a flag or a path and it still pastes as one command."""
    groups: list[str] = []
    for word in shell_words(command):  # a quoted value is one word: never cut inside it
        if word.startswith("--") or not groups or overrides and ("=" in word or word.startswith("~")):
            groups.append(word)
        else:
            groups[-1] += " " + word
    lines: list[str] = []
    for group in groups:
        if lines and len(lines[-1]) + 1 + len(group) <= width:
            lines[-1] += " " + group
        else:
            lines.append(group if not lines else "    " + group)
    return " \\\n".join(lines)


def config_files(r: dict[str, Any], run_dir: str | Path = ".") -> list[tuple[str, str]]:
    """(name, content) of the emitted configuration files the recommended remedy uses (read from disk, under the
    run's folder ``run_dir``: the results name them relative to it).

    The training script itself is named, not printed (it is the same for every remedy).
    """
    plan = r["plan"]
    rec = plan.get("recommended") or {}
    wanted = set(rec.get("config_files", []))
    out = []
    for name, path in plan["config_files"].items():
        p = Path(run_dir) / path  # an absolute path (an older run's results) stays itself
        if (p.name in wanted or name in wanted) and p.is_file() and p.suffix != ".py":
            out.append((p.name, p.read_text()))
    return out


def config_block(name: str, text: str) -> str:
    """One emitted file for the report: a config as an escaped code block; a Markdown file (``LAUNCH.md``) rendered
    as Markdown (oomlab wrote it, its user text escaped there), its headings moved below the report's own (``####``
    and deeper, out of the contents)."""
    if not name.endswith(".md"):
        return f"<strong><code>{esc(name)}</code></strong>\n\n<pre>{esc(text)}</pre>"
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            out.append(line)
        elif fenced:
            out.append(line)  # a fenced block is shown verbatim: Markdown escapes it
        elif line.startswith("#"):
            out.append("###" + line)
        else:
            out.append(line)
    return f"<strong><code>{esc(name)}</code></strong>\n\n" + "\n".join(out)


def _outside_assumption(rep: dict[str, Any], budget: dict[str, Any]) -> tuple[str, list[str]]:
    """The memory outside PyTorch as one item (loading, and training where the budget counts more), and the budget's
    other notes: the figure is stated once, whichever notebook assumed it."""
    loading = (f"{format_size(rep['outside_pytorch_bytes'])} while the model is moved to one GPU (the reproduction: "
               f"{rep['outside_pytorch_source']})")
    outside, source = budget["components"].get(MemCategory.OUTSIDE_PYTORCH.value, 0), budget["outside_pytorch_source"]
    note = outside_note(outside, source)  # the budget's own note on it, as its notes hold it
    rest = [n for n in budget["notes"] if n != note]
    if note not in budget["notes"]:
        return f"Memory held outside PyTorch on each GPU: {loading}.", rest
    figure, parts = outside_figure(outside, source), source or ""
    if rep["outside_pytorch_source"] in parts:  # the training figure builds on the loading one: name its parts once
        loading = f"{format_size(rep['outside_pytorch_bytes'])} while the model is moved to one GPU (the reproduction)"
    return (f"Memory held outside PyTorch on each GPU: {loading}; {figure} in training"
            + (f": {parts}" if parts else "") + ".", rest)


def assumptions(r: dict[str, Any]) -> list[str]:
    """Every assumption behind the report, each once (the notebooks state some of them twice)."""
    rep = r["reproduce"]["reproduce"]
    outside, notes = _outside_assumption(rep, r["budget"]["configured"])
    items = [
        outside,
        f"The reproduction ran on the {rep['device']} device: "
        + ("a model of PyTorch's CUDA caching allocator (torch 2.0 rules) under the real `Module._apply`."
           if rep["device"] == "simulated" else "a real GPU, capped to the chosen capacity."),
        *notes,
        "Traced: PyTorch's MemTracker on fake tensors at full size (CPU); measured: real training steps of tiny "
        "models on CPU; computed: everything else (the analytic budget, throughput, host RAM).",
        *r["plan"]["assumptions"],
        *setup_assumptions(r["reproduce"].get("launch") or {}),
        "No GPU was used for this report unless the reproduction line above says so.",
    ]
    return [esc(item) for item in dict.fromkeys(items)]


NO_FILES = "no launch files"


def setup_assumptions(launch: dict[str, Any]) -> list[str]:
    """The fields of the user's setup nobody stated, as assumptions: the pipeline's defaults in one sentence, the
    other assumed fields one each."""
    assumed = launch.get("assumptions", [])
    defaults = [a.split(": ", 1)[0] for a in assumed if NO_FILES in a]
    others = [a for a in assumed if NO_FILES not in a]
    out = [f"The user's setup, where no launch file says otherwise: {a}." for a in others]
    if defaults:
        out.insert(0, "The user's setup: no launch files were given, so these are the pipeline's defaults: "
                   + "; ".join(defaults) + ".")
    return out


def versions() -> list[list[str]]:
    rows = []
    for package in ("oomlab", "torch", "transformers", "accelerate", "peft", "bitsandbytes", "deepspeed", "papermill",
                    "nbconvert"):
        try:
            rows.append([package, version(package)])
        except PackageNotFoundError:
            rows.append([package, "not installed"])
    return rows


def parameter_rows(r: dict[str, Any]) -> list[list[str]]:
    rows = []
    for key, stem in NOTEBOOK_RESULTS.items():
        for name, value in r[key]["case"].items():
            rows.append([stem, name, str(value)])
    return rows
