"""An optimizer stepped inside backward (``setup.optimizer_in_backward``, torchtune's ``optimizer_in_bwd``): the
budget's moments in hand-computed bytes of the tiny model, what it refuses, the typed field's round trips, and the
budget against a real CPU step with per-parameter hooks (the allocator's count)."""

from __future__ import annotations

import pytest

from oomlab.budget.api import estimate
from oomlab.budget.estimator import estimate_setup
from oomlab.budget.inventory import take_inventory
from oomlab.budget.optimizer_in_backward import in_backward_candidates
from oomlab.budget.result import MemCategory, Phase
from oomlab.budget.step import tiny_setup
from oomlab.core.errors import InvalidValueError
from oomlab.core.setup import make_setup
from oomlab.evidence.published import compare
from oomlab.evidence.published_rows import load_rows
from oomlab.evidence.small_scale import SMALL_CASES, compare_small
from oomlab.launch.record import setup_of, setup_record

# the tiny LLaMA (h=128, i=344, 2 layers, V=512): 526,976 parameters
TINY_PARAMS = 2 * 512 * 128 + 2 * (4 * 128 * 128 + 3 * 128 * 344 + 2 * 128) + 128
HEAD = 512 * 128  # the LM head (or the tied embedding): the largest tensor


def _in_backward(**kw):
    return tiny_setup(kw.pop("model_config", None), precision="fp32", batch=1, seq=32, optimizer_in_backward=True,
                      **kw)


def test_tiny_model_parameter_count() -> None:
    """The hand count the fixtures below rest on."""
    assert tiny_setup().model.num_parameters == TINY_PARAMS == 526_976


def test_optimizer_phase_is_the_model_states_alone() -> None:
    """No gradient and no temporary after backward: fp32 weights (4 B) and AdamW's two fp32 moments (8 B)."""
    phases = estimate_setup(_in_backward()).phases
    assert dict(phases[Phase.OPTIMIZER]) == {MemCategory.WEIGHTS: 4 * TINY_PARAMS, MemCategory.MASTER_WEIGHTS: 0,
                                             MemCategory.OPTIMIZER_STATE: 8 * TINY_PARAMS,
                                             MemCategory.WORKSPACE: 0}


def test_backward_peak_is_the_heads_step_over_every_saved_tensor() -> None:
    """Untied, 32 tokens: the head's fp32 gradient and foreach AdamW's one-moment temporary, 2 x 4 x V x h."""
    backward = estimate_setup(_in_backward()).phases[Phase.BACKWARD]
    assert backward[MemCategory.GRADIENTS] == 2 * 4 * HEAD == 524_288
    assert backward[MemCategory.ACTIVATIONS] > 0


@pytest.mark.parametrize(("optimizer", "gradients"), [
    ("adamw-fused", 4 * HEAD),  # fused: no temporary
    ("sgd", 4 * HEAD),  # in place
    ("adamw", 8 * HEAD),  # foreach over one tensor: one moment
])
def test_step_temporary_is_one_tensors_moment(optimizer: str, gradients: int) -> None:
    """The step's temporary is the stepped tensor's moment, or none."""
    assert estimate_setup(_in_backward(optimizer=optimizer)).phases[Phase.BACKWARD][MemCategory.GRADIENTS] \
        == gradients


def test_tied_embedding_waits_then_ends_with_three_gradients() -> None:
    """Tied: the head's contribution waits while the top layer's weights step (an up projection's gradient and
    moment, 2 x 4 x h x i), then the embedding's own arrives and their sum: three at the end."""
    setup = _in_backward(model_config={"tie_word_embeddings": True})
    inventory = take_inventory(setup)
    held = {MemCategory.WEIGHTS: inventory.states.weights}
    head, end = (c[MemCategory.GRADIENTS] for c in in_backward_candidates(setup, inventory.states,
                                                                          inventory.tensors, held, 0))
    assert (head, end) == (4 * HEAD + 2 * 4 * 128 * 344, 3 * 4 * HEAD) == (614_400, 786_432)
    assert estimate_setup(setup).phases[Phase.BACKWARD][MemCategory.GRADIENTS] == head  # over every saved tensor


