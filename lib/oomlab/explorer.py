"""The interactive explorer: ipywidgets controls → the analytic budget, a stacked bar, the verdict and the step's
memory over time (inline SVG, :func:`~oomlab.exploration.render_timeline_svg`).

What it shows is computed in :mod:`oomlab.exploration` (:func:`~oomlab.exploration.explore`, the verdict's words, the
bar's PNG bytes); :class:`Explorer` wires that to widgets, so a test sets ``explorer.controls["gpu"].value =
"a100-80gb"`` and reads ``explorer.verdict.value`` and ``explorer.bar.value`` without a browser.
"""

from __future__ import annotations

import html
from dataclasses import fields
from typing import Any

from oomlab.budget.result import MemCategory
from oomlab.core.choices import Attention, BaseDtype, Loss, Method, Optimizer, Precision, Strategy, Trainer
from oomlab.core.errors import InvalidValueError, OomlabError, UnknownNameError
from oomlab.core.gpus import known_gpus, load_gpu
from oomlab.core.models import known_models, load_model
from oomlab.core.prices import resolve_host_ram
from oomlab.core.setup import MAX_GPUS_PER_NODE, MAX_NODES, lora_targets_for
from oomlab.core.units import GiB, format_size
from oomlab.core.versions import parse_versions
from oomlab.exploration import (
    AMBER,
    GREEN,
    MAX_BATCH_SEARCH,
    RED,
    BudgetBar,
    Choices,
    Exploration,
    explore,
    explorer_intro,
    hardware_key,
    largest_micro_batch,
    lora_target_options,
    lora_target_selection,
    registry_default,
    render_hardware_html,
    render_timeline_svg,
    render_verdict,
    render_verdict_html,
    search_for,
)
from oomlab.remedies.hardware import HardwareSearch

__all__ = ["Explorer", "build_explorer", "explorer_intro", "explore", "Choices", "Exploration", "render_verdict",
           "largest_micro_batch", "MAX_BATCH_SEARCH", "GREEN", "AMBER", "RED", "BudgetBar", "render_verdict_html",
           "render_timeline_svg"]


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
        "trainer": dropdown("trainer", [t.value for t in Trainer], Trainer(choices.trainer).value),
        "loss": dropdown("loss", [x.value for x in Loss], Loss(choices.loss).value),
        "offload_activations": w.Checkbox(description="activations offloaded to the host",
                                          value=choices.offload_activations, style=style, layout=layout),
        "base_dtype": dropdown("LoRA base dtype", [b.value for b in BaseDtype], BaseDtype(choices.base_dtype).value),
        # name==release pins, as --versions takes them; empty: the installed releases (the verdict says which)
        "versions": w.Text(description="versions", value=choices.versions or "",
                           placeholder="e.g. transformers==4.40.0", style=style, layout=layout,
                           continuous_update=False),
    }


def _side_label(text: str) -> Any:
    """A label like the other controls' descriptions (right-aligned in 120 px)."""
    import ipywidgets as w

    return w.HTML(f'<div style="text-align:right;padding-right:8px">{html.escape(text)}</div>',
                  layout=w.Layout(width="120px", min_width="120px"))



class Explorer:
    """The widgets and their callback: every change of a control re-estimates and redraws.

    ``controls`` maps each :class:`Choices` field to its widget; ``verdict`` (HTML), ``bar`` (Image, PNG
    bytes), ``timeline`` (HTML, the step's memory over time as inline SVG) and ``ui`` (the whole box, what a notebook
    displays) are widgets too.  ``exploration`` is the latest :class:`Exploration`; ``last_update_s`` how long the
    latest update took.
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
        self.timeline = w.HTML(layout=w.Layout(width="760px"))  # the step over time (inline SVG)
        self.timeline.add_class("oomlab-timeline")
        self.ui = w.HBox([w.VBox(rows), w.VBox([self.bar, self.verdict, self.timeline, self.search_button,
                                                self.hardware])],
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
        values["versions"] = values["versions"].strip() or None  # an empty field: the installed releases
        return Choices(**values)

    def set_choices(self, choices: Choices) -> None:
        """Put ``choices`` into the controls (each change re-estimates, as a user's would)."""
        for name, control in self.controls.items():
            value = getattr(choices, name)
            if name == "host_ram_bytes":
                value = value / GiB
            elif name == "outside_mib":
                value = -1.0 if value is None else value
            elif name == "versions":
                value = value or ""
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
        self.timeline.value = render_timeline_svg(exploration)
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
    host_ram: str | int = registry_default("host_ram"),
    nodes: int = Choices.nodes,
    attention: str = Choices.attention,
    lora_targets: str | tuple[str, ...] = Choices.lora_targets,
    outside_mib: float | None = Choices.outside_mib,
    trainer: str = Choices.trainer,
    loss: str = Choices.loss,
    offload_activations: bool = Choices.offload_activations,
    base_dtype: str = Choices.base_dtype,
    versions: str | None = None,
) -> Explorer:
    """The explorer's widgets, starting from these choices (the notebook's parameters).

    Unknown names raise :class:`~oomlab.core.errors.UnknownNameError` listing the known ones; a valid name in an
    invalid combination (bf16 on a T4, say) is shown as the verdict.  ``host_ram``: ``"192GiB"`` (a unit is
    required) or an integer number of bytes; ``lora_targets``: a tuple or ``"q_proj,v_proj"``; ``outside_mib``:
    None for the shipped figure of the GPU; ``versions``: ``name==release`` pins (None: the installed releases).
    """
    for kind, enum_type, value in (("strategy", Strategy, strategy), ("method", Method, method),
                                   ("precision", Precision, precision), ("optimizer", Optimizer, optimizer),
                                   ("attention", Attention, attention), ("trainer", Trainer, trainer),
                                   ("loss", Loss, loss), ("base dtype", BaseDtype, base_dtype)):
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
                      outside_mib=outside_mib, trainer=trainer, loss=loss,
                      offload_activations=bool(offload_activations), base_dtype=base_dtype,
                      versions=_pins_text(versions))
    return Explorer(choices)


def _pins_text(versions: str | None) -> str | None:
    """The versions control's text: the pins as given (checked now, so a bad pin is refused before any widget is
    built), or None for the installed releases.  A pip freeze file is for the CLI and the pipeline (a path)."""
    if versions is None or not str(versions).strip():
        return None
    if not isinstance(versions, str) or "==" not in versions:
        raise InvalidValueError(f"invalid versions {versions!r} for the explorer; expected name==release pins such "
                                "as 'transformers==4.40.0,peft==0.10.0' (or None: the installed releases)")
    parse_versions(versions)
    return versions.strip()


