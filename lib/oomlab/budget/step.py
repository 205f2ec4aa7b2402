"""The training step oomlab traces and measures, built from a setup: the model (transformers, peft LoRA), its
dtypes, the optimizer and one step of forward with loss, backward, ``optimizer.step()`` and ``zero_grad``.

Modelling choices (so traced, measured and analytic agree on what is modelled):

- precision ``fp32``: model in float32, no autocast. ``fp16-mixed`` / ``bf16-mixed``, as accelerate (and the
  Trainer, which relies on it) launches them: float32 trained parameters, and
  - single / DDP: accelerate's autocast around the forward with the outputs converted to fp32
    (:func:`accelerate_autocast`); CPU autocast keeps the same cache of cast weight copies as CUDA autocast, freed
    when the outermost autocast exits, i.e. before backward;
  - FSDP1 (``fsdp``): FSDP's ``MixedPrecision(half, half, half)`` gathers half weights, and accelerate's autocast
    wrap is still there (it casts no weight; the outputs are converted to fp32);
  - FSDP2 (``fsdp2``): ``MixedPrecisionPolicy(half, half, output=half)``, no autocast.
  ``fp16`` / ``bf16``: parameters, gradients and optimizer state in that dtype, no autocast.
- method ``lora``: peft ``LoraConfig(r, lora_alpha, target_modules, lora_dropout=0.0)``. **The frozen base is
  stored in the compute dtype** -- fp16 for ``fp16-mixed``, bf16 for ``bf16-mixed`` -- because a frozen base is
  kept in half in practice; the adapters are float32 for ``*-mixed`` (peft's ``autocast_adapter_dtype``) and in
  the model dtype otherwise. ``qlora`` needs real weights (bitsandbytes' NF4 kernels run on real data); it is
  built by :mod:`oomlab.instruments.measured`.
- optimizer ``adamw``: ``torch.optim.AdamW(foreach=True)`` and ``sgd``: ``SGD(momentum=0.9, foreach=True)`` --
  ``foreach`` is what PyTorch picks by default for CUDA parameters (on CPU it would not), so the optimizer
  temporaries (AdamW's ``sqrt(v)`` over all parameters at once) match a GPU run; ``adamw-fused``:
  ``AdamW(fused=True)``, the Trainer's default ``adamw_torch_fused`` (in place, no temporary).
  ``adamw-8bit`` is bitsandbytes'.
- checkpointing: ``model.activation_checkpointing_enable({"use_reentrant": False})`` (transformers 5 renamed
  ``gradient_checkpointing_enable``), which checkpoints each decoder layer's ``forward``.
- The loss: ``model(input_ids=ids, labels=ids).loss`` on random token ids; only the loss is kept (as the Hugging
  Face ``Trainer`` does), so the logits die once backward no longer needs them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from oomlab.core.choices import FSDP1_STRATEGIES, BaseDtype, Method, Optimizer, Precision
from oomlab.core.errors import InvalidValueError
from oomlab.core.models import Family, ModelSpec, model_from_config
from oomlab.core.quiet import quiet_libraries
from oomlab.core.setup import TrainingSetup, make_setup

BACKWARD_DONE = "backward done"  # the timeline mark after loss.backward(); later events are the optimizer's

LEARNING_RATE = 1e-4  # irrelevant to memory; any positive value
# MoE experts as transformers 5 runs them by default on a GPU (``get_correct_experts_implementation``): one
# ``grouped_mm`` over all (token, expert) pairs, sorted by expert -- no data-dependent shapes, so it traces on fake
# tensors and its memory does not depend on the routing (every token's top-k pairs are computed whatever the router
# picks). NB: GPUs below compute capability 8.0 (T4, V100) fall back to transformers' looped grouped_mm, same sizes.
EXPERTS_IMPLEMENTATION = "grouped_mm"


def library_versions() -> dict[str, str]:
    """Versions of the libraries a trace depends on."""
    import peft
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}


# ------------------------------------------------------------------------------------------------ tiny models

TINY_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 344,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 512,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "_source": "oomlab tiny LLaMA for traced-vs-measured checks",
}


# Tiny versions of each family's config: the family's own keys at h=128, 2 layers, V=512 (GQA where the family has
# it, 4 experts top-2 for MoE, a sliding window on alternate layers for Gemma-2); real CPU steps and quick traces.
_TINY_COMMON = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 512,
                "max_position_embeddings": 1024}
TINY_FAMILY_CONFIGS: Mapping[Family, Mapping[str, Any]] = MappingProxyType({
    Family.LLAMA: TINY_CONFIG,
    Family.MISTRAL: {"model_type": "mistral", "intermediate_size": 344, "num_key_value_heads": 2,
                     "sliding_window": 4096, "tie_word_embeddings": False},
    Family.MIXTRAL: {"model_type": "mixtral", "intermediate_size": 96, "num_key_value_heads": 2,
                     "num_local_experts": 4, "num_experts_per_tok": 2, "tie_word_embeddings": False},
    Family.QWEN2: {"model_type": "qwen2", "intermediate_size": 344, "num_key_value_heads": 2,
                   "tie_word_embeddings": False},
    Family.QWEN2_MOE: {"model_type": "qwen2_moe", "intermediate_size": 344, "num_key_value_heads": 4,
                       "moe_intermediate_size": 64, "shared_expert_intermediate_size": 172, "num_experts": 4,
                       "num_experts_per_tok": 2, "norm_topk_prob": False, "tie_word_embeddings": False},
    Family.QWEN3: {"model_type": "qwen3", "intermediate_size": 344, "num_key_value_heads": 2, "head_dim": 32,
                   "tie_word_embeddings": False},
    Family.QWEN3_MOE: {"model_type": "qwen3_moe", "intermediate_size": 344, "num_key_value_heads": 2, "head_dim": 32,
                       "moe_intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2,
                       "norm_topk_prob": True, "tie_word_embeddings": False},
    Family.GEMMA: {"model_type": "gemma", "intermediate_size": 344, "num_key_value_heads": 1, "head_dim": 64,
                   "hidden_act": "gelu_pytorch_tanh"},
    Family.GEMMA2: {"model_type": "gemma2", "intermediate_size": 344, "num_key_value_heads": 2, "head_dim": 48,
                    "sliding_window": 64, "query_pre_attn_scalar": 48, "final_logit_softcapping": 30.0,
                    "attn_logit_softcapping": 50.0},
    Family.PHI: {"model_type": "phi", "intermediate_size": 512, "partial_rotary_factor": 0.5,
                 "tie_word_embeddings": False},
    Family.PHI3: {"model_type": "phi3", "intermediate_size": 344, "num_key_value_heads": 2, "pad_token_id": 0,
                  "tie_word_embeddings": False},
    Family.GPT_NEOX: {"model_type": "gpt_neox", "intermediate_size": 512, "rotary_pct": 0.25,
                      "use_parallel_residual": True, "tie_word_embeddings": False},
    Family.STABLELM: {"model_type": "stablelm", "intermediate_size": 344, "num_key_value_heads": 4,
                      "partial_rotary_factor": 0.25,
                      "use_qkv_bias": True, "tie_word_embeddings": False},
    Family.OLMO2: {"model_type": "olmo2", "intermediate_size": 344, "num_key_value_heads": 4,
                   "tie_word_embeddings": False},
    Family.FALCON: {"model_type": "falcon", "multi_query": True, "parallel_attn": True, "bias": False,
                    "new_decoder_architecture": False, "alibi": False},
    Family.GRANITEMOE: {"model_type": "granitemoe", "intermediate_size": 96, "num_key_value_heads": 2,
                        "num_local_experts": 4, "num_experts_per_tok": 2, "tie_word_embeddings": True},
    Family.GPT_OSS: {"model_type": "gpt_oss", "intermediate_size": 96, "num_key_value_heads": 2, "head_dim": 32,
                     "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 64,
                     "layer_types": ["sliding_attention", "full_attention"], "tie_word_embeddings": False},
})


def tiny_model(family: Family | str = Family.LLAMA, **config: Any) -> ModelSpec:
    """A tiny spec of ``family`` (LLaMA: h=128, 2 layers, V=512; see :data:`TINY_FAMILY_CONFIGS`), overridable."""
    family = Family(family)
    base = TINY_CONFIG if family is Family.LLAMA else {
        **_TINY_COMMON, **TINY_FAMILY_CONFIGS[family], "_source": f"oomlab tiny {family.value} for traced-vs-measured "
                                                                  "checks"}
    fields = {**base, **config}
    stem = "tiny-llama" if family is Family.LLAMA else f"tiny-{family.value}"
    name = stem + "-" + "-".join(f"{k}{v}" for k, v in sorted(config.items())) if config else stem
    return model_from_config(fields, name)


def tiny_setup(model_config: Mapping[str, Any] | None = None, family: Family | str = Family.LLAMA,
               **kw: Any) -> TrainingSetup:
    """A :class:`TrainingSetup` over :func:`tiny_model` (defaults: batch 2, seq 128; every other knob as given)."""
    kw.setdefault("batch", 2)
    kw.setdefault("seq", 128)
    kw.setdefault("gpu", "a100-80gb")  # only for validation (bf16 support); traces do not depend on the GPU
    kw.setdefault("gpus", 1)  # one process: what the CPU runs measure
    return make_setup(model=tiny_model(family, **dict(model_config or {})), **kw)


# --------------------------------------------------------------------------------------------- building a step


@dataclass(frozen=True)
class StepDTypes:
    """The dtypes one setup trains with (torch dtype names), as its launch sets them up."""

    storage: str  # dtype of the (base) model's parameters as built
    autocast: str | None  # accelerate's autocast around the forward (outputs converted to fp32), or None
    adapters_fp32: bool  # LoRA adapters kept in float32 (peft's autocast_adapter_dtype)
    policy: str | None  # FSDP's mixed-precision param dtype (parameters gathered and computed in it), or None


def step_dtypes(setup: TrainingSetup) -> StepDTypes:
    """Storage and compute dtypes for a setup; see the module docstring for the choices."""
    precision, adapters = setup.precision, setup.method in (Method.LORA, Method.QLORA)
    if precision is Precision.FP32:
        return StepDTypes("float32", None, False, None)
    half = precision.compute_dtype
    if precision in (Precision.FP16_MIXED, Precision.BF16_MIXED):
        # full fine-tuning keeps fp32 parameters (master weights); a frozen base is stored in half unless it was
        # loaded in fp32 (budget.states.fp32_loaded_base: DeepSpeed, never traced, would cast it)
        storage = half if adapters and setup.base_dtype is not BaseDtype.FP32 else "float32"
        if setup.strategy in FSDP1_STRATEGIES:  # MixedPrecision(half x 3) + accelerate's autocast wrap
            return StepDTypes(storage, half, adapters, half)
        if setup.strategy.fsdp:  # FSDP2: MixedPrecisionPolicy(half), no autocast
            return StepDTypes(storage, None, adapters, half)
        return StepDTypes(storage, half, adapters, None)
    return StepDTypes(half, None, adapters, None)  # peft keeps adapters fp32 over a half base by default


def build_model(setup: TrainingSetup, device: str, dtypes: StepDTypes | None = None) -> Any:
    """The setup's model on ``device`` ("meta" for traces, "cpu" for real tiny runs), in training mode.

    Checkpointing and attention are set on the transformers model; LoRA is applied with peft. QLoRA is built
    by :mod:`oomlab.instruments.measured` (it needs real weights to quantize). ``dtypes``: other than the setup's own
    (:func:`step_dtypes`) -- the one-layer inventory builds each regime's dtypes directly.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if setup.method is Method.QLORA:
        raise InvalidValueError(
            "method 'qlora' needs real weights; build it with oomlab.instruments.measured.real_model")
    setup.model.check_attention(setup.attention.value)
    dtypes = dtypes or step_dtypes(setup)
    config = setup.model.hf_config()
    config.use_cache = False  # a training step: no KV cache
    extra = {"experts_implementation": EXPERTS_IMPLEMENTATION} if setup.model.family.moe else {}
    with quiet_libraries():
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(
                config, dtype=getattr(torch, dtypes.storage), attn_implementation=setup.attention.value, **extra
            )
        if setup.checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        if setup.method is Method.LORA:  # peft asks transformers' deprecated is_gradient_checkpointing: quiet
            model = apply_lora(model, setup, adapters_fp32=dtypes.adapters_fp32)
    if dtypes.autocast is not None:
        accelerate_autocast(model, dtypes.autocast)
    model.train()
    return model


