"""torchtune's launch read: ``tune run [torchrun options] <recipe> --config <config> [key=value ...]``.

The recipe and its YAML config are the whole setup; ``key=value`` words after the config override its keys (OmegaConf's
dotlist merge, ``torchtune/config/_parse.py``).  ``--config`` names the user's YAML, or a config torchtune ships
(``llama3_2/3B_qlora_single_device``), read from the copies in ``oomlab/data/torchtune-configs`` (torchtune
:data:`CONFIGS_RELEASE`, ``scripts/vendor_torchtune_configs.py``).  Each default is cited from pytorch/torchtune
``v0.6.1`` (the release read):

- the four fine-tuning recipes (``torchtune/_recipe_registry.py``): ``*_single_device`` refuse torchrun options
  (``torchtune/_cli/run.py`` :206-211), ``*_distributed`` shard with FSDP2 (``training.shard_model`` since 0.3.0,
  ``recipes/full_finetune_distributed.py``; FSDP1 ``FSDP(...)`` at v0.2.1 :319), ``fsdp_cpu_offload`` offloading;
- ``dtype`` bf16 (pure: weights, gradients and optimizer states in bf16, no autocast) or fp32; none is fp32, fp16 is
  refused, bf16 where the GPU lacks it raises (``training/precision.py`` :100-120; recipes' ``fp16 precision is
  not supported``);
- ``batch_size`` and ``gradient_accumulation_steps`` are read as ``cfg.batch_size`` / ``cfg.gradient_accumulation_
  steps`` (no default); ``enable_activation_checkpointing`` / ``enable_activation_offloading`` default False
  (``recipes/full_finetune_single_device.py`` :160-165); ``optimizer_in_bwd`` False (full recipes only);
  ``compile`` False;
- the sequence: ``tokenizer.max_seq_len``; packed datasets (``dataset.packed``) fill it, unpacked batches are padded
  to their longest sample (``padded_collate_sft``), at most ``max_seq_len``: the budget takes it (or ``--seq``);
- LoRA builders' defaults (``models/llama3_2/_model_builders.py`` :129-138): ``apply_lora_to_mlp`` and
  ``apply_lora_to_output`` False, ``lora_rank`` 8, ``lora_alpha`` 16, ``quantize_base`` False (``qlora_*``
  builders set it); ``lora_attn_modules`` has none.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from functools import cache
from typing import Any

import yaml

from oomlab.core.choices import Attention, Loss, Method, Optimizer, Precision, Trainer
from oomlab.core.errors import InvalidValueError, UnknownNameError, UnmodelledSettingError
from oomlab.core.gpus import load_gpu
from oomlab.core.models import load_model
from oomlab.core.paths import DATA_DIR
from oomlab.core.setup import TORCHTUNE_FSDP2
from oomlab.core.user_input import shown
from oomlab.core.versions import Versions, installed_versions
from oomlab.launch.claims import Claims
from oomlab.launch.command import LaunchCommand
from oomlab.launch.files import LaunchFile, read_file
from oomlab.launch.framework import Framework, FrameworkRead, command_path, layered_lookup, say_default
from oomlab.launch.memory_flags import refuse
from oomlab.launch.origin import Origin, OriginKind, Sourced, Unmodelled, assumed, default_origin, flag_origin
from oomlab.launch.read import MAX_BATCH, MAX_LORA, MAX_SEQ, bool_value, int_value

RELEASE_READ = (0, 6, 1)
VERSION = "torchtune 0.6.1"
CONFIGS_DIR = DATA_DIR / "torchtune-configs"
_MERGE = "torchtune's key=value overrides of the YAML, torchtune/config/_parse.py"

# recipe -> (method, distributed)
RECIPES = {"full_finetune_single_device": (Method.FULL, False), "full_finetune_distributed": (Method.FULL, True),
           "lora_finetune_single_device": (Method.LORA, False), "lora_finetune_distributed": (Method.LORA, True)}

# torchtune's model builder (without lora_/qlora_) -> the shipped model with that architecture
BUILDERS = {
    "llama2_7b": "llama-2-7b", "llama2_13b": "llama-2-13b", "llama2_70b": "llama-2-70b",
    "llama3_1_8b": "llama-3.1-8b", "llama3_1_70b": "llama-3.1-70b",
    "llama3_3_70b": "llama-3.1-70b",  # Llama 3.3 70B has Llama 3.1 70B's architecture (its builder calls the same)
    "llama3_2_1b": "llama-3.2-1b", "llama3_2_3b": "llama-3.2-3b", "mistral_7b": "mistral-7b",
    "gemma_2b": "gemma-2b", "gemma_7b": "gemma-7b", "gemma2_9b": "gemma-2-9b", "gemma2_27b": "gemma-2-27b",
    "phi3_mini": "phi-3-mini-4k", "phi4_14b": "phi-4", "qwen2_7b": "qwen2-7b", "qwen2_5_0_5b": "qwen2.5-0.5b",
    **{f"qwen2_5_{size}b_{kind}": f"qwen2.5-{size}b" for size in (7, 14, 32, 72) for kind in ("base", "instruct")},
}
_BUILDER = re.compile(r"torchtune\.models\.\w+\.(q?lora_)?(\w+)")

# torchtune's LoRA module names -> the model's module names, the first the model has (fused families: qkv_proj)
_TARGETS = {"q_proj": ("q_proj", "qkv_proj"), "k_proj": ("k_proj", "qkv_proj"), "v_proj": ("v_proj", "qkv_proj"),
            "output_proj": ("o_proj", "dense")}
_MLP = {"w1": ("gate_proj", "gate_up_proj"), "w3": ("up_proj", "gate_up_proj"), "w2": ("down_proj",)}

# optimizer._component_ -> the optimizer budgeted
_OPTIMIZERS = {"torch.optim.AdamW": Optimizer.ADAMW, "torch.optim.SGD": Optimizer.SGD,
               "bitsandbytes.optim.AdamW8bit": Optimizer.ADAMW_8BIT,
               "bitsandbytes.optim.PagedAdamW8bit": Optimizer.ADAMW_8BIT}
# loss._component_ -> the loss kernel (CEWithChunkedOutputLoss: compiled per chunk under compile: True)
_CHUNKED = "torchtune.modules.loss.CEWithChunkedOutputLoss"
_LOSSES = (_CHUNKED, "torch.nn.CrossEntropyLoss")

READ = frozenset({
    "model._component_", "model.lora_attn_modules", "model.apply_lora_to_mlp", "model.apply_lora_to_output",
    "model.lora_rank", "model.lora_alpha", "model.quantize_base", "model.lora_dropout", "batch_size",
    "gradient_accumulation_steps", "dtype", "enable_activation_checkpointing", "enable_activation_offloading",
    "optimizer_in_bwd", "compile", "loss._component_", "optimizer._component_", "optimizer.fused",
    "tokenizer.max_seq_len", "dataset.packed", "fsdp_cpu_offload", "tensor_parallel_dim", "ac_mode", "device",
})
# keys that decide nothing the budget holds
_HARMLESS = ("output_dir", "checkpointer", "tokenizer", "dataset", "seed", "shuffle", "epochs", "max_steps_per_epoch",
             "lr_scheduler", "metric_logger", "log_every_n_steps", "log_peak_memory_stats", "profiler", "optimizer",
             "resume_from_checkpoint", "save_adapter_weights_only", "loss", "clip_grad_norm", "run_val_every_n_steps",
             "log_level", "cudnn_deterministic_mode", "enable_async_checkpointing", "collate_fn", "low_cpu_ram",
             "custom_sharded_layers", "fsdp_reshard_after_forward", "model")


def builder_model(component: str) -> str | None:
    """The shipped model a torchtune model builder (``torchtune.models.llama3_2.qlora_llama3_2_3b``) builds."""
    match = _BUILDER.fullmatch(str(component))
    return None if match is None else BUILDERS.get(match.group(2))


@cache
def builtin_configs() -> dict[str, dict]:
    """torchtune's built-in configs copied into oomlab (``index.json``: name -> file, recipes)."""
    return json.loads((CONFIGS_DIR / "index.json").read_text())["configs"]


