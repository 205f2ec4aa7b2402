"""The budget of the preference and RL trainers (oomlab.budget.trainers): each term against the SFT step it adds to."""

from __future__ import annotations

import subprocess
import sys

import pytest

from oomlab.budget.api import estimate
from oomlab.budget.display import render_budget
from oomlab.budget.inventory import take_inventory
from oomlab.budget.result import MemCategory, Phase
from oomlab.budget.trainers import (
    TOKEN_TILE,
    VOCAB_TILE,
    frozen_copy_bytes,
    kv_cache_bytes,
    policy_setup,
    trainer_estimate,
    trainer_terms,
)
from oomlab.core.choices import Reference, Trainer
from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.setup import make_setup

ONE_A100 = {"model": "llama-7b", "gpu": "a100-80gb", "gpus": 1, "precision": "bf16-mixed"}


def _setup(**kw):
    return make_setup(**{**ONE_A100, **kw})


def test_dpo_exceeds_sft_by_the_reference_and_the_pairs() -> None:
    sft, dpo = _setup(), _setup(trainer="dpo")
    a, b = trainer_estimate(sft), trainer_estimate(dpo)
    n = sft.model.num_parameters
    # the reference: a frozen fp32 copy (the policy is loaded in fp32 for bf16-mixed full fine-tuning)
    assert trainer_terms(dpo).reference == 4 * n
    assert b.phases[Phase.FORWARD][MemCategory.WEIGHTS] == a.phases[Phase.FORWARD][MemCategory.WEIGHTS] + 4 * n
    # the policy's forward carries chosen and rejected: the activations of 2 × batch sequences
    doubled = take_inventory(_setup(batch=2)).tensors.layer_activations
    assert b.phases[Phase.FORWARD][MemCategory.ACTIVATIONS] > take_inventory(sft).tensors.layer_activations
    assert b.phases[Phase.FORWARD][MemCategory.ACTIVATIONS] == doubled - 2 * 2048 * sft.model.hidden_size * 2
    assert b.per_gpu_peak_bytes > a.per_gpu_peak_bytes + 4 * n
    assert b.setup.trainer is Trainer.DPO and policy_setup(dpo).batch == 2


def test_precompute_ref_log_probs_removes_the_reference() -> None:
    resident, none = _setup(trainer="dpo"), _setup(trainer="dpo", reference="none")
    assert trainer_terms(none).reference == 0
    diff = trainer_estimate(resident).phases[Phase.OPTIMIZER][MemCategory.WEIGHTS] \
        - trainer_estimate(none).phases[Phase.OPTIMIZER][MemCategory.WEIGHTS]
    assert diff == frozen_copy_bytes(resident) == 4 * resident.model.num_parameters
    assert any("precompute_ref_log_probs" in line for line in trainer_terms(none).lines)


def test_lora_dpo_has_no_second_weight_copy() -> None:
    """peft's adapter-disabled base serves as the reference (dpo_trainer.py :909-914, :1328-1336)."""
    sft, dpo = _setup(method="lora"), _setup(method="lora", trainer="dpo")
    assert trainer_terms(dpo).reference == 0
    a, b = trainer_estimate(sft), trainer_estimate(dpo)
    for phase in Phase:
        assert b.phases[phase][MemCategory.WEIGHTS] == a.phases[phase][MemCategory.WEIGHTS]
    assert any("adapter-disabled base" in line for line in trainer_terms(dpo).lines)


def test_reference_is_sharded_as_trl_prepares_it() -> None:
    n = make_setup(gpus=1, model="llama-7b").model.num_parameters
    assert frozen_copy_bytes(_setup(trainer="dpo", gpus=4, strategy="zero3")) == 2 * n // 4  # partitioned, half
    assert frozen_copy_bytes(_setup(trainer="dpo", gpus=4, strategy="zero2")) == 2 * n  # stage 0: a half replica
    assert frozen_copy_bytes(_setup(trainer="dpo", gpus=4, strategy="fsdp")) == 4 * n // 4
    assert frozen_copy_bytes(_setup(trainer="dpo", gpus=4, strategy="ddp")) == 4 * n


def test_grpo_counts_the_kv_cache() -> None:
    setup = _setup(trainer="grpo", method="lora", batch=16, seq=2048)
    spec = setup.model
    expected = 2 * spec.num_hidden_layers * 16 * 2048 * spec.num_key_value_heads * spec.head_dim * 2
    assert kv_cache_bytes(setup) == expected == 16 * 2**30  # llama-7b: 0.5 MiB per token in bf16
    terms = trainer_terms(setup)
    assert terms.kv_cache == expected and terms.reference == 0  # beta=0.0 by default: no reference
    # with checkpointing the training step is small: generation's KV cache is the forward phase's peak
    lean = trainer_estimate(setup.with_(checkpointing=True))
    assert lean.phases[Phase.FORWARD][MemCategory.WORKSPACE] >= expected
    assert trainer_terms(setup.with_(reference=Reference.RESIDENT, method="full")).reference > 0


