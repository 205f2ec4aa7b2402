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
# the model packages with qlora_ builders at v0.6.1 (torchtune/models/<package>/__init__.py); the others (qwen2,
# qwen2_5) quantize their lora_ builders' base with model.quantize_base=True
QLORA_PACKAGES = frozenset({"llama2", "llama3_1", "llama3_2", "llama3_3", "mistral", "gemma", "gemma2", "phi3",
                            "phi4"})

# torchtune's LoRA module names -> the model's module names, the first the model has (fused families: qkv_proj)
_TARGETS = {"q_proj": ("q_proj", "qkv_proj"), "k_proj": ("k_proj", "qkv_proj"), "v_proj": ("v_proj", "qkv_proj"),
            "output_proj": ("o_proj", "dense")}
_MLP = {"w1": ("gate_proj", "gate_up_proj"), "w3": ("up_proj", "gate_up_proj"), "w2": ("down_proj",)}

# optimizer._component_ -> the optimizer budgeted
_OPTIMIZERS = {"torch.optim.AdamW": Optimizer.ADAMW, "torch.optim.SGD": Optimizer.SGD,
               "bitsandbytes.optim.AdamW8bit": Optimizer.ADAMW_8BIT,
               "bitsandbytes.optim.PagedAdamW8bit": Optimizer.ADAMW_8BIT,
               "bitsandbytes.optim.PagedAdamW": Optimizer.ADAMW}  # 32-bit paged (the *_full_low_memory configs)
# loss._component_ -> the loss kernel (CEWithChunkedOutputLoss: compiled per chunk under compile: True)
_CHUNKED = "torchtune.modules.loss.CEWithChunkedOutputLoss"
_LOSSES = (_CHUNKED, "torch.nn.CrossEntropyLoss")

READ = frozenset({
    "model._component_", "model.lora_attn_modules", "model.apply_lora_to_mlp", "model.apply_lora_to_output",
    "model.lora_rank", "model.lora_alpha", "model.quantize_base", "model.use_dora", "batch_size",
    "gradient_accumulation_steps", "dtype", "enable_activation_checkpointing", "enable_activation_offloading",
    "optimizer_in_bwd", "compile", "loss._component_", "optimizer._component_", "optimizer.fused",
    "tokenizer.max_seq_len", "dataset.packed", "fsdp_cpu_offload", "tensor_parallel_dim", "ac_mode",
    "clip_grad_norm",
})
# keys (and key prefixes) that decide nothing the budget holds
_HARMLESS = ("output_dir", "checkpointer", "tokenizer", "dataset", "seed", "shuffle", "epochs", "max_steps_per_epoch",
             "lr_scheduler", "metric_logger", "log_every_n_steps", "log_peak_memory_stats", "profiler",
             "optimizer.lr", "optimizer.weight_decay", "optimizer.betas", "optimizer.eps", "resume_from_checkpoint",
             "save_adapter_weights_only", "run_val_every_n_steps", "log_level", "cudnn_deterministic_mode",
             "enable_async_checkpointing", "collate_fn", "model.lora_dropout", "device")
_DTYPES = ("bf16", "fp32")  # training/precision.py PRECISION_STR_TO_DTYPE, less fp16 (the recipes refuse it)


def builder_model(component: str) -> str | None:
    """The shipped model a torchtune model builder (``torchtune.models.llama3_2.qlora_llama3_2_3b``) builds."""
    match = _BUILDER.fullmatch(str(component))
    return None if match is None else BUILDERS.get(match.group(2))


@cache
def builtin_configs() -> dict[str, dict]:
    """torchtune's built-in configs copied into oomlab (``index.json``: name -> file, recipes)."""
    return json.loads((CONFIGS_DIR / "index.json").read_text())["configs"]


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

    _required(look, recipe, distributed)
    full_versions, release = release_of(versions)
    if builtin and release.value != VERSION.split()[-1]:
        unmodelled.append(Unmodelled(config.origin("model"), cmd.flag("--config")[1],
                                     f"a built-in config read at {VERSION}; torchtune {release.value}'s may differ "
                                     "(tune cp it and pass the file to read yours)"))
    read = FrameworkRead(Framework.TORCHTUNE, f"torchtune {release.value}",
                         Sourced(Trainer.SFT, default_origin(VERSION, f"{recipe}: supervised fine-tuning")),
                         unmodelled=unmodelled, files=[] if builtin else [config.path], versions=full_versions,
                         release=release)
    _launcher_rules(cmd, recipe, distributed, config)
    model = _model(look, method)
    read.refs["model"] = (True, model, look("model._component_")[2])
    package, _, builder = str(look("model._component_")[1]).rpartition(".")
    read.values = {"recipe": recipe, "distributed": distributed, "builder_package": package,
                   "builder_base": re.sub(r"^q?lora_", "", builder),
                   "yaml_keys": tuple(sorted(k for k, _ in config.leaves()))}
    _adapters(claims, look, method, model, read.unmodelled)
    _precision(claims, look, gpu)
    _counts(claims, look)
    _sequence(claims, look)
    _memory(claims, look, recipe, read)
    say_default(claims, "attention", Attention.SDPA, VERSION, "torchtune's attention: F.scaled_dot_product_attention "
                "(modules/attention_utils.py _sdpa_or_flex_attention; flex_attention with packed samples, budgeted "
                "as SDPA)")
    _optimizer(claims, look, read)
    if distributed:
        read.refs.update(_fsdp(look, full_versions))
    read.unmodelled += _unread(config, cmd, layered)
    return read


