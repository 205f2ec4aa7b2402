"""The honest account of the seed's reproduction: roles of the figures, the outside range, the layout finding."""

import json

import pytest

from oomlab.core.units import MiB
from oomlab.reproduction.fit import Figure
from oomlab.reproduction.honesty import FigureRole, honest_reproduction, render_honesty, render_honesty_record
from oomlab.reproduction.layouts import LaunchPath, llama_layouts
from oomlab.reproduction.outside import seed_outside_bytes


@pytest.fixture(scope="module")
def honest():
    return honest_reproduction()


def test_free_and_total_are_inputs(honest) -> None:
    """The free figure (the outside memory is derived from it) and the capacity are inputs, not matches."""
    roles = {c.figure: c.role for c in honest.figures}
    assert roles[Figure.FREE] is FigureRole.INPUT and roles[Figure.TOTAL] is FigureRole.INPUT
    assert "derived from it" in next(c.why for c in honest.figures if c.figure is Figure.FREE)


def test_reserved_is_fitted_tried_and_allocated_predicted(honest) -> None:
    """One figure picks the failure point; the other two follow from it: 2 inputs, 1 fitted, 2 predicted."""
    roles = {c.figure: c.role for c in honest.figures}
    assert roles[Figure.RESERVED] is FigureRole.FITTED
    assert roles[Figure.TRIED] is roles[Figure.ALLOCATED] is FigureRole.PREDICTED
    assert honest.counts == {FigureRole.INPUT: 2, FigureRole.FITTED: 1, FigureRole.PREDICTED: 2}
    assert all(c.seed == c.reproduced for c in honest.figures)


def test_outside_range_contains_the_derived_seed_value(honest) -> None:
    """465.81 – 601.81 MiB reproduces the three figures; the reproduction's 561.00 MiB lies inside."""
    (interval,) = honest.intervals
    assert interval.printed == "465.81 MiB – 601.81 MiB" and interval.width_bytes == 136 * MiB
    assert seed_outside_bytes() in interval and honest.derived_outside_bytes == seed_outside_bytes()
    assert honest.installed_layout == "5.0" and honest.failure_points == 174


def test_context_reading(honest) -> None:
    """The range is above every lazy-loading T4 context; the shipped old context + NCCL (689 MiB) is above it."""
    by_label = {c.label.split(" (")[0]: c for c in honest.context}
    assert not by_label["measured T4 contexts under lazy loading"].overlaps
    assert not by_label["shipped T4 range, torch >= 2.1"].overlaps
    assert by_label["shipped T4 context, torch <= 2.0"].overlaps  # but it is the seed's own figure
    assert "not independent" in by_label["shipped T4 context, torch <= 2.0"].note
    nccl = next(c for c in honest.context if "NCCL" in c.label)
    assert nccl.printed == "689.00 MiB" and not nccl.overlaps
    assert "4–6 lazy-loading contexts" in honest.context_finding


def test_layout_finding_follows_the_data(honest) -> None:
    """A layout can print the three figures exactly when .to() moves no per-layer cos/sin caches, on either path."""
    for row in honest.layouts:
        assert row.can_produce is (not row.layout.moves_rotary_caches), (row.layout.id, row.path)
    producing = {r.layout.id for r in honest.layouts if r.can_produce}
    assert producing == {"pre-22234", "4.38.0", "4.41", "4.43", "4.48", "5.0"}


def test_no_release_out_at_the_report_date_can_produce_it(honest) -> None:
    """On 2023-06-27 only 4.28-4.30 was out among the layouts, and it cannot; the first that can is 4.38.0."""
    out_then = {r.layout.id for r in honest.layouts if r.available_at_report}
    assert out_then == {"4.28"}
    assert not any(r.can_produce for r in honest.layouts if r.available_at_report)
    assert "The first release that can is 4.38.0 (2024-02-21); none was out on 2023-06-27" in honest.layout_finding


@pytest.mark.parametrize("path, allocated, reserved", [
    (LaunchPath.TO, "14.20 GiB", "14.21 GiB"),  # fp32 caches: 2 MiB a layer
    (LaunchPath.HALF_THEN_TO, "14.18 GiB", "14.18 GiB"),  # DeepSpeed's .half() first: 1 MiB a layer
])
def test_4_28_misses_by_the_caches(honest, path: LaunchPath, allocated: str, reserved: str) -> None:
    """With 4.28-4.30 the 136.00 MiB request at layer 23 comes after more allocated and reserved than the seed's."""
    row = next(r for r in honest.layouts if r.layout.id == "4.28" and r.path is path)
    assert (row.above.name, row.above.printed(Figure.ALLOCATED), row.above.printed(Figure.RESERVED)) == (
        "model.layers.23.mlp.gate_proj.weight", allocated, reserved)
    assert row.below.name.startswith("model.layers.22.mlp.") and row.shortfall_bytes > 280 * MiB


def test_rendered_tables(honest) -> None:
    """The Markdown carries the three tables, each row as wide as its header."""
    text = render_honesty(honest)
    tables = [block for block in text.split("\n\n") if block.startswith("|")]
    assert len(tables) == 3
    for table in tables:
        widths = {line.count(" | ") for line in table.splitlines() if not line.startswith("|---")}
        assert len(widths) == 1
    assert "2 are inputs, 1 is fitted and 2 are predicted" in text
    assert "{" not in text and "}" not in text  # every placeholder filled


def test_to_dict_is_plain_json(honest) -> None:
    """The results form is JSON as is, with the tables as rows and the two findings."""
    data = json.loads(json.dumps(honest.to_dict()))
    assert data["outside_intervals"][0]["low_bytes"] == 488_439_809
    assert data["counts"] == {"input": 2, "fitted": 1, "predicted": 2}
    assert len(data["tables"]["layouts"]["rows"]) == len(llama_layouts())
    assert data["layout_finding"] == honest.layout_finding and render_honesty_record(data) == render_honesty(honest)
    assert "markdown" not in data  # the record holds data; its one renderer writes the Markdown