def is_tune(cmd: LaunchCommand) -> bool:
    return cmd.launcher.value == "tune run"


def recipe_of(cmd: LaunchCommand) -> str:
    """The recipe ``tune run`` runs: a built-in name, or a copy of one (``tune cp``: ``my_recipe/full_finetune_...py``
    or its module path) read as that recipe; anything else refused naming the recipes read."""
    name = cmd.script.replace("\\", "/").rsplit("/", 1)[-1]
    name = name[:-3] if name.endswith(".py") else name.rsplit(".", 1)[-1]
    if name not in RECIPES:
        raise UnknownNameError("torchtune recipe", cmd.script, list(RECIPES), "torchtune's fine-tuning recipes oomlab "
                               "reads (a copied recipe keeps its file name)")
    return name


def release_of(versions: Versions | None) -> tuple[Versions, Sourced]:
    """The user's versions with torchtune's release: the one given, else :data:`RELEASE_READ` (assumed, said)."""
    base = versions if versions is not None else installed_versions()
    given = base.release("torchtune")
    if given is not None:
        text = ".".join(map(str, given))
        return base, Sourced(text, flag_origin(f"--versions torchtune=={text}"))
    text = ".".join(map(str, RELEASE_READ))
    return base.assuming(torchtune=RELEASE_READ), Sourced(text, assumed(
        f"torchtune {text}, the release oomlab reads: give --versions torchtune==X for yours"))


