"""The claims of every launch file and flag resolved into one :class:`~oomlab.launch.read.UserLaunch`:
:func:`read_launch` (from the paths and the command of :class:`~oomlab.launch.read.LaunchInputs`; a folder's files
are found by :func:`oomlab.launch.inputs.inputs_from_dir`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from oomlab.budget.deepspeed_config import OFFLOAD_PARAM_IGNORED, ignored_offload_param, read_deepspeed_config
from oomlab.core.choices import Method, Optimizer, Precision, Reference, Strategy, plain
from oomlab.core.errors import InvalidValueError, LaunchConflictError, LaunchFileError, UnknownNameError
from oomlab.core.gpus import load_gpu
from oomlab.core.models import ModelSpec, load_model
from oomlab.core.setup import make_setup
from oomlab.core.user_input import shown
from oomlab.core.versions import installed_versions
from oomlab.launch import keys as K
from oomlab.launch.axolotl import VERSION as AXOLOTL
from oomlab.launch.batch import World, deepspeed_batch
from oomlab.launch.claims import Claims, Strength
from oomlab.launch.command import Launcher, parse_command
from oomlab.launch.files import LaunchFile, read_json, read_yaml
from oomlab.launch.framework import Framework
from oomlab.launch.framework_read import read_framework
from oomlab.launch.given import given_claims, trainer_default
from oomlab.launch.llamafactory import VERSION as LLAMAFACTORY
from oomlab.launch.load_peak import default_load_dtype
from oomlab.launch.memory_flags import memory_flags
from oomlab.launch.nodes import hostfile_path, read_hostfile, slurm_claims
from oomlab.launch.origin import Origin, Sourced, Unmodelled, assumed, default_origin, file_origin, flag_origin
from oomlab.launch.read import (
    MAX_BATCH,
    MAX_LORA,
    MAX_PROCESSES,
    LaunchInputs,
    UserLaunch,
    accelerate_refs,
    bool_value,
    file_lookup,
    flag_lookup,
    int_value,
    launcher_refs,
    targets_of,
    training_claims,
)
from oomlab.launch.script_defaults import script_claims
from oomlab.launch.trained_dtype import frozen_base_dtype, trained_precision
from oomlab.launch.trainer_defaults import trainer_defaults
from oomlab.launch.trl_config import VERSION as TRL


def _unmodelled_leaves(f: LaunchFile, modelled: frozenset[str], harmless: frozenset[str] = frozenset(),
                       why: str = "not modelled by oomlab") -> list[Unmodelled]:
    out = []
    for key, value in f.leaves():
        if key in modelled:
            continue
        reason = "does not change GPU memory" if key.split(".")[0] in harmless else why
        out.append(Unmodelled(f.origin(key), value, reason))
    return out


def _deepspeed_file(inputs: LaunchInputs, refs: list[tuple[Any, Origin]], base_dirs: list[Path]) -> LaunchFile | None:
    """The one DeepSpeed JSON the launch names (``--deepspeed F`` first); two different files are a contradiction."""
    named = [(str(v), o) for v, o in refs if isinstance(v, str) and v.strip()]
    if inputs.deepspeed:
        given = Path(inputs.deepspeed)
        for value, origin in named:
            if Path(value).name != given.name:
                raise LaunchConflictError(f"contradiction in the DeepSpeed JSON: --deepspeed {inputs.deepspeed} but "
                                          f"{origin} names {value!r}; give the file the launch uses")
        return read_json(given)
    for value, origin in named:
        for base in base_dirs:
            candidate = (base / value) if not Path(value).is_absolute() else Path(value)
            if candidate.exists():  # a FIFO or a folder is refused by the reader, not passed over
                return read_json(candidate)
        if value.lower().endswith(".json"):
            raise LaunchFileError(f"{origin} names the DeepSpeed JSON {value!r}, which is not here; pass it with "
                                  "--deepspeed F")
    return None


def _from_command(inputs: LaunchInputs, value: str) -> str:
    """A path the launch command names, as the command reads it: relative to the folder holding the command."""
    path = Path(value).expanduser()
    return str(path if path.is_absolute() or not inputs.command_dir else Path(inputs.command_dir) / path)


def _hostfile_claims(claims: Claims, inputs: LaunchInputs, ref: tuple[Any, ...]) -> None:
    """A deepspeed ``--hostfile``: its first ``--num_nodes`` hosts are the nodes, their slots the GPUs per node
    (unless ``--num_gpus`` says)."""
    value, origin, num_nodes, num_nodes_origin, gpus_given = ref
    hostfile = read_hostfile(hostfile_path(str(value), inputs.command_dir), origin)
    nodes = hostfile.nodes(num_nodes)
    claims.say("nodes", nodes, num_nodes_origin if num_nodes is not None and num_nodes <= nodes else hostfile.origin())
    if not gpus_given:
        claims.say("gpus", *hostfile.slots(nodes))


def _processes(claims: Claims, inputs: LaunchInputs, launcher: Launcher | None, refs: dict[str, Any],
               env: dict[str, str], node_gpus: int | None = None) -> None:
    """How many processes (GPUs) per node: the launcher's, against the machine's ``--gpus`` (or what the command's
    CUDA_VISIBLE_DEVICES or SLURM_GPUS_ON_NODE shows)."""
    visible = _visible_devices(env["CUDA_VISIBLE_DEVICES"]) if "CUDA_VISIBLE_DEVICES" in env else node_gpus
    machine = inputs.gpus if inputs.gpus is not None else visible
    shown_env = "CUDA_VISIBLE_DEVICES" if "CUDA_VISIBLE_DEVICES" in env or node_gpus is None else "SLURM_GPUS_ON_NODE"
    machine_origin = flag_origin(f"--gpus {inputs.gpus}") if inputs.gpus is not None else \
        flag_origin(f"{shown_env}={env.get(shown_env)}")
    if "num_processes" in refs:
        total, origin = refs["num_processes"]
        nodes = claims.winner("nodes")
        per_node = total // (nodes.value if nodes else 1)
        claims.say("gpus", max(per_node, 1), origin)
    if not claims.stated("gpus") and launcher in PER_VISIBLE_GPU:
        library = PER_VISIBLE_GPU[launcher]
        if machine is None:
            claims.say("gpus", 1, assumed("the launcher starts one process per visible GPU; give --gpus N"),
                       Strength.ASSUMED)
        else:
            claims.say("gpus", machine, default_origin(f"{library} launcher", "a process per visible GPU"),
                       Strength.DEFAULT)
    if machine is not None and not claims.said.get("gpus"):
        claims.say("gpus", machine, machine_origin)
    claims.say("gpus", 1, assumed("no launcher or --gpus: one GPU"), Strength.ASSUMED)
    won = claims.winner("gpus")
    if machine is not None and won is not None and won.value > machine:
        raise LaunchConflictError(f"contradiction in gpus: {won.origin} starts {won.value} processes per node but "
                                  f"{machine_origin} has {machine} GPUs")


# one entry of CUDA_VISIBLE_DEVICES: a device index, or a GPU / MIG UUID (nvidia-smi -L)
_DEVICE = re.compile(r"\d+|(GPU|MIG)-[0-9A-Za-z/-]+")


def _visible_devices(value: str) -> int:
    """How many GPUs ``CUDA_VISIBLE_DEVICES=value`` in the launch command shows: its comma-separated entries."""
    entries = [d.strip() for d in value.split(",")]
    accepted = ("expected comma-separated device indices or GPU UUIDs, e.g. CUDA_VISIBLE_DEVICES=0,1 "
                f"(at least one, at most {MAX_PROCESSES:,})")
    bad = [d for d in entries if not _DEVICE.fullmatch(d)]
    if bad or not entries or len(entries) > MAX_PROCESSES:
        what = f"the entry {shown(bad[0])}" if bad else f"{len(entries):,} entries"
        raise InvalidValueError(f"CUDA_VISIBLE_DEVICES={shown(value)} in the launch command: {what} is not a GPU; "
                                f"{accepted}")
    return len(entries)


def _strategy(claims: Claims, refs: dict[str, Any], ds: LaunchFile | None, fsdp_ref: Any) -> tuple[str, Origin]:
    """Which distributed kind the launch is: deepspeed, fsdp, or a replica per process."""
    kinds = []
    dist = refs.get("distributed_type")
    if ds is not None or "deepspeed" in refs:
        kinds.append(("DEEPSPEED", ds.origin("zero_optimization.stage") if ds is not None else refs["deepspeed"][2]))
    if dist and dist[0] == "DEEPSPEED" and not kinds:
        kinds.append(("DEEPSPEED", dist[1]))
    if fsdp_ref is not None:
        kinds.append(("FSDP", fsdp_ref[2]))
    if dist and dist[0] == "FSDP" and not any(k == "FSDP" for k, _ in kinds):
        kinds.append(("FSDP", dist[1]))
    names = {k for k, _ in kinds}
    if len(names) > 1:
        (a, oa), (b, ob) = kinds[0], next(k for k in kinds if k[0] != kinds[0][0])
        raise LaunchConflictError(f"contradiction in strategy: {oa} says {a} but {ob} says {b}; launch one of them")
    if kinds:
        return kinds[0]
    return ("MULTI_GPU", dist[1]) if dist and dist[0] != "NO" else ("NO", dist[1] if dist else assumed("no file"))


def _fsdp_strategy(refs: dict[str, Any], fsdp_ref: Any, fsdp_config: Any) -> tuple[Strategy, Origin]:
    if "fsdp_sharding_strategy" in refs:
        value, origin = refs["fsdp_sharding_strategy"]
        if str(value).upper() not in ("FULL_SHARD", "1"):
            raise InvalidValueError(f"{origin}: fsdp_sharding_strategy {value!r} is not budgeted; oomlab budgets "
                                    "FULL_SHARD (1)")
    if fsdp_ref is not None:  # the Trainer's --fsdp "full_shard auto_wrap [offload]"
        words = str(fsdp_ref[1] or "").lower().split()
        if words and "full_shard" not in words:
            raise InvalidValueError(f"{fsdp_ref[2]}: fsdp {fsdp_ref[1]!r} is not budgeted; oomlab budgets full_shard "
                                    "(with auto_wrap and optionally offload)")
        version, vorigin = 2, default_origin(K.TRANSFORMERS, "fsdp_config version 2 (training_args.py)")
        if isinstance(fsdp_config, dict) and "version" in fsdp_config:
            version, vorigin = int_value(fsdp_config["version"], f"{fsdp_ref[2]} fsdp_config version", 2), fsdp_ref[2]
        offload = "offload" in words
        origin = fsdp_ref[2] if version == 2 else vorigin
    else:
        version, origin = 1, default_origin(K.ACCELERATE, "fsdp_version 1")
        if "fsdp_version" in refs:
            version, origin = refs["fsdp_version"]
        offload = "fsdp_offload_params" in refs and bool_value(*refs["fsdp_offload_params"])
    table = {(1, False): Strategy.FSDP, (1, True): Strategy.FSDP_OFFLOAD, (2, False): Strategy.FSDP2,
             (2, True): Strategy.FSDP2_OFFLOAD}
    return table[(version, offload)], origin


def _inline_deepspeed(refs: dict[str, Any]) -> dict[str, Any]:
    """accelerate's inline DeepSpeed keys (no JSON file) as a DeepSpeed config."""
    if "zero_stage" not in refs:
        where = (refs.get("distributed_type") or refs["deepspeed"][1:])[1]
        raise InvalidValueError(f"{where}: a DeepSpeed launch but no DeepSpeed JSON and no zero_stage; pass the JSON "
                                "with --deepspeed F")
    zero: dict[str, Any] = {"stage": refs["zero_stage"][0]}
    for key, block in (("offload_optimizer_device", "offload_optimizer"), ("offload_param_device", "offload_param")):
        if key in refs:
            zero[block] = {"device": str(refs[key][0])}
    return {"zero_optimization": zero}


