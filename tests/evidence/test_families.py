"""The committed family agreement matrix (docs/family-agreement.md): rendered from its JSON, every checked row within
tolerance, at least two traced setups and a real CPU step agreeing per family, the analytic figures current, and
three rows re-traced to check the committed traced figures."""

from __future__ import annotations

import json

import pytest

from oomlab.budget.estimator import estimate_setup
from oomlab.budget.result import MemCategory, Phase, Source
from oomlab.budget.traced import traced_budget
from oomlab.core.models import Family
from oomlab.evidence import families as fam
from oomlab.evidence.agreement import describe

COMMITTED = fam.load_committed()
ROWS = fam.rows_from_json(COMMITTED)


def _row(family: Family, index: int) -> fam.FamilyRow:
    label = describe(fam.traced_setup(family, index))
    return next(r for r in ROWS if r.family == family.value and r.setup == label)


def test_doc_is_rendered_from_the_committed_json() -> None:
    """docs/family-agreement.md is exactly what the committed JSON renders to."""
    assert fam.FAMILY_DOC.read_text() == fam.render_markdown(ROWS, COMMITTED["versions"])


def test_committed_json_is_what_the_rows_write() -> None:
    """family-agreement.json is exactly what committed_data writes from the rows read back from it."""
    assert json.dumps(fam.committed_data(ROWS, COMMITTED["versions"]), indent=2) + "\n" == fam.FAMILY_JSON.read_text()


def test_rows_hold_sources_phases_and_categories() -> None:
    """Rows hold Source, Phase and MemCategory members (no worst component for a measured row), a fresh traced row
    too; the strings are the JSON's."""
    assert {r.source for r in ROWS} == {Source.TRACED, Source.MEASURED}
    assert all(isinstance(r.analytic_phase, Phase) and isinstance(r.reference_phase, Phase) for r in ROWS)
    assert all(isinstance(r.worst_component, MemCategory) for r in ROWS if r.source is Source.TRACED)
    assert all(r.worst_component is None and r.to_json()["worst_component"] == "" for r in ROWS
               if r.source is Source.MEASURED)
    fresh = fam.traced_row(Family.LLAMA, 0)
    assert isinstance(fresh.analytic_phase, Phase) and isinstance(fresh.worst_component, MemCategory)
    assert fresh.source is Source.TRACED and fresh.to_json()["source"] == "traced"


def test_every_family_agrees_on_two_traced_setups_and_a_real_step() -> None:
    """Per family: >= 2 traced setups within 2 % (peak and components) and a real CPU step within 3 %."""
    assert {r.family for r in ROWS} == {f.value for f in Family}
    for family in Family:
        rows = [r for r in ROWS if r.family == family.value]
        assert sum(r.agrees for r in rows if r.source is Source.TRACED) >= 2, family
        assert [r.agrees for r in rows if r.source is Source.MEASURED] == [True], family


def test_only_the_stated_gaps_disagree() -> None:
    """Every row agrees but the known gaps, each stated with its reason in the JSON and the document."""
    gaps = {(r.family, r.setup) for r in ROWS if r.known_gap}
    assert gaps == {(f.value, describe(fam.traced_setup(f, i))) for f, i in fam.KNOWN_GAPS}
    assert all(r.agrees for r in ROWS if not r.known_gap)
    assert all(r.known_gap in fam.FAMILY_DOC.read_text() for r in ROWS if r.known_gap)


# one row of each setup, each kind of family (dense, tied, sliding window, MoE, fused projections): a cold trace cache
# makes each analytic figure a one-layer trace, so the test samples rather than recomputes all 75 (the generator does)
CURRENT = ((Family.LLAMA, 0), (Family.GEMMA2, fam.LORA_BF16_ROW), (Family.QWEN2_MOE, fam.FSDP2_ROW),
           (Family.FALCON, fam.LORA_FP16_ROW), (Family.PHI3, 0), (Family.GPT_NEOX, fam.LORA_BF16_ROW))
CURRENT_MEASURED = (Family.MIXTRAL, Family.PHI, Family.OLMO2)


def test_committed_analytic_figures_are_current() -> None:
    """Today's analytic budget gives the committed analytic peaks (a sample of traced and measured rows)."""
    for family, index in CURRENT:
        assert estimate_setup(fam.traced_setup(family, index)).allocated_peak_bytes == \
            _row(family, index).analytic_peak_bytes, (family, index)
    for family in CURRENT_MEASURED:
        row = next(r for r in ROWS if r.family == family.value and r.source is Source.MEASURED)
        case = fam.SmallCase(row.family, {"family": family, **fam.MEASURED_KNOBS})
        assert estimate_setup(case.setup).allocated_peak_bytes == row.analytic_peak_bytes, row.family


@pytest.mark.parametrize(("family", "index"), [(Family.MIXTRAL, 0), (Family.GEMMA2, fam.LORA_BF16_ROW),
                                               (Family.PHI3, fam.FSDP2_ROW)])
def test_committed_traced_figures_retrace(family: Family, index: int) -> None:
    """Re-tracing a row (MoE; Gemma-2's sliding window, eager; FSDP2) gives the committed traced peak."""
    setup = fam.traced_setup(family, index)
    assert traced_budget(setup).allocated_peak_bytes == _row(family, index).reference_peak_bytes
