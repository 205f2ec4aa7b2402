"""The final report's story, told from the results JSON the earlier notebooks wrote (nothing recomputed).

Every function takes the loaded results (:func:`load_results`) and returns Markdown, table rows or a figure.
Text that comes from the user (model paths, messages, names) is HTML-escaped before it reaches Markdown.
"""

from __future__ import annotations

import html
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from oomlab.core.gpus import load_gpu
from oomlab.core.seed import SEED_DTYPE, SEED_GPU, SEED_MODEL
from oomlab.core.units import format_signed_size, format_size
from oomlab.remedies.checks import VERIFY_HEADERS as CHECK_HEADERS
from oomlab.remedies.checks import Verification, verify_rows
from oomlab.remedies.display import COMPACT_REMEDY_HEADERS, knob_change_text, knob_rows
from oomlab.remedies.display import KNOB_HEADERS as KNOB_HEADERS
from oomlab.remedies.display import remedy_rows as plan_remedy_rows
from oomlab.remedies.knobs import KnobChange
from oomlab.remedies.remedy import Remedy
from oomlab.report.figures import BarRow, plot_budget_bars
from oomlab.report.results import NOTEBOOK_RESULTS


def esc(value: Any) -> str:
    """Escape user-supplied text for Markdown that becomes HTML."""
    return html.escape(str(value), quote=True)


def _gpu_name(r: dict[str, Any]) -> str:
    return load_gpu(r["budget"]["case"]["gpu"]).display_name


def title(r: dict[str, Any]) -> str:
    case = r["budget"]["case"]
    return f"## Can {esc(case['model'])} train on {case['gpus']} × {esc(_gpu_name(r))}?"


def seed_table_rows(r: dict[str, Any]) -> list[list[str]]:
    """The figure-by-figure comparison with the user's message, for the user's case only."""
    return seed_rows(r) if is_seed_case(r) else []


def is_seed_case(r: dict[str, Any]) -> bool:
    c = r["reproduce"]["case"]
    return (c["model"], c["dtype"], c["gpu"]) == (SEED_MODEL, SEED_DTYPE, SEED_GPU)


def answer(r: dict[str, Any]) -> str:
    """The answer in one paragraph: as configured, and otherwise."""
    rep, bud, plan = r["reproduce"]["reproduce"], r["budget"], r["plan"]
    case = bud["case"]
    gpu = esc(_gpu_name(r))
    configured = bud["configured"]
    parts = []
    if rep["raised"]:
        parts.append(
            f"**As configured, no.** Moving a full {esc(rep['dtype'])} replica of {esc(rep['model'])} to one "
            f"{gpu} already fails: `model.to('cuda')` raises `{esc(rep['exception'])}` after "
            f"{rep['moved_fraction']:.0%} of the parameters, because the weights alone need "
            f"{format_size(rep['model_reserved_bytes'])} and a GPU offers {format_size(rep['total_bytes'])}."
        )
    else:
        parts.append(
            f"**Loading works:** a {esc(rep['dtype'])} replica of {esc(rep['model'])} "
            f"({format_size(rep['model_reserved_bytes'])}) fits one {gpu} of {format_size(rep['total_bytes'])}."
        )
    verb = "fits" if configured["fits"] else "does not fit"
    parts.append(
        f"Training as configured ({esc(configured['strategy'])}, {esc(configured['method'])} fine-tuning, "
        f"{esc(configured['precision'])}, {esc(configured['optimizer'])}, micro-batch {configured['batch']} × "
        f"{configured['seq']} tokens) needs {format_size(configured['per_gpu_peak_bytes'])} per GPU and {verb} "
        f"({format_size(abs(configured['headroom_bytes']))} "
        f"{'to spare' if configured['fits'] else 'short'})"
        + (f"; the {case['gpus']} GPUs do not pool their memory." if case["gpus"] > 1 else ".")
    )
    rec = plan.get("recommended")
    if rec:
        parts.append(
            f"**Otherwise, yes:** {esc(rec['name'])} fits at {format_size(rec['per_gpu_peak_bytes'])} per GPU "
            f"({format_size(rec['headroom_bytes'])} headroom, micro-batch up to {rec['max_batch']}, about "
            f"{rec['tokens_per_s']:,.0f} tokens/s estimated) — the recommended fix below."
        )
    elif not configured["fits"]:
        parts.append("**No configuration oomlab knows fits these GPUs** (see the remedies below).")
    return " ".join(parts)


def deciding_configuration(r: dict[str, Any]) -> str:
    """Which knobs decide the result, from the knob table."""
    knobs = _knobs(r)
    singles = [k for k in knobs if len(k.changes) == 1 and k.fits]
    pairs = [k for k in knobs if len(k.changes) == 2 and k.fits]

    def name(k: KnobChange) -> str:
        return esc(knob_change_text(k))

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
    return plan_remedy_rows(Remedy.from_dict(plan["seed"]), [Remedy.from_dict(x) for x in plan["remedies"]], top,
                            compact=True)


SEED_HEADERS = ["figure", "user's message", "reproduced", "same"]


def seed_rows(r: dict[str, Any]) -> list[list[str]]:
    return [[c["figure"], c["seed"], c["reproduced"] or "-", "yes" if c["matches"] else "no"]
            for c in r["reproduce"]["seed_comparison"]]


