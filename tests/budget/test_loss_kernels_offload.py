"""Activation offloading in the budget (oomlab.budget.activation_offload): the saved layer activations move to pinned
host memory as TRL's OffloadActivations copies them (trl@f2cd577), the top layer's kept on the GPU; the host RAM
grows by the rest, per process.  (Named beside test_loss_kernels: the same issue's terms.)"""

from __future__ import annotations

import pytest

from oomlab.budget import activations as act
from oomlab.budget.api import estimate
from oomlab.budget.inventory import take_inventory
from oomlab.core.errors import InvalidValueError
from oomlab.core.setup import make_setup

KW = {"model": "llama-3.1-8b", "gpu": "a100-80gb", "gpus": 1, "method": "lora", "precision": "bf16-mixed",
      "batch": 8, "seq": 4096, "versions": "transformers==4.50.0,torch==2.8.0"}


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_saved_activations_move_to_the_host(checkpointing: bool) -> None:
    on, off = (make_setup(**KW, checkpointing=checkpointing, offload_activations=o) for o in (True, False))
    t_on, t_off = take_inventory(on).tensors, take_inventory(off).tensors
    kept = act.checkpoint_layer_bytes(on) if checkpointing else act.layer_activation_bytes(on)
    assert t_on.layer_activations == kept
    assert t_on.host_activations == t_off.layer_activations - kept > 0
    assert t_off.host_activations == 0
    # the loss's tensors are not offloaded at the end of forward: the last five saved are still in the stash
    assert t_on.logits_forward == t_off.logits_forward
    if checkpointing:  # backward reloads one layer input, then recomputes that layer
        assert t_on.recompute_activations == act.checkpoint_layer_bytes(on) + act.layer_activation_bytes(on)
    a, b = estimate(**KW, checkpointing=checkpointing, offload_activations=True), \
        estimate(**KW, checkpointing=checkpointing)
    assert a.host_ram_bytes - b.host_ram_bytes == t_on.host_activations  # one process per node here
    assert a.per_gpu_peak_bytes < b.per_gpu_peak_bytes
    assert a.to_dict()["offload_activations"] is True


def test_host_ram_grows_per_process() -> None:
    kw = {**KW, "gpus": 4, "strategy": "ddp"}
    on, off = estimate(**kw, offload_activations=True), estimate(**kw)
    t = take_inventory(make_setup(**kw, offload_activations=True)).tensors
    assert on.host_ram_bytes - off.host_ram_bytes == 4 * t.host_activations


def test_refused_where_not_budgeted() -> None:
    with pytest.raises(InvalidValueError, match="activation offloading with strategy 'fsdp' is not budgeted"):
        make_setup(**{**KW, "gpus": 2, "strategy": "fsdp"}, offload_activations=True)
    with pytest.raises(InvalidValueError, match="activation offloading is analytic only"):
        estimate(model="llama-3.2-1b", gpu="a100-80gb", gpus=1, offload_activations=True, source="traced")
