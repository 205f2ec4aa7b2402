"""What the explorer shows, apart from its widgets: the controls' :class:`Choices` → an :class:`Exploration` (the
analytic budget, or why the choices are not a valid setup, and the largest micro-batch that fits), its verdict in
words (:func:`render_verdict`), its stacked bar as PNG bytes (:class:`BudgetBar`), the hardware search it runs on
demand and the notebook's intro.  :mod:`oomlab.explorer` wires these to ipywidgets.

The bar is drawn by matplotlib's Agg canvas on one reused ``Figure`` (no pyplot, no ``Output`` widget): the PNG bytes
reach JupyterLab as one binary buffer per update and render the same in every front end.
"""

from __future__ import annotations

import html
import io
import re
from dataclasses import dataclass, replace
from typing import Any

from oomlab.budget.estimator import estimate_setup
from oomlab.budget.result import BudgetResult, Fit, MemCategory
from oomlab.budget.snapshot import simulate_allocator
from oomlab.budget.timeline import step_timeline
from oomlab.core.defaults import DEFAULTS, launch_strategy
from oomlab.core.errors import InvalidValueError, OomlabError
from oomlab.core.gpus import load_gpu
from oomlab.core.models import ALL_LINEAR, ModelSpec, load_model
from oomlab.core.prices import resolve_host_ram
from oomlab.core.search import largest_true
from oomlab.core.setup import TrainingSetup, lora_targets_for, make_setup
from oomlab.core.units import GiB, MiB, format_size
from oomlab.core.versions import pin_text, versions_from
from oomlab.pipeline.params import PARAMETERS
from oomlab.remedies.hardware import HardwareSearch, search_hardware
from oomlab.remedies.hardware_display import HARDWARE_HEADERS
from oomlab.remedies.ladder import Decision, climb
from oomlab.remedies.remedy import Evaluator
from oomlab.report import hardware as report_hardware
from oomlab.report.figures import FIT_COLORS, PALETTE
from oomlab.report.tables import html_table
from oomlab.report.timeline import TimelineSeries, memory_timeline_svg

MAX_BATCH_SEARCH = 4096  # the largest micro-batch the search tries; "4096 or more" beyond it

GREEN, AMBER, RED = (FIT_COLORS[fit].text for fit in (Fit.FITS, Fit.GPU_ONLY, Fit.NO))  # the verdict's words


def registry_default(name: str) -> Any:
    """The pipeline registry's default for ``name`` (its setup parameters' defaults are
    :data:`~oomlab.core.defaults.DEFAULTS`, as every entry point's)."""
    return PARAMETERS[name].default


def default_strategy() -> str:
    """The default launch on the default GPU count (:func:`oomlab.core.defaults.launch_strategy`)."""
    return launch_strategy(None, DEFAULTS.gpus * DEFAULTS.nodes).value


@dataclass(frozen=True)
class Choices:
    """What the explorer's controls hold: names as typed on the CLI, sizes in bytes."""

    model: str = DEFAULTS.model  # shipped spec name or path to a config.json
    gpu: str = DEFAULTS.gpu
    gpus: int = DEFAULTS.gpus  # GPUs per node
    nodes: int = DEFAULTS.nodes
    strategy: str = default_strategy()  # a replica per GPU, as the seed ran
    method: str = DEFAULTS.method.value
    precision: str = DEFAULTS.precision.value
    optimizer: str = DEFAULTS.optimizer.value
    batch: int = DEFAULTS.batch  # micro-batch per GPU
    seq: int = DEFAULTS.seq  # sequence length in tokens
    checkpointing: bool = DEFAULTS.checkpointing
    attention: str = DEFAULTS.attention.value
    lora_rank: int = DEFAULTS.lora_rank  # used by lora / qlora only
    lora_targets: tuple[str, ...] = DEFAULTS.lora_targets  # used by lora / qlora only
    host_ram_bytes: int = resolve_host_ram(registry_default("host_ram"), DEFAULTS.gpu, DEFAULTS.gpus).host_ram_bytes
    outside_mib: float | None = None  # memory outside PyTorch per GPU; None: the shipped figure for the GPU
    trainer: str = DEFAULTS.trainer.value  # the training loop (SFT, DPO, ...), as the pipeline's parameter
    loss: str = DEFAULTS.loss.value  # the loss kernel
    offload_activations: bool = DEFAULTS.offload_activations  # saved activations in host memory
    base_dtype: str = DEFAULTS.base_dtype.value  # LoRA's frozen base as loaded (half, or float32)
    versions: str | None = None  # the releases the run uses, as name==release pins; None: the installed ones

    def setup(self) -> TrainingSetup:
        """The validated training setup (raises :class:`~oomlab.core.errors.OomlabError` with the reason)."""
        if self.versions is not None and "==" not in self.versions:  # pins only: no file is read from the explorer
            raise InvalidValueError(f"invalid versions {self.versions[:120]!r}; expected name==release pins such as "
                                    "'transformers==4.40.0,peft==0.10.0' (empty: the installed releases)")
        return make_setup(model=self.model, gpu=self.gpu, gpus=self.gpus, nodes=self.nodes, strategy=self.strategy,
                          method=self.method, precision=self.precision, optimizer=self.optimizer,
                          batch=self.batch, seq=self.seq, checkpointing=self.checkpointing,
                          attention=self.attention, lora_rank=self.lora_rank, lora_targets=self.lora_targets,
                          trainer=self.trainer, loss=self.loss, offload_activations=self.offload_activations,
                          base_dtype=self.base_dtype, versions=self.versions)

    @property
    def outside_bytes(self) -> int | None:
        return None if self.outside_mib is None else round(self.outside_mib * MiB)