def _deepspeed_claims(claims: Claims, ds: LaunchFile) -> None:
    for key, value in (("fp16", Precision.FP16_MIXED), ("bf16", Precision.BF16_MIXED)):
        enabled = ds.get(f"{key}.enabled")
        if enabled is True or str(enabled).lower() == "true":
            claims.say("precision", value, ds.origin(f"{key}.enabled"))
    micro = ds.get("train_micro_batch_size_per_gpu")
    if micro not in (None, "auto"):
        claims.say("batch", int_value(micro, ds.origin("train_micro_batch_size_per_gpu"), MAX_BATCH),
                   ds.origin("train_micro_batch_size_per_gpu"))
    if ds.get("optimizer.type"):
        claims.override("optimizer", Optimizer.ADAMW, ds.origin("optimizer.type"),
                        f"the DeepSpeed JSON's optimizer block wins ({ds.origin('optimizer.type')}: "
                        "DeepSpeed's own AdamW; transformers integrations/deepspeed.py)")


def _model(inputs: LaunchInputs, model_ref: Any, unmodelled: list[Unmodelled]) -> tuple[ModelSpec, Origin]:
    if inputs.model:
        if model_ref is not None:
            unmodelled.append(Unmodelled(model_ref[2], model_ref[1], "the model is the one given with --model"))
        origin = file_origin(inputs.model, "", None) if inputs.model.endswith(".json") else \
            flag_origin(f"--model {inputs.model}")
        return load_model(inputs.model), origin
    if model_ref is not None:
        try:
            return load_model(str(model_ref[1]).rsplit("/", 1)[-1]), model_ref[2]
        except UnknownNameError as err:
            raise UnknownNameError("model", model_ref[1], err.known, f"named by {model_ref[2]}; pass --model "
                                   "NAME or the model's config.json") from err
    raise InvalidValueError("no model: pass --model NAME or the model's config.json (or --model_name_or_path in "
                            "the launch command)")


