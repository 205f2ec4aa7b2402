"""docs/trainers-small-scale.md against a recomputation: the rows are today's cases and the analytic column today's
trainer budget (fast); the measured column is what TRL's DPOTrainer measures again (slow, and only where trl is
installed: it is not a dependency)."""

from __future__ import annotations

import importlib.util
import re

import pytest

from oomlab.evidence.trainers import (
    DOC_FOOTER,
    DOC_HEADER,
    TRAINER_CASES,
    TRAINERS_DOC,
    analytic_bytes,
    fallback_tile_bytes,
    measure_trl,
)

REGENERATE = "stale: python -m oomlab.evidence trainers"
ROW = re.compile(r"^\| (?P<label>[^|]+?) \| [^|(]+\((?P<analytic>[\d,]+) B\) \| [^|(]+\((?P<measured>[\d,]+) B\) "
                 r"\| (?P<ratio>[\d.]+) \| (?P<tiles>-?[\d.]+) \| [^|]+ \|$", re.MULTILINE)


def doc_rows() -> list[dict[str, str]]:
    return [m.groupdict() for m in ROW.finditer(TRAINERS_DOC.read_text())]


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def test_doc_has_the_generators_text() -> None:
    text = TRAINERS_DOC.read_text()
    assert text.startswith(DOC_HEADER.strip().splitlines()[0]) and DOC_HEADER.strip() in text, REGENERATE
    assert DOC_FOOTER.strip() in text, REGENERATE


def test_doc_rows_are_todays_cases() -> None:
    assert [r["label"] for r in doc_rows()] == [c.label for c in TRAINER_CASES], REGENERATE


@pytest.mark.parametrize("case", TRAINER_CASES, ids=[c.label for c in TRAINER_CASES])
def test_doc_analytic_column_is_current(case) -> None:
    row = next(r for r in doc_rows() if r["label"] == case.label)
    assert _int(row["analytic"]) == analytic_bytes(case.setup), REGENERATE


def test_doc_ratio_and_tiles_are_its_columns() -> None:
    for case, row in zip(TRAINER_CASES, doc_rows(), strict=True):
        analytic, measured = _int(row["analytic"]), _int(row["measured"])
        assert row["ratio"] == f"{analytic / measured:.4f}", row["label"]
        assert row["tiles"] == f"{(measured - analytic) / fallback_tile_bytes(case.setup):.1f}", row["label"]


def test_the_measurements_show_what_the_budget_models() -> None:
    """The reference's copy, precompute and the doubled batch, as TRL measured them: the budget's differences between
    rows are the measured ones to within one CPU-fallback tile."""
    rows = {r["label"]: r for r in doc_rows()}
    labels = [c.label for c in TRAINER_CASES]
    resident, precomputed, _, batch4 = (rows[label] for label in labels[:4])
    tile = fallback_tile_bytes(TRAINER_CASES[0].setup)
    for a, b in ((resident, precomputed), (batch4, resident)):
        measured = _int(a["measured"]) - _int(b["measured"])
        analytic = _int(a["analytic"]) - _int(b["analytic"])
        assert abs(measured - analytic) <= 7 * tile, (a["label"], b["label"], measured, analytic)
    assert 0.8 < min(float(r["ratio"]) for r in rows.values()) <= max(float(r["ratio"]) for r in rows.values()) <= 1.0


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed (not an oomlab dependency)")
@pytest.mark.parametrize("case", TRAINER_CASES[:1], ids=[c.label for c in TRAINER_CASES[:1]])
def test_doc_measured_column_reproduces(case) -> None:
    row = next(r for r in doc_rows() if r["label"] == case.label)
    measured, _, _ = measure_trl(case.setup)
    assert abs(measured - _int(row["measured"])) <= 0.01 * measured, REGENERATE
