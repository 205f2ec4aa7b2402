"""``python -m oomlab``: the library's functions on the command line.

Bad input exits with code 2 and a message naming the bad value and what is accepted, before any work; a failed
pipeline run exits with code 1.  Building the parser loads no torch (--help answers at once); each command
imports the stage it runs.  Every option named like a pipeline parameter defaults to that parameter's default, but
where its value comes from elsewhere (None: ``explain`` infers the names, ``check`` reads the launch, ``plan
--any-gpu`` searches every method).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oomlab.budget.result import SOURCES
from oomlab.core.choices import Attention, Device, MessageFormat, Method, Optimizer, Precision, Strategy, message_format
from oomlab.core.defaults import DEFAULTS
from oomlab.core.errors import InvalidValueError, OomlabError, PipelineError
from oomlab.core.gpus import known_gpus
from oomlab.core.models import ALL_LINEAR, PROJECTIONS, known_models
from oomlab.core.prices import HOST_RAM_AUTO, seed_machine_text
from oomlab.core.terminal import terminal_streams
from oomlab.core.units import parse_memory_size
from oomlab.core.user_input import MAX_INT_DIGITS, shown
from oomlab.pipeline.params import PARAMETERS, render_params_help
from oomlab.remedies.launch_files import CONFIGS_DIR

EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but errors name the program and exit 2 (argparse's own convention)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def _nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid number {shown(text)}; expected a number of MiB >= 0") from err
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"invalid value {shown(text)}; must be >= 0 MiB")
    return value


def _positive_int(text: str) -> int:
    try:
        if len(text.strip().lstrip("+")) > MAX_INT_DIGITS:  # int() of 5,000 digits: Python's own limit, slowly
            raise ValueError(text)
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid integer {shown(text)}; expected an integer >= 1") from err
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid value {shown(text)}; must be an integer >= 1")
    return value


def _path(text: str) -> Path:
    """A file or folder argument; an empty one is refused (``Path("")`` would silently mean the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"empty path {text!r}; give a file or folder")
    return Path(text)


def _batch(text: str) -> int:
    """A micro-batch: an integer from 1 to the pipeline parameter's maximum (past it the traced step overflows)."""
    value = _positive_int(text)
    if value > _P["batch"].maximum:
        raise argparse.ArgumentTypeError(f"invalid value {shown(text)}; must be an integer from 1 to "
                                         f"{_P['batch'].maximum:g}")
    return value


