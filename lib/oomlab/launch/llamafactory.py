"""LLaMA-Factory's launch read: ``llamafactory-cli train config.yaml [key=value ...]`` (the YAML, or JSON, with
OmegaConf overrides after it) or ``llamafactory-cli train --key value ...`` (the flags alone).

LLaMA-Factory is not pip-light (it pins torch, transformers, datasets, peft, trl, ...), so its arguments are parsed
here and every default it fills is cited from its source at the release named in :data:`VERSION`
(``hiyouga/LLaMA-Factory`` tag ``v0.9.5``, commit 7af909522a951e3ad9f022ea6f88b6755257eaa5):

- ``stage`` ``"sft"`` and ``finetuning_type`` ``"lora"``: ``src/llamafactory/hparams/finetuning_args.py:460-465``;
  ``lora_rank`` 8 (``:77-78``), ``lora_target`` ``"all"`` (``:81-82``, every linear layer), ``lora_alpha`` =
  ``lora_rank * 2`` when unset (``:568``), ``pref_loss`` ``"sigmoid"`` (``:183-184``; the reference model is used for
  ``stage: dpo`` unless ``pref_loss`` is ``orpo`` or ``simpo``, ``:574``), ``pure_bf16`` (``:456``);
- ``cutoff_len`` 2048: ``src/llamafactory/hparams/data_args.py:46-47``; ``packing`` on only for ``stage: pt``
  (``hparams/parser.py:520``);
- gradient checkpointing is **on** unless ``disable_gradient_checkpointing`` (``hparams/model_args.py:145-146``,
  default False): ``model/model_utils/checkpointing.py:164`` ``if not model_args.disable_gradient_checkpointing:``
  enables it on every model that supports it;
- ``flash_attn`` ``"auto"`` (``model_args.py:117-118``) leaves transformers' choice (``model/model_utils/
  attention.py:65``); ``disabled`` is eager, ``sdpa`` SDPA, ``fa2``/``fa3`` flash attention;
- ``quantization_bit`` (``model_args.py:283``) with ``quantization_method`` ``"bnb"`` (``:279-280``);
- the model is loaded in the compute dtype: bf16 with ``bf16``/``pure_bf16``, fp16 with ``fp16``
  (``hparams/parser.py:512-515``);
- processes: ``llamafactory-cli train`` runs torchrun with ``NPROC_PER_NODE`` (every visible GPU) and ``NNODES``
  (``src/llamafactory/launcher.py:64-66``), read by :func:`oomlab.launch.read.launcher_refs`.

Everything else LLaMA-Factory passes to transformers' ``Seq2SeqTrainingArguments`` (``per_device_train_batch_size``,
``gradient_accumulation_steps``, ``bf16``/``fp16``, ``deepspeed``, ``optim``, ...) is read as TrainingArguments are.
"""

from __future__ import annotations

from typing import Any

from oomlab.core.choices import Attention, Method, Precision, Reference, Trainer
from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.models import ALL_LINEAR
from oomlab.launch import keys as K
from oomlab.launch.claims import Claims
from oomlab.launch.command import LaunchCommand
from oomlab.launch.framework import Framework, FrameworkRead, config_file, layered_lookup, say_default
from oomlab.launch.memory_flags import memory_flags
from oomlab.launch.origin import Sourced, Unmodelled, default_origin
from oomlab.launch.read import MAX_LORA, bool_value, int_value, targets_of, training_claims

VERSION = "LLaMA-Factory 0.9.5"
_MERGE = "OmegaConf.merge of the YAML and the command line, hparams/parser.py:90-93"

# stage -> the trainer kind (finetuning_args.py:460: pt, sft, rm, ppo, dpo, kto)
STAGES = {"pt": Trainer.SFT, "sft": Trainer.SFT, "rm": Trainer.REWARD, "ppo": Trainer.PPO, "dpo": Trainer.DPO,
          "kto": Trainer.KTO}
# finetuning_type -> oomlab's method (freeze and oft are not budgeted)
METHODS = {"lora": Method.LORA, "full": Method.FULL}
# flash_attn -> attention (NB: flash attention saves no s x s probabilities, as SDPA)
ATTENTION = {"disabled": Attention.EAGER, "sdpa": Attention.SDPA, "fa2": Attention.SDPA, "fa3": Attention.SDPA}

