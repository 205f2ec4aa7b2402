"""Which GPUs would it fit: the search equals the plan's recommendation, counts, prices, rankings, the pareto front."""

import json

import pytest

from oomlab.core.choices import Method
from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.prices import load_prices, row_price
from oomlab.remedies.hardware import HardwareSearch, gpu_counts, node_counts, search_hardware
from oomlab.remedies.hardware_display import render_search
from oomlab.remedies.plan import make_plan

SMALL = "qwen2.5-0.5b"


@pytest.fixture(scope="module")
def small() -> HardwareSearch:
    return search_hardware(SMALL, gpus=["t4", "a10g", "a100-80gb", "h100-80gb"], max_gpus=4)


@pytest.mark.parametrize(("model", "gpu", "gpus"), [
    ("llama-13b", "t4", 4),  # the seed's hardware: recommend() takes rank 12 for its headroom; label twins folded
    ("llama-2-7b", "a10g", 1),  # one GPU: rank 1, with label twins folded into it
    ("llama-2-7b", "a100-80gb", 2),  # room to spare: the bound stops the search early
])
def test_each_row_is_the_plans_recommendation(model: str, gpu: str, gpus: int) -> None:
    """Branch and bound finds exactly the fastest sound remedy of make_plan's grid on that hardware (what the
    hardware search ranks; the fix of the user's own run is the ladder's, Plan.fix)."""
    search = search_hardware(model, gpus=[gpu], max_gpus=gpus, host_ram="192GiB")
    row = next(o for o in search.options if o.gpus == gpus)
    rec = make_plan(model=model, gpu=gpu, gpus=gpus, host_ram="192GiB").fastest
    assert row.remedy is not None and rec is not None
    assert row.remedy.to_dict() == {**rec.to_dict(), "max_seq": None}  # the search skips the length search
    assert row.budgeted <= row.candidates


def test_a_row_where_nothing_fits_names_the_closest() -> None:
    """70B on one T4: no remedy, and the reason names the closest configuration and its shortfall."""
    search = search_hardware("llama-2-70b", ["lora"], gpus=["t4"], max_gpus=1)
    (row,) = search.options
    assert row.remedy is None and not row.fits and row.usd_per_million_tokens is None
    assert row.reason.startswith(f"none of {row.candidates} configurations fits; the closest, ")
    assert row.budgeted == row.candidates  # nothing fits: every candidate budgeted
    assert search.cheapest is search.fastest is search.fewest_gpus is None and search.pareto == ()


@pytest.mark.parametrize(("max_gpus", "counts"), [
    (1, (1,)),
    (6, (1, 2, 4, 6)),  # not a power of two: the powers below, then itself
    (8, (1, 2, 4, 8)),
])
def test_gpu_counts(max_gpus: int, counts: tuple[int, ...]) -> None:
    """Powers of two up to max_gpus, and max_gpus itself."""
    assert gpu_counts(max_gpus) == counts


@pytest.mark.parametrize("bad", [0, 73, True])
def test_gpu_counts_refuses(bad) -> None:
    """Zero, more than a node holds, and a bool are named."""
    with pytest.raises(InvalidValueError, match=rf"invalid max_gpus {bad!r}; must be an integer from 1 to 72"):
        gpu_counts(bad)


def test_node_counts() -> None:
    """1, 2, 4, ... up to the nodes given; 0 refused."""
    assert node_counts(1) == (1,) and node_counts(3) == (1, 2, 3)
    with pytest.raises(InvalidValueError, match="invalid nodes 0; must be an integer from 1 to 1024"):
        node_counts(0)


@pytest.mark.parametrize("bad", [0, 1025, True])
def test_search_refuses_node_counts_as_node_counts_does(bad) -> None:
    """search_hardware's own nodes are checked by the same rule and message as node_counts'."""
    with pytest.raises(InvalidValueError, match=rf"invalid nodes {bad!r}; must be an integer from 1 to 1024"):
        search_hardware(SMALL, ["lora"], gpus=["a10g"], max_gpus=1, nodes=(bad,))
    with pytest.raises(InvalidValueError, match=rf"invalid nodes {bad!r}; must be an integer from 1 to 1024"):
        node_counts(bad)


def test_from_dict_round_trip(small) -> None:
    """The results JSON rebuilds the search: the same rows (prices and remedies included) and rankings."""
    rebuilt = HardwareSearch.from_dict(json.loads(json.dumps(small.to_dict())))
    assert rebuilt == small
    assert (rebuilt.cheapest, rebuilt.fastest, rebuilt.fewest_gpus, rebuilt.pareto) == (
        small.cheapest, small.fastest, small.fewest_gpus, small.pareto)
    assert rebuilt.options[0].price.instance == small.options[0].price.instance


