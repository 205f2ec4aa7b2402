"""The interactive explorer: ipywidgets controls → the analytic budget, a stacked bar and the verdict.

Compute apart from display: :func:`explore` turns the controls' :class:`Choices` into an
:class:`Exploration` (the budget, or why the choices are not a valid setup, and the largest micro-batch
that fits); :func:`render_verdict` words it; :class:`BudgetBar` draws it as PNG bytes.  :class:`Explorer`
wires them to widgets, so a test sets ``explorer.controls["gpu"].value = "a100-80gb"`` and reads
``explorer.verdict.value`` and ``explorer.bar.value`` without a browser.

The bar is an ``ipywidgets.Image`` holding PNG bytes drawn by matplotlib's Agg canvas on one reused
``Figure`` (no pyplot, no ``Output`` widget): the bytes reach JupyterLab as one binary buffer per update and
render the same in every front end.
"""

from __future__ import annotations

import html
import io
import re
from dataclasses import dataclass, fields, replace
from typing import Any

from oomlab.budget.analytic import estimate_setup
from oomlab.budget.result import BudgetResult, Fit, MemCategory
from oomlab.core.choices import Attention, Method, Optimizer, Precision, Strategy
from oomlab.core.errors import InvalidValueError, OomlabError, UnknownNameError
from oomlab.core.gpus import known_gpus, load_gpu
from oomlab.core.models import ALL_LINEAR, ModelSpec, known_models, load_model
from oomlab.core.prices import resolve_host_ram
from oomlab.core.search import largest_true
from oomlab.core.setup import MAX_GPUS_PER_NODE, MAX_NODES, TrainingSetup, lora_targets_for, make_setup
from oomlab.core.units import GiB, MiB, format_size
from oomlab.pipeline.params import PARAMETERS
from oomlab.remedies.hardware import HardwareSearch, search_hardware
from oomlab.report import hardware as report_hardware
from oomlab.report.figures import FIT_COLORS, PALETTE
from oomlab.report.tables import html_table

MAX_BATCH_SEARCH = 4096  # the largest micro-batch the search tries; "4096 or more" beyond it

GREEN, AMBER, RED = (FIT_COLORS[fit].text for fit in (Fit.FITS, Fit.GPU_ONLY, Fit.NO))  # the verdict's words


def _default(name: str) -> Any:
    """The pipeline registry's default for ``name`` (one set of defaults for notebooks, CLI and explorer)."""
    return PARAMETERS[name].default


def _default_strategy() -> str:
    """The registry's strategy on the registry's GPU count: its ``ddp`` on one GPU is one process (``single``), as
    the pipeline reads it (:func:`oomlab.launch.user.user_launch`)."""
    strategy = _default("strategy")
    return Strategy.SINGLE.value if strategy == Strategy.DDP.value and _default("gpus") == 1 else strategy


@dataclass(frozen=True)
class Choices:
    """What the explorer's controls hold: names as typed on the CLI, sizes in bytes."""

    model: str = _default("model")  # shipped spec name or path to a config.json
    gpu: str = _default("gpu")
    gpus: int = _default("gpus")  # GPUs per node
    nodes: int = 1
    strategy: str = _default_strategy()  # a replica per GPU, as the seed ran
    method: str = _default("method")
    precision: str = _default("precision")
    optimizer: str = _default("optimizer")
    batch: int = _default("batch")  # micro-batch per GPU
    seq: int = _default("seq")  # sequence length in tokens
    checkpointing: bool = _default("checkpointing")
    attention: str = _default("attention")
    lora_rank: int = _default("lora_rank")  # used by lora / qlora only
    lora_targets: tuple[str, ...] = tuple(_default("lora_targets").split(","))  # used by lora / qlora only
    host_ram_bytes: int = resolve_host_ram(_default("host_ram"), _default("gpu"), _default("gpus")).host_ram_bytes
    outside_mib: float | None = None  # memory outside PyTorch per GPU; None: the shipped figure for the GPU

    def setup(self) -> TrainingSetup:
        """The validated training setup (raises :class:`~oomlab.core.errors.OomlabError` with the reason)."""
        return make_setup(model=self.model, gpu=self.gpu, gpus=self.gpus, nodes=self.nodes, strategy=self.strategy,
                          method=self.method, precision=self.precision, optimizer=self.optimizer,
                          batch=self.batch, seq=self.seq, checkpointing=self.checkpointing,
                          attention=self.attention, lora_rank=self.lora_rank, lora_targets=self.lora_targets)

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
    def colour(self) -> str:
        """Green only when it fits everywhere; amber when the GPUs hold it but the host RAM does not; else red."""
        if self.result is None or not self.result.fits:
            return RED
        return GREEN if self.host_ram_fits else AMBER

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
                       largest_batch=largest_micro_batch(setup, outside_bytes=choices.outside_bytes))