def _config(cmd: LaunchCommand, command_dir: str | None) -> tuple[LaunchFile, bool]:
    """The config ``--config`` names: the user's file, else a built-in one (True)."""
    hit = cmd.flag("--config")
    if hit is None or not hit[1]:
        raise InvalidValueError(f"{cmd.text!r}: tune run needs --config <config> (torchtune/_cli/run.py :174-179)")
    value = hit[1]
    path = command_path(command_dir, value)
    if value.lower().endswith((".yaml", ".yml")) or path.exists():
        return read_file(path), False
    configs = builtin_configs()
    if value not in configs:
        raise UnknownNameError("torchtune config", value, sorted(configs), f"the built-in configs of {VERSION} oomlab "
                               "reads, or a YAML file (tune cp <config> my_config.yaml)")
    builtin = read_file(CONFIGS_DIR / configs[value]["file"])  # shown by name: it is torchtune's, not the user's
    return replace(builtin, path=f"{VERSION}'s built-in config {value}"), True


def _components(cmd: LaunchCommand, config: LaunchFile) -> LaunchCommand:
    """``optimizer=torch.optim.AdamW`` read as torchtune reads it: ``optimizer._component_`` where the YAML's key
    holds a component (config/_utils.py :176-179 at v0.6.1)."""
    flags = tuple((f"{k}._component_" if not k.startswith(("-", "~")) and config.has(f"{k}._component_") else k, v)
                  for k, v in cmd.flags)
    return replace(cmd, flags=flags)


def _parsed(hit: tuple[bool, Any, Origin]) -> tuple[bool, Any, Origin]:
    """An override's text as OmegaConf reads it (YAML: ``True``, ``2``, ``['q_proj','v_proj']``), bounded: a long
    value or one with a YAML anchor stays text."""
    found, value, origin = hit
    if not found or not isinstance(value, str) or origin.kind is not OriginKind.FLAG or len(value) > 1000 \
            or "&" in value:
        return hit
    if value == "None":  # torchtune reads None as null (config/_utils.py :181-183)
        return found, None, origin
    try:
        loaded = yaml.safe_load(value)
    except yaml.YAMLError:
        return hit
    return (found, loaded, origin) if isinstance(loaded, (str, int, float, bool, list, type(None))) else hit


