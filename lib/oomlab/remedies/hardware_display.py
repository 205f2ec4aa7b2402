"""The hardware search for readers: its table rows, the rankings' winners and the CLI text, each written once from a
:class:`~oomlab.remedies.hardware.HardwareSearch` (the report rebuilds one from its results JSON with
:meth:`~oomlab.remedies.hardware.HardwareSearch.from_dict`)."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from oomlab.core.units import format_size
from oomlab.remedies.hardware import HardwareOption, HardwareSearch
from oomlab.remedies.remedy import format_tokens_per_s

HARDWARE_HEADERS = ["hardware", "best remedy that fits", "peak / GPU", "headroom", "max micro-batch", "tokens/s",
                    "$ / M tokens", "ranking"]
NO_PRICE = "no list price"
DOLLAR = "$"  # the currency sign of the CLI's text and of both tables' headers
MARKDOWN_DOLLAR = "&#36;"  # the same sign in Markdown, where a pair of bare "$" would be read as math
RANKINGS = (("cheapest", "cheapest per token"), ("fastest", "fastest"), ("fewest_gpus", "fewest GPUs"))


def cost_text(o: HardwareOption) -> str:
    """Dollars per million training tokens, to the tenth of a cent: a table cell's figure (its header says "$")."""
    cost = o.usd_per_million_tokens
    return NO_PRICE if cost is None else f"{cost:.3f}"


def winner(search: HardwareSearch, key: str) -> HardwareOption | None:
    """The winner of the ranking ``key`` (``cheapest``, ``fastest``, ``fewest_gpus``), or None when nothing fits."""
    return {"cheapest": search.cheapest, "fastest": search.fastest, "fewest_gpus": search.fewest_gpus}[key]


def marks(search: HardwareSearch) -> dict[str, str]:
    """Each row's label -> the rankings it wins, and ``pareto`` when it is on the front (rows with none left out)."""
    out: dict[str, list[str]] = {}
    for key, title in (("cheapest", "cheapest"), ("fastest", "fastest"), ("fewest_gpus", "fewest GPUs")):
        if (w := winner(search, key)) is not None:
            out.setdefault(w.label, []).append(title)
    for o in search.pareto:
        out.setdefault(o.label, []).append("pareto")
    return {label: ", ".join(titles) for label, titles in out.items()}


def option_row(search: HardwareSearch, o: HardwareOption, marked: dict[str, str] | None = None) -> tuple[Any, ...]:
    """One row of the table (:data:`HARDWARE_HEADERS`): a fitting option's figures, or why nothing fits
    (``marked``: :func:`marks` of the search, when the caller has it)."""
    r = o.remedy
    if r is None:
        return (o.label, o.reason, "-", "-", "-", "-", "-", "")
    marked = marks(search) if marked is None else marked
    return (o.label, r.name, format_size(r.per_gpu_peak_bytes), format_size(r.headroom_bytes), r.max_batch or "-",
            format_tokens_per_s(o.tokens_per_s), cost_text(o), marked.get(o.label, ""))


def hardware_rows(search: HardwareSearch, compact: bool = True) -> list[tuple[Any, ...]]:
    """The table's rows.  ``compact``: per GPU type, the fewest of it that fit (or its largest count, saying why
    nothing fits), then every ranking's winner and pareto row not already shown; else every searched row."""
    options, marked = search.options, marks(search)
    if not compact:
        return [option_row(search, o, marked) for o in options]
    chosen: list[HardwareOption] = []
    for gpu in dict.fromkeys(o.gpu for o in options):
        mine = [o for o in options if o.gpu == gpu]
        fitting = [o for o in mine if o.fits]
        chosen.append(min(fitting, key=lambda o: o.world_size) if fitting else max(mine, key=lambda o: o.world_size))
    shown = {o.label for o in chosen}
    chosen += [o for o in options if o.label in marked and o.label not in shown]
    return [option_row(search, o, marked) for o in chosen]


def winner_text(o: HardwareOption, esc: Callable[[str], str] = str, dollar: str = DOLLAR) -> str:
    """``8 × a100-80gb with <remedy> (1,234 tokens/s, $0.123 per million tokens)``; ``esc`` escapes user text,
    ``dollar`` is the sign as the output writes it (:data:`MARKDOWN_DOLLAR` in Markdown)."""
    price = "" if o.usd_per_million_tokens is None else f", {dollar}{cost_text(o)} per million tokens"
    return f"{esc(o.label)} with {esc(o.remedy.name)} ({format_tokens_per_s(o.tokens_per_s)} tokens/s{price})"


def _counts(search: HardwareSearch) -> list[int]:
    return sorted({o.gpus for o in search.options if o.nodes == 1})


def searched_in(search: HardwareSearch, sep: str) -> str:
    """``sep`` and ``"searched in 0.42 s"`` for a search timed here; ``""`` for one rebuilt from its results JSON,
    which keeps no timing (two identical runs write identical results)."""
    return "" if search.seconds is None else f"{sep}searched in {search.seconds:.2f} s"


def winners(search: HardwareSearch) -> str:
    """The three rankings' winners and the search time (when known: :func:`searched_in`), as Markdown (user text
    escaped, the dollar sign as an HTML entity: Jupyter's and nbconvert's Markdown read a pair of "$" as math)."""
    methods = "/".join(m.value for m in search.methods)
    parts = []
    for key, title in RANKINGS:
        o = winner(search, key)
        said = "nothing fits" if o is None else winner_text(o, html.escape, MARKDOWN_DOLLAR)
        parts.append(f"**{title}**: {said}")
    return (f"Every GPU type oomlab knows × {', '.join(str(n) for n in _counts(search))} GPUs, the plan's best "
            f"{html.escape(methods)} remedy on each: {len(search.fitting)} of {len(search.options)} fit"
            f"{searched_in(search, ', ')}. " + "; ".join(parts) + ". Prices: " + html.escape(search.prices_source)
            + ".")


def render_search(search: HardwareSearch) -> str:
    """The search as text (the CLI's): the three rankings' winners, the pareto front, then one line per row."""
    methods = "/".join(m.value for m in search.methods)
    lines = [f"which GPUs would train {search.model} ({methods}, seq {search.seq}): {len(search.options)} rows, "
             f"{len(search.fitting)} fit{searched_in(search, '; ')}"]
    for key, title in RANKINGS:
        o = winner(search, key)
        lines.append(f"  {title:<19} " + ("nothing fits" if o is None else winner_text(o)))
    lines.append("  pareto front (cost vs tokens/s): " + (", ".join(o.label for o in search.pareto) or "none"))
    lines.append("")
    lines.append(f"  {'hardware':<26} {'peak/GPU':>10} {'headroom':>10} {'max mb':>6} {'tokens/s':>9} "
                 f"{'$/M tok':>8}  best remedy (or why none)")
    marked = marks(search)
    for o in search.options:
        label, name, peak, headroom, max_batch, tps, cost, _marks = option_row(search, o, marked)
        lines.append(f"  {label:<26} {peak:>10} {headroom:>10} {max_batch:>6} {tps:>9} {cost:>8}  {name}")
    lines.append("")
    lines += [f"  NB: {a}" for a in search.assumptions]
    return "\n".join(lines) + "\n"
