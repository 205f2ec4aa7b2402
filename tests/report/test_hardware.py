"""The report's "Which GPUs would it fit?" section: one table from the search's JSON, the winners, the pareto figure."""

import json
from dataclasses import replace

import pytest

from oomlab.remedies.hardware import HardwareSearch, search_hardware
from oomlab.remedies.hardware_display import HARDWARE_HEADERS, hardware_rows, option_row, render_search, winners
from oomlab.report import hardware as rh

GPUS = ["t4", "a10g", "h100-80gb"]


@pytest.fixture(scope="module")
def data() -> dict:
    search = search_hardware("qwen2.5-0.5b", ["lora"], gpus=GPUS, max_gpus=4)
    return json.loads(json.dumps(search.to_dict()))  # as read back from the results JSON


def test_compact_table_has_one_row_per_gpu_type_then_the_winners(data) -> None:
    """Per GPU type the fewest that fit; every ranking winner and pareto row appears once."""
    rows = rh.hardware_rows(data)
    labels = [row[0] for row in rows]
    assert [label.split(" × ")[1] for label in labels[:len(GPUS)]] == GPUS  # in the order searched
    assert all(label.startswith("1 × ") for label in labels[:len(GPUS)])  # a 0.5B model fits one of each
    for key in ("cheapest", "fastest", "fewest_gpus"):
        assert labels.count(data[key]) == 1
    assert len(labels) == len(set(labels))
    assert all(len(row) == len(HARDWARE_HEADERS) for row in rows)


def test_full_table_and_marks(data) -> None:
    """compact=False lists every searched row; the ranking column names each winner."""
    rows = rh.hardware_rows(data, compact=False)
    assert len(rows) == len(data["options"]) == len(GPUS) * 3
    by_label = {row[0]: row for row in rows}
    assert "cheapest" in by_label[data["cheapest"]][-1] and "fastest" in by_label[data["fastest"]][-1]
    for label in data["pareto"]:
        assert "pareto" in by_label[label][-1]


def test_a_row_where_nothing_fits_shows_the_reason(data) -> None:
    """A row without a remedy carries its reason and dashes."""
    search = HardwareSearch.from_dict(data)
    option = replace(search.options[0], remedy=None, reason="none of 3 configurations fits; the closest, ...")
    assert option_row(search, option) == ("1 × t4", option.reason, "-", "-", "-", "-", "-", "")


def test_the_report_rebuilds_the_search(data) -> None:
    """The results JSON gives back the search the CLI shows: the same rows, rankings and pareto front."""
    search = search_hardware("qwen2.5-0.5b", ["lora"], gpus=GPUS, max_gpus=4)
    rebuilt = HardwareSearch.from_dict(data)
    assert rebuilt == search  # the remedies without their setup and step time, which compare=False
    stored = json.loads(json.dumps(data))  # a copy: the fixture is shared
    again = json.loads(json.dumps(rebuilt.to_dict()))
    for o in (*again["options"], *stored["options"]):
        if o["remedy"] is not None:
            del o["remedy"]["step_time"]  # not read back: the display needs none of it
    assert again == stored
    assert rh.hardware_rows(data, compact=False) == hardware_rows(search, compact=False)
    assert rh.winners(data) == winners(replace(search, seconds=None))  # the results JSON keeps no timing


def test_an_unpriced_row_says_so_in_every_view(data) -> None:
    """A fitting row the price table does not list: "no list price" in the table, no cost in the winners."""
    search = HardwareSearch.from_dict(data)
    fastest = search.fastest
    unpriced = replace(search, options=tuple(replace(o, price=None) if o == fastest else o for o in search.options))
    row = next(r for r in hardware_rows(unpriced, compact=False) if r[0] == fastest.label)
    assert row[6] == "no list price"
    assert "per million tokens" not in winners(unpriced).split("**fastest**")[1].split(";")[0]


def test_winners_sentence(data) -> None:
    """The three winners and the price source, in one paragraph (no search time: the results keep none)."""
    text = rh.winners(data)
    for title in ("**cheapest per token**", "**fastest**", "**fewest GPUs**"):
        assert title in text
    assert "searched in" not in text and "list prices" in text
    assert data["fastest"] in text
    assert "$" not in text  # Jupyter's Markdown would read a pair of dollars as math


def test_winners_say_dollars_as_the_cli_and_the_header_do(data) -> None:
    """One currency wording: the CLI's "$0.123 per million tokens" (its header "$/M tok"), and the same "$" in the
    report's Markdown, written as an entity so that the rendered page shows it and the bold around it."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    search = HardwareSearch.from_dict(data)
    cost = f"{search.cheapest.usd_per_million_tokens:.3f}"
    assert f", &#36;{cost} per million tokens)" in rh.winners(data) and "USD" not in rh.winners(data)
    page = markdown2html_mistune(rh.winners(data))
    assert f"${cost} per million tokens" in page and "**" not in page and page.count("<strong>") == 3
    text = render_search(search)
    assert f", ${cost} per million tokens)" in text and "$/M tok" in text and "USD" not in text


def test_pareto_figure_labels_the_front(data) -> None:
    """Points are the priced fitting rows; the front's are labelled GPU × count."""
    points = rh.cost_points(data)
    assert {p.label for p in points if p.on_front} == set(data["pareto"])
    fig = rh.plot_hardware_pareto(data)
    texts = {t.get_text() for t in fig.axes[0].texts}
    assert texts == set(data["pareto"])


def test_headers_are_read_from_their_home() -> None:
    """The report's hardware section re-exports nothing: the table's headers are hardware_display's alone."""
    assert not hasattr(rh, "HARDWARE_HEADERS") and HARDWARE_HEADERS[0] == "hardware"
