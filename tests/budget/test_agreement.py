"""The committed analytic-vs-traced matrix: within 2 % on peaks and components, current, and reproducible."""

from dataclasses import asdict

import pytest

from oomlab.budget import agreement
from oomlab.budget.analytic import estimate_setup
from oomlab.budget.result import Source


@pytest.fixture(scope="module")
def committed():
    return agreement.load_committed()


def _row(committed, key: tuple) -> dict:
    return next(row for row in committed["rows"] if tuple(row["key"]) == key)


def _rows_from_json(committed) -> list[agreement.AgreementRow]:
    return [agreement.AgreementRow(r["setup"], r["analytic_peak_bytes"], r["traced_peak_bytes"], r["analytic_phase"],
                                   r["traced_phase"], r["analytic_components"], r["traced_components"])
            for r in committed["rows"]]


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
    row = agreement.AgreementRow("x", 20 * gib, 20 * gib, "backward", "backward",
                                 {"activations": 4 * gib, "transient workspace": 16 * gib},
                                 {"activations": 18 * gib, "transient workspace": 2 * gib})
    assert row.ratio == 1 and not row.agrees and row.worst_component[0] in ("activations", "transient workspace")


def test_committed_analytic_figures_are_current(committed) -> None:
    """The committed analytic peaks and components are what the analytic model computes today."""
    for row in committed["rows"]:
        setup = agreement.matrix_setup(tuple(row["key"]))
        result = estimate_setup(setup)
        assert result.allocated_peak_bytes == row["analytic_peak_bytes"], row["setup"]
        phase = next(p for p in result.phases if p.value == row["traced_phase"])
        assert agreement._allocated(result.phases[phase]) == row["analytic_components"], row["setup"]
    for row in committed["analytic_only"]:
        fresh = agreement.analytic_only(tuple(row["key"]), agreement.NotTraced[row["reason"]])
        assert fresh.analytic_peak_bytes == row["analytic_peak_bytes"], row["setup"]


def test_committed_doc_is_rendered_from_the_committed_rows(committed) -> None:
    """docs/budget-agreement.md is what render_markdown writes from agreement.json (neither edited by hand)."""
    untraced = [agreement.AnalyticOnlyRow(r["setup"], r["analytic_peak_bytes"], r["analytic_phase"],
                                          agreement.NotTraced[r["reason"]]) for r in committed["analytic_only"]]
    measured = [agreement.MeasuredRow(m["setup"], m["measured_peak_bytes"], m["analytic_peak_bytes"],
                                      m["measured_phase"], m["analytic_phase"]) for m in committed["measured"]]
    expected = agreement.render_markdown(_rows_from_json(committed), untraced, committed["versions"], measured)
    assert agreement.AGREEMENT_DOC.read_text() == expected


def test_measured_deepspeed_rows_agree_and_are_current(committed) -> None:
    """The ZeRO rows measured at small scale: every one agrees, and they are today's (the small-scale data and the
    analytic model as they stand)."""
    assert len(committed["measured"]) >= 15
    assert all(abs(m["ratio"] - 1) <= agreement.TOLERANCE for m in committed["measured"])
    fresh = [asdict(m) for m in agreement.measured_rows()]
    assert fresh == [{k: v for k, v in m.items() if k != "ratio"} for m in committed["measured"]]


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
    assert fresh.traced_peak_bytes == row["traced_peak_bytes"]
    assert dict(fresh.traced_components) == row["traced_components"]


def test_traced_budget_components_sum_to_the_steady_peak(committed) -> None:
    """The traced budget's allocated components add up to the steady-state phase peak it reports."""
    from oomlab.budget.traced import steady_phase_totals, trace_step, traced_budget

    key = ("llama-7b", "single", 1, "lora", "fp16-mixed", "adamw", 2048, 1, False, "sdpa")  # backward peak
    setup = agreement.matrix_setup(key)
    traced = traced_budget(setup)
    assert traced.allocated_peak_bytes == max(steady_phase_totals(trace_step(setup)).values())
    assert traced.source is Source.TRACED and traced.allocated_peak_bytes == _row(committed, key)["traced_peak_bytes"]
    assert sum(_row(committed, key)["traced_components"].values()) == traced.allocated_peak_bytes
