"""The budget for readers: the fit word every verdict uses, the configured sentence, the outside-PyTorch note."""

import pytest

from oomlab.budget.analytic import ALLOCATOR_NOTE
from oomlab.budget.display import (
    budget_variants,
    component_rows,
    configured_sentence,
    configured_variants,
    summarize,
    training_words,
)
from oomlab.budget.estimator import estimate_setup
from oomlab.budget.result import Fit, outside_figure, outside_note
from oomlab.core.setup import make_setup
from oomlab.core.units import GiB, MiB


@pytest.mark.parametrize(("fits", "gpu_fits", "fit"), [
    (True, True, Fit.FITS),
    (True, False, Fit.FITS),  # fits everywhere checked: the GPU flag adds nothing
    (False, True, Fit.GPU_ONLY),  # the GPUs hold it, the host RAM does not
    (False, False, Fit.NO),
])
def test_fit_of(fits: bool, gpu_fits: bool, fit: Fit) -> None:
    """One word per state; two-state callers (no host RAM check) get fits / does not fit."""
    assert Fit.of(fits, gpu_fits) is fit
    assert Fit.of(fits).value == ("fits" if fits else "does not fit")


def test_configured_sentence() -> None:
    """The report's sentence on the configured budget, both ways."""
    words = training_words("ddp", "full", "fp16-mixed", "adamw", 1, 2048)
    assert configured_sentence(words, 30 * GiB, -15 * GiB, False, 4) == (
        "Training as configured (ddp, full fine-tuning, fp16-mixed, adamw, micro-batch 1 × 2048 tokens) needs "
        "30.00 GiB per GPU and does not fit (15.00 GiB short); the 4 GPUs do not pool their memory.")
    assert configured_sentence(words, 10 * GiB, 5 * GiB, True, 1).endswith("and fits (5.00 GiB to spare).")


@pytest.mark.parametrize(("gpus", "method", "strategy", "checkpointing", "words"), [
    (2, "full", None, False, "full fine-tune, a replica per GPU (ddp)"),  # the default: a replica per GPU
    (1, "full", "ddp", False, "full fine-tune, a replica per GPU (single)"),  # ddp on one GPU is the single run
    (2, "lora", "fsdp", True, "LoRA r8, fsdp, checkpointing"),
])
def test_variant_labels_carry_no_marker(gpus: int, method: str, strategy: str | None, checkpointing: bool,
                                        words: str) -> None:
    """The variants' labels name the variant alone; the budgets' first row, its table row and the summary say
    "as configured" once, none by stripping a prefix off a label."""
    variants = configured_variants(make_setup(model="llama-2-7b", gpu="a100-80gb", gpus=gpus, precision="bf16-mixed",
                                              seq=512, checkpointing=checkpointing, strategy=strategy,
                                              method=method))
    assert variants[0][0] == words and not any(label.startswith("as configured") for label, _ in variants)
    results = budget_variants(variants)
    assert [label for label, _ in results][0] == f"as configured: {words}"
    assert [label for label, _ in results][1:] == [label for label, _ in variants[1:]]
    assert component_rows(results)[0][0] == f"as configured: {words}"
    assert summarize(results, gpus).startswith(f"**As configured** ({words}) one training step needs ")


def test_outside_note_is_typed() -> None:
    """The budget says where its outside-PyTorch figure comes from as a field; its note is the one function's."""
    setup = make_setup(gpus=1, model="llama-2-7b", gpu="a10g")
    shipped = estimate_setup(setup)
    assert shipped.outside_source and shipped.outside_note in shipped.notes and ALLOCATOR_NOTE in shipped.notes
    assert shipped.outside_note.endswith(f" -- {shipped.outside_source}")
    assert shipped.to_dict()["outside_pytorch_source"] == shipped.outside_source
    given = estimate_setup(setup, 500 * MiB)
    assert given.outside_source is None and given.to_dict()["outside_pytorch_source"] is None
    assert given.outside_note == "outside PyTorch: 500.00 MiB (given)" == outside_note(500 * MiB, None)
    assert given.outside_note in given.notes and outside_figure(500 * MiB, None) == "500.00 MiB (given)"
