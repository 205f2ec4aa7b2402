"""The report's "Which GPUs would it fit?" section, told from the hardware search's results JSON
(:meth:`oomlab.remedies.hardware.HardwareSearch.to_dict`, written by notebook 03): one table of what would have fit,
the three rankings' winners in a sentence, and the pareto figure.  Nothing is recomputed."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from oomlab.core.units import format_size
from oomlab.report.figures import CostPoint, plot_pareto

HARDWARE_HEADERS = ["hardware", "best remedy that fits", "peak / GPU", "headroom", "max micro-batch", "tokens/s",
                    "$ / M tokens", "ranking"]


def _marks(data: Mapping[str, Any], label: str) -> str:
    marks = [name for key, name in (("cheapest", "cheapest"), ("fastest", "fastest"), ("fewest_gpus", "fewest GPUs"))
             if data.get(key) == label]
    if label in data.get("pareto", ()):
        marks.append("pareto")
    return ", ".join(marks)


def _cost(o: Mapping[str, Any]) -> str:
    cost = o.get("usd_per_million_tokens")
    return "no list price" if cost is None else f"{cost:.3f}"


def option_row(data: Mapping[str, Any], o: Mapping[str, Any]) -> tuple[Any, ...]:
    """One row of the table: a fitting option's figures, or why nothing fits."""
    if not o["fits"]:
        return (o["label"], o["reason"], "-", "-", "-", "-", "-", "")
    return (o["label"], o["remedy"]["name"], format_size(o["per_gpu_peak_bytes"]), format_size(o["headroom_bytes"]),
            o["max_batch"] or "-", f"{o['tokens_per_s']:,.0f}", _cost(o), _marks(data, o["label"]))


def hardware_rows(data: Mapping[str, Any], compact: bool = True) -> list[tuple[Any, ...]]:
    """The table's rows.  ``compact``: per GPU type, the fewest of it that fit (or its largest count, saying why
    nothing fits), then every ranking's winner and pareto row not already shown; else every searched row."""
    options = data["options"]
    if not compact:
        return [option_row(data, o) for o in options]
    chosen: list[Mapping[str, Any]] = []
    for gpu in dict.fromkeys(o["gpu"] for o in options):
        mine = [o for o in options if o["gpu"] == gpu]
        fitting = [o for o in mine if o["fits"]]
        chosen.append(min(fitting, key=lambda o: o["world_size"]) if fitting
                      else max(mine, key=lambda o: o["world_size"]))
    marked = {data.get("cheapest"), data.get("fastest"), data.get("fewest_gpus"), *data.get("pareto", ())}
    shown = {o["label"] for o in chosen}
    chosen += [o for o in options if o["label"] in marked and o["label"] not in shown]
    return [option_row(data, o) for o in chosen]


def _named(data: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    label = data.get(key)
    return next((o for o in data["options"] if o["label"] == label), None)


def winners(data: Mapping[str, Any]) -> str:
    """The three rankings' winners and the search time, as Markdown (user text escaped)."""
    methods = "/".join(data["methods"])
    fitting = sum(1 for o in data["options"] if o["fits"])
    parts = []
    for key, title in (("cheapest", "cheapest per token"), ("fastest", "fastest"), ("fewest_gpus", "fewest GPUs")):
        o = _named(data, key)
        if o is None:
            parts.append(f"**{title}**: nothing fits")
            continue
        cost = o.get("usd_per_million_tokens")
        price = "" if cost is None else f", {cost:.3f} USD per million tokens"  # no "$": Markdown math
        parts.append(f"**{title}**: {html.escape(o['label'])} with {html.escape(o['remedy']['name'])} "
                     f"({o['tokens_per_s']:,.0f} tokens/s{price})")
    return (f"Every GPU type oomlab knows × {', '.join(str(n) for n in _counts(data))} GPUs, the plan's best "
            f"{html.escape(methods)} remedy on each: {fitting} of {len(data['options'])} fit, searched in "
            f"{data['seconds']:.2f} s. " + "; ".join(parts) + ". Prices: " + html.escape(data["prices_source"])
            + ".")


def _counts(data: Mapping[str, Any]) -> list[int]:
    return sorted({o["gpus"] for o in data["options"] if o["nodes"] == 1})


def cost_points(data: Mapping[str, Any]) -> list[CostPoint]:
    """The priced rows that fit, as points of the pareto figure."""
    front = set(data.get("pareto", ()))
    return [CostPoint(o["label"], o["usd_per_million_tokens"], o["tokens_per_s"], o["label"] in front)
            for o in data["options"] if o["fits"] and o.get("usd_per_million_tokens") is not None]


def plot_hardware_pareto(data: Mapping[str, Any]) -> Any:
    """The pareto figure of cost per token against tokens/s, from the search's results."""
    return plot_pareto(cost_points(data), title=f"Which GPUs would train {data['model']}: cost against speed")