def to_empty_tied(model: Any, device: str = "cpu") -> Any:
    """``model.to_empty(device=...)`` with its tied weights tied again (as ``from_pretrained`` leaves them).

    ``Module._apply`` gives each registration of a shared parameter its own new tensor when it cannot swap the data in
    place (meta to fake): an LM head tied to the embedding would be counted twice.
    """
    model.to_empty(device=device)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.tie_weights()
    return model


def accelerate_autocast(model: Any, dtype: str) -> None:
    """Wrap ``model.forward`` as ``accelerator.prepare`` does with native AMP (accelerate/accelerator.py 1824-1835):
    ``torch.autocast`` around the forward, then every half output converted to fp32 (``convert_outputs_to_fp32``).

    On a GPU the autocast is CUDA's; traced and measured here it is the CPU's, whose cast cache behaves the same
    (``cached_cast`` in autocast_mode.cpp applies to every device).
    """
    from types import MethodType

    import torch
    from accelerate.utils import convert_outputs_to_fp32

    model._original_forward = model.forward
    autocast = torch.autocast(device_type="cpu", dtype=getattr(torch, dtype))
    model.forward = MethodType(autocast(model.forward.__func__), model)
    model.forward = MethodType(convert_outputs_to_fp32(model.forward.__func__), model)