class _StoreGiven(argparse.Action):
    """Store the value and note that the option was given: ``plan --any-gpu`` refuses ``--gpu`` and ``--gpus``; an
    unset ``--strategy`` on one GPU means single; an unset ``--host-ram`` is assumed (auto)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


_P = PARAMETERS  # one set of defaults: the pipeline's parameters (the seed's case)


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in its help line (argparse shows the choices in braces); an option without one
    (None) says in its help what happens instead."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _model_help() -> str:
    return f"a shipped model ({', '.join(known_models())}) or the path to a config.json"


def _gpu_help() -> str:
    return f"GPU type: {', '.join(known_gpus())}"


def _message_format_argument(text: str) -> str:
    """``auto``, ``old`` or ``new`` (``torch<=2.0`` / ``torch>=2.1`` are accepted for old / new)."""
    if text.strip() == "auto":
        return "auto"
    try:
        return "old" if message_format(text) is MessageFormat.OLD else "new"
    except OomlabError as err:
        raise argparse.ArgumentTypeError(f"invalid message format {text!r}; choose auto, old or new") from err


def add_setup_arguments(parser: argparse.ArgumentParser) -> None:
    """The training-setup options of ``budget``."""
    parser.add_argument("--model", default=DEFAULTS.model, help=_model_help())
    parser.add_argument("--gpu", default=DEFAULTS.gpu, help=_gpu_help())
    parser.add_argument("--gpus", type=_positive_int, default=DEFAULTS.gpus, help="GPUs per node")
    parser.add_argument("--nodes", type=_positive_int, default=DEFAULTS.nodes, help="nodes")
    parser.add_argument("--strategy", choices=[s.value for s in Strategy], default=None,
                        help="the launch: single = one process; ddp = accelerate/torchrun DDP; fsdp = accelerate's "
                        "default FSDP (fsdp_version 1); fsdp2 = accelerate fsdp_version 2; *-offload = with "
                        "fsdp_offload_params; zero1/zero2 = DeepSpeed (default: "
                        f"{DEFAULTS.strategy.value}; ddp over one GPU in all is single)")
    parser.add_argument("--method", choices=[m.value for m in Method], default=DEFAULTS.method.value,
                        help="what is trained")
    parser.add_argument("--precision", choices=[p.value for p in Precision], default=DEFAULTS.precision.value,
                        help="weights and compute dtypes (the budget's notes say what they mean for the launch)")
    parser.add_argument("--optimizer", choices=[o.value for o in Optimizer], default=DEFAULTS.optimizer.value,
                        help="adamw = torch.optim.AdamW as constructed by hand (foreach); adamw-fused = "
                        "AdamW(fused=True), the HF Trainer's default (optim='adamw_torch_fused')")
    parser.add_argument("--batch", type=_batch, default=DEFAULTS.batch, help="micro-batch per GPU")
    parser.add_argument("--seq", type=_positive_int, default=DEFAULTS.seq, help="sequence length in tokens")
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing of each layer")
    parser.add_argument("--attention", choices=[a.value for a in Attention], default=DEFAULTS.attention.value,
                        help="transformers' attention implementation")
    parser.add_argument("--lora-rank", type=_positive_int, default=DEFAULTS.lora_rank, help="LoRA rank")
    parser.add_argument("--lora-alpha", type=_positive_int, default=DEFAULTS.lora_alpha, help="LoRA alpha")
    parser.add_argument("--lora-targets", default=",".join(DEFAULTS.lora_targets),
                        help=f"comma-separated names of the model's nn.Linear modules (LLaMA's: "
                        f"{','.join(PROJECTIONS)}; other families their own), or {ALL_LINEAR}")


def setup_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The ``estimate``/``make_setup`` keyword arguments from parsed setup options (no ``--strategy``: None, the
    default launch of :func:`oomlab.core.defaults.launch_strategy`)."""
    return {"model": args.model, "gpu": args.gpu, "gpus": args.gpus, "nodes": args.nodes,
            "strategy": args.strategy, "method": args.method, "precision": args.precision,
            "optimizer": args.optimizer, "batch": args.batch, "seq": args.seq,
            "checkpointing": args.checkpointing, "attention": args.attention, "lora_rank": args.lora_rank,
            "lora_alpha": args.lora_alpha, "lora_targets": args.lora_targets}


def _host_ram_argument(text: str) -> int | str:
    if text.strip().lower() == HOST_RAM_AUTO:
        return HOST_RAM_AUTO
    try:
        return parse_memory_size(text)
    except OomlabError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


VALUE_OPTIONS = ("--host-ram", "--non-pytorch-mib")  # options whose value may start with "-" (refused with a reason)