def read_launch(inputs: LaunchInputs) -> UserLaunch:
    """The setup the user's files and command launch, every field with its origin (see :mod:`oomlab.launch.read`)."""
    load_gpu(inputs.gpu)  # an unknown GPU is refused before any file is read
    claims, unmodelled, files = Claims(), [], []
    given_trainer = given_claims(claims, inputs)
    framework = None
    cmd = parse_command(inputs.command) if inputs.command else None
    refs: dict[str, Any] = {}
    training_refs: dict[str, Any] = {}
    trainer = False
    base_dirs = [Path(inputs.command_dir) if inputs.command_dir else Path.cwd()]
    if inputs.accelerate_config or (cmd is not None and cmd.option("--config_file")):
        if inputs.accelerate_config:
            acc = read_yaml(inputs.accelerate_config)
        else:
            acc = read_yaml(_from_command(inputs, cmd.option("--config_file")[1]), "the launch command's --config_file")
        files.append(acc.path)
        refs.update(accelerate_refs(claims, acc))
        memory_flags(claims, file_lookup(acc))  # accelerate's parallelism_config: context parallelism refused
        unmodelled += _unmodelled_leaves(acc, K.ACCELERATE_KEYS, K.ACCELERATE_HARMLESS)
    if cmd is not None:
        refs.update(launcher_refs(claims, cmd))
        allowed = K.LAUNCHER_OPTIONS[cmd.launcher.value]
        unmodelled += [Unmodelled(flag_origin(k), v, "launcher option not modelled") for k, v in cmd.options
                       if k not in allowed and k != "--config_file"]
        framework = read_framework(claims, cmd, inputs)
        if framework is not None:  # LLaMA-Factory, axolotl, TRL: each runs the HF Trainer; torchtune its recipes
            training_refs.update(framework.refs)
            for key, value in framework.launcher_refs.items():
                refs.setdefault(key, value)
            unmodelled += framework.unmodelled
            files += framework.files
            base_dirs += [Path(f).parent for f in framework.files]
            trainer = framework.framework is not Framework.TORCHTUNE
        else:
            unmodelled += memory_flags(claims, flag_lookup(cmd))  # the loss kernel; refused settings
            training_refs.update(training_claims(claims, flag_lookup(cmd), is_json=False))
            script_claims(claims, cmd, inputs.command_dir)  # what the script's own source defaults
            trainer = any(f"--{k}" in {f for f, _ in cmd.flags} for k in ("per_device_train_batch_size",
                                                                           "output_dir"))
            unmodelled += [Unmodelled(flag_origin(k), v, "script flag not modelled") for k, v in cmd.flags
                           if k.lstrip("-").replace("-", "_") not in K.TRAINING_KEYS]
    if inputs.training_args:
        ta = read_json(inputs.training_args)
        files.append(ta.path)
        base_dirs.insert(0, Path(ta.path).parent)
        trainer = True
        unmodelled += memory_flags(claims, file_lookup(ta))
        for key, value in training_claims(claims, file_lookup(ta), is_json=True).items():
            training_refs.setdefault(key, value)
        unmodelled += _unmodelled_leaves(ta, K.TRAINING_KEYS)
    model_ref = training_refs.get("model")
    spec, model_origin = _model(inputs, model_ref, unmodelled)
    if inputs.model and inputs.model.endswith(".json") and inputs.model not in files:
        files.append(inputs.model)
    ds_refs = [(v[1], v[2]) for v in (refs.get("deepspeed"), training_refs.get("deepspeed")) if v is not None]
    if "deepspeed" in training_refs:
        refs.setdefault("deepspeed", training_refs["deepspeed"])
    ds = _deepspeed_file(inputs, ds_refs, base_dirs)
    if ds is not None:
        files.append(ds.path)
        _deepspeed_claims(claims, ds)
        unmodelled += _unmodelled_leaves(ds, K.DEEPSPEED_KEYS)
        if "zero_stage" in refs and refs["zero_stage"][0] != ds.get("zero_optimization.stage"):
            raise LaunchConflictError(f"contradiction in zero stage: {refs['zero_stage'][1]} says "
                                      f"{refs['zero_stage'][0]} but {ds.origin('zero_optimization.stage')} says "
                                      f"{ds.get('zero_optimization.stage')}")
    _quantization_and_adapter(claims, inputs, spec, unmodelled, files)
    env = dict(cmd.env) if cmd is not None else {}
    node_gpus = slurm_claims(claims, env, cmd.launcher if cmd else None)
    if "hostfile" in refs:
        _hostfile_claims(claims, inputs, refs["hostfile"])
    _processes(claims, inputs, cmd.launcher if cmd else None, refs, env, node_gpus)
    if ds is not None:
        gpus_won, nodes_won = claims.winner("gpus"), claims.winner("nodes")
        world = World(gpus_won.value, gpus_won.origin, nodes_won.value if nodes_won else 1,
                      nodes_won.origin if nodes_won else None)
        deepspeed_batch(claims, ds, world, training_refs.get("gradient_accumulation_steps"))
    if framework is not None and framework.versions is not None:  # torchtune's release, given or assumed
        versions = framework.versions
    else:
        versions = inputs.versions if inputs.versions is not None else installed_versions()
    trainer_defaults(claims, trainer, spec, versions)
    fields = {name: claims.winner(name) for name in list(claims.said)}
    kind, kind_origin = _strategy(claims, refs, ds, training_refs.get("fsdp"))
    gpus, nodes = fields["gpus"].value, fields["nodes"].value
    method = _method(fields)
    common = {"model": spec, "gpu": inputs.gpu, "gpus": gpus, "nodes": nodes, "method": method.value,
              "batch": fields["batch"].value, "seq": fields["seq"].value,
              "checkpointing": fields["checkpointing"].value, "attention": fields["attention"].value,
              "lora_rank": fields["lora_rank"].value, "lora_alpha": fields["lora_alpha"].value,
              "lora_targets": fields["lora_targets"].value}
    precision = fields["precision"].value
    release_default = "load_dtype" not in fields
    if release_default:  # nothing names it: from_pretrained's default at the user's transformers release
        fields["load_dtype"] = default_load_dtype(spec, precision, versions, method.value is Method.QLORA)
    settings = None
    if kind == "DEEPSPEED":
        config = dict(ds.data) if ds is not None else _inline_deepspeed(refs)
        launch = read_deepspeed_config(config, precision=precision.value, optimizer=fields["optimizer"].value.value,
                                       source=ds.path if ds is not None else None, **common)
        strategy, settings = launch.setup.strategy, launch.settings
        if ignored_offload_param(config):  # DeepSpeed runs it with the parameters on the GPU
            where = ds.origin("zero_optimization.offload_param.device") if ds is not None else \
                refs["offload_param_device"][1]
            device = ds.get("zero_optimization.offload_param.device") if ds is not None else \
                refs["offload_param_device"][0]
            unmodelled.append(Unmodelled(where, device, OFFLOAD_PARAM_IGNORED))
        strategy_origin = ds.origin("zero_optimization.stage") if ds is not None else refs["zero_stage"][1]
    elif kind == "FSDP":
        strategy, strategy_origin = _fsdp_strategy(refs, training_refs.get("fsdp"),
                                                   (training_refs.get("fsdp_config") or (0, None))[1])
    else:
        multi = gpus * nodes > 1
        strategy = Strategy.DDP if multi else Strategy.SINGLE
        strategy_origin = fields["gpus"].origin if multi or kind_origin is None else kind_origin
        if multi and cmd is None and "distributed_type" not in refs:
            strategy_origin = assumed(f"no launch command: a process per GPU (torchrun / accelerate launch) over "
                                      f"{fields['gpus'].origin}")
    kind = given_trainer or (framework.trainer if framework is not None else trainer_default(cmd is not None))
    reference = framework.reference if framework is not None and framework.reference is not None else \
        Sourced(Reference.DEFAULT, default_origin("the trainer", "its reference model as its config defaults it"))
    trained, refused = trained_precision(fields["precision"], fields.get("load_dtype"), strategy, method.value,
                                         release_default)
    if trained is not fields["precision"]:  # half-loaded weights under DDP train in half
        fields["precision"], precision = trained, trained.value
        unmodelled += [refused] if refused is not None else []
    base = frozen_base_dtype(fields.get("load_dtype"), method.value, precision)
    if method.value is not Method.FULL:  # full fine-tuning's weights follow the precision: the field is not shown
        fields["base_dtype"] = base
    setup = make_setup(strategy=strategy, precision=precision, optimizer=fields["optimizer"].value,
                       trainer=kind.value, reference=reference.value, versions=versions,
                       loss=fields["loss"].value, offload_activations=fields["offload_activations"].value,
                       base_dtype=base.value, optimizer_in_backward=bool(
                           fields["optimizer_in_backward"].value if "optimizer_in_backward" in fields else False),
                       **common)
    zero3 = _zero3_init(refs, trainer)
    if framework is not None and framework.release is not None:  # torchtune: its release; its recipe's strategy
        fields[framework.framework.value] = framework.release
        zero3 = Sourced(False, default_origin(framework.version, "no DeepSpeed in its recipes"))
        if strategy is Strategy.SINGLE:
            strategy_origin = default_origin(framework.version, f"{framework.values['recipe']}: one process")
    fields.update({"model": Sourced(spec.name, model_origin), "strategy": Sourced(strategy, strategy_origin),
                   "method": method, "zero3_init": zero3, "trainer": kind, "reference": reference,
                   "lora_targets": Sourced(setup.lora_targets, fields["lora_targets"].origin)})
    if cmd is not None:
        fields["launcher"] = Sourced(cmd.launcher, flag_origin(cmd.text.split()[0]))
    unmodelled += [Unmodelled(o, plain(v), why) for o, v, why in claims.overridden]  # as written, not the enum
    ordered = {name: fields[name] for name in (*SETUP_ORDER, *sorted(set(fields) - set(SETUP_ORDER)))
               if name in fields}
    return UserLaunch(setup=setup, fields=ordered, deepspeed=settings, launcher=cmd.launcher if cmd else None,
                      hf_trainer=trainer, command=cmd, unmodelled=K.ranked(unmodelled), files=tuple(files),
                      framework_values=dict(framework.values) if framework is not None else {})


