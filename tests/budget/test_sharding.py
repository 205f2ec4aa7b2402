"""Tests for oomlab.budget.sharding: the per-GPU share of each model-state category, with several nodes too.

The shard divisor is the world size, GPUs per node x nodes (a ZeRO/FSDP group spans every rank of the job).
Figures are hand-computed from llama-13b's 13,015,864,320 parameters.
"""

from __future__ import annotations

import pytest

from oomlab.budget.estimate import estimate
from oomlab.budget.result import MemCategory
from oomlab.budget.sharding import SHARES, Share, per_gpu
from oomlab.budget.states import gradients_on_gpu, master_weights_on_gpu, optimizer_on_gpu, weights_on_gpu
from oomlab.core.choices import Strategy
from oomlab.core.setup import make_setup

N = 13_015_864_320  # llama-13b's parameters
W, G, OPT = MemCategory.WEIGHTS, MemCategory.GRADIENTS, MemCategory.OPTIMIZER_STATE


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
    ("strategy", "weights", "gradients", "master", "optimizer"),
    [
        # FSDP, bf16-mixed: fp32 flat parameters (4N) and gradients (4N), Adam's two fp32 states (8N), all / 8
        ("fsdp", 4 * N // 8, 4 * N // 8, 0, 8 * N // 8),
        ("fsdp2", 4 * N // 8, 4 * N // 8, 0, 8 * N // 8),
        # ZeRO-1: half weights and gradients whole (2N each), fp32 master (4N) and Adam (8N) / 8
        ("zero1", 2 * N, 2 * N, 4 * N // 8, 8 * N // 8),
        # ZeRO-2: + half gradients / 8
        ("zero2", 2 * N, 2 * N // 8, 4 * N // 8, 8 * N // 8),
        # ZeRO-3: + half weights / 8
        ("zero3", 2 * N // 8, 2 * N // 8, 4 * N // 8, 8 * N // 8),
        # DDP: a replica, whatever the nodes
        ("ddp", 4 * N, 4 * N, 0, 8 * N),
    ],
)
def test_llama_13b_on_two_nodes(strategy: str, weights: int, gradients: int, master: int, optimizer: int) -> None:
    """Full-size figures on 4 GPUs x 2 nodes, hand-computed: the divisor is 8."""
    s = setup(strategy, 4, 2)
    got = (weights_on_gpu(s), gradients_on_gpu(s), master_weights_on_gpu(s), optimizer_on_gpu(s))
    assert got == (weights, gradients, master, optimizer)


def test_estimate_on_two_nodes_is_that_of_eight_gpus() -> None:
    """The whole budget: FSDP on 4 x 2 holds the model state of 8 x 1 (not of 4 x 1)."""
    kwargs = {"model": "llama-13b", "gpu": "a100-80gb", "strategy": "fsdp", "precision": "bf16-mixed"}
    two, eight, four = (estimate(**kwargs, gpus=g, nodes=n) for g, n in ((4, 2), (8, 1), (4, 1)))
    for category in (W, OPT):  # at the peak (the optimizer step) the gradients are freed
        assert two.components[category] == eight.components[category] < four.components[category]
    assert two.components[W] == 4 * N // 8 == 6_507_932_160
