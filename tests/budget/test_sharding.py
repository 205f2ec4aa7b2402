"""Tests for oomlab.budget.sharding: the per-GPU share of each model-state category, with several nodes too.

The shard divisor is the world size, GPUs per node x nodes (a ZeRO/FSDP group spans every rank of the job).
Figures are hand-computed from llama-13b's 13,015,864,320 parameters.
"""

from __future__ import annotations

import pytest

from oomlab.budget.api import estimate
from oomlab.budget.deepspeed_layout import flat_partition
from oomlab.budget.estimator import estimate_setup
from oomlab.budget.result import MemCategory, Phase
from oomlab.budget.sharding import SHARES, Share, per_gpu
from oomlab.budget.states import gradients_on_gpu, optimizer_on_gpu, weights_on_gpu
from oomlab.core.choices import Strategy
from oomlab.core.setup import make_setup

N = 13_015_864_320  # llama-13b's parameters
W, G, OPT = MemCategory.WEIGHTS, MemCategory.GRADIENTS, MemCategory.OPTIMIZER_STATE
M = MemCategory.MASTER_WEIGHTS
ROTARY = 512  # llama-13b's fp32 rotary buffers, which DeepSpeed does not cast


def setup(strategy: str, gpus: int, nodes: int):
    return make_setup("llama-13b", "a100-80gb", gpus=gpus, nodes=nodes, strategy=strategy, precision="bf16-mixed")


def test_world_size_is_gpus_times_nodes() -> None:
    assert setup("fsdp", 4, 2).world_size == 8 and setup("fsdp", 8, 1).world_size == 8
    assert setup("fsdp", 2, 3).world_size == 6


@pytest.mark.parametrize(
    ("gpus", "nodes", "total", "expected"),
    [
        (4, 2, 80, 10),  # 8 ranks over 2 nodes, not 4
        (8, 1, 80, 10),
        (4, 1, 80, 20),
        (4, 2, 81, 11),  # rounded up: the last rank's shard is padded, never lost
        (3, 3, 10, 2),  # 9 ranks: ceil(10 / 9)
    ],
)
def test_sharded_share_divides_by_the_world(gpus: int, nodes: int, total: int, expected: int) -> None:
    """A SHARDED category holds ceil(total / (gpus x nodes)) bytes per GPU."""
    assert per_gpu(setup("fsdp", gpus, nodes), W, total) == expected


@pytest.mark.parametrize("strategy", [s for s in Strategy if s.value != "device-map"
                                      and any(v is Share.SHARDED for v in SHARES.get(s, {}).values())])
