"""What each rung of the ladder costs in speed, modelled per mechanism (issue 22): recomputation for checkpointing,
the host link and the CPU's optimizer step for offload, the 4-bit weights' dequantization for QLoRA."""

from __future__ import annotations

import pytest

from oomlab.core.setup import make_setup
from oomlab.remedies.ladder import climb
from oomlab.remedies.remedy import Evaluator
from oomlab.remedies.throughput import (
    DEFAULT_ASSUMPTIONS,
    DEQUANTIZE_BYTES_PER_PARAM_PASS,
    speed_change,
    step_time,
)

BASE = dict(model="llama-2-7b", gpu="a10g", gpus=4, strategy="zero2", batch=8, seq=4096, precision="bf16-mixed")


@pytest.mark.parametrize(("change", "cause"), [
    ({"checkpointing": True}, "recomputed forwards"),
    ({"strategy": "zero2-offload"}, "host link (PCIe)"),
    ({"strategy": "zero2-offload"}, "optimizer step on the CPU"),
])
def test_each_change_names_what_slows_it(change, cause) -> None:
    base = make_setup(**BASE)
    ratio, causes = speed_change(base, base.with_(**change))
    assert ratio < 1 and any(cause in c for c in causes), causes


def test_qlora_pays_its_dequantization_per_pass() -> None:
    """Three passes with checkpointing (forward, recomputed forward, backward), two without, each moving
    DEQUANTIZE_BYTES_PER_PARAM_PASS bytes per quantized parameter at the GPU's memory bandwidth."""
    lora = make_setup(**{**BASE, "strategy": "ddp", "method": "lora"})
    qlora = lora.with_(method="qlora")
    plain, again = step_time(qlora, DEFAULT_ASSUMPTIONS), step_time(qlora.with_(checkpointing=True),
                                                                     DEFAULT_ASSUMPTIONS)
    assert step_time(lora, DEFAULT_ASSUMPTIONS).dequantize_s == 0
    assert again.dequantize_s == pytest.approx(1.5 * plain.dequantize_s)
    assert plain.dequantize_s > 2 * 6e9 * DEQUANTIZE_BYTES_PER_PARAM_PASS / qlora.gpu.memory_bandwidth_bytes_per_s
    ratio, causes = speed_change(lora, qlora)
    assert ratio < 1 and causes == ("4-bit weights dequantized in every pass",)


def test_the_decision_carries_each_steps_speed() -> None:
    d = climb(make_setup(**BASE), Evaluator(512 * 2**30, None))
    steps = d.to_dict()["steps"]
    assert steps and len(steps) == len(d.steps)
    for step, (ratio, causes) in zip(steps, d.speeds(), strict=True):
        assert step["speed_ratio"] == ratio and step["slower_by"] == list(causes)
    assert any(s["rung"] == "activation checkpointing" and s["speed_ratio"] < 1 for s in steps)