def apply_lora(model: Any, setup: TrainingSetup, *, adapters_fp32: bool) -> Any:
    """Wrap ``model`` with peft LoRA adapters on ``setup.lora_targets`` (base frozen)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=setup.lora_rank,
        lora_alpha=setup.lora_alpha,
        target_modules=list(setup.lora_targets),
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config, autocast_adapter_dtype=adapters_fp32)


def make_optimizer(setup: TrainingSetup, params: list[Any]) -> Any:
    """The setup's optimizer over ``params`` (state created lazily by the first ``step()``)."""
    import torch

    if setup.optimizer is Optimizer.ADAMW:
        return torch.optim.AdamW(params, lr=LEARNING_RATE, foreach=True)
    if setup.optimizer is Optimizer.ADAMW_FUSED:
        return torch.optim.AdamW(params, lr=LEARNING_RATE, fused=True)
    if setup.optimizer is Optimizer.ADAMW_HF:  # transformers' AdamW is gone from 5.x: torch's loop over the parameters
        return torch.optim.AdamW(params, lr=LEARNING_RATE, foreach=False)
    if setup.optimizer is Optimizer.SGD:
        return torch.optim.SGD(params, lr=LEARNING_RATE, momentum=0.9, foreach=True)
    try:
        import bitsandbytes as bnb
    except ImportError as err:  # pragma: no cover - bitsandbytes is a dependency
        raise InvalidValueError("optimizer 'adamw-8bit' needs bitsandbytes; pip install bitsandbytes") from err
    return bnb.optim.AdamW8bit(params, lr=LEARNING_RATE)


