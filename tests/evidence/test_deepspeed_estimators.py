"""DeepSpeed's own estimators beside oomlab's DeepSpeed budget: the estimator functions are DeepSpeed's (what the
``*_all_cold`` functions print), the model states agree where the definitions do, every difference adds up, and the
committed docs/deepspeed-estimators.md is current."""

import re

import pytest

from oomlab.budget.deepspeed import zero_states
from oomlab.budget.estimator import estimate_setup
from oomlab.evidence import deepspeed_estimators as de

P = 13_015_864_320
N = 4


def _printed(capsys, fn, *args, **kwargs) -> list[tuple[float, float, str]]:
    """``(per CPU GiB, per GPU GiB, options)`` rows an ``*_all_cold`` function prints."""
    fn(*args, **kwargs)
    out = capsys.readouterr().out
    return [(float(c), float(g), o.strip()) for c, g, o in re.findall(r"^\s*([\d.]+)GB \|\s*([\d.]+)GB \| (.*)$", out,
                                                                      re.M)]


def test_zero2_figures_are_what_deepspeed_prints(capsys) -> None:
    """oomlab's ZeRO-2 estimator figures (with and without offload) equal estimate_zero2_model_states_mem_needs_
    all_cold's printout for llama-13b on 4 GPUs."""
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs_all_cold

    printed = _printed(capsys, estimate_zero2_model_states_mem_needs_all_cold, P, num_gpus_per_node=N)
    assert len(printed) == 2
    for strategy, (cpu, gpu, _) in zip(("zero2-offload", "zero2"), printed, strict=True):
        figures = de.deepspeed_estimate(de.row_setup(("llama-13b", "t4", N, strategy, False)))
        assert (round(figures.host_bytes / 2**30, 2), round(figures.gpu_bytes / 2**30, 2)) == (cpu, gpu)
    assert printed[1][1] == round((2 * P + 18 * P / N) / 2**30, 2)  # 2 + 18/N bytes per parameter


def test_zero3_figures_are_what_deepspeed_prints(capsys) -> None:
    """oomlab's ZeRO-3 estimator figures equal estimate_zero3_model_states_mem_needs_all_cold's zero_init=1 rows."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold

    setup = de.row_setup(("llama-13b", "t4", N, "zero3", False))
    largest = de.layout.largest_module(setup)
    assert largest == 32_000 * 5120
    printed = {o: (c, g) for c, g, o in _printed(capsys, estimate_zero3_model_states_mem_needs_all_cold, P, largest,
                                                 num_gpus_per_node=N)}
    for strategy, options in (("zero3-offload", "offload_param=OffloadDeviceEnum.cpu, offload_optimizer="
                                                "OffloadDeviceEnum.cpu, zero_init=1"),
                              ("zero3", "offload_param=none, offload_optimizer=none, zero_init=1")):
        figures = de.deepspeed_estimate(de.row_setup(("llama-13b", "t4", N, strategy, False)))
        assert (round(figures.host_bytes / 2**30, 2), round(figures.gpu_bytes / 2**30, 2)) == printed[options]


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_model_states_agree_where_the_definitions_do(strategy) -> None:
    """fp32 master + Adam moments: the estimators' 4 + 8 bytes per parameter over N, exactly (llama-13b divides)."""
    z = zero_states(de.row_setup(("llama-13b", "t4", N, strategy, False)))
    assert z.master + z.optimizer == 12 * P // N


@pytest.mark.parametrize("row", de.ROWS, ids=de._label)
def test_differences_add_up(row) -> None:
    """The sized differences add up to oomlab's peak minus DeepSpeed's estimate, exactly."""
    setup = de.row_setup(row)
    total = sum(v for _, v in de.differences(setup))
    assert total == estimate_setup(setup, 0).allocated_peak_bytes - de.deepspeed_estimate(setup).gpu_bytes


def test_differences_name_buckets_activations_and_gradient_dtype() -> None:
    """For ZeRO-2 without checkpointing the activations, the IPG bucket and the fp32 gradients are each a sized row."""
    rows = dict(de.differences(de.row_setup(("llama-13b", "t4", N, "zero2", False))))
    text = " ".join(rows)
    assert "IPG bucket 50.00 MiB" in text and "fp32 gradients (4/N)" in text
    acts = next(v for k, v in rows.items() if k.startswith("activations"))
    assert acts > 10 * 2**30
    assert next(v for k, v in rows.items() if "fp32 gradients" in k) == -4 * P // N


def test_committed_doc_is_current() -> None:
    """docs/deepspeed-estimators.md is what the code renders now (`python -m oomlab.evidence deepspeed-estimators`)."""
    assert de.ESTIMATORS_DOC.read_text() == de.render_markdown()
