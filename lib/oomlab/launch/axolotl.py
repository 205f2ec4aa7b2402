"""axolotl's launch read: ``axolotl train config.yml``, ``accelerate launch -m axolotl.cli.train config.yml`` or
``python -m axolotl.cli.train config.yml`` -- the YAML is the whole setup (``--key value`` after it overrides a key).

axolotl is not pip-light (it pins torch, transformers, trl, bitsandbytes, flash-attn, ...), so its YAML is parsed here
and every default is cited from ``axolotl-ai-cloud/axolotl`` at the release named in :data:`VERSION` (tag
``v0.18.0``, commit 2f5cb9da62a0fe763a1ddeb7798fc9acb2f4a417):

- ``sequence_len`` 512: ``src/axolotl/utils/schemas/config.py:665-666``; ``gradient_checkpointing`` False
  (``:600-601``; ``offload``/``offload_disk`` checkpoint and offload the saved inputs); ``bf16`` ``"auto"``
  (``:559-560``), resolved in ``src/axolotl/utils/config/__init__.py:156-170``: bf16 where the GPU has it, else fp16;
  ``rl`` None (``:262-263``): supervised fine-tuning;
- ``micro_batch_size`` 1 and ``gradient_accumulation_steps`` 1: ``src/axolotl/utils/schemas/training.py:71-78``;
  ``optimizer`` ``"adamw_torch_fused"`` (``:122-123``);
- ``adapter`` None (``src/axolotl/utils/schemas/peft.py:41-42``): every parameter trains; ``lora_r``/``lora_alpha``
  have no default (``:53-54``) and go to peft's ``LoraConfig`` as written (``src/axolotl/loaders/adapter.py:188-189``);
  ``lora_target_linear`` adds every linear layer (``:174``); a 4-bit base only with ``adapter: qlora`` and
  ``load_in_4bit`` (``src/axolotl/loaders/model.py:712``);
- the model loads in bf16 with bf16, fp16 with fp16 or 8-bit, else fp32 (``utils/config/__init__.py:191-196``);
- ``chunked_cross_entropy`` (``src/axolotl/utils/schemas/config.py:978-983``, default None; the support matrix
  ``docs/support-matrix.qmd:114`` spells it ``chunked_cross_entropy: true``): ``loaders/patch_manager.py:304-311``
  replaces transformers' ``ForCausalLMLoss`` with ``monkeypatch/loss/chunked.py``'s loss, compiled per chunk over the
  whole logits (``setup.loss`` ``chunked-loss-compiled``); ``chunked_cross_entropy_num_chunks`` (``:984-989``, 8 when
  unset, ``chunked.py:127``) does not move that budget (the whole logits and their gradient are held at any count);
  with ``cut_cross_entropy`` axolotl refuses the config (``integrations/cut_cross_entropy/args.py:46-54``);
- FSDP: ``fsdp_version`` 2 sets ``FSDP_VERSION=2``, else accelerate's FSDP1 (``src/axolotl/utils/trainer.py:595``);
  ``fsdp_config.offload_params`` and ``activation_checkpointing`` (``utils/schemas/fsdp.py:15-26``).
"""

from __future__ import annotations

from typing import Any

from oomlab.core.choices import Loss, Method, Optimizer, Precision, Reference, Trainer
from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.gpus import load_gpu
from oomlab.core.models import ALL_LINEAR
from oomlab.launch.claims import Claims
from oomlab.launch.command import LaunchCommand
from oomlab.launch.framework import (
    Framework,
    FrameworkRead,
    config_file,
    layered_lookup,
    number_of,
    say_default,
)
from oomlab.launch.memory_flags import KEYS as MEMORY_FLAG_KEYS
from oomlab.launch.memory_flags import memory_flags
from oomlab.launch.origin import Origin, Sourced, Unmodelled, default_origin
from oomlab.launch.read import (
    MAX_BATCH,
    MAX_LORA,
    MAX_SEQ,
    attention_of,
    bool_value,
    int_value,
    optimizer_of,
    targets_of,
)

VERSION = "axolotl 0.18.0"
_MERGE = "axolotl's CLI overrides of the YAML, src/axolotl/cli/config.py"

