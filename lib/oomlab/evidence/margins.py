"""The margins a fit must keep, from the published real-GPU peaks: ``python -m oomlab.evidence margins`` writes
``lib/oomlab/data/margins.json`` (read by :mod:`oomlab.remedies.margin`).

Per training method (full, LoRA, QLoRA): the trusted rows (reliability high or medium, never a suspect or low one)
that oomlab models (coverage ``modelled``: no first-order feature missing -- an *approximated* row's error says what
its missing feature is worth, e.g. a paged optimizer's state outside the torch counters, not how far the estimate of
what oomlab models is off) of ``lib/oomlab/data/published-measurements.json`` estimated again
(:func:`oomlab.evidence.published.compare_all`); the underestimate is the largest ``published / estimate - 1`` among
them (a row above the estimate; rows below it need no margin), so the margin covers every trusted measurement. Plus a
fragmentation allowance, assumed and stated: rows compared on ``allocated`` or ``active`` counters do not include the
allocator's cached-but-free blocks. A method with no trusted row gets the largest margin of the others, said so. A
row whose own "after model init" figure is already within :data:`LOAD_SET_PEAK` of its training peak measured the
load, not the step: where oomlab budgets that load (:attr:`~oomlab.budget.result.BudgetResult.load` -- torchtune's
QLoRA tutorial, 9.13 GB reserved at init and 9.29 GB in training, on torchao 0.1's unchunked quantization) the row
counts like any other; where it does not, it cannot calibrate the step's margin and is left out, named in the
margin's source.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from oomlab.core.choices import Method
from oomlab.evidence.published import Comparison, compare_all
from oomlab.evidence.published_rows import Coverage, Moment, Reliability
from oomlab.remedies.margin import MARGINS_JSON

TRUSTED = (Reliability.HIGH, Reliability.MEDIUM)
LOAD_SET_PEAK = 0.9  # a figure after model init at 90 % or more of the training peak: the peak was set by the load
FRAGMENTATION = 0.03  # assumed: PyTorch's caching allocator rounds and caches blocks; a few % of the peak
REGENERATE = ".venv/bin/python -m oomlab.evidence margins"


def _method(c: Comparison) -> Method:
    return Method(c.row.setup_kwargs.get("method", Method.FULL.value))


def peak_set_at_load(c: Comparison) -> bool:
    """Did the row's run reach its peak while loading (its own after-init figure near the training one) where oomlab
    does not budget the load?"""
    if c.result is not None and c.result.load is not None:
        return False
    return any(m.moment is Moment.AFTER_MODEL_INIT and m.value_bytes >= LOAD_SET_PEAK * c.row.value_bytes
               for m in c.row.secondary)


def margins_data(comparisons: Sequence[Comparison] | None = None) -> dict[str, Any]:
    comparisons = compare_all() if comparisons is None else comparisons
    trusted = [c for c in comparisons if c.error is not None and c.row.reliability in TRUSTED]
    out = []
    for method in Method:
        mine = [c for c in trusted if _method(c) is method]
        rows = [c for c in mine if c.row.coverage is Coverage.MODELLED and not peak_set_at_load(c)]
        at_load = [c.row.id for c in mine if peak_set_at_load(c)]
        approximated = sum(1 for c in mine if c.row.coverage is not Coverage.MODELLED and not peak_set_at_load(c))
        if rows:
            worst = max(rows, key=lambda c: 1 / (1 + c.error) - 1)
            under = max(0.0, 1 / (1 + worst.error) - 1)
            source = (f"the largest excess of a trusted published peak over oomlab's estimate, {under:.1%} "
                      f"({worst.row.id}, of {len(rows)} trusted rows oomlab models), plus {FRAGMENTATION:.0%} for "
                      "fragmentation (assumed)")
            if approximated:
                source += (f"; left out: {approximated} approximated row{'s' if approximated > 1 else ''} (a "
                           "first-order feature oomlab does not model)")
            if at_load:
                source += (f"; left out: {', '.join(at_load)} (its peak was set while loading: its after-init figure"
                           f" is {LOAD_SET_PEAK:.0%} or more of the training one)")
            out.append({"method": method.value, "underestimate": round(under, 4), "fragmentation": FRAGMENTATION,
                        "rows": len(rows), "worst_row": worst.row.id, "source": source})
    if not out:
        raise AssertionError("no trusted published row: no margin can be derived")
    widest = max(out, key=lambda m: m["underestimate"])
    for method in Method:
        if all(m["method"] != method.value for m in out):
            out.append({**widest, "method": method.value, "rows": 0,
                        "source": f"no trusted published peak for {method.value}: the widest margin of the others "
                                  f"({widest['method']}: {widest['source']})"})
    return {"generated_by": REGENERATE, "from": "lib/oomlab/data/published-measurements.json",
            "margins": sorted(out, key=lambda m: [x.value for x in Method].index(m["method"]))}


def render(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def regenerate() -> int:
    MARGINS_JSON.write_text(render(margins_data()))
    print(f"wrote {MARGINS_JSON}")
    return 0
