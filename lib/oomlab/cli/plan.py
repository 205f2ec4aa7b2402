"""``python -m oomlab plan``: every remedy, budgeted and ranked (``--any-gpu``: every GPU type and count)."""

from __future__ import annotations

import argparse
import json

from oomlab.cli.common import (
    PARAMS,
    Formatter,
    StoreGiven,
    add_attention_and_lora_arguments,
    add_step_arguments,
    add_trainer_arguments,
    batch_argument,
    gpu_help,
    host_ram_argument,
    model_help,
    path_argument,
    positive_int,
    versions_argument,
)
from oomlab.core.choices import Method, Optimizer, Precision, Strategy
from oomlab.core.defaults import DEFAULTS
from oomlab.core.errors import InvalidValueError
from oomlab.core.prices import seed_machine_text
from oomlab.remedies.launch_files import CONFIGS_DIR


def add_parser(sub: argparse._SubParsersAction) -> None:
    pln = sub.add_parser("plan", help="every remedy for training the model on these GPUs: budgeted, ranked, "
                         "with the knob table and the launch files", formatter_class=Formatter)
    pln.add_argument("--model", default=DEFAULTS.model, action=StoreGiven, help=model_help())
    pln.add_argument("--gpu", default=DEFAULTS.gpu, action=StoreGiven, help=gpu_help())
    pln.add_argument("--gpus", type=positive_int, default=DEFAULTS.gpus, action=StoreGiven,
                     help="GPUs per node")
    pln.add_argument("--nodes", type=positive_int, default=1,
                     help="nodes (with --any-gpu: also search 2, 4, ... up to this many nodes of --max-gpus GPUs)")
    pln.add_argument("--any-gpu", action="store_true",
                     help="search every GPU type x 1, 2, 4, ... --max-gpus GPUs: the best remedy on each, ranked "
                     "by cost per token, speed and GPU count")
    pln.add_argument("--method", choices=[m.value for m in Method], action="append", default=None,
                     help="the user's method (default: full); with --any-gpu: the methods the search may use "
                     "(repeatable; default: every method)")
    pln.add_argument("--strategy", choices=[s.value for s in Strategy], default=None,
                     help="the user's strategy (default: ddp, one process on one GPU)")
    pln.add_argument("--launch-dir", type=path_argument, default=None, metavar="DIR",
                     help="a folder of the user's launch files (as check --launch-dir reads them): the plan's first "
                     "row is that run; --gpu names the GPU")
    pln.add_argument("--max-gpus", type=positive_int, default=8, help="with --any-gpu: the most GPUs per node")
    pln.add_argument("--prices", type=path_argument, default=None, metavar="FILE",
                     help="with --any-gpu: a price table JSON ({'instances': [{provider, instance, gpu, "
                     "gpus_per_instance, usd_per_hour}, ...]}; default: oomlab's dated list prices)")
    pln.add_argument("--host-ram", type=host_ram_argument, default=PARAMS["host_ram"].default, action=StoreGiven,
                     help="host RAM per node, with its unit; auto (the default) assumes the listed instance "
                     f"with these GPUs (specs/prices.json), else {seed_machine_text(sentence=False)}")
    pln.add_argument("--seq", type=positive_int, default=DEFAULTS.seq, help="target sequence length")
    pln.add_argument("--batch", type=batch_argument, default=DEFAULTS.batch,
                     help="the user's micro-batch per GPU")
    pln.add_argument("--precision", choices=[p.value for p in Precision], default=DEFAULTS.precision.value,
                     help="the user's precision")
    pln.add_argument("--optimizer", choices=[o.value for o in Optimizer], default=DEFAULTS.optimizer.value,
                     help="the user's optimizer")
    pln.add_argument("--checkpointing", action="store_true", help="the user's run used activation checkpointing")
    pln.add_argument("--lora-rank", type=positive_int, default=DEFAULTS.lora_rank,
                     help="LoRA rank of the LoRA/QLoRA remedies")
    add_attention_and_lora_arguments(pln, lora_rank=False)
    add_trainer_arguments(pln)
    add_step_arguments(pln)
    pln.add_argument("--versions", type=versions_argument, default=None,
                     help="the releases the run uses (name==release pins or a pip freeze file; default: installed)")
    pln.add_argument("--top", type=positive_int, default=15, help="remedies shown (--json has all)")
    pln.add_argument("--write-configs", type=path_argument, nargs="?", const=CONFIGS_DIR, default=None, metavar="DIR",
                     help=f"also write the launch files (into {CONFIGS_DIR} when no folder is given)")
    pln.add_argument("--json", action="store_true", help="print the plan as JSON")


# The flags that describe the user's run beyond the hardware, with their defaults (one set for every entry point:
# DEFAULTS): the hardware search refuses them changed, and a --launch-dir says them itself.
RUN_FLAG_DEFAULTS = {"trainer": DEFAULTS.trainer.value, "reference": DEFAULTS.reference.value, "versions": None,
                     "attention": DEFAULTS.attention.value, "lora_alpha": DEFAULTS.lora_alpha,
                     "lora_targets": ",".join(DEFAULTS.lora_targets), "loss": DEFAULTS.loss.value,
                     "offload_activations": DEFAULTS.offload_activations, "base_dtype": DEFAULTS.base_dtype.value,
                     "optimizer_in_backward": DEFAULTS.optimizer_in_backward}