def reproduction(r: dict[str, Any]) -> str:
    rep = r["reproduce"]["reproduce"]
    if not rep["raised"]:
        return (f"`model.to('cuda')` of {esc(rep['model'])} in {esc(rep['dtype'])} on one "
                f"{esc(rep['gpu'])} succeeded on the {esc(rep['device'])} device: "
                f"{format_size(rep['allocated_bytes'])} allocated, {format_size(rep['free_bytes'])} left.")
    ft = rep["failing_tensor"] or {}
    match = ""
    honesty = r["reproduce"].get("honesty")
    if is_seed_case(r) and honesty:
        same = sum(c["matches"] for c in r["reproduce"]["seed_comparison"])
        counts = honesty["counts"]
        match = (f" {same} of the message's {len(r['reproduce']['seed_comparison'])} figures print as the user's; of "
                 f"those, {counts['input']} are inputs, {counts['fitted']} is fitted and {counts['predicted']} are "
                 "predicted (below).")
    return (f"PyTorch's own `Module._apply` raised `{esc(rep['exception'])}` on the {esc(rep['device'])} device "
            f"while copying `{esc(ft.get('name', '?'))}` ({'×'.join(map(str, ft.get('shape', [])))}, "
            f"{esc(ft.get('dtype', '?'))}).{match}")


def honesty(r: dict[str, Any]) -> str:
    """What the match is worth (the user's case): the figures' roles, the outside range, the layout finding."""
    h = r["reproduce"].get("honesty")
    return h["markdown"] if h else ""


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
    return f"Decoding {esc(label)}:\n\n" + "\n\n".join(esc(p) for p in explained["verdict"].split("\n\n"))


def plot_variants(r: dict[str, Any]) -> Any:
    """The budget notebook's stacked bars, redrawn from its results JSON (the same figure function)."""
    return plot_budget_bars([BarRow.from_dict(v) for v in r["budget"]["variants"]])


def evidence_of_budget(r: dict[str, Any]) -> str:
    agreement = r["budget"]["agreement"]
    small = r["budget"].get("small_scale") or []
    text = (f"The analytic budget was checked against PyTorch's `MemTracker` on {agreement['setups']} full-size "
            f"setups: the worst analytic/traced ratio is {agreement['worst_ratio']:.4f} "
            f"({esc(agreement['worst_setup'])}), within the ±{agreement['tolerance']:.0%} target.")
    if small:
        ratios = [float(row["ratio"]) for row in small]
        text += (f" Tiny models trained for real on CPU agree to within {max(abs(x - 1) for x in ratios):.1%} "
                 f"({len(small)} setups measured for this report).")
    return text


VERIFY_HEADERS = CHECK_HEADERS


def verification_rows(r: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Every small-scale check notebook 03 recorded, as it shows them (:func:`oomlab.remedies.checks.verify_rows`)."""
    return [row for group in r["plan"]["verification"].values() for row in verify_rows(Verification.from_dict(group))]


def recommended_fix(r: dict[str, Any]) -> str:
    plan = r["plan"]
    rec = plan.get("recommended")
    if not rec:
        return "No remedy fits, so there is nothing to launch."
    return (f"**{esc(rec['name'])}** — per-GPU peak {format_size(rec['per_gpu_peak_bytes'])}, host RAM "
            f"{format_size(rec['host_ram_bytes'])}. The files are in `{esc(plan['config_dir'])}` (the training "
            f"script `train.py`, `LAUNCH.md` with every command); run there:\n\n"
            f"<pre>{esc(plan['launch_command'])}</pre>")


def config_files(r: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, content) of the emitted configuration files the recommended remedy uses (read from disk).

    The training script itself is named, not printed (it is the same for every remedy).
    """
    plan = r["plan"]
    rec = plan.get("recommended") or {}
    wanted = set(rec.get("config_files", []))
    out = []
    for name, path in plan["config_files"].items():
        p = Path(path)
        if (p.name in wanted or name in wanted) and p.is_file() and p.suffix != ".py":
            out.append((p.name, p.read_text()))
    return out


def config_block(name: str, text: str) -> str:
    return f"**{esc(name)}**\n\n<pre>{esc(text)}</pre>"


def assumptions(r: dict[str, Any]) -> list[str]:
    rep = r["reproduce"]["reproduce"]
    items = [
        f"Memory held outside PyTorch on each GPU: {format_size(rep['outside_pytorch_bytes'])} — "
        f"{rep['outside_pytorch_source']}.",
        f"The reproduction ran on the {rep['device']} device: "
        + ("a model of PyTorch's CUDA caching allocator (torch 2.0 rules) under the real `Module._apply`."
           if rep["device"] == "simulated" else "a real GPU, capped to the chosen capacity."),
        *r["budget"]["configured"]["notes"],
        "Traced: PyTorch's MemTracker on fake tensors at full size (CPU); measured: real training steps of tiny "
        "models on CPU; computed: everything else (the analytic budget, throughput, host RAM).",
        *r["plan"]["assumptions"],
        "No GPU was used for this report unless the reproduction line above says so.",
    ]
    return [esc(item) for item in items]


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
