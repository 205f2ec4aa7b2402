"""What the hardware search remembers per twin (a setup on another GPU type) reads nothing of the GPU: a candidate's
step-time terms and whether the plan could recommend it are the same for its twin on every GPU type; the grid's
``routes`` narrowing leaves out only what the search never recommends."""

from dataclasses import replace

import pytest

from oomlab.core.choices import Method, Route, Strategy
from oomlab.core.gpus import known_gpus, load_gpu
from oomlab.core.models import load_model
from oomlab.core.setup import make_setup
from oomlab.remedies import throughput
from oomlab.remedies.hardware import search_hardware
from oomlab.remedies.plan import Candidate, plan_grid
from oomlab.remedies.throughput import DEFAULT_ASSUMPTIONS, step_time, traffic
from oomlab.remedies.twins import twin_key

# the GPU types that differ most in what the budget and the speed read: no bf16 (T4), PCIe without NVLink (L40S),
# NVLink Hopper (H100), the most memory (H200)
GPUS = ("t4", "l40s", "h100-80gb", "h200")


def _candidates(model: str, gpu: str, gpus: int, nodes: int = 1) -> list[Candidate]:
    return [c for c in plan_grid(load_model(model), load_gpu(gpu), gpus, nodes, batch=1, seq=2048, attention="sdpa",
                                 lora_rank=8) if c.setup is not None]


@pytest.mark.parametrize(("model", "gpus", "nodes"), [
    ("llama-2-7b", 1, 1),  # one GPU: no collectives
    ("llama-2-7b", 8, 1),  # every strategy, DeepSpeed's offloads (host link, host optimizer), QLoRA's dequantization
    ("qwen3-30b-a3b", 4, 2),  # experts (MoE), two nodes
])
def test_twins_share_their_traffic(model: str, gpus: int, nodes: int) -> None:
    """A candidate's FLOPs, collective, host-link, host-optimizer and dequantization terms are those of its twin on
    every other GPU type, so step_time may remember them by twin."""
    checked = 0
    for c in _candidates(model, GPUS[0], gpus, nodes):
        mine = traffic(c.setup)
        for other in GPUS[1:]:
            assert traffic(replace(c.setup, gpu=load_gpu(other))) == mine, (c, other)
            checked += 1
    assert checked > 100


def test_step_time_is_the_same_remembered_or_not() -> None:
    """step_time of a setup whose twin on another GPU type was asked first equals step_time asked cold."""
    setups = [make_setup(model="llama-2-7b", gpu=g, gpus=4, strategy=s, method=m, optimizer="adamw")
              for g in GPUS[1:] for s in (Strategy.FSDP2, Strategy.ZERO3_OFFLOAD, Strategy.DDP)
              for m in (Method.FULL, Method.LORA)]
    throughput._TRAFFIC.clear()
    cold = [step_time(s, DEFAULT_ASSUMPTIONS, batch=b) for s in setups for b in (1, 8)]
    throughput._TRAFFIC.clear()
    for s in setups:  # each setup's twin on the T4 first
        step_time(replace(s, gpu=load_gpu("t4")), DEFAULT_ASSUMPTIONS)
    assert [step_time(s, DEFAULT_ASSUMPTIONS, batch=b) for s in setups for b in (1, 8)] == cold
    assert len({twin_key(s) for s in setups}) == len(setups) // len(GPUS[1:])  # twins, and only twins, share a key


@pytest.mark.parametrize(("model", "gpus"), [("llama-2-70b", 1), ("llama-2-70b", 4), ("gemma-2-9b", 2)])
def test_twins_share_may_recommend(model: str, gpus: int) -> None:
    """Whether the plan could recommend a candidate (launch files, no harmful caveat) is the same for its twin on
    every GPU type."""
    for c in _candidates(model, GPUS[0], gpus):
        for other in GPUS[1:]:
            assert replace(c, setup=replace(c.setup, gpu=load_gpu(other))).may_recommend == c.may_recommend, c


@pytest.mark.parametrize("gpu", known_gpus())
def test_device_map_route_is_never_recommended(gpu: str) -> None:
    """The any-GPU search's grid (process per GPU only) is the full grid's candidates the plan could recommend: no
    device-map candidate could be."""
    spec, gpu_spec = load_model("llama-2-13b"), load_gpu(gpu)
    full = list(plan_grid(spec, gpu_spec, 4, 1, batch=1, seq=2048, attention="sdpa", lora_rank=8))
    narrowed = list(plan_grid(spec, gpu_spec, 4, 1, batch=1, seq=2048, attention="sdpa", lora_rank=8,
                              routes=(Route.PROCESS_PER_GPU,)))
    assert any(c.route is Route.DEVICE_MAP and c.setup is not None for c in full)
    assert [c for c in full if c.may_recommend] == [c for c in narrowed if c.may_recommend]
    assert narrowed == [c for c in full if c.route is Route.PROCESS_PER_GPU]


def test_rows_are_shown_as_given_whatever_the_search_order() -> None:
    """The search budgets the largest GPUs first, but shows the rows in the order given, each as searched alone."""
    search = search_hardware("llama-2-7b", methods=["lora"], gpus=["t4", "h200", "a10g"], max_gpus=2)
    assert [o.label for o in search.options] == ["1 × t4", "2 × t4", "1 × h200", "2 × h200", "1 × a10g", "2 × a10g"]
    for gpu in ("t4", "h200", "a10g"):
        alone = search_hardware("llama-2-7b", methods=["lora"], gpus=[gpu], max_gpus=2)
        assert [o.to_dict() for o in search.options if o.gpu == gpu] == [o.to_dict() for o in alone.options]