def _launcher_rules(cmd: LaunchCommand, recipe: str, distributed: bool, config: LaunchFile) -> None:
    """What tune run and torchtune's config parser refuse, refused here with their words."""
    if cmd.options and not distributed:
        raise InvalidValueError(f"{cmd.text!r}: {recipe} does not support distributed training; tune run refuses "
                                "torchrun options with it (torchtune/_cli/run.py :206-211): drop them, or use its "
                                "*_distributed recipe")
    if distributed and not cmd.options:
        raise InvalidValueError(f"{cmd.text!r}: {recipe} without torchrun options runs as one plain process, which "
                                "its recipe refuses ('should be run via a distributed launcher'): launch it as "
                                f"tune run --nproc_per_node N {recipe} ...")
    for key, _value in cmd.flags:
        if key.startswith("-") and key != "--config":
            raise InvalidValueError(f"{cmd.text!r}: {key} after the recipe: torchtune takes only --config and "
                                    "key=value overrides there ('Additional flag arguments not supported', "
                                    "config/_parse.py :50-56); write it as key=value")
        if key.startswith("~"):
            dotted = key[1:]
            if "_component_" in dotted or config.has(f"{dotted}._component_"):
                raise InvalidValueError(f"{cmd.text!r}: {key}: torchtune refuses removing a component from the "
                                        "command line (config/_utils.py :154-157)")
            if not config.has(dotted):
                raise InvalidValueError(f"{cmd.text!r}: {key}: the config has no {dotted} to remove; torchtune raises "
                                        "'Could not find key' (config/_utils.py :158-164)")


def _required(look: Any, recipe: str, distributed: bool) -> None:
    """The keys the recipe reads as ``cfg.key`` (no default): absent, OmegaConf 2.3 raises 'Missing key' (a null
    value is read as null)."""
    keys = ["dtype"] + ([] if distributed else ["compile"]) \
        + (["optimizer_in_bwd"] if recipe == "full_finetune_single_device" else [])
    for key in keys:
        hit = look(key)
        if not hit[0]:
            raise InvalidValueError(f"no {key} in the config nor on the command line: recipes/{recipe}.py reads "
                                    f"cfg.{key} (no default at {VERSION}) and OmegaConf raises 'Missing key {key}'; "
                                    "set it")


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
    package = str(hit[1]).split(".")[2] if str(hit[1]).count(".") >= 3 else ""
    if ".qlora_" in str(hit[1]) and package not in QLORA_PACKAGES:
        raise InvalidValueError(f"{hit[2]}: torchtune.models.{package} has no qlora_ builders; use its lora_ builder "
                                "with model.quantize_base=True")
    if lora != (method is Method.LORA):
        raise InvalidValueError(f"{hit[2]}: {hit[1]} in a {'LoRA' if method is Method.LORA else 'full'} fine-tuning "
                                f"recipe; use a {'lora_ or qlora_' if method is Method.LORA else 'base'} builder")
    return model


def _adapters(claims: Claims, look: Any, method: Method, model: str, unmodelled: list[Unmodelled]) -> None:
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
    dora = look("model.use_dora")
    if dora[0] and dora[1] is not None and bool_value(dora[1], dora[2]):
        raise refuse("model.use_dora", dora[1], dora[2], "DoRA (a magnitude vector per adapted projection and the "
                     "weight norms it computes in every forward)")
    output = look("model.apply_lora_to_output")
    if output[0] and output[1] is not None and bool_value(output[1], output[2]):
        spec = load_model(model)
        rank = look("model.lora_rank")
        r = int_value(rank[1], rank[2], MAX_LORA) if rank[0] and rank[1] is not None else 8
        unmodelled.append(Unmodelled(output[2], output[1], f"the output head's LoRA adapter, {r} × ({spec.hidden_size} "
                                     f"+ {spec.vocab_size}) parameters with their gradients and optimizer state, is "
                                     "not budgeted (oomlab budgets adapters on the decoder layers' projections)"))


