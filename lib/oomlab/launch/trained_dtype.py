"""Which dtype full fine-tuning trains in, from the dtype the weights were loaded in.

``--bf16`` / ``--fp16`` turn on autocast; they do not give the weights an fp32 master copy.  Under DDP or one process
the HF Trainer trains the parameters from_pretrained made: loaded in fp32 (transformers 4.x without ``torch_dtype``)
it is mixed precision with fp32 weights, gradients and AdamW moments; loaded in half (``torch_dtype=bfloat16``) it is
pure half -- half gradients, and torch's AdamW keeps its moments in the parameter's dtype.  Only the sharded launchers
make their own fp32 master: accelerate upcasts low-precision parameters to fp32 for FSDP when mixed precision is on
(accelerate 1.15 accelerator.py:1999-2037, utils/fsdp_utils.py:816-824) and DeepSpeed keeps fp32 partitions of its
own.  A frozen base (LoRA's, QLoRA's non-4-bit parameters) stays in the dtype it was loaded in
(:func:`frozen_base_dtype`): nothing upcasts or casts it but DeepSpeed."""

from __future__ import annotations

from oomlab.core.choices import BaseDtype, Method, Precision, Strategy
from oomlab.launch.origin import OriginKind, Sourced, Unmodelled, default_origin

_PURE = {"bfloat16": Precision.BF16, "float16": Precision.FP16}
_MIXED = (Precision.BF16_MIXED, Precision.FP16_MIXED)
FP16_SCALER_REFUSES = ("the Trainer's GradScaler refuses fp16 parameters ('Attempting to unscale FP16 gradients', "
                       "torch/amp/grad_scaler.py _unscale_grads_): with --fp16 over a float16 model this launch fails "
                       "at its first optimizer step, whatever the memory; load in float32 (or bfloat16 with --bf16)")


def trained_precision(precision: Sourced, load_dtype: Sourced | None, strategy: Strategy,
                      method: Method, release_default: bool = False) -> tuple[Sourced, Unmodelled | None]:
    """The precision full fine-tuning trains in under ``strategy``: pure half where the launch itself loads the
    weights in half -- a file or flag says so, or transformers 5's default ``dtype='auto'`` loads the checkpoint's
    half ``torch_dtype`` (:attr:`~oomlab.core.versions.Fact.LOAD_DTYPE_AUTO`; the Trainer then trains those weights as
    they are: transformers 5.24 trainer.py casts the model only for full-half eval (:2950-2953), accelerate upcasts
    only for FSDP, accelerator.py:1997-2037; ``release_default``: the load dtype is that release default, not an
    assumption or a framework's);
    an assumed load dtype changes nothing -- and nothing makes an fp32 master, its origin saying why; and, for fp16,
    the refusal the run meets at its first step."""
    if (method is not Method.FULL or strategy not in (Strategy.DDP, Strategy.SINGLE) or precision.value not in _MIXED
            or load_dtype is None or load_dtype.value not in _PURE
            or not (load_dtype.origin.kind in (OriginKind.FILE, OriginKind.FLAG)
                    or release_default and load_dtype.origin.kind is OriginKind.DEFAULT)):
        return precision, None
    pure = _PURE[load_dtype.value]
    why = (f"{precision.value.value} ({precision.origin}) over weights loaded in {load_dtype.value} "
           f"({load_dtype.origin}): under {strategy.value} nothing makes an fp32 master copy, so weights, "
           f"gradients and AdamW moments stay {load_dtype.value}")
    trained = Sourced(pure, default_origin("the HF Trainer without FSDP or DeepSpeed", why),
                      (precision.origin, load_dtype.origin))
    note = Unmodelled(load_dtype.origin, load_dtype.value, FP16_SCALER_REFUSES) if pure is Precision.FP16 else None
    return trained, note


def frozen_base_dtype(load_dtype: Sourced | None, method: Method, precision: Precision) -> Sourced:
    """The dtype a launch's frozen base is stored in: fp32 where the launch loads the model in fp32 under a mixed
    precision -- a file or flag says so, a framework's default does (TRL's ``ModelConfig`` ``dtype``), or transformers
    4.x's ``from_pretrained`` default does (no ``torch_dtype``: ``torch.float``) -- its origin the load dtype's; else
    half.  An assumed load dtype changes nothing.  Said of full fine-tuning too, where it changes no budget (the
    weights follow the precision) but travels with the setup: a fix that turns the run into LoRA starts from the
    fp32 load the user's script makes (the ladder's LoRA rung loads it in half, and says so)."""
    if (load_dtype is not None and load_dtype.value == "float32" and precision in _MIXED
            and load_dtype.origin.kind is not OriginKind.ASSUMED):
        return Sourced(BaseDtype.FP32, load_dtype.origin)
    why = "full fine-tuning's weights follow the precision" if method is Method.FULL else \
        "the frozen base stored in the precision's half dtype, as loaded"
    return Sourced(BaseDtype.HALF, load_dtype.origin if load_dtype is not None and method is not Method.FULL
                   else default_origin("oomlab", why))
