"""Tests for oomlab.remedies.throughput: FLOPs per token from the spec's geometry, host-link bytes by the sharding
table's HOST cells.  Figures hand-computed for llama-13b (40 layers, h = 5120, V = 32,000, 13,015,864,320 params)."""

from __future__ import annotations

import pytest

from oomlab.core.setup import make_setup
from oomlab.core.units import ceil_div
from oomlab.remedies.throughput import attention_flops_per_token, flops_per_token, host_link_bytes, matmul_parameters

N = 13_015_864_320


def _setup(strategy: str = "single", gpus: int = 1, checkpointing: bool = False):
    return make_setup("llama-13b", "h100-80gb", gpus=gpus, strategy=strategy, precision="bf16-mixed",
                      checkpointing=checkpointing)


def test_attention_flops_use_the_query_width() -> None:
    """QK^T and AV: 4 s d_attn per token per layer, d_attn = heads x head_dim = 5120."""
    assert attention_flops_per_token(_setup()) == 40 * 4 * 2048 * 5120


def test_recompute_skips_the_embedding() -> None:
    """Checkpointing recomputes the layers' forward, not the LM head's: 2 (N_matmul - V h) + attention."""
    s = _setup(checkpointing=True)
    assert flops_per_token(s).recompute == 2 * (matmul_parameters(s) - 32_000 * 5120) + attention_flops_per_token(s)


@pytest.mark.parametrize(("strategy", "expected"), [
    ("fsdp", 0), ("zero2", 0), ("zero3", 0),  # nothing on the host
    # FSDP offload (every state HOST): the fp32 shard in for forward and for backward, the fp32 gradients out
    ("fsdp-offload", 2 * ceil_div(4 * N, 4) + ceil_div(4 * N, 4)),
    # zero2-offload (weights WHOLE): the fp32 gradient partition out, the updated half partition back
    ("zero2-offload", ceil_div(6 * N, 4)),
])
def test_host_link_bytes_follow_the_host_cells(strategy: str, expected: int) -> None:
    """Only what the sharding table keeps on the host crosses the host link."""
    assert host_link_bytes(_setup(strategy, gpus=4)) == expected


def test_zero3_offload_moves_its_parameter_partitions() -> None:
    """zero3-offload (weights HOST): its half parameters in for every gather, forward and backward, beside the half
    gradient partition out -- and no updated partition back (it stays on the host)."""
    s = _setup("zero3-offload", gpus=4)
    assert host_link_bytes(s) == ceil_div(2 * N, 4) + 2 * ceil_div(2 * N, 4)
