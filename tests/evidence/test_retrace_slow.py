"""Every committed row of lib/oomlab/data/agreement.json traced again from scratch (an empty cache): the traced peak
and every component reproduce to the byte.  Slow (tens of minutes cold): skipped unless `pytest -m slow` or
OOMLAB_SLOW=1; the fast file (test_agreement.py) re-traces three rows on every run."""

from __future__ import annotations

import pytest

from oomlab.evidence import agreement

COMMITTED = agreement.load_committed()
KEYS = [tuple(row["key"]) for row in COMMITTED["rows"]]

pytestmark = pytest.mark.slow


def test_every_committed_row_is_listed() -> None:
    """One key per row, none repeated (the parametrization below covers the whole matrix)."""
    assert len(KEYS) == len(COMMITTED["rows"]) == len(set(KEYS)) > 0


@pytest.mark.parametrize("key", KEYS, ids=[row["setup"] for row in COMMITTED["rows"]])
def test_committed_row_retraces(key: tuple, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh trace (no cache) gives the committed traced peak, phase and components; the analytic side is current."""
    monkeypatch.setenv("OOMLAB_CACHE_DIR", str(tmp_path))
    row = next(r for r in COMMITTED["rows"] if tuple(r["key"]) == key)
    fresh = agreement.compare(agreement.matrix_setup(key))
    assert fresh.setup == row["setup"]
    expected = agreement.AgreementRow.from_json(row)
    assert (fresh.traced_peak_bytes, fresh.traced_phase) == (expected.traced_peak_bytes, expected.traced_phase)
    assert dict(fresh.traced_components) == expected.traced_components
    assert fresh.analytic_peak_bytes == row["analytic_peak_bytes"]