def test_every_sharded_strategy_shards_over_nodes(strategy: Strategy) -> None:
    """Each strategy's sharded categories on 4 GPUs x 2 nodes equal those on 8 GPUs x 1 node, half those on 4 x 1."""
    try:
        two_nodes, one_node, small = (setup(strategy.value, g, n) for g, n in ((4, 2), (8, 1), (4, 1)))
    except ValueError as err:  # a strategy this setup cannot run (named in the error)
        pytest.skip(str(err))
    for category, how in SHARES[strategy].items():
        if how is Share.SHARDED:
            total = 8 * 10**9 + 7
            assert per_gpu(two_nodes, category, total) == per_gpu(one_node, category, total) == -(-total // 8)
            assert per_gpu(small, category, total) == -(-total // 4)


@pytest.mark.parametrize(
    ("strategy", "weights", "gradients", "optimizer"),
    [
        # FSDP, bf16-mixed: fp32 flat parameters (4N) and gradients (4N), Adam's two fp32 states (8N), all / 8
        ("fsdp", 4 * N // 8, 4 * N // 8, 8 * N // 8),
        ("fsdp2", 4 * N // 8, 4 * N // 8, 8 * N // 8),
        # DDP: a replica, whatever the nodes
        ("ddp", 4 * N, 4 * N, 8 * N),
    ],
)
def test_llama_13b_on_two_nodes(strategy: str, weights: int, gradients: int, optimizer: int) -> None:
    """Full-size figures on 4 GPUs x 2 nodes, hand-computed: the divisor is 8."""
    s = setup(strategy, 4, 2)
    assert (weights_on_gpu(s), gradients_on_gpu(s), optimizer_on_gpu(s)) == (weights, gradients, optimizer)


@pytest.mark.parametrize("strategy", ["zero1", "zero2"])
def test_zero12_llama_13b_on_two_nodes(strategy: str) -> None:
    """estimate()'s ZeRO-1/2 optimizer step on 4 GPUs x 2 nodes: the half replica whole (2N and the rotary buffers),
    the half gradient partition (whole parameters of the rank's share: ZeRO-1 too, not a replica), the fp32 master
    (4N) and Adam (8N) / 8."""
    s = setup(strategy, 4, 2)
    step = estimate_setup(s, 0).phases[Phase.OPTIMIZER]
    part = flat_partition(s)
    assert part.partition == N // 8 < part.in_partition < N // 4
    assert (step[W], step[G], step[M], step[OPT]) == (2 * N + ROTARY, 2 * part.in_partition, 4 * N // 8, 8 * N // 8)


def _whole_model(strategy: Strategy, method: str) -> dict[MemCategory, int]:
    """The strategy's optimizer-step model states on one GPU (what a replica holds), DeepSpeed's from its
    non-offloaded sibling (an offloaded one holds nothing to compare)."""
    sibling = {Strategy.ZERO2_OFFLOAD: Strategy.ZERO2, Strategy.ZERO3_OFFLOAD: Strategy.ZERO3,
               Strategy.FSDP_OFFLOAD: Strategy.FSDP, Strategy.FSDP2_OFFLOAD: Strategy.FSDP2}.get(strategy, strategy)
    one = make_setup("llama-13b", "h100-80gb", gpus=1, strategy=sibling.value, method=method, precision="bf16-mixed")
    return dict(estimate_setup(one, 0).phases[Phase.OPTIMIZER])


@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.parametrize("strategy", [s for s in Strategy if s is not Strategy.SINGLE])
def test_estimate_holds_what_the_table_says(strategy: Strategy, method: str) -> None:
    """The one rule: in estimate()'s optimizer step on 8 GPUs each category is what SHARES says -- a WHOLE one the
    one-GPU figure, a SHARDED one about an eighth of it (DeepSpeed's padding and whole-parameter partitions above
    the exact eighth, well below a quarter), a HOST one nothing (but the rotary buffers)."""
    eight = make_setup("llama-13b", "h100-80gb", gpus=8, strategy=strategy.value, method=method,
                       precision="bf16-mixed")
    step, whole = dict(estimate_setup(eight, 0).phases[Phase.OPTIMIZER]), _whole_model(strategy, method)
    for category, how in SHARES[strategy].items():
        got, total = step.get(category, 0), whole.get(category, 0)
        if how is Share.HOST:  # DeepSpeed keeps the model's buffers (not parameters) on the GPU
            assert got == (ROTARY if strategy.deepspeed and category is W else 0), category
        elif how is Share.WHOLE:
            assert got == total, category
        elif total:  # SHARDED (a category the setup has at all)
            assert total // 8 <= got < total // 4, category


def test_estimate_on_two_nodes_is_that_of_eight_gpus() -> None:
    """The whole budget: FSDP on 4 x 2 holds the model state of 8 x 1 (not of 4 x 1)."""
    kwargs = {"model": "llama-13b", "gpu": "a100-80gb", "strategy": "fsdp", "precision": "bf16-mixed"}
    two, eight, four = (estimate(**kwargs, gpus=g, nodes=n) for g, n in ((4, 2), (8, 1), (4, 1)))
    for category in (W, OPT):  # at the peak (the optimizer step) the gradients are freed
        assert two.components[category] == eight.components[category] < four.components[category]
    assert two.components[W] == 4 * N // 8 == 6_507_932_160
