"""A fix written on the user's ``tune run`` command: each change as torchtune reads it (``key=value`` overrides after
the config, ``~key`` to drop a YAML key, ``--nproc_per_node`` before the recipe, the recipe and the model builder
swapped for LoRA), where the user's own YAML does not already carry it (:func:`oomlab.launch.rewrite.changed_files`
edits that file's scalar keys).

What :mod:`oomlab.launch.torchtune` read and a fix needs (the builder, the recipe, the YAML's keys) travels on
:class:`oomlab.launch.read.UserLaunch`'s ``framework_values``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from oomlab.core.choices import Method, Optimizer, Strategy
from oomlab.core.setup import TrainingSetup
from oomlab.core.user_input import shell_words
from oomlab.launch.read import UserLaunch
from oomlab.launch.torchtune import QLORA_PACKAGES

# the optimizer's component as torchtune names it (bitsandbytes' unpaged AdamW8bit: its state on the GPU, as budgeted)
COMPONENTS = {Optimizer.ADAMW: "torch.optim.AdamW", Optimizer.ADAMW_FUSED: "torch.optim.AdamW",
              Optimizer.ADAMW_8BIT: "bitsandbytes.optim.AdamW8bit", Optimizer.SGD: "torch.optim.SGD"}
# oomlab's module names back to torchtune's LoRA names (fused families: every name of the fused module)
_ATTENTION = {"q_proj": ("q_proj",), "k_proj": ("k_proj",), "v_proj": ("v_proj",), "o_proj": ("output_proj",),
              "dense": ("output_proj",), "qkv_proj": ("q_proj", "k_proj", "v_proj")}
_MLP = ("gate_proj", "up_proj", "down_proj", "gate_up_proj")


def set_override(text: str, key: str, value: str) -> str:
    """``text`` with ``key=value``: replaced where the command gives it, else added at the end."""
    words = shell_words(text)
    for i, word in enumerate(words):
        if word.startswith(f"{key}=") or word == f"~{key}":
            words[i] = f"{key}={value}"
            return " ".join(words)
    return f"{text} {key}={value}"


def drop_override(text: str, key: str) -> str:
    """``text`` without a ``key=...`` override."""
    return " ".join(w for w in shell_words(text) if not w.startswith(f"{key}="))


def set_processes(text: str, gpus: int) -> str:
    """``--nproc_per_node N`` among tune run's torchrun options (before the recipe)."""
    for flag in ("--nproc_per_node", "--nproc-per-node"):
        match = re.search(rf"{flag}(=| )\S+", text)
        if match:
            return text[:match.start()] + f"{flag}{match.group(1)}{gpus}" + text[match.end():]
    return text.replace("tune run ", f"tune run --nproc_per_node {gpus} ", 1)


def _recipe(text: str, old: str, new: str) -> str:
    return " ".join(new if w == old or w.endswith(f"/{old}.py") else w for w in shell_words(text))


def lora_overrides(launch: UserLaunch, fix: TrainingSetup) -> list[tuple[str, str]]:
    """The builder and the adapter keys of ``fix``'s LoRA / QLoRA, as torchtune's builders take them."""
    values = launch.framework_values
    package, base = values["builder_package"], values["builder_base"]
    own_qlora = package.rsplit(".", 1)[-1] in QLORA_PACKAGES  # else: lora_ with quantize_base (qwen2, qwen2_5)
    prefix = "qlora_" if fix.method is Method.QLORA and own_qlora else "lora_"
    out = [("model._component_", f"{package}.{prefix}{base}")]
    if fix.method is Method.QLORA and not own_qlora:
        out.append(("model.quantize_base", "True"))
    if launch.setup.method is Method.FULL:  # the adapter keys the full config lacks
        attention = [n for t in fix.lora_targets for n in _ATTENTION.get(t, ())]
        out += [("model.lora_attn_modules", "[" + ",".join(dict.fromkeys(attention)) + "]"),
                ("model.apply_lora_to_mlp", str(any(t in _MLP for t in fix.lora_targets))),
                ("model.lora_rank", str(fix.lora_rank)), ("model.lora_alpha", str(fix.lora_alpha))]
        if "lr_scheduler._component_" not in launch.framework_values.get("yaml_keys", ()):
            # the LoRA recipes call cfg.lr_scheduler's step (recipes/lora_finetune_single_device.py :340-344, 718):
            # a full config has none; the LoRA configs' own
            out += [("lr_scheduler._component_", "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup"),
                    ("lr_scheduler.num_warmup_steps", "100")]
    return out