@dataclass(frozen=True)
class Exploration:
    """The analytic budget of one set of choices, or why they are not a valid setup."""

    choices: Choices
    result: BudgetResult | None  # None when the choices are invalid
    error: str | None  # the validation error's message when they are
    largest_batch: int | None  # largest micro-batch that fits per GPU; None if invalid or not even 1 fits
    decision: Decision | None = None  # the ladder on these choices (check's and plan's decision procedure)

    @property
    def host_ram_fits(self) -> bool | None:
        """Does the node's host RAM hold what the setup needs there? None when the setup is invalid."""
        if self.result is None:
            return None
        return self.result.host_ram_bytes <= self.choices.host_ram_bytes

    @property
    def fits(self) -> bool:
        """Fits on every GPU and in host RAM."""
        return self.result is not None and self.result.fits and bool(self.host_ram_fits)

    @property
    def fit(self) -> Fit:
        """Fits everywhere, on the GPUs only (the host RAM is short), or not (also when the setup is invalid)."""
        return Fit.of(self.fits, self.result is not None and self.result.fits)

    @property
    def colour(self) -> str:
        """Green only when it fits everywhere; amber when the GPUs hold it but the host RAM does not; else red."""
        return FIT_COLORS[self.fit].text

    @property
    def segments(self) -> dict[MemCategory, int]:
        """The bar's data: per-GPU bytes by component at the peak, in :class:`MemCategory` order."""
        if self.result is None:
            return {}
        return {c: self.result.components[c] for c in MemCategory if self.result.components.get(c)}


def largest_micro_batch(setup: TrainingSetup, limit: int = MAX_BATCH_SEARCH,
                        outside_bytes: int | None = None) -> int | None:
    """The largest micro-batch (≤ ``limit``) whose analytic per-GPU peak fits; None if 1 does not.

    Memory grows with the micro-batch, so doubling then bisecting needs about 2·log2(limit) estimates.
    """

    def fits(batch: int) -> bool:
        return estimate_setup(replace(setup, batch=batch), outside_bytes).fits

    return largest_true(fits, 1, limit)


def explore(choices: Choices) -> Exploration:
    """The budget of ``choices``; invalid combinations give their error message instead of raising."""
    try:
        setup = choices.setup()
    except OomlabError as err:
        return Exploration(choices=choices, result=None, error=str(err), largest_batch=None)
    return Exploration(choices=choices, result=estimate_setup(setup, choices.outside_bytes), error=None,
                       largest_batch=largest_micro_batch(setup, outside_bytes=choices.outside_bytes),
                       decision=climb(setup, Evaluator(choices.host_ram_bytes, choices.outside_bytes)))


# ------------------------------------------------------------------------------------------ display


