"""What nobody stated in a launch: the HF Trainer's defaults at the user's transformers release, peft's, and oomlab's
assumptions where no library decides (:func:`trainer_defaults`, the last step of :func:`oomlab.launch.resolve.
read_launch`'s claims)."""

from __future__ import annotations

from typing import Any

from oomlab.core.choices import Attention, Loss, Method, Optimizer, Precision
from oomlab.core.defaults import DEFAULT_LORA_TARGETS
from oomlab.core.models import ModelSpec
from oomlab.core.versions import Fact, Versions, runs_sdpa_by_default, sdpa_release, trainer_default_optimizer
from oomlab.launch import keys as K
from oomlab.launch.claims import Claims, Strength
from oomlab.launch.load_peak import transformers_label
from oomlab.launch.origin import Origin, assumed, default_origin
from oomlab.launch.read import ASSUMED_SEQ

OPTIM_WHY = {"adamw_torch_fused": " on torch >= 2.8",  # what decided the Trainer's default optim (core.versions)
             "adamw_torch": f" ({Fact.TRAINER_FUSED_ADAMW.value}: adamw_torch_fused from "
                            f"{Fact.TRAINER_FUSED_ADAMW.release_text} under torch >= 2.8)",
             "adamw_hf": f" ({Fact.TRAINER_ADAMW_TORCH.value}: adamw_torch from "
                         f"{Fact.TRAINER_ADAMW_TORCH.release_text})"}


def trainer_defaults(claims: Claims, trainer: bool, spec: ModelSpec, versions: Versions) -> None:
    """What nobody stated: the HF Trainer's defaults for a Trainer script at the user's transformers release (the
    optimizer: :func:`~oomlab.core.versions.trainer_default_optimizer`; the attention:
    :attr:`~oomlab.core.versions.Fact.SDPA_DEFAULT`), else oomlab's assumptions."""
    t = transformers_label(versions)
    optim = trainer_default_optimizer(versions)
    if trainer:
        for name, value, what in (
                ("precision", Precision.FP32, "TrainingArguments fp16=False, bf16=False"),
                ("batch", 8, "TrainingArguments per_device_train_batch_size=8"),
                ("checkpointing", False, "TrainingArguments gradient_checkpointing=False"),
                ("optimizer", K.OPTIM_NAMES[optim], f"TrainingArguments optim='{optim}'{OPTIM_WHY[optim]}"),
            ("accumulation", 1, "TrainingArguments gradient_accumulation_steps=1")):
            _library_default(claims, name, value, default_origin(t, what))
    for name, value, why in (
            ("precision", Precision.FP16_MIXED, "the pipeline's precision default (the seed's case)"),
            ("batch", 1, "the pipeline's batch default"),
            ("checkpointing", False, "the pipeline's checkpointing default"),
            ("optimizer", Optimizer.ADAMW, "the pipeline's optimizer default"),
            ("nodes", 1, "one node"),
            ("seq", min(ASSUMED_SEQ, spec.max_position_embeddings),
             f"the pipeline's seq default {ASSUMED_SEQ}, at most {spec.name}'s max_position_embeddings"),
            ("lora_targets", DEFAULT_LORA_TARGETS, "oomlab's LoRA targets (the attention projections)")):
        claims.say(name, value, assumed(why), Strength.ASSUMED)
    torch = versions.release("torch")  # transformers' is_torch_sdpa_available: torch >= 2.1.1
    family = spec.family.value
    if runs_sdpa_by_default(family, versions) and (torch is None or torch >= (2, 1, 1)):
        _library_default(claims, "attention", Attention.SDPA, default_origin(t, "attn_implementation='sdpa' where "
                                                                              "torch has it"))
    else:
        since = ".".join(map(str, sdpa_release(family)))
        _library_default(claims, "attention", Attention.EAGER, default_origin(t, (
            f"the eager attention: no SDPA for {family} models before transformers {since} "
            f"({Fact.SDPA_DEFAULT.value}: the family's _supports_sdpa) nor under torch < 2.1.1 "
            "(is_torch_sdpa_available)")))
    _library_default(claims, "method", Method.FULL, default_origin(t, "no adapter: every parameter trains"))
    _library_default(claims, "loss", Loss.STANDARD, default_origin(t, "use_liger_kernel=False: the loss over the "
                                                                      "(tokens x vocab) logits"))
    _library_default(claims, "offload_activations", False, default_origin(t, "no activation_offloading: the saved "
                                                                          "activations stay on the GPU"))
    _library_default(claims, "lora_rank", 8, default_origin(K.PEFT, "LoraConfig r=8"))
    _library_default(claims, "lora_alpha", 8, default_origin(K.PEFT, "LoraConfig lora_alpha=8"))


def _library_default(claims: Claims, name: str, value: Any, origin: Origin) -> None:
    """transformers' or peft's default, unless a framework (LLaMA-Factory, axolotl, TRL) said its own."""
    if not any(strength <= Strength.DEFAULT for _, _, strength in claims.said.get(name, ())):
        claims.say(name, value, origin, Strength.DEFAULT)
