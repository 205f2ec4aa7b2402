"""docs/small-scale-measured.md against a recomputation: the rows are today's cases, the analytic column is today's
estimate (fast); the measured column is what training the tiny setups again measures (slow: `pytest -m slow`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from oomlab.budget.estimator import estimate_setup
from oomlab.evidence.small_scale import DOC_FOOTER, DOC_HEADER, SMALL_CASES, compare_small

DOC = Path(__file__).resolve().parents[2] / "docs" / "small-scale-measured.md"
REGENERATE = "stale: python -m oomlab.evidence small-scale"
ROW = re.compile(r"^\| (?P<label>[^|]+?) \| [^|(]+\((?P<analytic>[\d,]+) B\) \| [^|(]+\((?P<measured>[\d,]+) B\) "
                 r"\| (?P<ratio>[\d.]+) \| (?P<aphase>\w+) \| (?P<mphase>\w+) \|$", re.MULTILINE)


def doc_rows() -> list[dict[str, str]]:
    text = DOC.read_text()
    table = text.split("Phase by phase")[0]
    return [m.groupdict() for m in ROW.finditer(table)]


def test_doc_has_the_generators_text() -> None:
    text = DOC.read_text()
    assert text.startswith(DOC_HEADER.strip().splitlines()[0]) and DOC_HEADER.strip() in text, REGENERATE
    assert DOC_FOOTER.strip() in text, REGENERATE


def test_doc_rows_are_todays_cases() -> None:
    """One row per SMALL_CASES entry, in order (a case added or renamed since the doc was written shows here)."""
    assert [r["label"] for r in doc_rows()] == [c.label for c in SMALL_CASES], REGENERATE


@pytest.mark.parametrize("case", SMALL_CASES, ids=[c.label for c in SMALL_CASES])
def test_doc_analytic_column_is_current(case) -> None:
    """The analytic peak (bytes) and phase in the doc are today's estimate of that tiny setup."""
    row = next((r for r in doc_rows() if r["label"] == case.label), None)
    assert row is not None, f"{case.label!r} is not in the doc; {REGENERATE}"
    result = estimate_setup(case.setup)
    phases = {p: sum(c.values()) for p, c in result.phases.items()}
    peak_phase = max(phases, key=lambda p: phases[p])
    assert (int(row["analytic"].replace(",", "")), row["aphase"]) == (phases[peak_phase], peak_phase.value), REGENERATE


def test_doc_ratio_is_its_columns() -> None:
    """Each ratio is analytic / measured of its own row, to the 4 decimals printed."""
    for row in doc_rows():
        ratio = int(row["analytic"].replace(",", "")) / int(row["measured"].replace(",", ""))
        assert row["ratio"] == f"{ratio:.4f}", row["label"]


@pytest.mark.slow
@pytest.mark.parametrize("case", SMALL_CASES, ids=[c.label for c in SMALL_CASES])
def test_doc_measured_column_reproduces(case) -> None:
    """Training the tiny setup again measures the committed peak (CPU allocator events: deterministic to 0.1 %)."""
    row = next((r for r in doc_rows() if r["label"] == case.label), None)
    assert row is not None, f"{case.label!r} is not in the doc; {REGENERATE}"
    fresh = compare_small(case)
    assert fresh.measured_peak_bytes == pytest.approx(int(row["measured"].replace(",", "")), rel=1e-3), REGENERATE
    assert fresh.measured.peak_phase.value == row["mphase"]