def read_torchtune(claims: Claims, cmd: LaunchCommand, command_dir: str | None, gpu: str,
                   versions: Versions | None) -> FrameworkRead:
    """Claims of a ``tune run`` launch: its recipe, its config and the overrides after it."""
    recipe = recipe_of(cmd)
    method, distributed = RECIPES[recipe]
    config, builtin = _config(cmd, command_dir)
    cmd = _components(cmd, config)
    unmodelled: list[Unmodelled] = []
    layered = layered_lookup(cmd, config, unmodelled, _MERGE)
    removed = {k[1:] for k, _ in cmd.flags if k.startswith("~")}

    def look(key: str) -> tuple[bool, Any, Origin]:
        if key in removed or any(key.startswith(r + ".") for r in removed):
            return False, None, flag_origin(f"~{key}")
        return _parsed(layered(key))

    full_versions, release = release_of(versions)
    if builtin and release.value != VERSION.split()[-1]:
        unmodelled.append(Unmodelled(config.origin("model"), cmd.flag("--config")[1],
                                     f"a built-in config read at {VERSION}; torchtune {release.value}'s may differ "
                                     "(tune cp it and pass the file to read yours)"))
    read = FrameworkRead(Framework.TORCHTUNE, f"torchtune {release.value}",
                         Sourced(Trainer.SFT, default_origin(VERSION, f"{recipe}: supervised fine-tuning")),
                         unmodelled=unmodelled, files=[] if builtin else [config.path], versions=full_versions,
                         release=release)
    if cmd.option("--nproc_per_node", "--nproc-per-node", "--nnodes") and not distributed:
        raise InvalidValueError(f"{cmd.text!r}: {recipe} does not support distributed training; torchtune refuses "
                                "torchrun options with it (torchtune/_cli/run.py :206-211): use its *_distributed "
                                "recipe")
    model = _model(look, method)
    read.refs["model"] = (True, model, look("model._component_")[2])
    package, _, builder = str(look("model._component_")[1]).rpartition(".")
    read.values = {"recipe": recipe, "builder_package": package,
                   "builder_base": re.sub(r"^q?lora_", "", builder),
                   "yaml_keys": tuple(sorted(k for k, _ in config.leaves()))}
    _adapters(claims, look, method, model)
    _precision(claims, look, gpu)
    _counts(claims, look)
    _sequence(claims, look)
    _memory(claims, look, recipe, read)
    say_default(claims, "attention", Attention.SDPA, VERSION, "torchtune's attention: F.scaled_dot_product_attention "
                "(modules/attention_utils.py _sdpa_or_flex_attention; flex_attention with packed samples, budgeted "
                "as SDPA)")
    _optimizer(claims, look, read)
    if distributed:
        read.refs.update(_fsdp(look, release))
    read.unmodelled += _unread(config, layered)
    return read


def _model(look: Any, method: Method) -> str:
    hit = look("model._component_")
    if not hit[0] or not hit[1]:
        raise InvalidValueError(f"{hit[2]}: no model._component_; torchtune builds the model it names")
    model = builder_model(hit[1])
    if model is None:
        raise UnknownNameError(f"torchtune model builder ({hit[2]})", hit[1],
                               sorted(f"[q]lora_{b}" if method is Method.LORA else b for b in BUILDERS),
                               "the builders of models oomlab ships (torchtune.models.<family>.<builder>)")
    lora = re.search(r"\.q?lora_", str(hit[1])) is not None
    if lora != (method is Method.LORA):
        raise InvalidValueError(f"{hit[2]}: {hit[1]} in a {'LoRA' if method is Method.LORA else 'full'} fine-tuning "
                                f"recipe; use a {'lora_ or qlora_' if method is Method.LORA else 'base'} builder")
    return model