# ------------------------------------------------------------------------------------------ display


def render_verdict(exploration: Exploration) -> list[str]:
    """The verdict in plain sentences: fits or not and why, headroom, host RAM, the largest micro-batch."""
    if exploration.result is None:
        return [f"Not a valid setup: {exploration.error}"]
    r, c = exploration.result, exploration.choices
    s = r.setup
    where = f"{s.world_size} x {s.gpu.display_name} ({format_size(r.capacity_bytes)} each)"
    if r.fits and not exploration.host_ram_fits:
        gpu_line = (f"Fits the GPUs but not the host RAM: {format_size(r.per_gpu_peak_bytes)} per GPU on {where} at "
                    f"the {r.peak_phase.value} peak, headroom {format_size(r.headroom_bytes)}; the node needs more "
                    "host RAM (below).")
    elif r.fits:
        gpu_line = (f"Fits on {where}: {format_size(r.per_gpu_peak_bytes)} per GPU at the {r.peak_phase.value} "
                    f"peak, headroom {format_size(r.headroom_bytes)}.")
    else:
        breaking = r.breaking_component
        gpu_line = (f"Does not fit on {where}: needs {format_size(r.per_gpu_peak_bytes)} per GPU at the "
                    f"{r.peak_phase.value} peak, short by {format_size(-r.headroom_bytes)}; the largest component "
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
    return [gpu_line, host_line, batch_line]


def render_verdict_html(exploration: Exploration) -> str:
    """:func:`render_verdict` as escaped HTML: the GPU and host-RAM lines green when they fit, else red."""
    lines = [html.escape(line) for line in render_verdict(exploration)]
    r = exploration.result
    colours = [RED] if r is None else [exploration.colour, GREEN if exploration.host_ram_fits else RED, ""]
    spans = [f'<span style="color:{colour}">{line}</span>' if colour else line
             for line, colour in zip(lines, colours, strict=True)]
    spans[0] = f"<b>{spans[0]}</b>"
    return f'<div class="oomlab-verdict-text" style="line-height:1.5">{"<br>".join(spans)}</div>'


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
            verdict = "fits" if exploration.fits else ("fits the GPUs, not the host RAM" if r.fits
                                                       else "does not fit")
            self.title.set_text(f"{r.setup.model.name} on {r.setup.gpu.display_name}: "
                                f"{format_size(r.per_gpu_peak_bytes)} per GPU - {verdict}")
            self.title.set_color(exploration.colour)
            shown = [self.rects[c] for c in segments]
            ax.legend(handles=shown, loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=min(5, len(shown)) or 1,
                      fontsize=7, frameon=False, handlelength=1.2, columnspacing=1.0)
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=self.dpi)
        return buffer.getvalue()


# ------------------------------------------------------------------------------------------ widgets


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


