"""Real training steps of tiny models on CPU (oomlab.measure) against the analytic budget (oomlab.budget)."""

from __future__ import annotations

import logging

import pytest

from oomlab.budget import states
from oomlab.budget.result import Phase
from oomlab.budget.step import tiny_setup
from oomlab.core.errors import InvalidValueError
from oomlab.evidence.small_scale import SMALL_CASES, SmallCase, compare_small, render_small_agreement
from oomlab.instruments.measured import measure_steps, real_model, resident_bytes

# transformers deprecates its own alias internally (peft calls it)
pytestmark = [pytest.mark.heavy,  # real training steps on CPU
              pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")]

CASES = {case.label: case for case in SMALL_CASES}


@pytest.mark.parametrize(
    "label",
    [
        "full fp32 AdamW",
        "full fp16-mixed AdamW",  # real fp16 autocast on CPU: the autocast weight cache
        "full pure bf16 AdamW",
        "full fp32 SGD (momentum)",
        "LoRA r8 fp16-mixed AdamW",
        "full fp16-mixed AdamW, checkpointing",  # peaks in the optimizer step
        "QLoRA r8 bf16-mixed AdamW (NF4, double quant)",  # bitsandbytes' CPU backend
        "full fp32 AdamW8bit",
    ],
)
def test_analytic_peak_within_3_percent_of_measured(label):
    """The analytic allocated peak is within 3 % of the allocator's steady-state peak, in the same phase."""
    row = compare_small(CASES[label])
    assert row.ratio == pytest.approx(1.0, abs=0.03)
    assert row.analytic_peak_phase is row.measured.peak_phase


@pytest.mark.parametrize("label", ["full fp16-mixed AdamW", "QLoRA r8 bf16-mixed AdamW (NF4, double quant)",
                                   "full fp32 AdamW8bit"])
def test_every_phase_within_3_percent(label):
    """Forward, backward and optimizer totals agree too (8-bit: with its CPU-only step temporaries)."""
    row = compare_small(CASES[label])
    for phase in Phase:
        assert row.phase_ratio(phase) == pytest.approx(1.0, abs=0.03), phase


@pytest.mark.parametrize(("label", "tolerance"), [
    ("LoRA r8 fp16-mixed AdamW, checkpointing", 0.03),
    # peft's fp32 upcast: the recomputed layer's gradients are partly fp32, which the budget does not derive (the
    # case's stated gap, 0.945 measured with bitsandbytes 0.50.2 / peft 0.21.2)
    ("QLoRA r8 bf16-mixed AdamW, checkpointing, b4 s256", 0.06),
])
def test_lora_checkpointing_within_tolerance(label, tolerance):
    """(Q)LoRA with checkpointing peaks inside a recomputed layer's backward, which the budget models (QLoRA: where
    the tokens exceed the hidden size, without the dequantized weight, as measured)."""
    row = compare_small(CASES[label])
    assert row.ratio == pytest.approx(1.0, abs=tolerance)


def test_second_step_starts_with_the_optimizer_state():
    """The steady-state step's forward holds the optimizer state the first step created."""
    measured = measure_steps(tiny_setup(precision="fp32"), steps=2)
    first, second = measured.step_phase_peaks
    assert second[Phase.FORWARD] - first[Phase.FORWARD] == pytest.approx(
        measured.optimizer_state_bytes, abs=64
    )
    assert measured.peak_bytes == max(second.values())


def test_qlora_model_is_nf4_with_double_quantization():
    """Decoder projections are bitsandbytes Linear4bit, NF4, nested absmax; resident bytes match the budget."""
    import bitsandbytes as bnb

    setup = tiny_setup(method="qlora", precision="bf16-mixed")
    model = real_model(setup)
    linears = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(linears) == 7 * setup.model.num_hidden_layers
    state = linears[0].weight.quant_state
    assert (state.quant_type, state.blocksize, state.nested) == ("nf4", 64, True)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    # NB: 4.127 bits is 4 + 8/64 + 32/(64*256) rounded: a few bytes per model
    assert resident_bytes(model) - buffers == pytest.approx(states.weights_on_gpu(setup), abs=16)


def test_adamw8bit_state_matches_the_analytic_layout():
    """AdamW8bit on CPU: uint8 moments + fp32 absmax per 256 values; fp32 moments under 4,096 values."""
    setup = tiny_setup(precision="fp32", optimizer="adamw-8bit")
    measured = measure_steps(setup, steps=1)
    qmaps = 2 * 256 * 4  # the signed and unsigned dynamic maps, shared by every tensor
    assert measured.optimizer_state_bytes == pytest.approx(
        states.optimizer_state_bytes_total(setup) + qmaps, abs=64
    )


def test_bitsandbytes_cpu_kernel_warning_is_silenced():
    """The 'Failed to load CPU gemm_4bit_forward' warning's logger is raised to ERROR by oomlab.core.quiet."""
    assert logging.getLogger("bitsandbytes.backends.cpu.ops").level == logging.ERROR


def test_render_lists_every_row_with_its_ratio():
    """The Markdown table has one line per row in each table, ratios to four places."""
    row = compare_small(SmallCase("tiny", {"precision": "bf16"}))
    text = render_small_agreement([row])
    assert f"| tiny | {row.phase_ratio(Phase.FORWARD):.4f}" in text
    assert f"{row.ratio:.4f} | backward | backward |" in text


def test_large_models_refused():
    """Real steps on CPU take tiny models only."""
    with pytest.raises(InvalidValueError, match="takes tiny models only"):
        measure_steps(tiny_setup(model_config={"hidden_size": 4096, "intermediate_size": 11008,
                                               "num_hidden_layers": 4, "num_attention_heads": 32,
                                               "num_key_value_heads": 32, "vocab_size": 32000}))