def _adapters(claims: Claims, look: Any, method: Method, model: str) -> None:
    builder = look("model._component_")
    if method is Method.FULL:  # and what its LoRA builders default to, should a fix add adapters
        say_default(claims, "method", Method.FULL, VERSION, "a full fine-tuning recipe: every parameter trains")
        for name, default in (("lora_rank", 8), ("lora_alpha", 16)):
            say_default(claims, name, default, VERSION, f"{name}={default}, its LoRA builders' default "
                        "(models/llama3_2/_model_builders.py :133-134)")
        return
    claims.say("method", Method.LORA, builder[2])
    quantized = ".qlora_" in str(builder[1])
    hit = look("model.quantize_base")
    if hit[0] and hit[1] is not None:
        quantized = bool_value(hit[1], hit[2])
    if quantized:
        claims.say("quantization", 4, hit[2] if hit[0] else builder[2])
    for key, name, default in (("model.lora_rank", "lora_rank", 8), ("model.lora_alpha", "lora_alpha", 16)):
        hit = look(key)
        if hit[0] and hit[1] is not None:
            claims.say(name, int_value(hit[1], hit[2], MAX_LORA), hit[2])
        else:
            say_default(claims, name, default, VERSION, f"{key.split('.')[1]}={default} (the builder's default, "
                        "models/llama3_2/_model_builders.py :133-134)")
    modules = look("model.lora_attn_modules")
    if not modules[0] or not modules[1]:
        raise InvalidValueError(f"{builder[2]}: no model.lora_attn_modules; torchtune's LoRA builders need it "
                                "(e.g. ['q_proj', 'v_proj'])")
    written = modules[1] if isinstance(modules[1], list) else str(modules[1]).strip("[]").replace(",", " ").split()
    names = load_model(model).lora_target_names
    targets: dict[str, None] = {}
    for raw in written:
        name = str(raw).strip("'\" ")
        if name not in _TARGETS:
            raise UnknownNameError(f"model.lora_attn_modules ({modules[2]})", name, list(_TARGETS),
                                   "torchtune's attention LoRA modules")
        targets[next((n for n in _TARGETS[name] if n in names), _TARGETS[name][0])] = None
    mlp = look("model.apply_lora_to_mlp")
    if mlp[0] and mlp[1] is not None and bool_value(mlp[1], mlp[2]):
        for candidates in _MLP.values():
            targets[next((n for n in candidates if n in names), candidates[0])] = None
    claims.say("lora_targets", tuple(targets), modules[2])
    output = look("model.apply_lora_to_output")
    if output[0] and output[1] is not None and bool_value(output[1], output[2]):
        raise refuse("model.apply_lora_to_output", output[1], output[2], "a LoRA adapter on the output head (oomlab "
                     "budgets adapters on the decoder layers' projections)")


def _precision(claims: Claims, look: Any, gpu: str) -> None:
    hit = look("dtype")
    name = "fp32" if not hit[0] or hit[1] is None else str(hit[1]).lower()
    if name not in ("bf16", "fp32"):
        raise InvalidValueError(f"{hit[2]}: dtype {shown(hit[1])}: torchtune trains in bf16 or fp32 (fp16 is refused "
                                "by its recipes; training/precision.py :100-111)")
    if name == "bf16" and not load_gpu(gpu).bf16:
        raise InvalidValueError(f"{hit[2]}: dtype bf16 on {gpu}, which lacks bf16: torchtune raises 'bf16 precision "
                                "was requested but not available on this hardware' (training/precision.py "
                                ":113-120); use dtype=fp32")
    precision = Precision.BF16 if name == "bf16" else Precision.FP32
    if hit[0] and hit[1] is not None:
        claims.say("precision", precision, hit[2])
    else:
        say_default(claims, "precision", precision, VERSION, "dtype None: float32 (training/precision.py :100-102)")
    claims.say("load_dtype", "bfloat16" if name == "bf16" else "float32",
               default_origin(VERSION, f"the model built under training.set_default_dtype({name})"))


def _counts(claims: Claims, look: Any) -> None:
    for key, name in (("batch_size", "batch"), ("gradient_accumulation_steps", "accumulation")):
        hit = look(key)
        if not hit[0] or hit[1] is None:
            raise InvalidValueError(f"{hit[2]}: no {key}; torchtune's recipes read cfg.{key} (no default): set it")
        claims.say(name, int_value(hit[1], hit[2], MAX_BATCH), hit[2])


def _sequence(claims: Claims, look: Any) -> None:
    hit, packed = look("tokenizer.max_seq_len"), look("dataset.packed")
    is_packed = packed[0] and packed[1] is not None and bool_value(packed[1], packed[2])
    if hit[0] and hit[1] is not None:
        claims.say("seq", int_value(hit[1], hit[2], MAX_SEQ), hit[2])
        return
    if is_packed:
        raise InvalidValueError(f"{packed[2]}: dataset.packed without tokenizer.max_seq_len; torchtune packs to "
                                "max_seq_len and refuses packing without it: set it")
    if "seq" not in claims.said:
        raise InvalidValueError(f"{hit[2]}: tokenizer.max_seq_len is null: torchtune pads each batch to its longest "
                                "sample, whatever its length; pass --seq N (the longest sample in tokens) or set "
                                "tokenizer.max_seq_len")