def _precision(claims: Claims, look: Any, gpu: str) -> None:
    hit = look("dtype")
    name = "fp32" if not hit[0] or hit[1] is None else str(hit[1])
    if name not in _DTYPES:
        raise InvalidValueError(f"{hit[2]}: dtype {shown(hit[1])}: oomlab budgets torchtune's {' and '.join(_DTYPES)} "
                                "(its recipes refuse fp16; training/precision.py :104-111 spells them in lower case)")
    if name == "bf16" and not load_gpu(gpu).bf16:  # the setup's own rule: no bf16 on a GPU without its units
        raise InvalidValueError(f"{hit[2]}: dtype bf16 on {gpu}, which has no bf16 units: torchtune either refuses it "
                                "(training/precision.py :113-120) or, where torch emulates bf16, runs it slowly; "
                                "oomlab budgets no emulated bf16: use dtype=fp32 (torchtune has no fp16 or mixed "
                                "precision)")
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
    offload, checkpoint = look("enable_activation_offloading"), look("enable_activation_checkpointing")
    if offload[0] and offload[1] is not None and bool_value(offload[1], offload[2]) \
            and not (checkpoint[0] and checkpoint[1] is not None and bool_value(checkpoint[1], checkpoint[2])):
        raise InvalidValueError(f"{offload[2]}: enable_activation_offloading without enable_activation_checkpointing: "
                                f"torchtune raises 'should only be True when enable_activation_checkpointing is True' "
                                f"(recipes/{recipe}.py :170-175); set enable_activation_checkpointing=True")
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
    if not loss[0] or loss[1] is None:
        raise InvalidValueError(f"{loss[2]}: no loss._component_; torchtune's recipes instantiate cfg.loss")
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
            return
        for key, refused in (("gradient_accumulation_steps", "Gradient accumulation"), ("clip_grad_norm",
                                                                                          "Gradient clipping")):
            other = look(key)
            if other[0] and other[1] is not None and (key == "clip_grad_norm" or int_value(
                    other[1], other[2], 1 << 20) > 1):
                raise InvalidValueError(f"{other[2]}: {key} {shown(other[1])} with optimizer_in_bwd ({hit[2]}): "
                                        f"torchtune raises '{refused} is not supported with optimizer in bwd' "
                                        f"(recipes/{recipe}.py :146-157)")
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
    if name.startswith("bitsandbytes.") and read.values.get("distributed"):
        raise InvalidValueError(f"{hit[2]}: {name} in {read.values['recipe']}: bitsandbytes' optimizers are for "
                                "torchtune's single-device recipes (they do not run on FSDP2's DTensor parameters, "
                                "pytorch/torchtune#1856); use torch.optim.AdamW")
    if name.startswith("bitsandbytes.optim.Paged"):
        kind = "AdamW8bit" if name.endswith("8bit") else "AdamW (its fp32 states)"
        read.unmodelled.append(Unmodelled(hit[2], name, "paged: bitsandbytes keeps its state in CUDA managed memory "
                                          f"(it pages out under pressure); budgeted on the GPU as {kind}"))


def _fsdp(look: Any, versions: Versions) -> dict[str, Any]:
    """FSDP as the recipe shards: FSDP2 from 0.3.0 (FSDP1 before), CPU offload with ``fsdp_cpu_offload``."""
    words = "full_shard auto_wrap"
    hit = look("fsdp_cpu_offload")
    if hit[0] and hit[1] is not None and bool_value(hit[1], hit[2]):
        words += " offload"
    release = versions.release("torchtune")
    version = 2 if release >= TORCHTUNE_FSDP2 else 1
    origin = default_origin(VERSION, f"a *_distributed recipe shards with FSDP{version} at torchtune "
                                     f"{'.'.join(map(str, release))}")
    return {"fsdp": (True, words, hit[2] if "offload" in words else origin),
            "fsdp_config": (True, {"version": version}, origin)}


def _unread(config: LaunchFile, cmd: LaunchCommand, look: Any) -> list[Unmodelled]:
    """Every key of the config, and every override, oomlab does not read: harmless ones said so, the rest listed as
    not modelled."""
    def why(key: str) -> str:
        harmless = any(key == h or key.startswith(h + ".") for h in _HARMLESS)
        return "does not change GPU memory" if harmless else f"{VERSION} key not modelled by oomlab"

    out = [Unmodelled(config.origin(key), look(key)[1] if look(key)[0] else value, why(key))
           for key, value in config.leaves() if key not in READ]
    out += [Unmodelled(flag_origin(f"{key}={value}"), value, why(key)) for key, value in cmd.flags
            if not key.startswith(("-", "~")) and key not in READ and not config.has(key)]
    return out

