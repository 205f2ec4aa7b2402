"""The committed analytic-vs-traced matrix: within 2 %, current, and reproducible."""

import pytest

from oomlab.budget import agreement
from oomlab.budget.analytic import estimate_setup
from oomlab.budget.result import Source


@pytest.fixture(scope="module")
def committed():
    return agreement.load_committed()


def test_matrix_is_large_enough(committed) -> None:
    """At least 24 setups, spanning 7B and 13B, full and LoRA, single, DDP and FSDP."""
    keys = [row["key"] for row in committed["rows"]]
    assert len(keys) >= 24 and len(keys) == len(agreement.MATRIX)
    assert {k[0] for k in keys} == {"llama-7b", "llama-13b"}
    assert {k[1] for k in keys} == {"single", "ddp", "fsdp"}
    assert {k[3] for k in keys} == {"full", "lora"}
    assert {k[4] for k in keys} >= {"fp32", "fp16-mixed", "fp16"}


def test_every_ratio_within_two_percent(committed) -> None:
    """|analytic / traced - 1| <= 2 % for every committed setup."""
    for row in committed["rows"]:
        assert abs(row["ratio"] - 1) <= agreement.TOLERANCE, row["setup"]


def test_committed_analytic_figures_are_current(committed) -> None:
    """The committed analytic peaks are what the analytic model computes today (the doc is not stale)."""
    for row in committed["rows"]:
        setup = agreement.matrix_setup(tuple(row["key"]))
        assert estimate_setup(setup).allocated_peak_bytes == row["analytic_peak_bytes"], row["setup"]


@pytest.mark.parametrize("index", [5, 11])  # 7B LoRA single seq 2048; 7B LoRA FSDP x4 seq 2048
def test_committed_traced_figures_reproduce(committed, index, tmp_path, monkeypatch) -> None:
    """Tracing again from scratch gives the committed traced peak to the byte."""
    monkeypatch.setenv("OOMLAB_CACHE_DIR", str(tmp_path))
    row = committed["rows"][index]
    fresh = agreement.compare(agreement.matrix_setup(tuple(row["key"])))
    assert fresh.traced_peak_bytes == row["traced_peak_bytes"]


def test_traced_budget_components_sum_to_the_steady_peak(committed) -> None:
    """The traced budget's allocated components add up to the steady-state phase peak it reports."""
    from oomlab.budget.traced import steady_phase_totals, trace_step, traced_budget

    setup = agreement.matrix_setup(tuple(committed["rows"][5]["key"]))  # 7B LoRA, backward peak
    traced = traced_budget(setup)
    assert traced.allocated_peak_bytes == max(steady_phase_totals(trace_step(setup)).values())
    assert traced.source is Source.TRACED and traced.allocated_peak_bytes == committed["rows"][5]["traced_peak_bytes"]
