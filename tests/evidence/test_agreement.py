"""The committed analytic-vs-traced matrix: within 2 % on peaks and components, current, and reproducible."""

import json

import pytest

from oomlab.budget.estimator import estimate_setup
from oomlab.budget.result import MemCategory, Phase, Source
from oomlab.evidence import agreement

pytestmark = pytest.mark.heavy  # re-traces the committed rows: `pytest -m "not heavy"` leaves it out


@pytest.fixture(scope="module")
def committed():
    return agreement.load_committed()


def _row(committed, key: tuple) -> dict:
    return next(row for row in committed["rows"] if tuple(row["key"]) == key)


def _rows_from_json(committed) -> list[agreement.AgreementRow]:
    return [agreement.AgreementRow.from_json(r) for r in committed["rows"]]


def _untraced_from_json(committed) -> list[agreement.AnalyticOnlyRow]:
    return [agreement.AnalyticOnlyRow.from_json(r) for r in committed["analytic_only"]]


def _measured_from_json(committed) -> list[agreement.MeasuredRow]:
    return [agreement.MeasuredRow.from_json(m) for m in committed["measured"]]


def test_matrix_covers_every_launch(committed) -> None:
    """>= 40 traced setups: every traceable strategy, both AdamW variants, full and LoRA, three models; the untraced
    strategies, QLoRA and 8-bit AdamW budgeted as analytic-only rows with a reason."""
    keys = [tuple(row["key"]) for row in committed["rows"]]
    assert len(keys) >= 40 and keys == list(agreement.MATRIX)
    assert {k[1] for k in keys} == {"single", "ddp", "fsdp", "fsdp2", "fsdp2-offload"}
    assert {k[5] for k in keys} >= {"adamw", "adamw-fused", "sgd"}
    assert {k[3] for k in keys} == {"full", "lora"}
    assert {k[0] for k in keys} == {"llama-7b", "llama-13b", "mistral-7b"}
    for strategy in ("fsdp", "fsdp2"):  # each FSDP launch with both optimizers, with and without checkpointing
        assert {(k[5], k[8]) for k in keys if k[1] == strategy} >= {("adamw", False), ("adamw", True),
                                                                    ("adamw-fused", True)}
    untraced = [tuple(row["key"]) for row in committed["analytic_only"]]
    assert untraced == [row for row, _ in agreement.ANALYTIC_ONLY]
    assert {k[1] for k in untraced} >= {"zero1", "zero2", "fsdp-offload"}
    assert {k[3] for k in untraced} >= {"qlora"} and {k[5] for k in untraced} >= {"adamw-8bit"}
    assert {row["reason"] for row in committed["analytic_only"]} == {r.name for r in agreement.NotTraced}


def test_every_peak_and_component_within_two_percent(committed) -> None:
    """|analytic / traced - 1| <= 2 % and every category within 2 % of the traced peak, for every committed setup."""
    for row in _rows_from_json(committed):
        assert abs(row.ratio - 1) <= agreement.TOLERANCE, row.setup
        name, delta = row.worst_component
        assert abs(delta) <= agreement.TOLERANCE, (row.setup, name, delta)


def test_components_test_catches_a_misfiled_category() -> None:
    """A row whose totals agree but whose bytes sit in another category does not agree."""
    gib = 1024**3
    act, work = MemCategory.ACTIVATIONS, MemCategory.WORKSPACE
    row = agreement.AgreementRow("x", 20 * gib, 20 * gib, Phase.BACKWARD, Phase.BACKWARD,
                                 {act: 4 * gib, work: 16 * gib}, {act: 18 * gib, work: 2 * gib})
    assert row.ratio == 1 and not row.agrees and row.worst_component[0] in (act, work)


def test_rows_hold_phases_and_categories() -> None:
    """Computed rows hold Phase and MemCategory members; their values appear only in the JSON and the document."""
    row = agreement.compare(agreement.matrix_setup(agreement.MATRIX[0]))
    assert isinstance(row.analytic_phase, Phase) and isinstance(row.traced_phase, Phase)
    assert {type(c) for c in (*row.analytic_components, *row.traced_components)} == {MemCategory}
    assert isinstance(row.worst_component[0], MemCategory)
    assert row.to_json()["traced_phase"] == row.traced_phase.value
    assert all(isinstance(m.measured_phase, Phase) and isinstance(m.analytic_phase, Phase)
               for m in agreement.measured_rows())
    untraced = agreement.analytic_only(*agreement.ANALYTIC_ONLY[0])
    assert isinstance(untraced.analytic_phase, Phase)