def render_verdict(exploration: Exploration) -> list[str]:
    """The verdict in plain sentences: fits or not and why, headroom, host RAM, the largest micro-batch."""
    if exploration.result is None:
        return [f"Not a valid setup: {exploration.error}"]
    r, c = exploration.result, exploration.choices
    s = r.setup
    where = f"{s.world_size} x {s.gpu.display_name} ({format_size(r.capacity_bytes)} each)"
    if r.fits and not exploration.host_ram_fits:
        gpu_line = (f"Fits the GPUs but not the host RAM: {format_size(r.per_gpu_peak_bytes)} per GPU on {where} "
                    f"{r.peak_where}, headroom {format_size(r.headroom_bytes)}; the node needs more "
                    "host RAM (below).")
    elif r.fits:
        gpu_line = (f"Fits on {where}: {format_size(r.per_gpu_peak_bytes)} per GPU {r.peak_where}, "
                    f"headroom {format_size(r.headroom_bytes)}.")
    else:
        breaking = r.breaking_component
        gpu_line = (f"Does not fit on {where}: needs {format_size(r.per_gpu_peak_bytes)} per GPU "
                    f"{r.peak_where}, short by {format_size(-r.headroom_bytes)}; the largest component "
                    f"is {breaking.value} ({format_size(r.components[breaking])}).")
    host_ok = exploration.host_ram_fits
    host_line = (f"Host RAM: needs {format_size(r.host_ram_bytes)} of {format_size(c.host_ram_bytes)} per node"
                 + (" - fits." if host_ok else f" - does not fit, short by "
                    f"{format_size(r.host_ram_bytes - c.host_ram_bytes)}."))
    if exploration.largest_batch is None:
        batch_line = f"Largest micro-batch that fits: none - even micro-batch 1 at sequence length {s.seq} is too big."
    elif exploration.largest_batch >= MAX_BATCH_SEARCH:
        batch_line = f"Largest micro-batch that fits: {MAX_BATCH_SEARCH} or more at sequence length {s.seq}."
    else:
        batch_line = f"Largest micro-batch that fits: {exploration.largest_batch} at sequence length {s.seq}."
    stack = []  # the user's releases where given, and loading's own peak where it has one (torchtune 0.1 QLoRA)
    if s.versions.given:
        stack.append(f"Versions: {s.versions.describe()}.")
    if r.load is not None:
        stack.append(r.load.what[0].upper() + r.load.what[1:] + ".")
    return [gpu_line, host_line, batch_line, *stack, *decision_lines(exploration.decision)]


def decision_lines(decision: Decision | None) -> list[str]:
    """The one decision ``check`` and ``plan`` give for the same run: the verdict with the margin, and the least
    disruptive fix when it needs one."""
    if decision is None:
        return []
    v = decision.verdict
    lines = [f"With the margin this setup class needs ({v.margin.words}): {v.word}."]
    if not v.fits:
        if decision.steps:
            lines.append("Least disruptive fix: " + "; ".join(s.words for s in decision.steps)
                         + (f" (micro-batch {decision.setup.batch} x accumulation {decision.accumulation})"
                            if decision.accumulation > 1 else "") + ".")
        else:
            lines.append("Nothing on the ladder fits with the margin.")
    return lines


def render_verdict_html(exploration: Exploration) -> str:
    """:func:`render_verdict` as escaped HTML: the GPU and host-RAM lines green when they fit, else red."""
    lines = [html.escape(line) for line in render_verdict(exploration)]
    r = exploration.result
    colours = [RED] if r is None else [exploration.colour, GREEN if exploration.host_ram_fits else RED,
                                        *[""] * (len(lines) - 2)]
    spans = [f'<span style="color:{colour}">{line}</span>' if colour else line
             for line, colour in zip(lines, colours, strict=True)]
    spans[0] = f"<b>{spans[0]}</b>"
    return f'<div class="oomlab-verdict-text" style="line-height:1.5">{"<br>".join(spans)}</div>'


def render_timeline_svg(exploration: Exploration) -> str:
    """The step's memory over time for these choices (inline SVG: categories stacked, phases, capacity, the OOM where
    the allocator model gives up); empty when the choices are invalid."""
    r = exploration.result
    if r is None:
        return ""
    timeline = step_timeline(r)
    s = r.setup
    return memory_timeline_svg(TimelineSeries.of_step(timeline, simulate_allocator(r, timeline)),
                               title=f"{s.model.name}, {s.method.value}, {s.strategy.value} on {s.gpus} x "
                                     f"{s.gpu.name}: one step over time")


