"""Two identical runs write identical results: no wall-clock timing reaches a results JSON (issue 20).

The hardware search of notebook 03 timed itself and :meth:`HardwareSearch.to_dict` wrote that time into
``results/03_remediations.json``; the time is now only said in the CLI's text, from the live search."""

from __future__ import annotations

import json

from oomlab.remedies.hardware import HardwareSearch, search_hardware
from oomlab.remedies.hardware_display import render_search, winners


def test_two_identical_searches_serialise_identically() -> None:
    """The same search twice gives byte-identical JSON, and holds no timing at all."""
    first, second = (search_hardware("qwen2.5-0.5b", ["lora"], gpus=["t4"], max_gpus=2) for _ in range(2))
    assert first.seconds is not None and first.seconds > 0  # timed, as the CLI says
    assert json.dumps(first.to_dict()) == json.dumps(second.to_dict())
    assert "seconds" not in first.to_dict()


def test_the_time_is_said_only_from_the_live_search() -> None:
    """The CLI's text says how long the search took; a search rebuilt from its JSON says nothing of time."""
    search = search_hardware("qwen2.5-0.5b", ["lora"], gpus=["t4"], max_gpus=2)
    rebuilt = HardwareSearch.from_dict(json.loads(json.dumps(search.to_dict())))
    assert rebuilt.seconds is None
    assert f"; searched in {search.seconds:.2f} s" in render_search(search).splitlines()[0]
    assert "searched in" not in render_search(rebuilt) and "searched in" not in winners(rebuilt)
    assert f"fit, searched in {search.seconds:.2f} s. " in winners(search)