def _control_widgets(choices: Choices) -> dict[str, Any]:
    import ipywidgets as w

    style = {"description_width": "120px"}
    layout = w.Layout(width="390px")
    gpu_options = [(f"{load_gpu(g).display_name} ({format_size(load_gpu(g).total_memory_bytes)})", g)
                   for g in known_gpus()]
    gpu = load_gpu(choices.gpu).name  # validates the name; canonical spelling
    spec = load_model(choices.model)
    targets = lora_target_options(spec)  # the chosen model's names: they follow the model control

    def dropdown(label: str, options: Any, value: Any) -> Any:
        return w.Dropdown(description=label, options=options, value=value, style=style, layout=layout)

    def number(label: str, value: int, low: int, high: int) -> Any:
        return w.BoundedIntText(description=label, value=value, min=low, max=high, style=style, layout=layout)

    return {
        # a shipped name from the list, or any config.json path typed in (validated on each change)
        "model": w.Combobox(description="model", options=known_models(), value=choices.model, ensure_option=False,
                            placeholder="name or path/to/config.json", style=style, layout=layout,
                            continuous_update=False),
        "gpu": dropdown("GPU", gpu_options, gpu),
        "gpus": w.IntSlider(description="GPUs per node", value=choices.gpus, min=1, max=MAX_GPUS_PER_NODE,
                            style=style, layout=layout, continuous_update=False),
        "nodes": number("nodes", choices.nodes, 1, MAX_NODES),
        "strategy": dropdown("strategy", [s.value for s in Strategy], Strategy(choices.strategy).value),
        "method": w.ToggleButtons(options=[m.value for m in Method], value=Method(choices.method).value,
                                  style={"button_width": "76px"}),
        "precision": dropdown("precision", [p.value for p in Precision], Precision(choices.precision).value),
        "optimizer": dropdown("optimizer", [o.value for o in Optimizer], Optimizer(choices.optimizer).value),
        "batch": number("micro-batch", choices.batch, 1, 1 << 20),
        "seq": number("sequence length", choices.seq, 1, 1 << 22),  # the model's own limit: see the verdict
        "checkpointing": w.Checkbox(description="activation checkpointing", value=choices.checkpointing,
                                    style=style, layout=layout),
        "attention": dropdown("attention", [a.value for a in Attention], Attention(choices.attention).value),
        "lora_rank": number("LoRA rank", choices.lora_rank, 1, 4096),
        "lora_targets": w.SelectMultiple(description="LoRA targets", options=targets,
                                         value=lora_target_selection(spec, tuple(choices.lora_targets)),
                                         rows=len(targets), style=style, layout=layout),
        "host_ram_bytes": w.BoundedFloatText(description="host RAM (GiB)", value=choices.host_ram_bytes / GiB,
                                             min=1, max=1 << 20, style=style, layout=layout),
        # a negative value means "the shipped figure for the GPU" (a widget holds no None)
        "outside_mib": w.FloatText(description="outside PyTorch (MiB)",
                                   value=-1.0 if choices.outside_mib is None else choices.outside_mib,
                                   style=style, layout=layout),
    }


def _side_label(text: str) -> Any:
    """A label like the other controls' descriptions (right-aligned in 120 px)."""
    import ipywidgets as w

    return w.HTML(f'<div style="text-align:right;padding-right:8px">{html.escape(text)}</div>',
                  layout=w.Layout(width="120px", min_width="120px"))


def hardware_key(choices: Choices) -> tuple[Any, ...]:
    """What the hardware search depends on (not the GPU, its count or the host RAM: it searches those)."""
    return (choices.model, choices.method, choices.seq, choices.attention, choices.lora_rank)


def search_for(choices: Choices) -> HardwareSearch:
    """Which GPUs would train the chosen model with the chosen method: every GPU type x 1, 2, 4, 8 (each row's
    host RAM assumed from its listed instance); raises :class:`OomlabError` with the reason for invalid choices."""
    return search_hardware(choices.model, (choices.method,), seq=choices.seq, attention=choices.attention,
                           lora_rank=choices.lora_rank)


def render_hardware_html(search: HardwareSearch | OomlabError) -> str:
    """The search as HTML: the rankings' winners, then one row per GPU type and count (or why the search could not
    run)."""
    if isinstance(search, OomlabError):
        return f'<div style="color:{RED}">cannot search: {html.escape(str(search))}</div>'
    data = search.to_dict()
    winners = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", report_hardware.winners(data))  # its user text is escaped
    table = html_table(report_hardware.HARDWARE_HEADERS, report_hardware.hardware_rows(data, compact=False))
    return f'<div class="oomlab-hardware"><p>{winners}</p>{table}</div>'


