"""The committed DeepSpeed small-scale measurements (ZeRO-1/2/3 trained for real on CPU gloo processes) are current:
the data covers today's cases and versions, every figure agrees with today's analytic budget, and the committed doc
is rendered from the committed data."""

import pytest

from oomlab.budget.result import Phase
from oomlab.evidence import deepspeed_measured as dm
from oomlab.instruments.deepspeed_run import PHASES, phase_mark


@pytest.fixture(scope="module")
def data():
    return dm.load_committed()


@pytest.fixture(scope="module")
def rows(data):
    return dm.compare(data["cases"], data["measured"])


def test_committed_cases_are_todays(data) -> None:
    """The JSON was measured for exactly today's cases (a changed case needs `python -m oomlab.budget.
    deepspeed_measured` again) with DeepSpeed installed at the version it records."""
    import deepspeed

    assert data["cases"] == [dict(c) for c in dm.CASES]
    assert data["versions"]["deepspeed"] == deepspeed.__version__
    assert len(data["measured"]) == len(dm.CASES)


def test_every_case_ran_on_every_rank(data) -> None:
    """DeepSpeed trained every case on this CPU: no rank failed, two finite losses each."""
    for case, ranks in zip(data["cases"], data["measured"], strict=True):
        assert len(ranks) == case["knobs"]["gpus"]
        assert all(r["status"] == "ok" for r in ranks), case["label"]
        assert all(len(r["losses"]) == 2 and all(0 < x < 100 for x in r["losses"]) for r in ranks)


def test_every_figure_agrees_with_todays_analytic_budget(rows) -> None:
    """Each measured figure (phase peaks, bytes after the step, DeepSpeed's own tensors) is within 2 % or 4 KiB of the
    analytic one recomputed now."""
    bad = [(r.case, r.quantity, r.measured, r.analytic) for r in rows if not r.agrees]
    assert not bad
    assert len(rows) >= 150
    labels = {r.case for r in rows}
    assert {"ZeRO-1", "ZeRO-2", "ZeRO-3", "zero2-offload (optimizer on the host)",
            "zero3-offload (optimizer and parameters on the host)"} <= labels


def test_committed_doc_is_rendered_from_the_data(data) -> None:
    """docs/deepspeed-small-scale.md equals the rendering of the committed JSON with today's analytic side."""
    assert dm.MEASURED_DOC.read_text() == dm.render_markdown(data)


def test_phases_are_the_phase_enum(data) -> None:
    """The run marks each step's phases with Phase members (their values label the profiler marks and key the JSON);
    measured and analytic figures are compared by member."""
    assert PHASES == tuple(Phase) and phase_mark(2, Phase.OPTIMIZER) == "s2_optimizer"
    rank = data["measured"][0][0]
    assert set(rank["peaks"]) == {p.value for p in Phase}
    assert dm.measured_peaks(rank) == {p: rank["peaks"][p.value] for p in Phase}
    analytic = dm.analytic_step(data["cases"][0])
    assert list(analytic.phases) == list(Phase) and analytic.peak_phase in Phase


def test_row_agreement_can_fail() -> None:
    """A figure 3 % off (and more than 4 KiB) does not agree."""
    assert not dm.Row("case", "figure", 1_000_000, 1_030_000).agrees
    assert dm.Row("case", "figure", 1_000_000, 1_010_000).agrees
    assert dm.Row("case", "figure", 1_000, 5_000).agrees  # scalars: within 4,096 bytes


def test_zero_init_builds_no_replica(data) -> None:
    """Under zero.Init the model holds less at the end of construction than the same model built in fp32."""
    zinit = next(m for c, m in zip(data["cases"], data["measured"], strict=True) if c.get("zero_init"))
    plain = next(m for c, m in zip(data["cases"], data["measured"], strict=True) if c["label"] == "ZeRO-3")
    assert max(r["built"] for r in zinit) * 3 < max(r["built"] for r in plain)
