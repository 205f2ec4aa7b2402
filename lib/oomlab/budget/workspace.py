"""Transient memory of a step besides the saved activations: DDP's gradient buckets, the logits and the loss's
tensors, the gradient temporaries of a recomputed layer and QLoRA's dequantized weight (FSDP's buffers:
:mod:`oomlab.budget.fsdp`)."""

from __future__ import annotations

from dataclasses import dataclass

from oomlab.budget import activations as act
from oomlab.budget.states import grad_bytes_per_param, trainable_parameters
from oomlab.core.choices import Method, Precision, Strategy
from oomlab.core.setup import TrainingSetup


def ddp_bucket_bytes(setup: TrainingSetup) -> int:
    """DDP's reducer keeps flat gradient buckets as large as the gradients (gradient_as_bucket_view=False)."""
    if setup.strategy is not Strategy.DDP or setup.world_size == 1:
        return 0
    return grad_bytes_per_param(setup) * trainable_parameters(setup)


@dataclass(frozen=True)
class LogitsBytes:
    """The (tokens x vocab) tensors of the LM head and the loss (transformers' ForCausalLMLoss)."""

    logits: int  # lm_head output, held by the model output
    fp32_copy: int  # logits.float() inside the loss (none when the logits are fp32 already)
    log_softmax: int  # saved by cross_entropy for backward
    grad: int  # d loss / d log_softmax and d log_softmax / d logits, one at a time


def logits_bytes(setup: TrainingSetup) -> LogitsBytes:
    """The setup's :class:`LogitsBytes`."""
    tv = act.tokens(setup) * setup.model.vocab_size
    c = 4 if setup.precision is Precision.FP32 else 2
    return LogitsBytes(logits=c * tv, fp32_copy=0 if c == 4 else 4 * tv, log_softmax=4 * tv, grad=4 * tv)


def recompute_gradient_bytes(setup: TrainingSetup) -> int:
    """Gradient temporaries inside a recomputed layer's backward (measured at small scale).

    The gradients of the SwiGLU product, the SiLU output and up (``3 i``) and the incoming hidden-state
    gradient (``h``), in the compute dtype, per token.
    """
    c = 4 if setup.precision is Precision.FP32 else 2
    spec = setup.model
    return act.tokens(setup) * c * (3 * spec.intermediate_size + spec.hidden_size)


NF4_BLOCK = 64  # bitsandbytes' default bnb_4bit blocksize: one absmax per 64 weights


def dequant_bytes(setup: TrainingSetup) -> int:
    """QLoRA: the transient dequantized weight of the projection being computed (0 for other methods).

    bitsandbytes 0.50 ``MatMul4Bit``: backward always computes ``grad_output @ dequantize_4bit(W)`` (autograd/
    _functions.py ``MatMul4Bit.backward``); forward runs ``gemm_4bit``, which on CUDA dequantizes and calls
    ``F.linear`` past 1,536 tokens (backends/cuda/ops.py ``_dequant_linear_fallback``) and always does on CPU
    (backends/default/ops.py).  Each dequantization holds the whole weight in the compute dtype plus its
    double-quantized absmax expanded to fp32, one projection at a time, freed after the matmul: the largest
    projection is the transient.
    """
    if setup.method is not Method.QLORA:
        return 0
    largest = max(n_in * n_out for n_in, n_out in setup.model.projection_shapes.values())
    return 2 * largest + 4 * (largest // NF4_BLOCK)


def in_layer_backward_bytes(setup: TrainingSetup, gradient_temporaries: int) -> int:
    """The largest transient inside one layer's backward, given its elementwise gradient temporaries.

    Without quantization it is those temporaries (``c (3 i + h)`` per token, :func:`recompute_gradient_bytes`).
    QLoRA's gate/up input gradient holds one dequantized ``h x i`` weight beside two of the three ``i``-wide gradients
    (:func:`dequant_bytes`): larger when ``h`` exceeds the micro-batch's tokens (13B at 2,048 tokens; measured at
    small scale, where tokens exceed ``h``, the dequantized weight is not at the peak).
    """
    dequant = dequant_bytes(setup)
    if not dequant:
        return gradient_temporaries
    c = 4 if setup.precision is Precision.FP32 else 2
    return max(gradient_temporaries, gradient_temporaries - c * act.tokens(setup) * setup.model.intermediate_size
               + dequant)