# rl -> the trainer kind (utils/schemas/enums.py RLType: dpo, gdpo, grpo, ipo, orpo, kto, simpo, ebft)
RL = {"dpo": Trainer.DPO, "ipo": Trainer.DPO, "orpo": Trainer.ORPO, "simpo": Trainer.ORPO, "kto": Trainer.KTO,
      "grpo": Trainer.GRPO, "gdpo": Trainer.GRPO}
ADAPTERS = {"lora": Method.LORA, "qlora": Method.LORA}  # qlora is LoRA over load_in_4bit's base

KEYS = frozenset({
    "base_model", "adapter", "load_in_4bit", "load_in_8bit", "lora_r", "lora_alpha", "lora_target_modules",
    "lora_target_linear", "sequence_len", "micro_batch_size", "gradient_accumulation_steps", "gradient_checkpointing",
    "deepspeed", "fsdp", "fsdp_version", "optimizer", "bf16", "fp16", "flash_attention", "sdp_attention",
    "attn_implementation", "rl", "trl.beta", "chunked_cross_entropy", *MEMORY_FLAG_KEYS,
    *(f"fsdp_config.{k}" for k in ("fsdp_version", "version", "offload_params", "fsdp_offload_params",
                                   "activation_checkpointing", "fsdp_activation_checkpointing")),
})
_NOTED = {
    "sample_packing": "packed sequences fill sequence_len: the budget takes every sequence at sequence_len either way",
    "pad_to_sequence_len": "every sequence padded to sequence_len, as the budget takes it",
    "batch_size": "the global batch: the budget reads micro_batch_size (and gradient_accumulation_steps)",
    "eval_sample_packing": "evaluation only",
    "chunked_cross_entropy_num_chunks": "the chunk count of chunked_cross_entropy: the budget holds the whole logits "
                                        "and their gradient at any count (monkeypatch/loss/chunked.py)",
}


def read_axolotl(claims: Claims, cmd: LaunchCommand, command_dir: str | None, gpu: str) -> FrameworkRead:
    """Claims of axolotl's YAML (and ``--key value`` overrides), axolotl's defaults where it says nothing."""
    if cmd.config is None:
        raise InvalidValueError(f"{cmd.text!r}: axolotl's config YAML is missing; axolotl reads "
                                "'axolotl train config.yml'")
    unmodelled: list[Unmodelled] = []
    config = config_file(command_dir, cmd.config)
    look = layered_lookup(cmd, config, unmodelled, _MERGE)
    read = FrameworkRead(Framework.AXOLOTL, VERSION, _trainer(look), unmodelled=unmodelled, files=[config.path])
    read.unmodelled += memory_flags(claims, look, "axolotl")  # the loss kernel (its plugins); refused settings
    _chunked_loss(claims, look)
    for key, name, high, default, where in (
            ("micro_batch_size", "batch", MAX_BATCH, 1, "training.py:77-78"),
            ("gradient_accumulation_steps", "accumulation", MAX_BATCH, 1, "training.py:71-72"),
            ("sequence_len", "seq", MAX_SEQ, 512, "config.py:665-666")):
        hit = look(key)
        if hit[0] and hit[1] is not None:
            claims.say(name, int_value(hit[1], hit[2], high), hit[2])
            if name == "accumulation":
                read.refs["gradient_accumulation_steps"] = (int_value(hit[1], hit[2], high), hit[2])
        else:
            say_default(claims, name, default, VERSION, f"{key}={default} (utils/schemas/{where})")
    hit = look("base_model")
    if hit[0] and hit[1]:
        read.refs["model"] = hit
    _adapter(claims, look)
    _precision(claims, look, gpu)
    _checkpointing(claims, look)
    _attention(claims, look)
    hit = look("optimizer")
    if hit[0] and hit[1] is not None:
        claims.say("optimizer", optimizer_of(hit[1], hit[2]), hit[2])
    else:
        say_default(claims, "optimizer", Optimizer.ADAMW_FUSED, VERSION, "optimizer='adamw_torch_fused' "
                    "(utils/schemas/training.py:122-123)")
    hit = look("deepspeed")
    if hit[0] and hit[1]:
        if not isinstance(hit[1], str):
            raise InvalidValueError(f"{hit[2]}: an inline DeepSpeed mapping is not read; write it to a JSON file and "
                                    "name it (deepspeed: zero2.json)")
        read.refs["deepspeed"] = hit
    read.refs.update(_fsdp(claims, look))
    beta = look("trl.beta")
    if read.trainer.value is Trainer.GRPO and beta[0] and beta[1] is not None:  # TRL's GRPO: beta 0 loads none
        read.reference = Sourced(Reference.RESIDENT if number_of(beta[1], beta[2]) > 0 else Reference.NONE, beta[2])
    read.unmodelled += _unread(config, look)
    return read


