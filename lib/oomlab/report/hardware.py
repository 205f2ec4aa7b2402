"""The report's "Which GPUs would it fit?" section, told from the hardware search's results JSON
(:meth:`oomlab.remedies.hardware.HardwareSearch.to_dict`, written by notebook 03): one table of what would have fit,
the three rankings' winners in a sentence, and the pareto figure.  The search is rebuilt with
:meth:`~oomlab.remedies.hardware.HardwareSearch.from_dict` and shown by :mod:`oomlab.remedies.hardware_display`'s
rows and sentence, the CLI's; nothing is recomputed but the rankings over the stored rows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from oomlab.core.markdown import md_text
from oomlab.remedies import hardware_display
from oomlab.remedies.hardware import HardwareSearch
from oomlab.report.figures import CostPoint, plot_pareto


def search_of(data: Mapping[str, Any] | HardwareSearch) -> HardwareSearch:
    """The search, from its results JSON (or as given)."""
    return data if isinstance(data, HardwareSearch) else HardwareSearch.from_dict(dict(data))


def hardware_rows(data: Mapping[str, Any] | HardwareSearch, compact: bool = True) -> list[tuple[Any, ...]]:
    """The table's rows (:func:`oomlab.remedies.hardware_display.hardware_rows`)."""
    return hardware_display.hardware_rows(search_of(data), compact)


def winners(data: Mapping[str, Any] | HardwareSearch) -> str:
    """The three rankings' winners and the search time, as Markdown (:func:`~oomlab.remedies.hardware_display.winners`:
    user text escaped)."""
    return hardware_display.winners(search_of(data))


def cost_points(data: Mapping[str, Any] | HardwareSearch) -> list[CostPoint]:
    """The priced rows that fit, as points of the pareto figure."""
    search = search_of(data)
    front = {o.label for o in search.pareto}
    return [CostPoint(o.label, o.usd_per_million_tokens, o.tokens_per_s, o.label in front) for o in search.priced]


def plot_hardware_pareto(data: Mapping[str, Any] | HardwareSearch) -> Any:
    """The pareto figure of cost per token against tokens/s, from the search's results."""
    search = search_of(data)
    return plot_pareto(cost_points(search), title=f"Which GPUs would train {search.model}: cost against speed")


def scope(r: Mapping[str, Any]) -> str:
    """What the hardware search ranks, said where the user's run is not a transformers one (empty otherwise): the
    search's candidates are oomlab's own transformers + peft launches, not the user's framework's."""
    framework = (r.get("budget") or {}).get("configured", {}).get("framework", "transformers")
    if framework == "transformers":
        return ""
    return (f"NB: this search ranks oomlab's own launches (transformers + peft, the files it writes), not "
            f"{md_text(framework)}'s: for your {md_text(framework)} run, the recommended fix above is the answer.")