# LLaMA-Factory's own keys that enter the setup
KEYS = frozenset({*K.CHECKPOINTING_KEYS, "stage", "finetuning_type", "lora_rank", "lora_alpha", "lora_target",
                  "cutoff_len", "quantization_bit", "quantization_method", "flash_attn",
                  "disable_gradient_checkpointing", "pure_bf16", "pref_loss"})
# read, and said why they are not budgeted apart
_NOTED = {
    "packing": "packed sequences fill cutoff_len: the budget takes every sequence at cutoff_len either way",
    "neat_packing": "packing without cross-attention: the budget takes every sequence at cutoff_len either way",
    "ref_model": "a separate reference model: budgeted as a frozen copy of the trained model (its own size is not "
                 "read)",
    "reward_model": "a separate reward model's size is not budgeted apart: the trainer kind's budget holds a copy of "
                    "the trained model",
}


def read_llamafactory(claims: Claims, cmd: LaunchCommand, command_dir: str | None) -> FrameworkRead:
    """Claims of ``llamafactory-cli train``'s YAML and flags, LLaMA-Factory's defaults where they say nothing."""
    unmodelled: list[Unmodelled] = []
    config = config_file(command_dir, cmd.config)
    look = layered_lookup(cmd, config, unmodelled, _MERGE)
    unmodelled += memory_flags(claims, look, "llamafactory")  # the loss kernel; refused settings
    # the Trainer's gradient_checkpointing can switch checkpointing on, never off: LLaMA-Factory enables it itself
    refs = training_claims(claims, lambda key: (False, None, look(key)[2]) if key in K.CHECKPOINTING_KEYS
                           else look(key), is_json=config is not None)
    read = FrameworkRead(Framework.LLAMAFACTORY, VERSION, _trainer(look), refs=refs, unmodelled=unmodelled,
                         files=[] if config is None else [config.path])
    _method(claims, look)
    _precision(claims, look)
    hit = look("cutoff_len")
    if not hit[0]:
        say_default(claims, "seq", 2048, VERSION, "cutoff_len=2048 (hparams/data_args.py:46-47)")
    hit, trainer_on = look("disable_gradient_checkpointing"), _trainer_checkpointing(look)
    if trainer_on is not None:
        claims.say("checkpointing", True, trainer_on)
    elif hit[0]:
        claims.say("checkpointing", not bool_value(hit[1], hit[2]), hit[2])
    else:
        say_default(claims, "checkpointing", True, VERSION, "gradient checkpointing on unless "
                    "disable_gradient_checkpointing (model/model_utils/checkpointing.py:164)")
    hit = look("flash_attn")
    if hit[0] and str(hit[1]).lower() != "auto":
        name = str(hit[1]).lower()
        if name not in ATTENTION:
            raise UnknownNameError(f"flash_attn ({hit[2]})", name, ["auto", *ATTENTION])
        claims.say("attention", ATTENTION[name], hit[2])
    else:
        say_default(claims, "attention", Attention.SDPA, VERSION, "flash_attn='auto' leaves transformers' choice, "
                    "sdpa (model/model_utils/attention.py:65)")
    hit = look("quantization_bit")
    if hit[0] and hit[1] is not None:
        method = look("quantization_method")
        if method[0] and str(method[1]).lower() not in ("bnb", "bitsandbytes"):
            raise UnknownNameError(f"quantization_method ({method[2]})", method[1], ["bnb"],
                                   "oomlab budgets bitsandbytes 4-bit NF4")
        bits = int_value(hit[1], hit[2], 8, 2)
        if bits not in (4, 8):
            raise InvalidValueError(f"{hit[2]}: quantization_bit {bits} is not budgeted; oomlab budgets 4 "
                                    "(bitsandbytes NF4) and refuses 8 with its reason")
        claims.say("quantization", bits, hit[2])
    ref = look("ref_model")
    if ref[0] and ref[1] and read.trainer.value in (Trainer.DPO, Trainer.KTO):  # a separate model, loaded frozen
        read.reference = Sourced(Reference.RESIDENT, ref[2])
    read.unmodelled += _unread(cmd, config, look)
    return read


