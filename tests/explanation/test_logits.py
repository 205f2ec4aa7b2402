"""oomlab.explanation.logits: the logits' sizes for the batch and seq given, or the b × s a request allows."""

import pytest

from oomlab.core.models import load_model
from oomlab.explanation.aggregate import AggregateKind
from oomlab.explanation.context import RunContext
from oomlab.explanation.logits import logits
from oomlab.explanation.printed import printed_size
from oomlab.explanation.request import request_range

V = 32_000  # llama-2-7b's vocabulary


def test_given_batch_and_seq() -> None:
    """b × s × V in half and fp32, and the shifted copy b × (s − 1) × V."""
    got = [(a.kind, a.nbytes) for a in logits(load_model("llama-2-7b"), RunContext(batch=2, seq=2048), ())]
    assert got == [(AggregateKind.LOGITS, 2 * 2048 * V * 2), (AggregateKind.LOGITS, 2 * 2047 * V * 2),
                   (AggregateKind.LOGITS_FP32, 2 * 2048 * V * 4), (AggregateKind.LOGITS_FP32, 2 * 2047 * V * 4)]


@pytest.mark.parametrize(
    ("printed", "ctx", "solved"),
    [
        # 8 × 4096 fp32 logits of llama-2-7b: 4.00 GiB less 1.95 MiB (4,194,304,000 bytes) -> 4.00 GiB segment
        ("3.91 GiB", RunContext(), "b × s = 32,768 tokens (4 × 8192, 8 × 4096 or 16 × 2048)"),
        # the seq given: its batch
        ("3.91 GiB", RunContext(seq=4096), "b × s = 32,768 tokens (8 × 4096)"),
        # the batch given: its seq
        ("3.91 GiB", RunContext(batch=16), "b × s = 32,768 tokens (16 × 2048)"),
    ],
)
def test_solved_token_counts(printed: str, ctx: RunContext, solved: str) -> None:
    """Without both, the request's token count, named with the shapes that make it."""
    request = request_range(printed_size(*printed.split()))
    fp32 = [a for a in logits(load_model("llama-2-7b"), ctx, request) if a.kind is AggregateKind.LOGITS_FP32]
    assert fp32[0].solved == solved and fp32[0].nbytes == 32_768 * V * 4


def test_no_round_shape_no_candidate() -> None:
    """A token count that is no batch × power-of-two length is not offered: any count would match some shape."""
    request = request_range(printed_size("12.00", "MiB"))  # (10, 12] MiB: 82–98 fp32 tokens, under 128
    assert list(logits(load_model("llama-2-7b"), RunContext(), request)) == []