def _cmd_plan_any_gpu(args: argparse.Namespace) -> int:
    """``plan --any-gpu``: every GPU type and count, refused flags named before any work."""
    kept = ((f"--{dest.replace('_', '-')}", dest, default) for dest, default in RUN_FLAG_DEFAULTS.items())
    for flag, dest, default in kept:
        if getattr(args, dest) != default:
            raise InvalidValueError(f"{flag} applies to plan without --any-gpu (got {flag} {getattr(args, dest)}): "
                                    "the hardware search budgets supervised fine-tuning at the installed releases, "
                                    "with the default step")
    for flag, dest in (("--gpu", "gpu"), ("--gpus", "gpus"), ("--write-configs", "write_configs")):
        if getattr(args, f"{dest}_given", False) or (dest == "write_configs" and args.write_configs is not None):
            raise InvalidValueError(f"--any-gpu searches every GPU type and count; drop {flag} (got {flag} "
                                    f"{getattr(args, dest)}) or drop --any-gpu; --max-gpus sets the most GPUs")
    from oomlab.core.prices import load_prices
    from oomlab.remedies import hardware, hardware_display

    hardware.gpu_counts(args.max_gpus)  # refused before any work
    nodes = hardware.node_counts(args.nodes)
    table = load_prices(args.prices) if args.prices is not None else None
    search = hardware.search_hardware(model=args.model, methods=args.method, max_gpus=args.max_gpus, nodes=nodes,
                             seq=args.seq, host_ram=args.host_ram if getattr(args, "host_ram_given", False) else None,
                             prices=table, lora_rank=args.lora_rank)
    print(json.dumps(search.to_dict(), indent=2) if args.json else hardware_display.render_search(search).rstrip("\n"))
    return 0


def command(args: argparse.Namespace) -> int:
    from oomlab.remedies.display import render_plan
    from oomlab.remedies.plan import make_plan

    if args.any_gpu:
        return _cmd_plan_any_gpu(args)
    if args.prices is not None:
        raise InvalidValueError(f"--prices applies to plan --any-gpu only (got --prices {args.prices})")
    if args.method is not None and len(args.method) > 1:
        raise InvalidValueError(f"--method names the user's one method without --any-gpu (got {', '.join(args.method)})"
                                "; give one of full, lora, qlora, or add --any-gpu to search several")
    if args.write_configs is not None:  # an existing file is refused before the plan (its contents need the plan)
        from oomlab.remedies.launch_writer import check_destination

        check_destination(args.write_configs, {})

    if args.launch_dir is not None:  # the user's run as check reads it: the plan's configured row
        given = [f"--{dest.replace('_', '-')}" for dest, default in RUN_FLAG_DEFAULTS.items()
                 if dest not in ("trainer", "reference", "versions") and getattr(args, dest) != default]
        if given:
            raise InvalidValueError(f"{', '.join(given)} with --launch-dir: the launch files say the run's setup "
                                    "(drop the flags, or drop --launch-dir and describe the run with flags)")
        from oomlab.launch.inputs import check_inputs
        from oomlab.launch.resolve import read_launch
        from oomlab.remedies.plan import plan_for

        inputs = check_inputs(launch_dir=args.launch_dir, gpu=args.gpu,
                              gpus=args.gpus if getattr(args, "gpus_given", False) else None,
                              model=args.model if getattr(args, "model_given", False) else None)
        plan = plan_for(read_launch(inputs).setup, host_ram=args.host_ram)
    else:
        plan = make_plan(model=args.model, gpu=args.gpu, gpus=args.gpus, nodes=args.nodes, host_ram=args.host_ram,
                         seq=args.seq, batch=args.batch, precision=args.precision, optimizer=args.optimizer,
                         checkpointing=args.checkpointing, lora_rank=args.lora_rank, strategy=args.strategy,
                         method=args.method[0] if args.method else DEFAULTS.method, trainer=args.trainer,
                         reference=args.reference, versions=args.versions, attention=args.attention,
                         lora_alpha=args.lora_alpha, lora_targets=args.lora_targets, loss=args.loss,
                         offload_activations=args.offload_activations, base_dtype=args.base_dtype,
                         optimizer_in_backward=args.optimizer_in_backward)
    written = None
    if args.write_configs is not None:
        from oomlab.remedies.launch_writer import write_configs

        written = write_configs(args.write_configs, plan)
    if args.json:
        data = plan.to_dict()
        data["configs_written"] = None if written is None else {k: str(v) for k, v in written.items()}
        print(json.dumps(data, indent=2))
    else:
        print(render_plan(plan, top=args.top))
        if written:
            print(f"launch files written to {args.write_configs}: {', '.join(written)}")
    return 0
