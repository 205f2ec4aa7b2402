"""Liger's fused linear cross-entropy and Cut Cross-Entropy in the budget (oomlab.budget.loss_kernels): the
(tokens x vocab) logits and their fp32 copies are gone, replaced by what each kernel's source allocates.

The figures below are worked by hand from the kernels' sources (the module's docstring cites each line), for
Llama-2-7B (H 4096, V 32000) at transformers 4.50 (the loss upcasts the half logits once and shifts the labels).
Neither kernel runs on CPU (both are Triton), so no measurement backs them: the arithmetic is the source's own.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from oomlab.budget.api import estimate
from oomlab.budget.inventory import forward_end_bytes, take_inventory
from oomlab.budget.loss_kernels import liger_chunk_rows
from oomlab.core.choices import Loss
from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.setup import make_setup

H, V = 4096, 32000
VERSIONS = "transformers==4.50.0,torch==2.8.0"


def _lora(loss: str, **changes):
    kw = {"model": "llama-2-7b", "gpu": "a100-80gb", "gpus": 1, "method": "lora", "precision": "bf16-mixed",
          "batch": 4, "seq": 4096, "versions": VERSIONS, "loss": loss, **changes}
    return make_setup(**kw)


def test_liger_chunk_rows_is_liger_own_example():
    # fused_linear_cross_entropy.py :63 "BT = 4096*4, V = 32000, H = 4096 ==> inc_factor = 8, chunk_size = 2048"
    assert liger_chunk_rows(4096 * 4, 32000, 4096) == 2048
    assert liger_chunk_rows(100, 128256, 4096) == 4  # next_power_of_2(cdiv(100, 32))
    assert liger_chunk_rows(3, 32000, 4096) == 1
    assert liger_chunk_rows(4096, 4096, 4096) == 4096  # one chunk, never past BT


def test_the_setup_field_is_typed_and_defaults_to_the_standard_loss():
    assert make_setup().loss is Loss.STANDARD
    assert _lora("liger-flce").loss is Loss.LIGER_FLCE
    assert _lora("standard").with_(loss="cce").loss is Loss.CCE
    with pytest.raises(UnknownNameError, match="unknown loss 'liger'.*cce, chunked, chunked-compiled, "
                       "chunked-loss-compiled, chunked-no-upcast, liger-flce, standard"):
        _lora("liger")


def test_liger_has_no_tokens_by_vocab_term_and_saves_the_right_bytes():
    n = 4 * 4096
    tv = n * V
    std = take_inventory(_lora("standard")).tensors
    liger = take_inventory(_lora("liger-flce")).tensors
    assert (std.logits, std.logits_fp32, std.log_softmax) == (2 * tv, 4 * tv, 4 * tv)
    assert liger.logits_fp32 == 0
    assert max(liger.logits, liger.log_softmax, liger.loss_grad) < tv  # nothing (tokens x vocab) in any dtype
    # forward: two 2048 x 32000 bf16 chunks (the next one computed while the last is still bound), loss_1d (fp32)
    # and the target mask
    assert liger.logits == 2 * 2048 * V * 2 + 4 * n + n == 262_225_920
    assert liger.log_softmax == n * H * 2 == 134_217_728  # grad_input, saved for backward (LoRA: no grad_weight)
    assert liger.loss_grad == 0  # backward only scales the saved gradients in place
    saved = forward_end_bytes(take_inventory(_lora("standard"))) - forward_end_bytes(take_inventory(
        _lora("liger-flce")))
    assert saved == 10 * tv - 262_225_920 - 134_217_728 == 4_846_436_352


def test_liger_full_fine_tuning_head_gradient_by_torch_release():
    """Full fine-tuning under autocast: the fp32 head's gradient (:77) is saved; its accumulation needs no
    temporary on torch >= 2.8 with compute capability >= 8 (:233-255), else a V x H bf16 product and its fp32 copy
    (:257)."""
    full = {"model": "llama-2-7b", "gpu": "a100-80gb", "gpus": 1, "method": "full", "precision": "bf16-mixed",
            "batch": 1, "seq": 4096, "loss": "liger-flce"}
    new = take_inventory(make_setup(**full, versions="transformers==4.50.0,torch==2.8.0")).tensors
    old = take_inventory(make_setup(**full, versions="transformers==4.50.0,torch==2.4.0")).tensors
    n, rows = 4096, 512  # next_power_of_2(cdiv(4096, 8))
    assert new.log_softmax == n * H * 4 + V * H * 4  # grad_input in the fp32 stream, grad_weight like the fp32 head
    # two chunks, the input chunk cast to bf16 and the head's bf16 cast (weight.t() is no leaf) at the product
    assert new.logits == 2 * rows * V * 2 + rows * H * 2 + V * H * 2 + 4 * n + n
    assert old.logits == rows * V * 2 + V * H * (2 + 4) + 4 * n + n  # one chunk beside the V x H temporaries
    std = take_inventory(make_setup(**{**full, "loss": "standard"}, versions=VERSIONS)).tensors
    assert std.layer_activations - new.layer_activations == n * H * 2  # lm_head's input, no longer saved
    assert std.autocast_copies - new.autocast_copies == V * H * 2  # the head's bf16 copy, not kept for backward


def test_cut_cross_entropy_terms():
    n = 4 * 4096
    cce = take_inventory(_lora("cce")).tensors
    assert cce.logits_fp32 == 0
    assert cce.logits == 4 * n + 4 * V + 4 * n  # lse, logit_avg, the target logits
    assert cce.log_softmax == n * H * 2 + 4 * n + 4 * V + 8 * n + 4 * n  # e, lse, logit_avg, targets, valids
    assert 2 * cce.loss_grad == 4 * V + n * H * 2  # vocab_ordering, de (LoRA: the head is frozen, no dc)


def test_the_peak_drops_where_the_logits_dominate():
    """Llama-3.1-8B (V 128256) LoRA at 12 x 4096 on one A100-80GB: the logits are the budget's largest transient
    (103 GiB standard, 41 GiB with Liger)."""
    kw = {"model": "llama-3.1-8b", "gpu": "a100-80gb", "gpus": 1, "method": "lora", "precision": "bf16-mixed",
          "batch": 12, "seq": 4096, "checkpointing": True, "versions": VERSIONS}
    std, liger, cce = (estimate(**kw, loss=loss) for loss in ("standard", "liger-flce", "cce"))
    assert not std.fits and liger.fits and cce.fits
    tv = 12 * 4096 * 128256
    assert std.per_gpu_peak_bytes - liger.per_gpu_peak_bytes > 2 * tv  # more than the fp32 copy's 4 * tv / 2
    assert any("Liger's fused linear cross-entropy" in n for n in liger.notes)
    assert any("Cut Cross-Entropy" in n for n in cce.notes)
    assert liger.to_dict()["loss"] == "liger-flce"


def test_a_fused_loss_is_analytic_only():
    with pytest.raises(InvalidValueError, match="loss 'liger-flce' is analytic only"):
        estimate(model="llama-3.2-1b", gpus=1, gpu="a100-80gb", loss="liger-flce", source="traced")


def test_budget_cli_takes_loss():
    out = subprocess.run([sys.executable, "-m", "oomlab", "budget", "--model", "llama-3.1-8b", "--gpu", "a100-80gb",
                          "--gpus", "1", "--method", "lora", "--precision", "bf16-mixed", "--loss", "cce"],
                         capture_output=True, text=True, check=True).stdout
    assert "loss cce" in out.splitlines()[0]
    assert "apple/ml-cross-entropy@d42911f" in out
    bad = subprocess.run([sys.executable, "-m", "oomlab", "budget", "--loss", "fused"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "liger-flce" in bad.stderr
