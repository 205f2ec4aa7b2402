"""``plan --any-gpu``'s answer does not depend on how fast it is found: the search that skips candidates by their floors
(:mod:`oomlab.remedies.peak_floor`) equals the search that budgets every candidate it reaches, row for row and figure
for figure, and each row equals an evaluation of every candidate of the plan's grid."""

import pytest

from oomlab.core.gpus import load_gpu
from oomlab.core.models import load_model
from oomlab.remedies.hardware import search_hardware
from oomlab.remedies.plan import make_plan, plan_grid, rank_key
from oomlab.remedies.remedy import Evaluator, reason, remedy_name
from oomlab.remedies.throughput import DEFAULT_ASSUMPTIONS, step_time


@pytest.mark.heavy  # each search twice: about 40 s in all
@pytest.mark.parametrize(("model", "kwargs"), [
    ("llama-2-70b", {}),  # the command: every GPU type x 1, 2, 4, 8
    ("llama-13b", {}),
    ("llama-3.1-8b", {"methods": ["qlora"]}),
    ("llama-2-70b", {"methods": ["full"]}),  # rows where nothing fits: their closest candidates
    ("mixtral-8x7b", {"gpus": ["t4", "a10g", "l40s", "a100-80gb", "h200"]}),  # experts (slow budgets: five GPU types)
    ("qwen3-30b-a3b", {"gpus": ["l4", "h100-80gb"], "max_gpus": 4, "nodes": (1, 2)}),  # whole nodes
    ("llama-7b", {"methods": ["lora", "full"], "host_ram": "64GiB"}),  # the host RAM given: rows short of it
])
def test_floors_change_no_answer(model: str, kwargs: dict) -> None:
    """Every row, its reason, its counts and the rankings are those of the search without floors."""
    fast = search_hardware(model, **kwargs)
    assert fast.to_dict() == search_hardware(model, use_floors=False, **kwargs).to_dict()


@pytest.mark.heavy  # every candidate budgeted on four rows
@pytest.mark.parametrize(("gpu", "gpus"), [("a10g", 1), ("l4", 1), ("t4", 1), ("v100-16gb", 1)])
def test_closest_is_that_of_every_candidate(gpu: str, gpus: int) -> None:
    """Where nothing fits (70B on one small GPU), the reason names the closest of every candidate budgeted in full:
    the one that fits the GPU if any does, else the smallest peak, the first in the search's order among equals."""
    search = search_hardware("llama-2-70b", gpus=["h100-80gb", "l40s", gpu], max_gpus=gpus)
    row = next(o for o in search.options if o.gpu == gpu)
    assert row.remedy is None
    spec, gpu_spec = load_model("llama-2-70b"), load_gpu(gpu)
    cands = [c for c in plan_grid(spec, gpu_spec, gpus, 1, batch=1, seq=2048, attention="sdpa", lora_rank=8)
             if c.may_recommend]
    order = sorted(range(len(cands)), key=lambda i: (rank_key(True, True, step_time(
        cands[i].setup, DEFAULT_ASSUMPTIONS, cands[i].route, batch=8).tokens_per_s, cands[i].optimizer, 0)[2], i))
    evaluate = Evaluator(row.host_ram_bytes, None)
    budgets = [(evaluate(cands[i].setup, route=cands[i].route), cands[i]) for i in order]
    assert not any(ev.fits for ev, _ in budgets)
    ev, c = min(budgets, key=lambda e: (not e[0].gpu_fits, e[0].per_gpu_peak_bytes))
    name = remedy_name(c.route, c.strategy, c.method, c.precision, c.optimizer, c.checkpointing, 8)
    assert row.reason == (f"none of {len(cands)} configurations fits; the closest, {name}: "
                          f"{reason(ev, c.setup, row.host_ram_bytes)}")
    assert row.candidates == row.budgeted == len(cands)


@pytest.mark.heavy  # a whole plan per row
@pytest.mark.parametrize(("gpu", "gpus"), [("a100-40gb", 2), ("t4", 2), ("rtx-4090", 1)])
def test_row_after_other_gpu_types_is_the_plans_recommendation(gpu: str, gpus: int) -> None:
    """A row searched after other GPU types (so with their floors) is make_plan's fastest sound remedy there, which
    budgets every candidate of the grid in full."""
    search = search_hardware("llama-2-7b", gpus=["h200", "a10g", gpu], max_gpus=gpus, host_ram="192GiB")
    row = next(o for o in search.options if o.gpu == gpu and o.gpus == gpus)
    rec = make_plan(model="llama-2-7b", gpu=gpu, gpus=gpus, host_ram="192GiB").fastest
    assert row.remedy is not None and rec is not None
    assert row.remedy.to_dict() == {**rec.to_dict(), "max_seq": None}  # the search skips the length search
