"""oomlab.explanation.outside: the memory outside PyTorch a message's GPU should show -- the budget's own figure and
the shipped range around it -- and the anomaly only above that range."""

import pytest

from oomlab.core.choices import MessageFormat
from oomlab.core.gpus import load_gpu
from oomlab.core.outside import TorchEra, outside_memory
from oomlab.core.seed import seed_report_text
from oomlab.core.units import GiB, MiB
from oomlab.explanation.anomalies import AnomalyCode
from oomlab.explanation.explain import explain
from oomlab.explanation.outside import OutsideReading, expected_outside

# A V100-32GB rank (31.75 GiB), torch >= 2.1: total − free − reserved = 31.75 − 0.79 − (28.61 + 0.84) ≈ 1.50 GiB
V100_1_5 = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB. GPU 0 has a total capacity of "
            "31.75 GiB of which 812.00 MiB is free. Including non-PyTorch memory, this process has 30.95 GiB memory in "
            "use. Of the allocated memory 28.61 GiB is allocated by PyTorch, and 863.00 MiB is reserved by PyTorch but "
            "unallocated.")


def test_v100_rank_outside_is_the_expected_range() -> None:
    """1.5 GiB outside PyTorch on a V100 rank of 8: the budget counts 1.19 GiB (448 MiB context + 768 MiB NCCL) and
    the measured spread is 864 MiB – 2.17 GiB, so it reads as expected, not anomalous."""
    e = explain(V100_1_5, gpus=8)
    assert AnomalyCode.OUTSIDE_LARGE not in [a.code for a in e.anomalies]
    x = e.expected_outside
    assert x.budget_bytes == 448 * MiB + 768 * MiB == outside_memory(load_gpu("v100-32gb"), 8).total_bytes
    assert x.interval == (352 * MiB + 512 * MiB, 1200 * MiB + 1 * GiB)
    assert x.reading(e.outside) is OutsideReading.WITHIN
    assert ("— within the 864.00 MiB – 2.17 GiB expected on the v100-32gb under torch>=2.1, with NCCL for 8 GPUs "
            "(CUDA context 352.00 MiB – 1.17 GiB + NCCL 512.00 MiB – 1024.00 MiB; oomlab's budget counts 1.19 GiB)"
            ) in e.verdict
    assert e.to_dict()["expected_outside"]["reading"] == "within"


def test_v100_outside_without_world_size_names_the_multi_gpu_range() -> None:
    """Without --gpus one process's range applies (a message names one GPU): 1.5 GiB is above it, and the remark
    says that one rank of a multi-GPU job would be expected."""
    e = explain(V100_1_5)
    text = next(a.text for a in e.anomalies if a.code is AnomalyCode.OUTSIDE_LARGE)
    assert "above the 352.00 MiB – 1.17 GiB expected on the v100-32gb under torch>=2.1" in text
    assert "One rank of a multi-GPU job holds NCCL's buffers too (864.00 MiB – 2.17 GiB in all)" in text


@pytest.mark.parametrize(
    ("gpu", "world", "fmt", "interval", "budget"),
    [
        # new era, one process: the A100's measured contexts; the budget's point inside
        ("a100-80gb", None, MessageFormat.NEW, (448 * MiB, 768 * MiB), 576 * MiB),
        # old era (torch <= 2.0): the T4's, which hold the seed's own 561 MiB
        ("t4", None, MessageFormat.OLD, (553 * MiB, 880 * MiB), 561 * MiB),
        # Hopper on 8 NVSwitch GPUs: NCCL's NVLS buffers (up to 2.25 GiB more) widen the top
        ("h100-80gb", 8, MessageFormat.NEW, (1 * GiB, 2 * GiB + 2304 * MiB), 1536 * MiB),
        # a PCIe GPU on 2: NCCL's PCIe figure
        ("l4", 2, MessageFormat.NEW, (192 * MiB + 64 * MiB, 448 * MiB + 512 * MiB), 320 * MiB + 128 * MiB),
    ],
)
def test_expected_ranges(gpu, world, fmt, interval, budget) -> None:
    """The shipped range for the GPU, era and world size, and the budget's figure for the same."""
    x = expected_outside((load_gpu(gpu),), world, fmt)
    assert x.interval == interval and x.budget_bytes == budget
    assert x.budget_bytes == outside_memory(load_gpu(gpu), world or 1, TorchEra(fmt.value)).total_bytes


def test_unknown_gpu_takes_every_shipped_gpu() -> None:
    """No GPU named or matched: the widest range of the era, and no single budget figure."""
    x = expected_outside((), None, MessageFormat.NEW)
    assert x.interval == (96 * MiB, 1200 * MiB) and x.budget_bytes is None


def test_seed_outside_is_within_the_t4_range() -> None:
    """The seed (a T4 under torch 2.0): 553–574 MiB outside, within the T4's old-era range, not remarked on."""
    e = explain(seed_report_text())
    assert e.expected_outside.reading(e.outside) is OutsideReading.WITHIN
    assert AnomalyCode.OUTSIDE_LARGE not in [a.code for a in e.anomalies]