def trainable_tensors(model: Any) -> list[Any]:
    return [p for p in model.parameters() if p.requires_grad]


def run_step(model: Any, optimizer: Any, input_ids: Any, mark: Callable[[str], None] = lambda label: None) -> None:
    """One training step: forward with loss, backward, optimizer step, zero_grad (set_to_none).

    Autocast, where the launch has it, is part of the model's forward (:func:`accelerate_autocast`).
    """
    loss = model(input_ids=input_ids, labels=input_ids).loss
    mark("loss")
    loss.backward()
    mark(BACKWARD_DONE)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    mark("zero_grad done")


@contextlib.contextmanager
def real_data_decisions() -> Iterator[None]:
    """Make transformers take, on fake tensors, the branches it takes on the real token ids -- and run MoE experts
    through a grouped matmul that fake tensors can run.

    transformers reads tensor *values* in one place of a LLaMA training forward: ``find_packed_sequence_indices``
    checks whether the position ids describe several packed sequences, and skips the check -- assuming packing --
    when the tensor is fake (``is_tracing``). Assuming packing disables SDPA's ``is_causal`` fast path and
    materialises a ``batch x 1 x seq x seq`` mask plus an additive copy per layer, memory a real step never
    allocates. Our ids are one unpacked sequence per row (positions ``0 .. seq-1``), for which the real answer
    is ``None``.

    MoE (``grouped_mm`` experts): ``torch._grouped_mm``'s meta function accepts bfloat16 only (it mirrors the CUDA
    kernel's checks), so fp32 and fp16 experts cannot run on fake tensors; for them transformers' own fallback custom
    op (``transformers::grouped_mm_fallback``, integrations/moe.py) computes the same product with a registered fake
    implementation and autograd formula that save the same two tensors (the sorted token states and the expert
    weight). bfloat16 experts run the native op. Traces and real CPU runs take the same path. NB: the fallback's
    backward also computes the gradient of frozen experts (LoRA over an fp16 base): one transient expert-sized
    tensor per layer that the native op would not allocate.
    """
    from unittest import mock

    from transformers import masking_utils
    from transformers.integrations import moe

    native = moe._can_use_grouped_mm

    def bf16_only(input: Any, weight: Any, offs: Any) -> bool:
        import torch

        return weight.dtype == torch.bfloat16 and native(input, weight, offs)

    with mock.patch.object(masking_utils, "find_packed_sequence_indices", lambda position_ids: None), \
            mock.patch.object(moe, "_can_use_grouped_mm", bf16_only):
        yield
