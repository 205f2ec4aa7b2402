"""Activation offloading: the saved activations moved to pinned host memory as forward saves them (TRL's
``SFTConfig(activation_offloading=True)``; axolotl's ``activation_offloading: true`` runs the same context).

Read from TRL 1.10.0.dev0 at commit f2cd57710ae345ea6428ae95363267fcf38a3dc8 (no measurement: the offload needs a
CUDA device and streams; on CPU ``pack_tensor`` keeps every tensor where it is, :236-238):

- ``trl/trainer/sft_trainer.py`` :1352-1353 builds ``get_act_offloading_ctx_manager(model)`` and :1840-1842 wraps
  the whole ``training_step`` in it (forward, and backward's recomputation under checkpointing);
- ``trl/models/activation_offloading.py`` ``OffloadActivations.pack_tensor`` (:208): every saved tensor of at least
  ``min_offload_size`` = 1024 bytes (:128, :241) that is not a parameter or buffer (:246) is copied into a pinned
  host tensor of its size (:333 ``torch.empty_like(activation, pin_memory=True, device="cpu")``); the GPU copy is
  dropped once ``max_fwd_stash_size`` = 5 newer tensors have been offloaded (:129, :277);
- :668, :710-731: the model's output head (``lm_head``) runs under a no-op context: its saved input stays on the GPU
  (the loss's tensors are saved after it, and the last five are still in the stash at the end of forward);
- backward (``unpack_tensor_with_streams`` :399): each tensor is copied back when its node runs and freed after it.

Budgeted: at the end of forward the GPU keeps the last layer's saved tensors (the five-tensor stash, bounded by one
layer's inventory) and the loss's; backward holds one layer's saved tensors at a time (under checkpointing: one layer
input and the recomputed layer); the host holds the rest, per process.  NB: autocast's half weight copies saved for
backward are offloaded too, but the autocast cache holds them to the end of forward; they are budgeted on the GPU.
"""

from __future__ import annotations

from dataclasses import replace

from oomlab.budget import activations as act
from oomlab.budget.step_parts import StepTensors
from oomlab.core.setup import TrainingSetup
from oomlab.core.units import format_size

TRL = "TRL 1.10.0.dev0 (huggingface/trl@f2cd577, trl/models/activation_offloading.py)"
MIN_OFFLOAD_BYTES = 1024  # :128 min_offload_size
STASH_TENSORS = 5  # :129 max_fwd_stash_size


def kept_on_gpu(setup: TrainingSetup) -> int:
    """The saved activations left on the GPU at the end of forward: the top layer's (its input alone when
    checkpointed), which bounds the five-tensor stash."""
    return act.checkpoint_layer_bytes(setup) if setup.checkpointing else act.layer_activation_bytes(setup)


def offload_tensors(setup: TrainingSetup, t: StepTensors) -> StepTensors:
    """``t`` with the saved layer activations on the host (the terms: module docstring); unchanged when the setup
    does not offload."""
    if not setup.offload_activations:
        return t
    kept = min(kept_on_gpu(setup), t.layer_activations)
    recompute = t.recompute_activations
    if setup.checkpointing:  # every layer input on the host but the one reloaded, and the recomputed layer's tensors
        recompute = act.checkpoint_layer_bytes(setup) + act.layer_activation_bytes(setup)
    return replace(t, layer_activations=kept, recompute_activations=min(recompute, t.recompute_activations),
                   host_activations=t.layer_activations - kept)


def offload_note(t: StepTensors) -> str:
    """One line for the budget's notes: what is on the host, what stays, and the source."""
    return (f"activations offloaded: {format_size(t.host_activations)} of saved activations per process in pinned "
            f"host memory, the top layer's {format_size(t.layer_activations)} kept on the GPU ({TRL})")