class BudgetBar:
    """One horizontal stacked bar of per-GPU bytes by component against the GPU's capacity.

    The figure, its bars and its capacity line are made once; :meth:`render` moves them and saves a PNG.
    """

    def __init__(self, width_in: float = 7.0, height_in: float = 2.4, dpi: int = 80) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self.figure = Figure(figsize=(width_in, height_in), dpi=dpi)  # not pyplot: no global state
        FigureCanvasAgg(self.figure)
        self.dpi = dpi
        ax = self.axes = self.figure.add_axes((0.04, 0.42, 0.92, 0.40))
        self.rects = {c: ax.barh([0], [0], left=[0], height=0.6, color=PALETTE[c])[0] for c in MemCategory}
        for category, rect in self.rects.items():
            rect.set_label(category.value)
        # loading's own peak where it needs more than the step (torchtune 0.1's QLoRA init): an outline to its figure
        self.load_rect = ax.barh([0], [0], left=[0], height=0.6, fill=False, hatch="//", edgecolor="#444444",
                                 linewidth=0.8)[0]
        self.load_rect.set_label("loading (init), beyond the step")
        self.capacity_line = ax.axvline(0, color="black", linewidth=1.5)
        self.capacity_label = ax.text(0, 0.42, "", ha="right", va="bottom", fontsize=8)
        ax.set_yticks([])
        ax.set_ylim(-0.5, 0.75)
        ax.set_xlabel("GiB per GPU (analytic budget)", fontsize=8)
        ax.tick_params(axis="x", labelsize=8)
        self.title = ax.set_title("", fontsize=9, loc="left")

    def render(self, exploration: Exploration) -> bytes:
        """PNG bytes of the bar for ``exploration`` (an empty bar and the reason when invalid)."""
        segments = exploration.segments
        left = 0.0
        for category, rect in self.rects.items():
            width = segments.get(category, 0) / GiB
            rect.set_x(left)
            rect.set_width(width)
            left += width
        ax = self.axes
        r = exploration.result
        loading = r is not None and r.loading_peaks
        self.load_rect.set_x(left)
        self.load_rect.set_width((r.per_gpu_peak_bytes / GiB - left) if loading else 0)
        left = r.per_gpu_peak_bytes / GiB if loading else left
        if r is None:
            self.capacity_line.set_visible(False)
            self.capacity_label.set_text("")
            ax.set_xlim(0, 1)
            self.title.set_text("not a valid setup (see the verdict)")
            self.title.set_color(RED)
            legend = ax.get_legend()
            if legend is not None:
                legend.remove()
        else:
            capacity = r.capacity_bytes / GiB
            self.capacity_line.set_visible(True)
            self.capacity_line.set_xdata([capacity, capacity])
            right = 1.05 * max(capacity, left)
            ax.set_xlim(0, right)
            self.capacity_label.set_position((capacity, 0.42))
            if capacity > right / 2:  # the label on the line's left, else on its right
                self.capacity_label.set_text(f"capacity {format_size(r.capacity_bytes)} ")
                self.capacity_label.set_horizontalalignment("right")
            else:
                self.capacity_label.set_text(f" capacity {format_size(r.capacity_bytes)}")
                self.capacity_label.set_horizontalalignment("left")
            verdict = exploration.fit.value
            self.title.set_text(f"{r.setup.model.name} on {r.setup.gpu.display_name}: "
                                f"{format_size(r.per_gpu_peak_bytes)} per GPU - {verdict}")
            self.title.set_color(exploration.colour)
            shown = [self.rects[c] for c in segments] + ([self.load_rect] if loading else [])
            ax.legend(handles=shown, loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=min(5, len(shown)) or 1,
                      fontsize=7, frameon=False, handlelength=1.2, columnspacing=1.0)
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=self.dpi)
        return buffer.getvalue()




def lora_target_options(spec: ModelSpec) -> tuple[str, ...]:
    """What the LoRA-targets control offers for ``spec``'s model: its family's nn.Linear names and ``all-linear``."""
    return (*spec.lora_target_names, ALL_LINEAR)