def optimizer_overrides(launch: UserLaunch, optimizer: Optimizer, text: str) -> list[tuple[str, str | None]]:
    """``optimizer._component_`` (and ``fused``) for ``optimizer`` on the command ``text``; ``(key, None)``: no
    ``fused`` left, the YAML's dropped with ``~optimizer.fused`` unless ``text`` already drops it (bitsandbytes'
    optimizers take no ``fused``, and torchtune refuses removing a key twice)."""
    out: list[tuple[str, str | None]] = [("optimizer._component_", COMPONENTS[optimizer])]
    words = shell_words(text)
    in_yaml = "optimizer.fused" in launch.framework_values.get("yaml_keys", ())
    if optimizer is Optimizer.ADAMW_FUSED:
        out.append(("optimizer.fused", "True"))
    elif in_yaml and "~optimizer.fused" not in words or any(w.startswith("optimizer.fused=") for w in words):
        out.append(("optimizer.fused", None))
    return out


def _without_fused(text: str, launch: UserLaunch) -> str:
    """``text`` with no ``fused`` left: an override of it dropped, the YAML's removed (once)."""
    text = drop_override(text, "optimizer.fused")
    in_yaml = "optimizer.fused" in launch.framework_values.get("yaml_keys", ())
    if in_yaml and "~optimizer.fused" not in shell_words(text):
        text = f"{text} ~optimizer.fused"
    return text


def how(launch: UserLaunch, knob: str, fix: TrainingSetup, batch_words: str) -> str | None:
    """The words for one change on a ``tune run`` launch (None: the knob has no torchtune spelling)."""
    if knob == "optimizer":
        overrides = optimizer_overrides(launch, fix.optimizer, launch.command.text)
        words = [f"{k}={v}" for k, v in overrides if v is not None]
        if any(v is None for _, v in overrides):
            words.append("and no optimizer.fused (~optimizer.fused where the YAML sets it)")
        return " ".join(words)
    if knob == "strategy" and fix.strategy in (Strategy.FSDP2_OFFLOAD, Strategy.FSDP_OFFLOAD):
        return "fsdp_cpu_offload=True (the *_distributed recipe offloads parameters, gradients and optimizer states)"
    if knob == "method":
        recipe = launch.framework_values["recipe"]
        words = " ".join(f"{k}={v}" for k, v in lora_overrides(launch, fix))
        return f"recipe {recipe.replace('full_', 'lora_')}, {words}" if recipe.startswith("full_") else words
    if knob == "gpus":
        return f"tune run --nproc_per_node {fix.gpus}"
    if knob == "batch" and launch.setup.optimizer_in_backward and not fix.optimizer_in_backward:
        return f"{batch_words} optimizer_in_bwd=False (torchtune accumulates only without it)"
    return {"checkpointing": "enable_activation_checkpointing=True", "seq": f"tokenizer.max_seq_len={fix.seq}",
            "batch": batch_words}.get(knob)


def fixed(launch: UserLaunch, changes: Iterable[tuple[str, TrainingSetup]], accumulation: int,
          edited: set[str]) -> str:
    """The user's ``tune run`` with each ``(knob, setup after it)`` change, except the keys ``edited`` in the user's
    YAML."""
    text = launch.command.text
    for knob, s in changes:
        if knob == "checkpointing" and "enable_activation_checkpointing" not in edited:
            text = set_override(text, "enable_activation_checkpointing", "True")
        elif knob == "seq" and "tokenizer.max_seq_len" not in edited:
            text = set_override(text, "tokenizer.max_seq_len", str(s.seq))
        elif knob == "batch":
            if "batch_size" not in edited:
                text = set_override(text, "batch_size", str(s.batch))
            if "gradient_accumulation_steps" not in edited:
                text = set_override(text, "gradient_accumulation_steps", str(accumulation))
            if launch.setup.optimizer_in_backward and not s.optimizer_in_backward:
                text = set_override(text, "optimizer_in_bwd", "False")
        elif knob == "optimizer":
            for key, value in optimizer_overrides(launch, s.optimizer, text):
                text = set_override(text, key, value) if value is not None else _without_fused(text, launch)
        elif knob == "strategy" and s.strategy in (Strategy.FSDP2_OFFLOAD, Strategy.FSDP_OFFLOAD):
            text = set_override(text, "fsdp_cpu_offload", "True")
        elif knob == "gpus":
            text = set_processes(text, s.gpus)
        elif knob == "method":
            recipe = launch.framework_values["recipe"]
            if recipe.startswith("full_"):
                text = drop_override(_recipe(text, recipe, recipe.replace("full_", "lora_")), "optimizer_in_bwd")
            for key, value in lora_overrides(launch, s):
                text = set_override(text, key, value)
    return text