def test_nodes_search_whole_nodes() -> None:
    """Two nodes are searched with full nodes of max_gpus, priced per node."""
    search = search_hardware(SMALL, ["lora"], gpus=["a100-80gb"], max_gpus=8, nodes=(1, 2))
    two = [o for o in search.options if o.nodes == 2]
    assert [(o.gpus, o.world_size, o.label) for o in two] == [(8, 16, "2 nodes × 8 × a100-80gb")]
    one = next(o for o in search.options if o.nodes == 1 and o.gpus == 8)
    assert two[0].price.usd_per_hour == pytest.approx(2 * one.price.usd_per_hour)


def test_row_price_exact_instance_and_fallback() -> None:
    """An instance with exactly that many GPUs, else GPU-hours at the cheapest $/GPU-hour (said so)."""
    table = load_prices()
    exact = row_price(table, "t4", 4, 1)
    four = [i for i in table.for_gpu("t4") if i.gpus_per_instance == 4]
    assert exact.usd_per_hour == min(i.usd_per_hour for i in four)
    counts = {i.gpus_per_instance for i in table.for_gpu("t4")}
    missing = next(n for n in (3, 5, 6, 7) if n not in counts)
    fallback = row_price(table, "t4", missing, 1)
    cheapest = table.cheapest_per_gpu_hour("t4")
    assert fallback.usd_per_hour == pytest.approx(missing * cheapest.usd_per_gpu_hour)
    assert f"no {missing}-GPU instance listed" in fallback.basis


def test_users_price_table(tmp_path) -> None:
    """A user's table prices the rows: only its GPUs get a cost, at its price."""
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"instances": [
        {"provider": "mine", "instance": "box", "gpu": "t4", "gpus_per_instance": 1, "usd_per_hour": 0.1}]}))
    search = search_hardware(SMALL, ["lora"], gpus=["t4", "a10g"], max_gpus=1, prices=str(path))
    t4, a10g = search.options
    assert t4.price.usd_per_hour == 0.1 and a10g.price is None and a10g.usd_per_million_tokens is None
    assert t4.usd_per_million_tokens == pytest.approx(0.1 / (t4.tokens_per_s * 3600) * 1e6)
    assert search.cheapest is t4 and search.prices_source == f"price table {str(path)!r}"


def test_rankings(small) -> None:
    """Cheapest = least $/M tokens, fastest = most tokens/s, fewest = fewest GPUs that fit, over fitting rows."""
    fitting = small.fitting
    assert fitting
    assert small.cheapest.usd_per_million_tokens == min(o.usd_per_million_tokens for o in small.priced)
    assert small.fastest.tokens_per_s == max(o.tokens_per_s for o in fitting)
    assert small.fewest_gpus.world_size == min(o.world_size for o in fitting) == 1


def test_pareto_front(small) -> None:
    """No front row is beaten on both axes; every other priced row is; cheapest and fastest priced are on it."""
    front = small.pareto
    for o in front:
        assert not any(p.usd_per_million_tokens <= o.usd_per_million_tokens and p.tokens_per_s >= o.tokens_per_s
                       and p is not o and (p.usd_per_million_tokens, p.tokens_per_s)
                       != (o.usd_per_million_tokens, o.tokens_per_s) for p in small.priced)
    for o in set(small.priced) - set(front):
        assert any(p.usd_per_million_tokens <= o.usd_per_million_tokens and p.tokens_per_s >= o.tokens_per_s
                   for p in front)
    assert small.cheapest in front
    assert [o.usd_per_million_tokens for o in front] == sorted(o.usd_per_million_tokens for o in front)


def test_methods_restrict_the_search() -> None:
    """--method qlora: every row's remedy is QLoRA; an unknown method is named."""
    search = search_hardware(SMALL, ["qlora"], gpus=["a10g"], max_gpus=2)
    assert search.methods == (Method.QLORA,)
    assert {o.remedy.method for o in search.fitting} == {Method.QLORA}
    with pytest.raises(UnknownNameError, match="unknown method 'lorax'; known: full, lora, qlora"):
        search_hardware(SMALL, ["lorax"], gpus=["a10g"], max_gpus=1)


def test_to_dict_and_render(small) -> None:
    """JSON has integer bytes and the winners' labels; the text names the three winners and the front."""
    data = json.loads(json.dumps(small.to_dict()))
    assert data["cheapest"] == small.cheapest.label and data["fastest"] == small.fastest.label
    row = data["options"][0]
    assert isinstance(row["per_gpu_peak_bytes"], int) and isinstance(row["gpu_capacity_bytes"], int)
    text = render_search(small)
    for title in ("cheapest per token", "fastest", "fewest GPUs", "pareto front"):
        assert title in text
    assert small.fastest.remedy.name in text


def test_seq_beyond_the_models_context_is_refused() -> None:
    """A sequence past max_position_embeddings is named before any work."""
    with pytest.raises(InvalidValueError, match="invalid seq 10000000"):
        search_hardware(SMALL, seq=10_000_000)