def _join_dash_values(argv: Sequence[str]) -> list[str]:
    """``--host-ram -5GiB`` as ``--host-ram=-5GiB``: argparse would take ``-5GiB`` for an option and say only
    "expected one argument"; joined, the option's own check names the value."""
    out: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        if items[i] in VALUE_OPTIONS and i + 1 < len(items) and items[i + 1].startswith("-") \
                and not items[i + 1].startswith("--"):
            out.append(f"{items[i]}={items[i + 1]}")
            i += 2
            continue
        out.append(items[i])
        i += 1
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m oomlab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    rep = sub.add_parser("reproduce", help="move a model to one GPU as model.to('cuda') does; report the OOM",
                         formatter_class=_Formatter)
    rep.add_argument("--model", default=DEFAULTS.model, help=_model_help())
    rep.add_argument("--dtype", default=DEFAULTS.dtype, help="storage dtype: float16, bfloat16 or float32")
    rep.add_argument("--gpu", default=DEFAULTS.gpu, help=_gpu_help())
    rep.add_argument(
        "--non-pytorch-mib",
        type=_nonnegative_float,
        default=None,
        help="memory held outside PyTorch on the GPU, MiB (none: derived from the seed's message for the seed's "
        "case, else the shipped figure for the GPU)",
    )
    rep.add_argument("--device", choices=[d.value for d in Device], default=_P["device"].default,
                     help="auto: cuda if available, else simulated")
    rep.add_argument("--message-format", type=_message_format_argument, choices=("auto", "old", "new"),
                     default=_P["message_format"].default,
                     help="OOM message of the simulated device: old = torch<=2.0, new = torch>=2.1, auto = old for the "
                     "seed's case (which printed it), else new")
    rep.add_argument("--json", action="store_true", help="print the result as JSON")

    exp = sub.add_parser("explain", help="decode an out-of-memory message (and its traceback) and explain it",
                         formatter_class=_Formatter)
    exp.add_argument("text", nargs="?", default=None,
                     help="the message (or a whole traceback/log); '-' or nothing reads standard input")
    exp.add_argument("--file", type=_path, default=None, help="read the message from this file instead")
    exp.add_argument("--model", default=None, help=_model_help() + ": name the tensors")
    exp.add_argument("--gpu", default=None, help=_gpu_help() + " (none: inferred from the total capacity)")
    exp.add_argument("--dtype", default=None, help="float16, bfloat16 or float32 (none: every dtype that fits)")
    for flag, what in (("--gpus", "GPUs per node"), ("--nodes", "nodes"), ("--batch", "micro-batch per GPU"),
                       ("--seq", "sequence length")):  # the run's, which no message states: none = solved if it can be
        exp.add_argument(flag, type=_positive_int, default=None, help=f"{what} (none: not known)")
    for flag, kind in (("--strategy", Strategy), ("--method", Method), ("--optimizer", Optimizer)):
        exp.add_argument(flag, choices=[c.value for c in kind], default=None, help="the run's (none: not known)")
    exp.add_argument("--json", action="store_true", help="print the explanation as JSON")

    bud = sub.add_parser("budget", help="per-GPU memory of one training step, component by component",
                         formatter_class=_Formatter)
    add_setup_arguments(bud)
    bud.add_argument("--source", choices=SOURCES, default="analytic",
                     help="analytic (formulas, microseconds) or traced (PyTorch's MemTracker on fake tensors)")
    bud.add_argument("--json", action="store_true", help="print the result as JSON")

    pln = sub.add_parser("plan", help="every remedy for training the model on these GPUs: budgeted, ranked, "
                         "with the knob table and the launch files", formatter_class=_Formatter)
    pln.add_argument("--model", default=DEFAULTS.model, action=_StoreGiven, help=_model_help())
    pln.add_argument("--gpu", default=DEFAULTS.gpu, action=_StoreGiven, help=_gpu_help())
    pln.add_argument("--gpus", type=_positive_int, default=DEFAULTS.gpus, action=_StoreGiven,
                     help="GPUs per node")
    pln.add_argument("--nodes", type=_positive_int, default=1,
                     help="nodes (with --any-gpu: also search 2, 4, ... up to this many nodes of --max-gpus GPUs)")
    pln.add_argument("--any-gpu", action="store_true",
                     help="search every GPU type x 1, 2, 4, ... --max-gpus GPUs: the best remedy on each, ranked "
                     "by cost per token, speed and GPU count")
    pln.add_argument("--method", choices=[m.value for m in Method], action="append", default=None,
                     help="the user's method (default: full); with --any-gpu: the methods the search may use "
                     "(repeatable; default: every method)")
    pln.add_argument("--strategy", choices=[s.value for s in Strategy], default=None,
                     help="the user's strategy (default: ddp, one process on one GPU)")
    pln.add_argument("--launch-dir", type=_path, default=None, metavar="DIR",
                     help="a folder of the user's launch files (as check --launch-dir reads them): the plan's first "
                     "row is that run; --gpu names the GPU")
    pln.add_argument("--max-gpus", type=_positive_int, default=8, help="with --any-gpu: the most GPUs per node")
    pln.add_argument("--prices", type=_path, default=None, metavar="FILE",
                     help="with --any-gpu: a price table JSON ({'instances': [{provider, instance, gpu, "
                     "gpus_per_instance, usd_per_hour}, ...]}; default: oomlab's dated list prices)")
    pln.add_argument("--host-ram", type=_host_ram_argument, default=_P["host_ram"].default, action=_StoreGiven,
                     help="host RAM per node, with its unit; auto (the default) assumes the listed instance "
                     f"with these GPUs (specs/prices.json), else {seed_machine_text(sentence=False)}")
    pln.add_argument("--seq", type=_positive_int, default=DEFAULTS.seq, help="target sequence length")
    pln.add_argument("--batch", type=_batch, default=DEFAULTS.batch,
                     help="the user's micro-batch per GPU")
    pln.add_argument("--precision", choices=[p.value for p in Precision], default=DEFAULTS.precision.value,
                     help="the user's precision")
    pln.add_argument("--optimizer", choices=[o.value for o in Optimizer], default=DEFAULTS.optimizer.value,
                     help="the user's optimizer")
    pln.add_argument("--checkpointing", action="store_true", help="the user's run used activation checkpointing")
    pln.add_argument("--lora-rank", type=_positive_int, default=DEFAULTS.lora_rank,
                     help="LoRA rank of the LoRA/QLoRA remedies")
    pln.add_argument("--top", type=_positive_int, default=15, help="remedies shown (--json has all)")
    pln.add_argument("--write-configs", type=_path, nargs="?", const=CONFIGS_DIR, default=None, metavar="DIR",
                     help=f"also write the launch files (into {CONFIGS_DIR} when no folder is given)")
    pln.add_argument("--json", action="store_true", help="print the plan as JSON")

    chk = sub.add_parser("check", help="read the user's launch files and command: where the run fails first "
                         "(load or step, which phase), the per-GPU budget and the smallest fix",
                         formatter_class=_Formatter)
    chk.add_argument("--launch", default=None, metavar="COMMAND",
                     help="the launch command line, quoted: torchrun / accelerate launch / deepspeed / python ...")
    chk.add_argument("--launch-dir", type=_path, default=None, metavar="DIR",
                     help="a folder of launch files (launch.txt, accelerate*.yaml, DeepSpeed JSON, training_args.json,"
                     " adapter_config.json, quantization_config.json, config.json)")
    chk.add_argument("--accelerate-config", default=None, metavar="F", help="accelerate config YAML")
    chk.add_argument("--deepspeed", default=None, metavar="F", help="DeepSpeed JSON")
    chk.add_argument("--training-args", default=None, metavar="F", help="HF TrainingArguments as JSON")
    chk.add_argument("--adapter-config", default=None, metavar="F", help="peft adapter_config.json")
    chk.add_argument("--quantization-config", default=None, metavar="F", help="a quantization_config JSON")
    chk.add_argument("--model", default=None, help=_model_help() + " (none: from the launch)")
    chk.add_argument("--gpu", required=True, help=_gpu_help())
    chk.add_argument("--gpus", type=_positive_int, default=None, help="GPUs per node (none: as the launch says)")
    chk.add_argument("--host-ram", type=_host_ram_argument, default=_P["host_ram"].default,
                     help="host RAM per node, with its unit (an assumption unless given)")
    chk.add_argument("--message", type=_path, default=None, metavar="FILE",
                     help="the user's OOM message (and traceback): set against the budget of the launch as read")
    chk.add_argument("--json", action="store_true", help="print the answer as JSON")
    chk.add_argument("--markdown", action="store_true", help="print a reply to paste under the user's GitHub issue")

    run = sub.add_parser("run", help="run the notebooks with papermill and render outputs/report.html",
                         epilog=render_params_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--params", type=_path, default=None, help="YAML file of parameters")
    run.add_argument("-p", dest="pairs", action="append", default=[], metavar="KEY=VALUE",
                     help="a parameter (repeatable; overrides --params; the keys are listed below)")
    run.add_argument("--out", default=None, help="output folder (default outputs/)")  # a str: '' is refused
    run.add_argument("--no-progress", action="store_true", help="hide papermill's progress bars under --verbose")
    run.add_argument("--verbose", action="store_true",
                     help="also show the kernels' own output, every cell's output and papermill's progress bars")
    return parser


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from oomlab.reproduction import summary
    from oomlab.reproduction.replay import reproduce

    result = reproduce(
        model=args.model,
        dtype=args.dtype,
        gpu=args.gpu,
        non_pytorch_mib=args.non_pytorch_mib,
        device=args.device,
        message_format=args.message_format,
    )
    print(json.dumps(result.to_dict(), indent=2) if args.json else summary.render_text(result))
    return 0


def _read_explain_input(args: argparse.Namespace) -> str:
    if args.file is not None and args.text is not None:
        raise InvalidValueError(
            f"give the message as TEXT or --file, not both (got TEXT and --file {str(args.file)!r})")
    from oomlab.core.user_input import read_stream_text, read_user_text
    from oomlab.explanation.message import MAX_INPUT_BYTES

    # bounded: a regular file (never /dev/zero or a FIFO) or standard input of at most MAX_INPUT_BYTES, UTF-8
    if args.file is not None:
        return read_user_text(args.file, "--file", max_bytes=MAX_INPUT_BYTES)
    if args.text is None or args.text == "-":
        return read_stream_text(sys.stdin, "standard input", max_bytes=MAX_INPUT_BYTES)
    return args.text


def _cmd_explain(args: argparse.Namespace) -> int:
    from oomlab.explanation.display import render_explanation
    from oomlab.explanation.explain import explain

    run = {k: getattr(args, k) for k in ("gpus", "nodes", "strategy", "method", "optimizer", "batch", "seq")}
    result = explain(_read_explain_input(args), model=args.model, gpu=args.gpu, dtype=args.dtype, **run)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(render_explanation(result), end="")
    return 0


def _cmd_budget(args: argparse.Namespace) -> int:
    from oomlab.budget.api import estimate
    from oomlab.budget.display import render_budget

    result = estimate(source=args.source, **setup_kwargs(args))
    print(json.dumps(result.to_dict(), indent=2) if args.json else render_budget(result))
    return 0


def _cmd_plan_any_gpu(args: argparse.Namespace) -> int:
    """``plan --any-gpu``: every GPU type and count, refused flags named before any work."""
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


def _cmd_plan(args: argparse.Namespace) -> int:
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
                         method=args.method[0] if args.method else DEFAULTS.method)
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