class Explorer:
    """The widgets and their callback: every change of a control re-estimates and redraws.

    ``controls`` maps each :class:`Choices` field to its widget; ``verdict`` (HTML), ``bar`` (Image, PNG
    bytes) and ``ui`` (the whole box, what a notebook displays) are widgets too.  ``exploration`` is the
    latest :class:`Exploration`; ``last_update_s`` how long the latest update took.
    """

    def __init__(self, choices: Choices) -> None:
        import ipywidgets as w

        self.controls = _control_widgets(choices)
        self.chart = BudgetBar()
        self.verdict = w.HTML(layout=w.Layout(width="560px"))
        self.verdict.add_class("oomlab-verdict")
        self.bar = w.Image(format="png", layout=w.Layout(width="560px"))
        self.bar.add_class("oomlab-bar")
        rows = [w.HBox([_side_label("method"), control]) if name == "method" else control
                for name, control in self.controls.items()]  # ToggleButtons' own description wraps above them
        self.search_button = w.Button(description="Which GPUs would it fit?", layout=w.Layout(width="240px"),
                                      tooltip="every GPU type x 1, 2, 4, 8 for this model and method (seconds)")
        self.hardware = w.HTML(layout=w.Layout(width="560px"))
        self.hardware.add_class("oomlab-hardware")
        self.search: HardwareSearch | None = None
        self._searched_key: tuple[Any, ...] | None = None
        self.search_button.on_click(lambda _button: self.run_search())
        self.ui = w.HBox([w.VBox(rows), w.VBox([self.bar, self.verdict, self.search_button, self.hardware])],
                         layout=w.Layout(flex_flow="row wrap"))  # the bar goes below the controls when narrow
        self.ui.add_class("oomlab-explorer")
        self.exploration: Exploration | None = None
        self.last_update_s = 0.0
        self._holding = False  # True while a callback sets controls itself: one update after, not one per control
        self.update()
        for control in self.controls.values():
            control.observe(self._on_change, names="value")

    @property
    def choices(self) -> Choices:
        """The controls' current values."""
        values = {f.name: self.controls[f.name].value for f in fields(Choices)}
        values["host_ram_bytes"] = round(values["host_ram_bytes"] * GiB)
        values["outside_mib"] = None if values["outside_mib"] < 0 else values["outside_mib"]
        values["lora_targets"] = tuple(values["lora_targets"])
        return Choices(**values)

    def set_choices(self, choices: Choices) -> None:
        """Put ``choices`` into the controls (each change re-estimates, as a user's would)."""
        for name, control in self.controls.items():
            value = getattr(choices, name)
            if name == "host_ram_bytes":
                value = value / GiB
            elif name == "outside_mib":
                value = -1.0 if value is None else value
            elif name == "lora_targets":
                if self._follow_model(tuple(value)):
                    self.update()
                continue
            control.value = value

    def _follow_model(self, targets: tuple[str, ...] | None = None) -> bool:
        """Offer the chosen model's own LoRA target names and select ``targets`` (default: the selection) as that
        model reads them (:func:`lora_target_selection`); True when the control changed."""
        control = self.controls["lora_targets"]
        targets = tuple(control.value) if targets is None else targets
        try:
            spec = load_model(self.controls["model"].value)
            options, selection = lora_target_options(spec), lora_target_selection(spec, targets)
        except OomlabError:  # not a model (the verdict says why): the last model's names stay
            options = tuple(control.options)
            selection = tuple(t for t in targets if t in options)
        if (tuple(control.options), tuple(control.value)) == (options, selection):
            return False
        self._holding = True
        try:
            if tuple(control.options) != options:
                control.options, control.rows = options, len(options)
            control.value = selection
        finally:
            self._holding = False
        return True

    @property
    def bar_data(self) -> dict[MemCategory, int]:
        """The bar's segments as drawn: per-GPU bytes by component."""
        return self.exploration.segments if self.exploration else {}

    def _on_change(self, change: dict[str, Any]) -> None:
        if self._holding:
            return
        if change.get("owner") is self.controls["model"]:
            self._follow_model()
        self.update()

    def update(self) -> Exploration:
        """Re-estimate from the controls and redraw the bar and the verdict."""
        import time

        start = time.perf_counter()
        exploration = explore(self.choices)
        full = exploration.choices.method == Method.FULL.value
        self.controls["lora_rank"].disabled = self.controls["lora_targets"].disabled = full
        self.bar.value = self.chart.render(exploration)
        self.verdict.value = render_verdict_html(exploration)
        self.exploration = exploration
        if self._searched_key is not None and self._searched_key != hardware_key(exploration.choices):
            self.hardware.value, self.search, self._searched_key = "", None, None  # stale: press the button again
        self.last_update_s = time.perf_counter() - start
        return exploration

    def run_search(self) -> HardwareSearch | None:
        """The button: search every GPU type and count for the chosen model and method; show the ranking table."""
        choices = self.choices
        self.search_button.disabled = True
        self.hardware.value = "searching every GPU type and count..."
        try:
            self.search = search_for(choices)
            self.hardware.value = render_hardware_html(self.search)
        except OomlabError as err:
            self.search = None
            self.hardware.value = render_hardware_html(err)
        finally:
            self.search_button.disabled = False
        self._searched_key = hardware_key(choices)
        return self.search

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.ui._repr_mimebundle_(**kwargs)


