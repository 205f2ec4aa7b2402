"""oomlab.explanation.model_copies: whole copies, partitions and shards, FSDP units and dequantized weights of
llama-2-7b, against hand-computed sizes."""

import pytest

from oomlab.core.choices import Strategy
from oomlab.core.models import load_model
from oomlab.explanation.aggregate import SOLVED_WORLD_SIZES, AggregateKind, parameter_inventory
from oomlab.explanation.context import RunContext
from oomlab.explanation.model_copies import dequantized, fsdp_units, partitions, whole_copies, world_sizes

N = 6_738_415_616  # llama-2-7b: 32 layers × 202,383,360 + embedding and LM head 2 × 32,000 × 4,096 + final norm 4,096
LAYER = 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096  # q/k/v/o, gate/up/down, two RMSNorms
ONE_D = 32 * 2 * 4096 + 4096  # the norms: llama has no biases


@pytest.fixture(scope="module")
def inv():
    return parameter_inventory("llama-2-7b")


def test_inventory(inv) -> None:
    """291 parameters, the 1-D ones the norms, 32 equal layers, the embedding the largest."""
    assert (inv.total, inv.one_d, inv.count, inv.largest) == (N, ONE_D, 291, 32_000 * 4096)
    assert inv.layers == tuple((i, LAYER) for i in range(32)) and LAYER == 202_383_360


def test_whole_copies(inv) -> None:
    """N × 4, × 2, × 1, × 0.5 bytes, each exact at its nominal size, at load or move."""
    copies = list(whole_copies(inv))
    assert [a.nbytes for a in copies] == [N * 4, N * 2, N, N // 2]
    assert [a.what for a in copies][:2] == ["a whole fp32 copy of the model", "a whole bf16/fp16 copy of the model"]
    assert copies[0].arithmetic == "6.74B parameters × 4 bytes = 25.10 GiB"


def test_world_sizes() -> None:
    """The world size given, or one GPU and the powers of two, each an assumption."""
    assert world_sizes(RunContext(world_size=6)) == ((6, None),)
    solved = world_sizes(RunContext())
    assert [w for w, _ in solved] == [1, *SOLVED_WORLD_SIZES] and solved[2] == (4, "the job has 4 GPUs")


def test_partition_span(inv) -> None:
    """ZeRO's fp32 gradient partition over 8: the Trainer's decay group alone at the low end, DeepSpeed's padding at the
    high end (8 elements a parameter, 2·W a group)."""
    grad = next(a for a in partitions(inv, RunContext(world_size=8)) if a.kind is AggregateKind.GRADIENT_PARTITION)
    assert grad.nbytes == N * 4 // 8 == 3_369_207_808
    assert grad.span == ((N - ONE_D) * 4 // 8, (N // 8 + 291 * 8 + 16) * 4)
    assert grad.strategies == frozenset({Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3})


def test_fsdp_units(inv) -> None:
    """A decoder layer's flat parameter in half and fp32, the root's (FSDP1) and FSDP2's embedding and head groups."""
    units = [(a.what, a.nbytes) for a in fsdp_units(inv, RunContext()) if "half" in a.what]
    assert units == [("decoder layer 0's flat parameter unsharded, in half (an FSDP unit)", LAYER * 2),
                     ("the root unit's (embedding, final norm, LM head) flat parameter unsharded, in half (an FSDP "
                      "unit)", (2 * 32_000 * 4096 + 4096) * 2),
                     ("the input embedding's flat parameter unsharded, in half (an FSDP unit)", 32_000 * 4096 * 2),
                     ("the final norm and LM head's flat parameter unsharded, in half (an FSDP unit)",
                      (32_000 * 4096 + 4096) * 2)]
    shards = [a for a in fsdp_units(inv, RunContext(world_size=8)) if a.kind is AggregateKind.UNIT_SHARD]
    assert shards[0].nbytes == LAYER * 4 // 8
    assert list(fsdp_units(inv, RunContext(strategy=Strategy.ZERO2))) == []  # not FSDP: no units


def test_dequantized() -> None:
    """Each distinct projection shape in half: q/k/v/o 4096 × 4096, gate/up 11008 × 4096, down 4096 × 11008."""
    got = [(a.what, a.nbytes) for a in dequantized(load_model("llama-2-7b"))]
    assert got == [("a 4-bit q_proj/k_proj/v_proj/o_proj weight dequantized to bf16/fp16", 4096 * 4096 * 2),
                   ("a 4-bit gate_proj/up_proj weight dequantized to bf16/fp16", 11008 * 4096 * 2),
                   ("a 4-bit down_proj weight dequantized to bf16/fp16", 4096 * 11008 * 2)]