def _memory(claims: Claims, look: Any, recipe: str, read: FrameworkRead) -> None:
    for key, name in (("enable_activation_checkpointing", "checkpointing"),
                      ("enable_activation_offloading", "offload_activations")):
        hit = look(key)
        if hit[0] and hit[1] is not None:
            claims.say(name, bool_value(hit[1], hit[2]), hit[2])
        else:
            say_default(claims, name, False, VERSION, f"{key} False (recipes/{recipe}.py :160-165)")
    hit = look("ac_mode")
    if hit[0] and str(hit[1]).strip().lower() == "selective":
        raise refuse("ac_mode", hit[1], hit[2], "torchtune's selective activation checkpointing")
    hit = look("tensor_parallel_dim")
    if hit[0] and hit[1] is not None and int_value(hit[1], hit[2], 1024) > 1:
        raise refuse("tensor_parallel_dim", hit[1], hit[2], "tensor parallelism")
    compiled = look("compile")
    on = compiled[0] and compiled[1] is not None and bool_value(compiled[1], compiled[2])
    if on:
        read.unmodelled.append(Unmodelled(compiled[2], compiled[1], "torch.compile of each layer: budgeted as the "
                                          "eager model (its activations are usually at or below it)"))
    loss = look("loss._component_")
    if loss[0] and loss[1] is not None:
        if loss[1] not in _LOSSES:
            raise UnmodelledSettingError(f"{loss[2]}: loss {shown(loss[1])} is not budgeted; oomlab budgets "
                                         f"{', '.join(_LOSSES)}")
        kernel = Loss.STANDARD if loss[1] != _CHUNKED else Loss.CHUNKED_COMPILED if on else Loss.CHUNKED
        claims.say("loss", kernel, loss[2])
    hit = look("optimizer_in_bwd")
    if hit[0] and hit[1] is not None and bool_value(hit[1], hit[2]):
        if recipe.startswith("lora"):
            read.unmodelled.append(Unmodelled(hit[2], hit[1], f"{recipe} does not read optimizer_in_bwd"))
        else:
            claims.say("optimizer_in_backward", True, hit[2])


def _optimizer(claims: Claims, look: Any, read: FrameworkRead) -> None:
    hit = look("optimizer._component_")
    if not hit[0] or not hit[1]:
        raise InvalidValueError(f"{hit[2]}: no optimizer._component_; torchtune instantiates the optimizer it names")
    name = str(hit[1])
    if name not in _OPTIMIZERS:
        raise UnknownNameError(f"optimizer._component_ ({hit[2]})", name, list(_OPTIMIZERS),
                               "the optimizers oomlab budgets")
    optimizer = _OPTIMIZERS[name]
    fused = look("optimizer.fused")
    if optimizer is Optimizer.ADAMW and fused[0] and fused[1] is not None and bool_value(fused[1], fused[2]):
        optimizer, origin = Optimizer.ADAMW_FUSED, fused[2]
    else:
        origin = hit[2]
    claims.say("optimizer", optimizer, origin)
    if name.endswith("PagedAdamW8bit"):
        read.unmodelled.append(Unmodelled(hit[2], name, "paged: bitsandbytes keeps its state in CUDA managed memory "
                                          "(it pages out under pressure); budgeted on the GPU as AdamW8bit"))


def _fsdp(look: Any, release: Sourced) -> dict[str, Any]:
    """FSDP as the recipe shards: FSDP2 from 0.3.0 (FSDP1 before), CPU offload with ``fsdp_cpu_offload``."""
    words = "full_shard auto_wrap"
    hit = look("fsdp_cpu_offload")
    if hit[0] and hit[1] is not None and bool_value(hit[1], hit[2]):
        words += " offload"
    release_tuple = tuple(int(p) for p in release.value.split("."))
    version = 2 if release_tuple >= TORCHTUNE_FSDP2 else 1
    origin = default_origin(VERSION, f"a *_distributed recipe shards with FSDP{version} at torchtune {release.value}")
    return {"fsdp": (True, words, hit[2] if "offload" in words else origin),
            "fsdp_config": (True, {"version": version}, origin)}


def _unread(config: LaunchFile, look: Any) -> list[Unmodelled]:
    out = []
    for key, value in config.leaves():
        if key in READ:
            continue
        top = key.split(".")[0]
        why = "does not change GPU memory" if top in _HARMLESS else f"{VERSION} key not modelled by oomlab"
        out.append(Unmodelled(config.origin(key), look(key)[1] if look(key)[0] else value, why))
    return out