def _trainer(look: Any) -> Sourced:
    hit = look("rl")
    if not hit[0] or hit[1] in (None, False, ""):
        return Sourced(Trainer.SFT, default_origin(VERSION, "rl=None: supervised fine-tuning "
                                                            "(utils/schemas/config.py:262-263)"))
    name = str(hit[1]).lower()
    if name not in RL:
        raise UnknownNameError(f"rl ({hit[2]})", name, list(RL), "the trainers oomlab budgets")
    return Sourced(RL[name], hit[2])


def _adapter(claims: Claims, look: Any) -> None:
    adapter = look("adapter")
    if not adapter[0] or adapter[1] in (None, ""):
        say_default(claims, "method", Method.FULL, VERSION, "adapter=None: every parameter trains "
                    "(utils/schemas/peft.py:41-42)")
    else:
        name = str(adapter[1]).lower()
        if name not in ADAPTERS:
            raise UnknownNameError(f"adapter ({adapter[2]})", name, list(ADAPTERS), "the adapters oomlab budgets")
        claims.say("method", ADAPTERS[name], adapter[2])
        for key, field_name in (("lora_r", "lora_rank"), ("lora_alpha", "lora_alpha")):
            hit = look(key)
            if not hit[0] or hit[1] is None:
                raise InvalidValueError(f"{adapter[2]}: adapter {name} without {key}; axolotl passes {key} to peft's "
                                        "LoraConfig as written (loaders/adapter.py:188-189): set it")
            claims.say(field_name, int_value(hit[1], hit[2], MAX_LORA), hit[2])
        linear, modules = look("lora_target_linear"), look("lora_target_modules")
        if linear[0] and bool_value(linear[1], linear[2]):
            claims.say("lora_targets", (ALL_LINEAR,), linear[2])
        elif modules[0] and modules[1]:
            claims.say("lora_targets", targets_of(modules[1]), modules[2])
        else:
            raise InvalidValueError(f"{adapter[2]}: adapter {name} without lora_target_modules or "
                                    "lora_target_linear; set one")
    for key, bits in (("load_in_4bit", 4), ("load_in_8bit", 8)):
        hit = look(key)
        if hit[0] and bool_value(hit[1], hit[2]):
            if bits == 4 and str(adapter[1]).lower() != "qlora":  # loaders/model.py:712
                raise InvalidValueError(f"{hit[2]}: load_in_4bit without adapter: qlora; axolotl quantizes the base "
                                        "to 4 bits only for qlora (loaders/model.py:712)")
            claims.say("quantization", bits, hit[2])


def _chunked_loss(claims: Claims, look: Any) -> None:
    """``chunked_cross_entropy: true``: the loss compiled per chunk over transformers' whole logits
    (loaders/patch_manager.py:304-311); with ``cut_cross_entropy`` too, the claims name both (axolotl refuses it)."""
    hit = look("chunked_cross_entropy")
    if hit[0] and hit[1] is not None and bool_value(hit[1], hit[2]):
        claims.say("loss", Loss.CHUNKED_LOSS_COMPILED, hit[2])


def _precision(claims: Claims, look: Any, gpu: str) -> None:
    """bf16 / fp16 as utils/config/__init__.py resolve_dtype sets them, and the load dtype that follows."""
    bf16, fp16 = look("bf16"), look("fp16")
    fp16_on = fp16[0] and fp16[1] is not None and bool_value(fp16[1], fp16[2])
    auto = not bf16[0] or str(bf16[1]).lower() == "auto"
    if fp16_on:
        chosen, origin = Precision.FP16_MIXED, fp16[2]
        claims.say("precision", chosen, origin)
        if not auto and bool_value(bf16[1], bf16[2]):
            claims.say("precision", Precision.BF16_MIXED, bf16[2])  # a contradiction, named by the claims
    elif auto:
        has_bf16 = load_gpu(gpu).bf16
        chosen = Precision.BF16_MIXED if has_bf16 else Precision.FP16_MIXED
        origin = default_origin(VERSION, f"bf16='auto': {gpu} {'has' if has_bf16 else 'lacks'} bf16, so "
                                         f"{chosen.value} (utils/config/__init__.py:156-167)")
        say_default(claims, "precision", chosen, VERSION, origin.key)
    else:
        chosen = Precision.BF16_MIXED if bool_value(bf16[1], bf16[2]) else Precision.FP32
        origin = bf16[2]
        claims.say("precision", chosen, origin)
    eight = look("load_in_8bit")
    if chosen is Precision.BF16_MIXED:
        dtype = "bfloat16"
    elif chosen is Precision.FP16_MIXED or eight[0] and bool_value(eight[1], eight[2]):
        dtype = "float16"
    else:
        dtype = "float32"
    claims.say("load_dtype", dtype, default_origin(VERSION, f"torch_dtype {dtype} from {origin} "
                                                            "(utils/config/__init__.py:191-196)"))


