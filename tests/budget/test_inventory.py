"""Tests for oomlab.budget.inventory: one pass through a setup into a typed Inventory, the phases assembled from it."""

from __future__ import annotations

import pytest

from oomlab.budget import activations as act
from oomlab.budget.deepspeed import host_offload_bytes, zero_states
from oomlab.budget.estimator import estimate_setup
from oomlab.budget.inventory import assemble_phases, take_inventory
from oomlab.budget.step_parts import StepTensors, ZeroStates
from oomlab.core.setup import make_setup


def _setup(strategy: str, checkpointing: bool, method: str = "full", gpus: int = 4):
    return make_setup("llama-13b", "h100-80gb", gpus=gpus, strategy=strategy, method=method, precision="bf16-mixed",
                      checkpointing=checkpointing)


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("method", ["full", "lora"])
def test_the_inventory_holds_the_per_layer_terms(checkpointing: bool, method: str) -> None:
    """The per-layer terms FSDP's phases read are the inventory's, computed once from activations (and only for the
    FSDP strategies, whose phases alone read them)."""
    s = _setup("fsdp2", checkpointing, method)
    inventory = take_inventory(s)
    t, lt = inventory.tensors, inventory.layers
    assert isinstance(t, StepTensors) and lt is not None
    assert (lt.layer_saved, lt.first_layer, lt.layer_fixed, lt.stream, lt.rope) == (
        act.layer_activation_bytes(s), act.first_layer_activation_bytes(s), act.layer_fixed_bytes(s),
        act.checkpoint_layer_bytes(s), act.rope_bytes(s))
    assert lt.per_layer == (lt.stream if checkpointing else lt.layer_saved)
    assert lt.layer_inputs == 40 * lt.stream + lt.rope  # llama-13b's 40 layers
    assert take_inventory(_setup("ddp", checkpointing, method)).layers is None
    assert t.logits_forward == t.logits + t.logits_fp32 + t.log_softmax
    assert t.loss_backward == t.log_softmax + 2 * t.loss_grad


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3", "zero2-offload", "zero3-offload"])
def test_deepspeed_inventory_holds_its_zero_states(strategy: str) -> None:
    """A DeepSpeed setup's inventory carries its ZeroStates (what the phases, the load note and the host RAM read);
    the model states and the per-node host bytes are theirs."""
    s = _setup(strategy, False)
    inv = take_inventory(s)
    assert isinstance(inv.zero, ZeroStates) and inv.zero == zero_states(s)
    assert (inv.states.weights, inv.states.gradients, inv.states.master_weights, inv.states.optimizer_state) == (
        inv.zero.weights, inv.zero.gradients, inv.zero.master, inv.zero.optimizer)
    assert inv.states.host_per_node == 4 * inv.zero.host == 4 * host_offload_bytes(s)
    assert (inv.zero.host > 0) is s.strategy.offloads_optimizer


@pytest.mark.parametrize("strategy", ["single", "ddp", "fsdp", "fsdp2-offload"])
def test_pytorch_inventory_has_no_zero_states(strategy: str) -> None:
    """Only DeepSpeed's inventory has a ZeRO layout; torch's mixed precision keeps no master copy."""
    inv = take_inventory(_setup(strategy, True, gpus=1 if strategy == "single" else 4))
    assert inv.zero is None and inv.states.master_weights == 0


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "fsdp2", "zero1", "zero3-offload"])
def test_estimate_assembles_the_inventory_it_takes(strategy: str) -> None:
    """estimate_setup's phases are assemble_phases of the setup's one inventory."""
    s = _setup(strategy, True)
    phases = assemble_phases(s, take_inventory(s))
    assert {p: dict(c) for p, c in estimate_setup(s, 0).phases.items()} == phases



def test_fsdp1_offload_recompute_of_the_bottom_layer_holds_no_negative_gradients() -> None:
    """FSDP1 CPU offload with checkpointing: the bottom layer's recompute in backward holds its input, its saved
    tensors again and no gradient on the GPU. The outer units' gradient share used to be subtracted from the
    offloaded (zero) gradients anyway (-590,938,112 B for falcon-7b on 2 GPUs), which hid this candidate behind a
    smaller one: the backward peak is now this recompute (1.35 GiB of activations, not 0.56 GiB)."""
    from oomlab.budget.result import MemCategory, Phase

    setup = make_setup(model="falcon-7b", gpu="a100-40gb", gpus=2, strategy="fsdp-offload", method="full",
                       checkpointing=True, seq=2048)
    inventory = take_inventory(setup)
    lt = inventory.layers
    backward = assemble_phases(setup, inventory)[Phase.BACKWARD]
    assert backward.get(MemCategory.GRADIENTS, 0) == 0
    assert backward[MemCategory.ACTIVATIONS] == lt.per_layer + lt.rope + lt.first_layer + lt.layer_fixed