SETUP_ORDER = ("model", "gpus", "nodes", "strategy", "trainer", "reference", "method", "precision", "optimizer",
               "batch", "accumulation", "seq", "checkpointing", "attention", "loss", "offload_activations",
               "lora_rank", "lora_alpha", "lora_targets", "load_dtype", "base_dtype", "zero3_init")
# the launchers that start a process per visible GPU unless told how many, and whose default that is
PER_VISIBLE_GPU = {Launcher.ACCELERATE: K.ACCELERATE, Launcher.DEEPSPEED: K.DEEPSPEED,
                   Launcher.LLAMAFACTORY: LLAMAFACTORY, Launcher.AXOLOTL: AXOLOTL, Launcher.TRL: TRL}


def _method(fields: dict[str, Sourced]) -> Sourced:
    method = fields["method"]
    quant = fields.get("quantization")
    if quant is None:
        return method
    if quant.value == 8:
        raise InvalidValueError(f"{quant.origin}: an 8-bit base (load_in_8bit) is not budgeted; oomlab budgets a "
                                "4-bit NF4 base (qlora)")
    if method.value is Method.FULL:
        raise InvalidValueError(f"{quant.origin}: a 4-bit base without adapters cannot be trained; add a LoRA "
                                "adapter_config.json (or --use_peft)")
    return Sourced(Method.QLORA, quant.origin, (method.origin,))