def build_explorer(
    model: str = Choices.model,
    gpu: str = Choices.gpu,
    gpus: int = Choices.gpus,
    strategy: str = Choices.strategy,
    method: str = Choices.method,
    precision: str = Choices.precision,
    optimizer: str = Choices.optimizer,
    batch: int = Choices.batch,
    seq: int = Choices.seq,
    checkpointing: bool = Choices.checkpointing,
    lora_rank: int = Choices.lora_rank,
    host_ram: str | int = _default("host_ram"),
    nodes: int = Choices.nodes,
    attention: str = Choices.attention,
    lora_targets: str | tuple[str, ...] = Choices.lora_targets,
    outside_mib: float | None = Choices.outside_mib,
) -> Explorer:
    """The explorer's widgets, starting from these choices (the notebook's parameters).

    Unknown names raise :class:`~oomlab.core.errors.UnknownNameError` listing the known ones; a valid name in an
    invalid combination (bf16 on a T4, say) is shown as the verdict.  ``host_ram``: ``"192GiB"`` (a unit is
    required) or an integer number of bytes; ``lora_targets``: a tuple or ``"q_proj,v_proj"``; ``outside_mib``:
    None for the shipped figure of the GPU.
    """
    for kind, enum_type, value in (("strategy", Strategy, strategy), ("method", Method, method),
                                   ("precision", Precision, precision), ("optimizer", Optimizer, optimizer),
                                   ("attention", Attention, attention)):
        if value not in {m.value for m in enum_type}:
            raise UnknownNameError(kind, value, [m.value for m in enum_type])
    for name, number in (("gpus", gpus), ("nodes", nodes), ("batch", batch), ("seq", seq),
                         ("lora_rank", lora_rank)):
        if not isinstance(number, int) or isinstance(number, bool) or number < 1:
            raise InvalidValueError(f"invalid {name} {number!r}; must be an integer >= 1")
    if outside_mib is not None and not outside_mib >= 0:
        raise InvalidValueError(f"invalid outside_mib {outside_mib!r}; must be >= 0 MiB (or None for the GPU's "
                                "shipped figure)")
    targets = tuple(t.strip() for t in lora_targets.split(",") if t.strip()) if isinstance(lora_targets, str) \
        else tuple(lora_targets)
    host = resolve_host_ram(host_ram, load_gpu(gpu).name, gpus).host_ram_bytes  # auto: the GPUs' machine's
    spec = load_model(model)  # an unknown name or a missing config.json is refused here, naming it
    if targets:
        lora_targets_for(spec, targets)  # the model's own names (its family's), as make_setup judges them
    choices = Choices(model=model, gpu=gpu, gpus=gpus, nodes=nodes, strategy=strategy, method=method,
                      precision=precision, optimizer=optimizer, batch=batch, seq=seq, checkpointing=checkpointing,
                      attention=attention, lora_rank=lora_rank, lora_targets=targets, host_ram_bytes=host,
                      outside_mib=outside_mib)
    return Explorer(choices)


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
            f"unless given), memory outside PyTorch: {outside}. Run the cell below, then change any control: the "
            "bar, the verdict and the largest micro-batch update at once.")
