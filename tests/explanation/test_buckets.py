"""oomlab.explanation.buckets: DDP's gradient buckets and DeepSpeed's reduce buckets, hand-computed."""

import pytest

from oomlab.core.units import MiB
from oomlab.explanation.aggregate import parameter_inventory
from oomlab.explanation.buckets import ddp_bucket_sizes, ddp_buckets, reduce_buckets


@pytest.mark.parametrize(
    ("numels", "itemsize", "buckets"),
    [
        # the first bucket closes past 1 MiB (400 B + 1.2 MB), each later one past 25 MiB; the rest is the last
        ((100, 300_000, 7_000_000, 7_000_000, 1_000), 4,
         [(1_200_400, (0, 1)), (28_000_000, (2,)), (28_000_000, (3,)), (4_000, (4,))]),
        # in half: 600,200 B stays under 1 MiB, so the first bucket takes the first 7M too; 14 MB is under 25 MiB
        ((100, 300_000, 7_000_000, 7_000_000, 1_000), 2, [(14_600_200, (0, 1, 2)), (14_002_000, (3, 4))]),
        # exactly at a cap closes the bucket (size >= cap)
        ((MiB // 4, 25 * MiB // 4, 1), 4, [(MiB, (0,)), (25 * MiB, (1,)), (4, (2,))]),
    ],
)
def test_ddp_bucket_sizes(numels, itemsize, buckets) -> None:
    """Buckets as the Reducer fills them: whole parameters until the cap is reached."""
    assert ddp_bucket_sizes(numels, itemsize) == buckets


def test_ddp_first_bucket_is_every_parameter() -> None:
    """Before the first backward DDP holds one bucket of every gradient: llama-2-7b's 6,738,415,616 in fp32."""
    first = next(ddp_buckets(parameter_inventory("llama-2-7b")))
    assert first.nbytes == 6_738_415_616 * 4 and first.phases == frozenset()


def test_reduce_buckets() -> None:
    """5e8 elements (DeepSpeed's default) and hidden_size² (the Trainer's "auto"), in half and fp32."""
    sizes = [a.nbytes for a in reduce_buckets(parameter_inventory("llama-2-7b"))]
    assert sizes == [1_000_000_000, 2_000_000_000, 4096 * 4096 * 2, 4096 * 4096 * 4]
