"""The price table: shipped list prices with sources, a user's table read the same way, bad tables named."""

import json

import pytest

from oomlab.core.errors import InvalidValueError
from oomlab.core.gpus import known_gpus
from oomlab.core.prices import PriceTable, assumed_host_ram, load_prices


def test_shipped_prices_cover_every_gpu_with_a_source_and_a_date() -> None:
    """Every shipped GPU has at least one dated, sourced price; the seed's g4dn.12xlarge is $3.912/h for 4 x T4."""
    table = load_prices()
    assert {i.gpu for i in table.instances} == set(known_gpus())
    assert all(i.source.startswith("https://github.com/skypilot-org/skypilot-catalog/blob/") for i in table.instances)
    assert all(i.date for i in table.instances)
    seed = next(i for i in table.instances if i.instance == "g4dn.12xlarge")
    assert (seed.gpu, seed.gpus_per_instance, seed.usd_per_hour) == ("t4", 4, 3.912)
    assert seed.usd_per_gpu_hour == pytest.approx(0.978)
    assert table.host_for("t4", 4).host_ram_bytes == 192 * 2**30


def test_cheapest_per_gpu_hour_is_the_minimum() -> None:
    table = load_prices()
    for gpu in known_gpus():
        best = table.cheapest_per_gpu_hour(gpu)
        assert best.usd_per_gpu_hour == min(i.usd_per_gpu_hour for i in table.for_gpu(gpu))


def test_unreliable_host_ram_is_not_used() -> None:
    """RunPod's catalog states GPU memory as host RAM: those rows carry no host RAM."""
    table = load_prices()
    assert all(i.host_ram_bytes is None for i in table.instances if i.provider == "runpod")


def test_user_table(tmp_path) -> None:
    """A user's table replaces the shipped one; a GPU oomlab does not know is left out."""
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"instances": [
        {"provider": "mine", "instance": "box", "gpu": "a100-80gb", "gpus_per_instance": 8, "usd_per_hour": 8.0},
        {"provider": "mine", "instance": "other", "gpu": "mi300x", "gpus_per_instance": 8, "usd_per_hour": 9.0}]}))
    table = load_prices(path)
    assert [i.instance for i in table.instances] == ["box"] and table.instances[0].usd_per_gpu_hour == 1.0
    assert "mine.json" in table.source


@pytest.mark.parametrize(("content", "message"), [
    ("[]", "must be an object with a list 'instances'"),
    ('{"instances": [{"provider": "x"}]}', "instance 0 lacks instance, gpu, gpus_per_instance, usd_per_hour"),
    ('{"instances": [{"provider": "x", "instance": "y", "gpu": "t4", "gpus_per_instance": 0, "usd_per_hour": 1}]}',
     "gpus_per_instance 0"),
    ('{"instances": [{"provider": "x", "instance": "y", "gpu": "t4", "gpus_per_instance": 1, "usd_per_hour": -1}]}',
     "usd_per_hour -1"),
    ("{not json", "is not valid JSON: line 1"),
])
def test_bad_tables_are_refused_naming_the_problem(tmp_path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(InvalidValueError, match=message.replace("(", r"\(")):
        load_prices(path)


def test_missing_table_says_file_not_found(tmp_path) -> None:
    with pytest.raises(InvalidValueError, match="file not found"):
        load_prices(tmp_path / "nope.json")


def test_a_gpu_no_table_lists_falls_back_to_the_seeds_machine_read_from_the_shipped_table() -> None:
    """With no instance of the GPU in the table, host_ram auto is the seed's 4 x T4 machine, its figure and name read
    from specs/prices.json (not a typed-in 192 GiB), and said to be oomlab's fallback."""
    seed = load_prices().host_for("t4", 4)
    found = assumed_host_ram("h100", 8, PriceTable((), "an empty table"))
    assert found.assumed and found.host_ram_bytes == seed.host_ram_bytes
    assert "no h100 instance is listed" in found.source and seed.label in found.source
    assert "seed" not in found.source  # said to a user of another case, who never read the seed report