def _trainer_checkpointing(look: Any) -> Any:
    """The origin of a TrainingArguments ``gradient_checkpointing`` that is on (the Trainer enables it whatever
    ``disable_gradient_checkpointing`` says); None where it is off or not given."""
    for key in K.CHECKPOINTING_KEYS:
        hit = look(key)
        if hit[0] and bool_value(hit[1], hit[2]):
            return hit[2]
    return None


def _trainer(look: Any) -> Sourced:
    stage = look("stage")
    if not stage[0]:
        return Sourced(Trainer.SFT, default_origin(VERSION, "stage='sft' (hparams/finetuning_args.py:460-461)"))
    name = str(stage[1]).lower()
    if name not in STAGES:
        raise UnknownNameError(f"stage ({stage[2]})", name, list(STAGES))
    kind = STAGES[name]
    loss = look("pref_loss")
    if kind is Trainer.DPO and loss[0] and str(loss[1]).lower() in ("orpo", "simpo"):
        # finetuning_args.py:574: no reference model for these losses; chosen and rejected still concatenated
        return Sourced(Trainer.ORPO, loss[2], (stage[2],))
    return Sourced(kind, stage[2])


def _method(claims: Claims, look: Any) -> None:
    hit = look("finetuning_type")
    if hit[0]:
        name = str(hit[1]).lower()
        if name not in METHODS:
            raise UnknownNameError(f"finetuning_type ({hit[2]})", name, list(METHODS),
                                   "oomlab budgets LoRA (QLoRA with quantization_bit 4) and full fine-tuning; "
                                   "freeze and oft are not budgeted")
        claims.say("method", METHODS[name], hit[2])
        lora = METHODS[name] is Method.LORA
    else:
        say_default(claims, "method", Method.LORA, VERSION, "finetuning_type='lora' "
                    "(hparams/finetuning_args.py:464-465)")
        lora = True
    rank = look("lora_rank")
    rank_value = int_value(rank[1], rank[2], MAX_LORA) if rank[0] and rank[1] is not None else 8
    if not rank[0]:
        say_default(claims, "lora_rank", 8, VERSION, "lora_rank=8 (hparams/finetuning_args.py:77-78)")
    if not look("lora_alpha")[0]:
        say_default(claims, "lora_alpha", rank_value * 2, VERSION, "lora_alpha = lora_rank * 2 "
                    "(hparams/finetuning_args.py:568)")
    target = look("lora_target")
    if target[0] and target[1]:
        names = targets_of(target[1])
        claims.say("lora_targets", (ALL_LINEAR,) if names == ("all",) else names, target[2])
    elif lora:
        say_default(claims, "lora_targets", (ALL_LINEAR,), VERSION, "lora_target='all': every linear layer "
                    "(hparams/finetuning_args.py:81-82)")


def _precision(claims: Claims, look: Any) -> None:
    pure = look("pure_bf16")
    if pure[0] and bool_value(pure[1], pure[2]):  # every weight, gradient and state in bf16
        claims.override("precision", Precision.BF16, pure[2], f"{pure[2]} trains in pure bf16 "
                        "(hparams/finetuning_args.py:456, parser.py:512)")
        claims.say("load_dtype", "bfloat16", pure[2])
        return
    for key, dtype in (("bf16", "bfloat16"), ("fp16", "float16")):
        hit = look(key)
        if hit[0] and bool_value(hit[1], hit[2]):  # the model is loaded in the compute dtype (parser.py:512-515)
            claims.say("load_dtype", dtype, default_origin(VERSION, f"compute_dtype {dtype} from {hit[2]} "
                                                                    "(hparams/parser.py:512-515)"))


def _unread(cmd: LaunchCommand, config: Any, look: Any) -> list[Unmodelled]:
    """Every key of the YAML and every flag that does not enter the setup, said why where LLaMA-Factory's meaning is
    known."""
    modelled = K.TRAINING_KEYS | KEYS
    out = []
    names = [key for key, _ in config.leaves()] if config is not None else []
    names += [flag.lstrip("-").replace("-", "_") for flag, _ in cmd.flags]
    for name in dict.fromkeys(names):
        if name in modelled:
            continue
        hit = look(name)
        if not hit[0]:
            continue
        out.append(Unmodelled(hit[2], hit[1], _NOTED.get(name, f"{VERSION} key not modelled by oomlab")))
    return out