def lora_target_selection(spec: ModelSpec, targets: tuple[str, ...]) -> tuple[str, ...]:
    """The control's selection for ``targets`` in ``spec``'s model: the names as given where the model has them,
    else what :func:`~oomlab.core.setup.lora_targets_for` makes of them (LLaMA's default names: the family's
    attention projections), else -- names of another family's, left from the model before -- those projections."""
    if set(targets) <= set(lora_target_options(spec)):
        return tuple(targets)
    try:
        return lora_targets_for(spec, targets)
    except OomlabError:
        return spec.attention_projections



def hardware_key(choices: Choices) -> tuple[Any, ...]:
    """What the hardware search depends on (not the GPU, its count or the host RAM: it searches those)."""
    return (choices.model, choices.method, choices.seq, choices.attention, choices.lora_rank)


def search_for(choices: Choices) -> HardwareSearch:
    """Which GPUs would train the chosen model with the chosen method: every GPU type x 1, 2, 4, 8 (each row's
    host RAM assumed from its listed instance); raises :class:`OomlabError` with the reason for invalid choices.
    NB: the search's own question (:func:`~oomlab.remedies.hardware.search_hardware`: supervised fine-tuning at the
    installed releases, the default loss and LoRA targets), as ``plan --any-gpu`` asks it; its table says so."""
    return search_hardware(choices.model, (choices.method,), seq=choices.seq, attention=choices.attention,
                           lora_rank=choices.lora_rank)


def render_hardware_html(search: HardwareSearch | OomlabError) -> str:
    """The search as HTML: the rankings' winners, then one row per GPU type and count (or why the search could not
    run)."""
    if isinstance(search, OomlabError):
        return f'<div style="color:{RED}">cannot search: {html.escape(str(search))}</div>'
    caveat = ('<div style="font-size:smaller">The search budgets supervised fine-tuning at the installed library '
              "releases, with the default loss and LoRA targets, for the model, method, sequence length, attention and "
              "LoRA rank above (as <code>plan --any-gpu</code>); the verdict above is the run the controls "
              "describe.</div>")
    data = search.to_dict()
    winners = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", report_hardware.winners(data))  # its user text is escaped
    table = html_table(HARDWARE_HEADERS, report_hardware.hardware_rows(data, compact=False))
    return f'<div class="oomlab-hardware"><p>{winners}</p>{table}{caveat}</div>'



def explorer_intro(choices: Choices) -> str:
    """The notebook's intro for where the explorer starts, in Markdown: the case, not a typed-in one."""
    spec, gpu = load_model(choices.model), load_gpu(choices.gpu)
    method = {"full": "full fine-tuning", "lora": f"LoRA r{choices.lora_rank}",
              "qlora": f"QLoRA r{choices.lora_rank}"}[choices.method]
    nodes = f" x {choices.nodes} nodes" if choices.nodes > 1 else ""
    outside = ("the shipped figure for the GPU" if choices.outside_mib is None
               else format_size(round(choices.outside_mib * MiB)))
    return (f"The explorer starts from the case's parameters: {spec.name}, {method}, strategy `{choices.strategy}`, "
            f"{choices.precision}, {choices.optimizer}, micro-batch {choices.batch} x {choices.seq} tokens"
            f"{', activation checkpointing' if choices.checkpointing else ''}, on {choices.gpus} x "
            f"{gpu.display_name}{nodes}, host RAM {format_size(choices.host_ram_bytes)} per node (an assumption "
            f"unless given), memory outside PyTorch: {outside}"
            + (f", trainer {choices.trainer}" if choices.trainer != DEFAULTS.trainer.value else "")
            + (f", loss {choices.loss}" if choices.loss != DEFAULTS.loss.value else "")
            + (", activations offloaded" if choices.offload_activations else "")
            + (f", LoRA base in {choices.base_dtype}" if choices.base_dtype != DEFAULTS.base_dtype.value else "")
            + (f", versions {_pins(choices.versions)}" if choices.versions else ", the installed library versions")
            + ". Run the cell below, then change any control: the "
            "bar, the verdict and the largest micro-batch update at once.")


def _pins(text: str) -> str:
    """The pins as parsed (known package names and release numbers only: nothing the user typed is echoed)."""
    try:
        given = versions_from(text).given
    except OomlabError:
        return "(not valid: see the verdict)"
    return ", ".join(pin_text(name, release) for name, release in given)