def _checkpointing(claims: Claims, look: Any) -> None:
    hit = look("gradient_checkpointing")
    if hit[0] and hit[1] is not None:
        if str(hit[1]).lower() in ("offload", "offload_disk"):
            claims.say("checkpointing", True, hit[2])
            if str(hit[1]).lower() == "offload":  # the checkpointed layer inputs in host memory
                claims.say("offload_activations", True, hit[2])
        else:
            claims.say("checkpointing", bool_value(hit[1], hit[2]), hit[2])
    else:
        say_default(claims, "checkpointing", False, VERSION, "gradient_checkpointing=False "
                    "(utils/schemas/config.py:600-601)")
    for key in ("fsdp_config.activation_checkpointing", "fsdp_config.fsdp_activation_checkpointing"):
        hit = look(key)
        if hit[0] and hit[1] is not None and bool_value(hit[1], hit[2]):
            claims.say("checkpointing", True, hit[2])


def _attention(claims: Claims, look: Any) -> None:
    hit = look("attn_implementation")
    if hit[0] and hit[1]:
        claims.say("attention", attention_of(hit[1], hit[2]), hit[2])
    for key, name in (("flash_attention", "flash_attention_2"), ("sdp_attention", "sdpa")):
        hit = look(key)
        if hit[0] and hit[1] is not None and bool_value(hit[1], hit[2]):
            claims.say("attention", attention_of(name, hit[2]), hit[2])


def _fsdp(claims: Claims, look: Any) -> dict[str, Any]:
    """FSDP as the Trainer's ``fsdp`` reference (``full_shard auto_wrap [offload]``) and its version."""
    listed, top_version = look("fsdp"), look("fsdp_version")
    config_version = next((h for h in (look("fsdp_config.fsdp_version"), look("fsdp_config.version")) if h[0]), None)
    offload = next((h for h in (look("fsdp_config.offload_params"), look("fsdp_config.fsdp_offload_params"))
                    if h[0]), None)
    on = listed[0] and listed[1] or top_version[0] and top_version[1] is not None or config_version is not None
    if not on:
        return {}
    words = listed[1] if listed[0] and listed[1] else ["full_shard", "auto_wrap"]
    words = words.split() if isinstance(words, str) else [str(w) for w in words]
    if offload is not None and bool_value(offload[1], offload[2]) and "offload" not in words:
        words.append("offload")
    origin: Origin = listed[2] if listed[0] and listed[1] else (top_version if top_version[0] else config_version)[2]
    version_hit = top_version if top_version[0] else config_version
    version = 1 if version_hit is None else int_value(version_hit[1], version_hit[2], 2)
    return {"fsdp": (True, " ".join(words), origin), "fsdp_config": (True, {"version": version}, origin)}


def _unread(config: Any, look: Any) -> list[Unmodelled]:
    out = []
    for key, value in config.leaves():
        top = key.split(".")[0]
        if key in KEYS or top in ("fsdp", "datasets", "special_tokens"):
            if top in ("datasets", "special_tokens"):
                out.append(Unmodelled(config.origin(key), value, "does not change GPU memory"))
            continue
        if top == "trl":
            why = "the RL trainer's setting (generations, beta, reference model) is not budgeted apart"
        else:
            why = _NOTED.get(key, f"{VERSION} key not modelled by oomlab")
        out.append(Unmodelled(config.origin(key), look(key)[1] if look(key)[0] else value, why))
    return out