def test_committed_json_is_what_the_rows_write(committed) -> None:
    """agreement.json is exactly what committed_data writes from the rows read back from it (to_json / from_json
    round-trip to the byte)."""
    data = agreement.committed_data(_rows_from_json(committed), _untraced_from_json(committed),
                                    _measured_from_json(committed), committed["versions"])
    assert json.dumps(data, indent=2) + "\n" == agreement.AGREEMENT_JSON.read_text()


def test_committed_analytic_figures_are_current(committed) -> None:
    """The committed analytic peaks and components are what the analytic model computes today."""
    for row in committed["rows"]:
        setup = agreement.matrix_setup(tuple(row["key"]))
        result = estimate_setup(setup)
        assert result.allocated_peak_bytes == row["analytic_peak_bytes"], row["setup"]
        expected = agreement.AgreementRow.from_json(row)
        assert agreement._allocated(result.phases[expected.traced_phase]) == expected.analytic_components, row["setup"]
    for row in committed["analytic_only"]:
        fresh = agreement.analytic_only(tuple(row["key"]), agreement.NotTraced[row["reason"]])
        assert fresh.analytic_peak_bytes == row["analytic_peak_bytes"], row["setup"]


def test_committed_doc_is_rendered_from_the_committed_rows(committed) -> None:
    """docs/budget-agreement.md is what render_markdown writes from agreement.json (neither edited by hand)."""
    expected = agreement.render_markdown(_rows_from_json(committed), _untraced_from_json(committed),
                                         committed["versions"], _measured_from_json(committed))
    assert agreement.AGREEMENT_DOC.read_text() == expected


def test_measured_deepspeed_rows_agree_and_are_current(committed) -> None:
    """The ZeRO rows measured at small scale: every one agrees, and they are today's (the small-scale data and the
    analytic model as they stand)."""
    assert len(committed["measured"]) >= 15
    assert all(abs(m["ratio"] - 1) <= agreement.TOLERANCE for m in committed["measured"])
    assert [m.to_json() for m in agreement.measured_rows()] == committed["measured"]


@pytest.mark.parametrize("key", [
    ("llama-7b", "fsdp", 4, "full", "fp16-mixed", "adamw", 512, 1, False, "sdpa"),  # FSDP1, optimizer-bound
    ("llama-7b", "fsdp2", 4, "lora", "bf16-mixed", "adamw", 2048, 1, False, "sdpa"),  # FSDP2 policy, LoRA
    ("llama-7b", "single", 1, "full", "fp16-mixed", "adamw-fused", 512, 1, False, "sdpa"),  # fused AdamW
])
def test_committed_traced_figures_reproduce(committed, key, tmp_path, monkeypatch) -> None:
    """Tracing again from scratch gives the committed traced peak and components to the byte."""
    monkeypatch.setenv("OOMLAB_CACHE_DIR", str(tmp_path))
    row = _row(committed, key)
    fresh = agreement.compare(agreement.matrix_setup(key))
    expected = agreement.AgreementRow.from_json(row)
    assert (fresh.traced_peak_bytes, fresh.traced_phase) == (expected.traced_peak_bytes, expected.traced_phase)
    assert dict(fresh.traced_components) == expected.traced_components


def test_traced_budget_components_sum_to_the_steady_peak(committed) -> None:
    """The traced budget's allocated components add up to the steady-state phase peak it reports."""
    from oomlab.budget.traced import steady_phase_totals, trace_step, traced_budget

    key = ("llama-7b", "single", 1, "lora", "fp16-mixed", "adamw", 2048, 1, False, "sdpa")  # backward peak
    setup = agreement.matrix_setup(key)
    traced = traced_budget(setup)
    assert traced.allocated_peak_bytes == max(steady_phase_totals(trace_step(setup)).values())
    assert traced.source is Source.TRACED and traced.allocated_peak_bytes == _row(committed, key)["traced_peak_bytes"]
    assert sum(_row(committed, key)["traced_components"].values()) == traced.allocated_peak_bytes