def _cmd_run(args: argparse.Namespace) -> int:
    from oomlab.core.paths import OUTPUTS_DIR
    from oomlab.pipeline.params import parse_params
    from oomlab.pipeline.runner import RunInterrupted, render_notebook_run, run_pipeline

    params = parse_params(args.pairs, args.params)
    out = args.out if args.out is not None else OUTPUTS_DIR
    try:
        result = run_pipeline(params, out_dir=out, progress=args.verbose and not args.no_progress,
                              verbose=args.verbose, on_notebook=lambda run: print(render_notebook_run(run), flush=True))
    except RunInterrupted as err:  # Ctrl-C: the runner kept what ran; no traceback
        # nbclient's cell task, abandoned by the interrupt, would be reported by asyncio as the process ends ("Task
        # exception was never retrieved ... DeadKernelError") under the one line this prints
        logging.getLogger("asyncio").disabled = True
        partial = "" if err.kept is None else f", partial run in {err.kept}"
        print(f"interrupted; outputs unchanged{partial}", file=sys.stderr)
        return 130
    print(f"report: {result.report_path}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from oomlab.launch.check import check
    from oomlab.launch.display import render_check, render_markdown

    result = check(launch=args.launch, launch_dir=args.launch_dir, accelerate_config=args.accelerate_config,
                   deepspeed=args.deepspeed, training_args=args.training_args, adapter_config=args.adapter_config,
                   quantization_config=args.quantization_config, model=args.model, gpu=args.gpu, gpus=args.gpus,
                   host_ram=args.host_ram, message=args.message)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    elif args.markdown:
        print(render_markdown(result))
    else:
        print(render_check(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """:func:`run_cli` with standard output and error in the terminal's encoding (:func:`terminal_streams`)."""
    with terminal_streams():
        return run_cli(argv)


def run_cli(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run its command: 0, 2 for bad input (:class:`OomlabError`), 1 for a failed run."""
    parser = build_parser()
    args = parser.parse_args(_join_dash_values(sys.argv[1:] if argv is None else argv))
    handlers: dict[str, Any] = {"reproduce": _cmd_reproduce, "explain": _cmd_explain, "budget": _cmd_budget,
                                "plan": _cmd_plan, "run": _cmd_run, "check": _cmd_check}
    try:
        return handlers[args.command](args)
    except BrokenPipeError:  # `python -m oomlab ... | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own advice: no second error while flushing at exit
        return 0
    except OomlabError as err:
        print(f"{parser.prog} {args.command}: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except PipelineError as err:
        print(f"{parser.prog} {args.command}: failed: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
