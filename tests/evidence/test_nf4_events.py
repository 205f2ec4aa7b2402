"""torchao 0.1's NF4 allocations: the committed recording is what its code allocates (recorded again from the
verbatim copy), and that copy is the wheel's file."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from oomlab.evidence import nf4_events


def test_the_recorded_copy_is_the_wheels_file() -> None:
    """tests/fixtures/torchao-0.1/nf4tensor.py hashes to what torchao 0.1's wheel RECORD lists for it."""
    digest = hashlib.sha256(nf4_events.VERBATIM.read_bytes()).digest()
    name, recorded, size = nf4_events.WHEEL_RECORD.split(",")
    assert name == "torchao/dtypes/nf4tensor.py"
    assert recorded == "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    assert int(size) == nf4_events.VERBATIM.stat().st_size


@pytest.fixture(scope="module")
def committed() -> dict:
    return json.loads(nf4_events.NF4_EVENTS_JSON.read_text())


def test_the_committed_sequences_are_the_recording(committed) -> None:
    """Recording torchao 0.1's to_nf4 and get_original_weight again gives the committed sequences (stale otherwise:
    ``python -m oomlab.evidence nf4-events``)."""
    assert nf4_events.record_file() == committed["sequences"]
    assert nf4_events.render(committed) == nf4_events.NF4_EVENTS_JSON.read_text()


def _live_bytes_per_element(events: list[list]) -> tuple[float, float]:
    """(the most bytes live at once, the bytes kept at the end), per weight element (no input counted)."""
    sizes, live, peak = {}, 0, 0
    for event in events:
        if event[0] == "alloc":
            sizes[event[1]] = event[2] + event[3] * 2**30 // nf4_events.UNIT
            live += sizes[event[1]]
            peak = max(peak, live)
        else:
            live -= sizes.pop(event[1])
    return peak / 2**30, live / 2**30


def test_to_nf4_holds_two_code_distance_tensors_at_its_peak(committed) -> None:
    """The unchunked nearest-code search, (value.unsqueeze(-1) - nf4).abs(): two bf16 (elements x 16) tensors, 64
    bytes per element, with the scaled bf16 copy beside them; what it keeps is the 4-bit data and its scalers."""
    peak, kept = _live_bytes_per_element(committed["sequences"]["to_nf4"])
    assert 64 <= peak < 72
    assert 0.5 < kept < 0.6
    peak, kept = _live_bytes_per_element(committed["sequences"]["get_original_weight"])
    assert kept == 2  # the bf16 weight it returns
    assert peak < 16
