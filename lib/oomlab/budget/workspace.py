"""Transient memory of a step besides the saved activations: DDP's gradient buckets, FSDP's all-gather and
reduce-scatter buffers, the logits and the loss's tensors, and the gradient temporaries of a recomputed layer."""

from __future__ import annotations

import enum

from oomlab.budget import activations as act
from oomlab.budget.states import grad_bytes_per_param, param_bytes, trainable_parameters
from oomlab.core.choices import Method, Precision, Strategy
from oomlab.core.setup import TrainingSetup

FSDP_STRATEGIES = (Strategy.FSDP, Strategy.FSDP_OFFLOAD)


class GatherPoint(enum.Enum):
    """Where in the step FSDP's buffers are counted."""

    FORWARD = "forward"  # trained layers: the current all-gather and the next one prefetched; frozen: one
    BACKWARD_START = "backward-start"  # the last layer gathered again
    BACKWARD = "backward"  # a trained layer's backward: it, the next prefetched, its reduce-scatter, its grads


def ddp_bucket_bytes(setup: TrainingSetup) -> int:
    """DDP's reducer keeps flat gradient buckets as large as the gradients (gradient_as_bucket_view=False)."""
    if setup.strategy is not Strategy.DDP or setup.world_size == 1:
        return 0
    return grad_bytes_per_param(setup) * trainable_parameters(setup)


def fsdp_root_bytes(setup: TrainingSetup) -> int:
    """FSDP2 keeps the root module's parameters (embedding, final norm, LM head) unsharded all step."""
    if setup.strategy not in FSDP_STRATEGIES:
        return 0
    spec = setup.model
    return param_bytes(setup) * (spec.embedding_params + spec.lm_head_params + spec.hidden_size)


def fsdp_layer_bytes(setup: TrainingSetup) -> int:
    """One decoder layer's unsharded parameters (the size of each all-gather / reduce-scatter buffer)."""
    if setup.strategy not in FSDP_STRATEGIES:
        return 0
    spec = setup.model
    return param_bytes(setup) * (spec.layer_matmul_params + 2 * spec.hidden_size)


def fsdp_gather_bytes(setup: TrainingSetup, where: GatherPoint) -> int:
    """FSDP2 workspace: the unsharded root plus per-layer all-gather / reduce-scatter buffers at ``where``.

    NB: buffer counts read off FSDP2 traces (FSDPMemTracker); see tests/budget/test_agreement.py.
    """
    layer = fsdp_layer_bytes(setup)
    if not layer:
        return 0
    trained = setup.method is Method.FULL
    # NB: at the end of forward and the start of backward the traces hold two layer buffers (the last
    # gathered and the next) except for frozen, non-checkpointed layers, where only the last remains.
    held = 2 if trained or setup.checkpointing else 1
    if where is GatherPoint.FORWARD:
        return fsdp_root_bytes(setup) + held * layer
    if where is GatherPoint.BACKWARD_START or not trained:
        return fsdp_root_bytes(setup) + (held if not trained else 1) * layer
    grads = layer * grad_bytes_per_param(setup) // param_bytes(setup)
    return fsdp_root_bytes(setup) + 3 * layer + grads


def logits_bytes(setup: TrainingSetup) -> dict[str, int]:
    """The (tokens x vocab) tensors of the LM head and the loss (transformers' ForCausalLMLoss)."""
    tv = act.tokens(setup) * setup.model.vocab_size
    c = 4 if setup.precision is Precision.FP32 else 2
    return {
        "logits": c * tv,  # lm_head output, held by the model output
        "fp32 copy": 0 if c == 4 else 4 * tv,  # logits.float() inside the loss
        "log_softmax": 4 * tv,  # saved by cross_entropy for backward
        "grad": 4 * tv,  # d loss / d log_softmax and d log_softmax / d logits, one at a time
    }


def recompute_gradient_bytes(setup: TrainingSetup) -> int:
    """Gradient temporaries inside a recomputed layer's backward (measured at small scale).

    The gradients of the SwiGLU product, the SiLU output and up (``3 i``) and the incoming hidden-state
    gradient (``h``), in the compute dtype, per token.
    """
    c = 4 if setup.precision is Precision.FP32 else 2
    spec = setup.model
    return act.tokens(setup) * c * (3 * spec.intermediate_size + spec.hidden_size)