def _zero3_init(refs: dict[str, Any], trainer: bool) -> Sourced:
    if "zero3_init_flag" in refs:
        value, origin = refs["zero3_init_flag"]
        return Sourced(bool_value(value, origin), origin)
    if trainer:
        return Sourced(True, default_origin(K.TRANSFORMERS, "TrainingArguments(deepspeed=...) is built before "
                                            "from_pretrained: ZeRO-3 loads under zero.Init"))
    return Sourced(True, default_origin(K.ACCELERATE, "zero3_init_flag defaults to the JSON's stage == 3 "
                                        "(utils/dataclasses.py)"))


def _quantization_and_adapter(claims: Claims, inputs: LaunchInputs, spec: ModelSpec, unmodelled: list[Unmodelled],
                              files: list[str]) -> None:
    raw_quant = spec.config.get("quantization_config") if spec.config else None
    if raw_quant:
        _quant_claims(claims, dict(raw_quant), lambda k: file_origin(spec.source, f"quantization_config.{k}", None))
    if inputs.quantization_config:
        q = read_json(inputs.quantization_config)
        files.append(q.path)
        _quant_claims(claims, dict(q.data), q.origin)
        unmodelled += _unmodelled_leaves(q, K.QUANT_KEYS)
    if inputs.adapter_config:
        a = read_json(inputs.adapter_config)
        files.append(a.path)
        peft_type = str(a.get("peft_type", "LORA")).upper()
        if peft_type != "LORA":
            raise UnknownNameError(f"peft_type ({a.origin('peft_type')})", peft_type, ["LORA"],
                                   "oomlab budgets LoRA adapters")
        claims.say("method", Method.LORA, a.origin("peft_type") if a.has("peft_type") else file_origin(a.path, "",
                                                                                                        None))
        if a.has("r"):
            claims.say("lora_rank", int_value(a.get("r"), a.origin("r"), MAX_LORA), a.origin("r"))
        if a.has("lora_alpha"):
            claims.say("lora_alpha", int_value(a.get("lora_alpha"), a.origin("lora_alpha"), MAX_LORA),
                       a.origin("lora_alpha"))
        if a.get("target_modules"):
            claims.say("lora_targets", targets_of(a.get("target_modules")), a.origin("target_modules"))
        unmodelled += _unmodelled_leaves(a, K.ADAPTER_KEYS)


def _quant_claims(claims: Claims, raw: dict[str, Any], origin_of: Any) -> None:
    method = str(raw.get("quant_method", "bitsandbytes")).lower()
    if method != "bitsandbytes":
        raise UnknownNameError(f"quant_method ({origin_of('quant_method')})", method, ["bitsandbytes"],
                               "oomlab budgets bitsandbytes 4-bit NF4")
    for key, bits in (("load_in_4bit", 4), ("load_in_8bit", 8)):
        if raw.get(key) is True:
            claims.say("quantization", bits, origin_of(key))