def test_fused_head_replaces_the_logits() -> None:
    """TRL 1.16's DPO loss scores tokens in 4096 × 32768 tiles: no (tokens × vocab) logits."""
    dpo = trainer_estimate(_setup(trainer="dpo", reference="none", method="lora"))
    orpo = trainer_estimate(_setup(trainer="orpo", method="lora"))
    tokens, vocab = 2 * 2048, 32000
    tile = min(tokens, TOKEN_TILE) * VOCAB_TILE * 2  # allocated 32768 wide whatever the vocabulary
    assert dpo.phases[Phase.FORWARD][MemCategory.LOGITS_LOSS] < orpo.phases[Phase.FORWARD][MemCategory.LOGITS_LOSS]
    assert orpo.phases[Phase.FORWARD][MemCategory.LOGITS_LOSS] > tokens * vocab * 4  # materialised
    assert dpo.phases[Phase.FORWARD][MemCategory.LOGITS_LOSS] > tile


def test_ppo_holds_four_models() -> None:
    sft, ppo = trainer_estimate(_setup()), trainer_estimate(_setup(trainer="ppo"))
    n = make_setup(gpus=1, model="llama-7b").model.num_parameters
    assert ppo.phases[Phase.OPTIMIZER][MemCategory.WEIGHTS] == sft.phases[Phase.OPTIMIZER][MemCategory.WEIGHTS] \
        + 2 * 4 * n  # reference and reward, frozen fp32 copies
    assert ppo.phases[Phase.OPTIMIZER][MemCategory.GRADIENTS] == 2 * sft.phases[Phase.OPTIMIZER][MemCategory.GRADIENTS]


def test_estimate_takes_the_trainer_and_names_it() -> None:
    result = estimate(trainer="dpo", **ONE_A100)
    assert result.setup.trainer is Trainer.DPO and result.to_dict()["trainer"] == "dpo"
    assert result.per_gpu_peak_bytes > estimate(**ONE_A100).per_gpu_peak_bytes
    text = render_budget(result)
    assert "trainer dpo" in text and "reference model:" in text
    with pytest.raises(UnknownNameError, match="dpo, grpo, kto, orpo, ppo, reward, sft"):
        estimate(trainer="dpx", **ONE_A100)
    with pytest.raises(InvalidValueError, match="analytic only"):
        estimate(trainer="dpo", source="traced", **ONE_A100)


def test_with_keeps_the_trainer() -> None:
    """Every remedy is a ``with_`` of the user's setup: a DPO run's fix is still DPO."""
    dpo = _setup(trainer="dpo")
    for change in ({"checkpointing": True}, {"method": "lora"}, {"batch": 2}, {"strategy": "zero3", "gpus": 4}):
        assert dpo.with_(**change).trainer is Trainer.DPO


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oomlab", *argv], capture_output=True, text=True, timeout=120)


def test_cli_budget_trainer_round_trip() -> None:
    import json

    run = _cli("budget", "--model", "llama-7b", "--gpu", "a100-80gb", "--gpus", "1", "--trainer", "dpo",
               "--reference", "none", "--json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert (out["trainer"], out["reference"]) == ("dpo", "none")
    expected = estimate(model="llama-7b", gpu="a100-80gb", gpus=1, trainer="dpo", reference="none")
    assert out["per_gpu_peak_bytes"] == expected.per_gpu_peak_bytes


def test_cli_bad_trainer_exits_2_listing_the_choices() -> None:
    run = _cli("budget", "--trainer", "dpx")
    assert run.returncode == 2
    assert "'sft', 'dpo', 'orpo', 'kto', 'grpo', 'ppo', 'reward'" in run.stderr


def _trainer_evaluator(setup):
    """The remedies' Evaluator, budgeting with the trainer (oomlab.budget.trainers)."""
    from oomlab.remedies.remedy import Evaluation

    result = trainer_estimate(setup)
    return Evaluation(result.per_gpu_peak_bytes, result.headroom_bytes, result.host_ram_bytes,
                      result.breaking_component, result.fits, True, result)


def test_ladder_keeps_dpo_and_precomputes_the_reference() -> None:
    """A DPO run on one 24 GB card: dropping the resident reference (precompute_ref_log_probs) is the cheap fix,
    and the fix is still DPO."""
    from oomlab.remedies.ladder import COST, Rung, climb

    dpo = make_setup(model="llama-3.2-1b", gpu="rtx-4090", gpus=1, precision="bf16-mixed", optimizer="adamw-fused",
                     trainer="dpo", seq=512)
    assert not trainer_estimate(dpo).fits and trainer_estimate(dpo.with_(reference="none")).fits
    decision = climb(dpo, _trainer_evaluator)
    steps = decision.steps
    assert steps and steps[0].rung is Rung.PRECOMPUTE_REFERENCE
    assert all(s.setup.trainer is Trainer.DPO for s in steps)
    assert steps[-1].setup.reference is Reference.NONE
    assert "one extra pass over the data" in COST[Rung.PRECOMPUTE_REFERENCE]
    # nothing to precompute where no reference is resident: LoRA's adapter-disabled base, ORPO, SFT
    for other in (dpo.with_(method="lora"), dpo.with_(trainer="orpo"), dpo.with_(trainer="sft")):
        assert Rung.PRECOMPUTE_REFERENCE not in [r for r, _ in climb(other, _trainer_evaluator).tried]