def test_in_backward_is_below_the_step_after_backward() -> None:
    """Published-size: Llama-3.2-3B full bf16 at 2 x 4096 drops every gradient and the whole-state temporary."""
    kw = dict(model="llama-3.2-3b", gpu="a100-80gb", gpus=1, method="full", precision="bf16", batch=2, seq=4096,
              checkpointing=True, loss="chunked-compiled", versions={"torchtune": "0.4.0"})
    after, inside = estimate(**kw), estimate(**kw, optimizer_in_backward=True)
    assert after.peak_phase is Phase.OPTIMIZER and inside.peak_phase is not Phase.OPTIMIZER
    assert inside.allocated_peak_bytes < after.allocated_peak_bytes - 2 * 3_212_749_824  # grads + temp, bf16


@pytest.mark.parametrize(("kw", "message"), [
    ({"gpus": 2}, "optimizer in backward with strategy 'ddp' is not budgeted (a DDP hook would step before the "
     "gradients are reduced; FSDP's and DeepSpeed's per-parameter steps are not modelled); use strategy 'single' "
     "(strategies: single, ddp, zero1, zero2, fsdp, fsdp-offload, fsdp2, fsdp2-offload, zero3, zero2-offload, "
     "zero3-offload), or step after backward"),
    ({"gpus": 1, "trainer": "dpo"}, "optimizer in backward with trainer 'dpo' is not budgeted (the step in backward "
     "is budgeted for the SFT step only); use trainer 'sft' (trainers: sft, dpo, orpo, kto, grpo, ppo, reward), or "
     "step after backward"),
])
def test_refused_beyond_one_process_and_sft(kw: dict, message: str) -> None:
    """What is not budgeted is refused, naming the valid choices."""
    with pytest.raises(InvalidValueError) as err:
        make_setup(model="llama-2-7b", gpu="a100-80gb", optimizer_in_backward=True, **kw)
    assert str(err.value) == message


def test_traced_refuses_it() -> None:
    """The traced step steps after backward: refused, pointing to the analytic budget."""
    with pytest.raises(InvalidValueError, match="optimizer in backward is analytic only"):
        estimate(model="llama-2-7b", gpu="a100-80gb", gpus=1, optimizer_in_backward=True, source="traced")


def test_record_round_trip_and_old_records() -> None:
    """The field survives the setup record; a record written before it reads as False."""
    setup = _in_backward()
    record = setup_record(setup)
    assert record["optimizer_in_backward"] is True
    assert setup_of(record).optimizer_in_backward is True
    del record["optimizer_in_backward"]
    assert setup_of(record).optimizer_in_backward is False


def test_result_dict_says_it() -> None:
    assert estimate_setup(_in_backward()).to_dict()["optimizer_in_backward"] is True


def test_no_published_row_marks_it_unmodelled() -> None:
    """Every row that ran optimizer_in_bwd is estimated with it; the torchtune README's rows within 15 %."""
    rows = [r for r in load_rows() if r.setup_kwargs.get("optimizer_in_backward")]
    ran_it = [r for r in load_rows() if r.published.get("optimizer_in_bwd") or "optimizer_in_bwd=True" in
              str(r.published.get("optimizer"))]
    assert {r.id for r in ran_it} == {r.id for r in rows} and len(rows) == 6
    for rid in ("torchtune-readme-flags-3b-optinbwd", "torchtune-readme-flags-3b-offload"):
        assert abs(compare(next(r for r in rows if r.id == rid)).error) <= 0.15


IN_BACKWARD_CASES = [c for c in SMALL_CASES if c.setup.optimizer_in_backward]


@pytest.mark.heavy  # real training steps on CPU
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("case", IN_BACKWARD_CASES, ids=[c.label for c in IN_BACKWARD_CASES])
def test_budget_matches_a_real_step_in_backward(case) -> None:
    """Per-parameter AdamW in post-accumulate-grad hooks on CPU: every phase within 3 % of the allocator's count
    (a budget that held every gradient to the end would read about 40 % high in the optimizer phase)."""
    row = compare_small(case)
    for phase in Phase:
        assert row.phase_ratio(phase) == pytest.approx(1.0, abs=0.03), phase
