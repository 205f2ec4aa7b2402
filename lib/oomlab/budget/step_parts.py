"""What one setup's step is made of, as typed parts: the model states (:class:`ModelStates`; DeepSpeed's own layout
:class:`ZeroStates`), the tensors of one micro-batch (:class:`StepTensors`) and the :class:`Inventory` that holds
them.  :mod:`.inventory` computes them once per setup; :mod:`.fsdp`, :mod:`.deepspeed` and :mod:`.inventory` assemble
the phases from them.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomlab.budget.deepspeed_config import DeepSpeedSettings


@dataclass(frozen=True)
class ModelStates:
    """Per-GPU bytes that do not depend on the micro-batch or the length (memoised: searches vary only those)."""

    weights: int
    gradients: int  # all of them, at the end of backward
    master_weights: int
    optimizer_state: int
    optimizer_temps: int  # inside optimizer.step()
    ddp_buckets: int
    grad_bytes: int  # bytes per trained parameter of its gradient
    held_gradients: int  # gradient buffers held all step (DeepSpeed ZeRO-3's partitions, BF16_Optimizer's)
    replica: int  # one full replica of the weights as stored (what a process loading the model holds on the host)
    host_per_node: int  # the offloaded states (sharding.Share.HOST) one node's host memory holds

    @property
    def persistent(self) -> int:
        """Bytes held all step long: weights, master weights, optimizer state (and permanent gradient buffers)."""
        return self.weights + self.master_weights + self.optimizer_state + self.held_gradients


@dataclass(frozen=True)
class ZeroStates:
    """One GPU's DeepSpeed model states and buffers (bytes), the largest rank's."""

    weights: int  # half parameters held (ZeRO-1/2: the flat replica; ZeRO-3: partitions + persistent gathered)
    master: int  # fp32 master partition (0 when offloaded)
    optimizer: int  # optimizer state of the partition (0 when offloaded)
    gradients: int  # gradient bytes held at the end of backward (the partition buffer; ZeRO-1: see below)
    held_gradients: int  # gradient bytes held all step (ZeRO-3's permanent partition buffer, BF16_Optimizer's)
    full_gradients: int  # ZeRO-1 / BF16_Optimizer: every half gradient alive at the end of autograd's backward
    bucket: int  # the IPG bucket(s)
    bucket_permanent: bool  # ZeRO-3 allocates it once (stage3.py:779-784); ZeRO-1/2 per backward (:3256-3280)
    flush: int  # the reduction's flatten / cat copy of one bucket
    step_temps: int  # inside step(): the flat half gradient copy and the fp32 gradient
    offload_temps: int  # zero2-offload: temp_grad_buffer_for_gpu_offload (stage_1_and_2.py:659-661)
    gathered_forward: int  # ZeRO-3: parameters gathered at the end of forward (reuse window + prefetch)
    gathered_layer: int  # ZeRO-3: one module's gathered parameters in flight (+ prefetch)
    persistent_gathered: int  # ZeRO-3: small parameters kept gathered (released for the step)
    first_grad: int  # workspace when backward's first gradient (the LM head's) arrives: itself, or the bucket
    last_grad: int  # ZeRO-3: the embedding's gradient in flight at the end of backward
    host: int  # one rank's offloaded states on the host (pinned; deepspeed.host_offload_bytes)


@dataclass(frozen=True)
class StepTensors:
    """Per-GPU bytes of one micro-batch: saved activations, logits and loss, autocast's weight copies."""

    layer_activations: int  # saved for backward at the end of forward (the loss's own tensors excluded)
    autocast_copies: int  # half weight copies that backward still needs
    autocast_cache: int  # every weight's half copy, held until the outermost autocast exits
    logits: int  # the LM head's output
    logits_fp32: int  # logits.float() inside the loss
    log_softmax: int  # saved by cross_entropy
    loss_grad: int  # one (tokens x vocab) fp32 gradient
    recompute_activations: int  # checkpointing: every layer's input + the recomputed layer's saved tensors
    recompute_workspace: int  # checkpointing: the recomputed layer's fixed bytes and gradient temporaries
    input_leaf: int = 0  # QLoRA under peft's enable_input_require_grads: the embedding output leaf and its gradient
    host_activations: int = 0  # activation offloading: the saved activations in pinned host memory (per process)
    head_forward: int = 0  # litgpt: the head's output at its largest before the loss (chunks, Fabric's fp32 copies)
    head_backward: int = 0  # litgpt: inside the head's backward (the fp32 logits, the chunks' half gradients)
    carried_activations: int = 0  # litgpt: the previous micro-batch's saved tensors the loop still holds
    carried_logits: int = 0  # litgpt: the previous micro-batch's logits the loop still holds (until the forward ends)

    @property
    def logits_forward(self) -> int:
        """The end of forward: the logits, their fp32 copy and the loss's saved log-softmax."""
        return self.logits + self.logits_fp32 + self.log_softmax

    @property
    def loss_backward(self) -> int:
        """The start of backward: the saved log-softmax and the loss's two (tokens x vocab) gradients (or, where
        larger, the head's own backward: ``head_backward``)."""
        return max(self.log_softmax + 2 * self.loss_grad, self.head_backward)

    @property
    def carried(self) -> int:
        """What the loop holds from the previous micro-batch (litgpt's ``logits`` and its graph)."""
        return self.carried_activations + self.carried_logits


@dataclass(frozen=True)
class LayerTerms:
    """Per-GPU bytes of one decoder layer's tensors, what FSDP's phases (inside one layer) are assembled from."""

    layer_saved: int  # one decoder layer's saved tensors, not checkpointed (activations.layer_activation_bytes)
    first_layer: int  # the first layer's (less under LoRA, whose first input needs no gradient)
    layer_fixed: int  # one layer's saved bytes that do not scale with tokens (activations.layer_fixed_bytes)
    stream: int  # one hidden-state tensor: a checkpointed layer's input (activations.checkpoint_layer_bytes)
    rope: int  # RoPE's cos and sin (and a materialised mask), shared by every layer, counted once
    per_layer: int  # what each layer keeps for backward: ``stream`` when checkpointed, else ``layer_saved``
    layer_inputs: int  # every layer's input (one ``stream`` each) and ``rope``: what checkpointing keeps


@dataclass(frozen=True)
class Inventory:
    """Everything one setup's step is assembled from."""

    states: ModelStates
    tensors: StepTensors
    deepspeed: DeepSpeedSettings | None = None  # DeepSpeed's knobs (None: the defaults; only DeepSpeed reads them)
    zero: ZeroStates | None = None  # DeepSpeed's layout of the model states (None: not a DeepSpeed setup)
    layers: LayerTerms | None = None  # one layer's terms (None: not an FSDP setup, whose phases alone read them)
