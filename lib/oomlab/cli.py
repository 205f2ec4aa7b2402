"""``python -m oomlab``: the library's functions on the command line.

Bad input exits with code 2 and a message naming the bad value and what is accepted, before any work; a failed
pipeline run exits with code 1.  Building the parser loads no torch (``--help`` answers at once); each command
imports the stage it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oomlab.budget.result import SOURCES
from oomlab.core.choices import MESSAGE_FORMAT_NAMES, Attention, Device, Method, Optimizer, Precision, Strategy
from oomlab.core.errors import InvalidValueError, OomlabError, PipelineError
from oomlab.core.setup import DEFAULT_HOST_RAM, LORA_TARGET_CHOICES
from oomlab.core.units import parse_size
from oomlab.pipeline.params import render_params_help
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
        raise argparse.ArgumentTypeError(f"invalid number {text!r}; expected a number of MiB >= 0") from err
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}; must be >= 0 MiB")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}; expected an integer >= 1") from err
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}; must be an integer >= 1")
    return value


def add_setup_arguments(parser: argparse.ArgumentParser) -> None:
    """The training-setup options of ``budget``."""
    parser.add_argument("--model", default="llama-13b", help="model spec name or path to a config.json")
    parser.add_argument("--gpu", default="t4", help="GPU spec name (default t4)")
    parser.add_argument("--gpus", type=_positive_int, default=1, help="GPUs per node (default 1)")
    parser.add_argument("--nodes", type=_positive_int, default=1, help="nodes (default 1)")
    parser.add_argument("--strategy", choices=[s.value for s in Strategy], default="single",
                        help="the launch: single = one process; ddp = accelerate/torchrun DDP; fsdp = accelerate's "
                        "default FSDP (fsdp_version 1); fsdp2 = accelerate fsdp_version 2; *-offload = with "
                        "fsdp_offload_params; zero1/zero2 = DeepSpeed (default single)")
    parser.add_argument("--method", choices=[m.value for m in Method], default="full")
    parser.add_argument("--precision", choices=[p.value for p in Precision], default="fp16-mixed")
    parser.add_argument("--optimizer", choices=[o.value for o in Optimizer], default="adamw",
                        help="adamw = torch.optim.AdamW as constructed by hand (foreach); adamw-fused = "
                        "AdamW(fused=True), the HF Trainer's default (optim='adamw_torch_fused') (default adamw)")
    parser.add_argument("--batch", type=_positive_int, default=1, help="micro-batch per GPU (default 1)")
    parser.add_argument("--seq", type=_positive_int, default=2048, help="sequence length (default 2048)")
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing of each layer")
    parser.add_argument("--attention", choices=[a.value for a in Attention], default="sdpa")
    parser.add_argument("--lora-rank", type=_positive_int, default=8)
    parser.add_argument("--lora-alpha", type=_positive_int, default=16)
    parser.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj",
                        help=f"comma-separated, from {','.join(LORA_TARGET_CHOICES)}")


def setup_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The ``estimate``/``make_setup`` keyword arguments from parsed setup options."""
    return {"model": args.model, "gpu": args.gpu, "gpus": args.gpus, "nodes": args.nodes,
            "strategy": args.strategy, "method": args.method, "precision": args.precision,
            "optimizer": args.optimizer, "batch": args.batch, "seq": args.seq,
            "checkpointing": args.checkpointing, "attention": args.attention, "lora_rank": args.lora_rank,
            "lora_alpha": args.lora_alpha, "lora_targets": args.lora_targets}


def _size_argument(text: str) -> int:
    try:
        return parse_size(text)
    except OomlabError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m oomlab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    rep = sub.add_parser("reproduce", help="move a model to one GPU as model.to('cuda') does; report the OOM")
    rep.add_argument("--model", default="llama-13b", help="model spec name or path to a config.json")
    rep.add_argument("--dtype", default="float16", help="float16, bfloat16 or float32 (default float16)")
    rep.add_argument("--gpu", default="t4", help="GPU spec name (default t4)")
    rep.add_argument(
        "--non-pytorch-mib",
        type=_nonnegative_float,
        default=None,
        help="memory held outside PyTorch on the GPU, MiB (default: derived from the seed's message)",
    )
    rep.add_argument("--device", choices=[d.value for d in Device], default="auto",
                     help="auto: cuda if available, else simulated")
    rep.add_argument("--message-format", choices=("auto", *MESSAGE_FORMAT_NAMES), default="auto",
                     help="OOM message format of the simulated device: old = torch<=2.0, new = torch>=2.1; "
                     "auto (default) = old for the seed's case, which printed it, else new")
    rep.add_argument("--json", action="store_true", help="print the result as JSON")

    exp = sub.add_parser("explain", help="decode a CUDA out-of-memory message (and its traceback) and explain it")
    exp.add_argument("text", nargs="?", default=None,
                     help="the message (or a whole traceback/log); '-' or nothing reads standard input")
    exp.add_argument("--file", type=Path, default=None, help="read the message from this file instead")
    exp.add_argument("--model", default=None, help="model spec name or path to a config.json: name the tensors")
    exp.add_argument("--gpu", default=None, help="GPU spec name (default: inferred from the total capacity)")
    exp.add_argument("--dtype", default=None, help="float16, bfloat16 or float32 (default: every dtype that fits)")
    exp.add_argument("--json", action="store_true", help="print the explanation as JSON")

    bud = sub.add_parser("budget", help="per-GPU memory of one training step, component by component")
    add_setup_arguments(bud)
    bud.add_argument("--source", choices=SOURCES, default="analytic",
                     help="analytic (formulas, microseconds) or traced (PyTorch's MemTracker on fake tensors)")
    bud.add_argument("--json", action="store_true", help="print the result as JSON")

    pln = sub.add_parser("plan", help="every remedy for training the model on these GPUs: budgeted, ranked, "
                         "with the knob table and the launch files")
    pln.add_argument("--model", default="llama-13b", help="model spec name or path to a config.json")
    pln.add_argument("--gpu", default="t4", help="GPU spec name (default t4)")
    pln.add_argument("--gpus", type=_positive_int, default=4, help="GPUs per node (default 4)")
    pln.add_argument("--nodes", type=_positive_int, default=1, help="nodes (default 1)")
    pln.add_argument("--host-ram", type=_size_argument, default=DEFAULT_HOST_RAM,
                     help="host RAM per node (default 192GiB: the 4 x T4 g4dn.12xlarge, an assumption)")
    pln.add_argument("--seq", type=_positive_int, default=2048, help="target sequence length (default 2048)")
    pln.add_argument("--batch", type=_positive_int, default=1, help="the user's micro-batch per GPU (default 1)")
    pln.add_argument("--precision", choices=[p.value for p in Precision], default="fp16-mixed",
                     help="the user's precision (default fp16-mixed)")
    pln.add_argument("--optimizer", choices=[o.value for o in Optimizer], default="adamw",
                     help="the user's optimizer (default adamw)")
    pln.add_argument("--checkpointing", action="store_true", help="the user's run used activation checkpointing")
    pln.add_argument("--lora-rank", type=_positive_int, default=8, help="LoRA rank of the LoRA/QLoRA remedies")
    pln.add_argument("--top", type=_positive_int, default=15, help="remedies shown (default 15; --json has all)")
    pln.add_argument("--write-configs", type=Path, nargs="?", const=CONFIGS_DIR, default=None, metavar="DIR",
                     help=f"also write the launch files (default folder {CONFIGS_DIR})")
    pln.add_argument("--json", action="store_true", help="print the plan as JSON")

    run = sub.add_parser("run", help="run the notebooks with papermill and render outputs/report.html",
                         epilog=render_params_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--params", type=Path, default=None, help="YAML file of parameters")
    run.add_argument("-p", dest="pairs", action="append", default=[], metavar="KEY=VALUE",
                     help="a parameter (repeatable; overrides --params)")
    run.add_argument("--out", type=Path, default=None, help="output folder (default outputs/)")
    run.add_argument("--no-progress", action="store_true", help="hide papermill's progress bars under --verbose")
    run.add_argument("--verbose", action="store_true",
                     help="also show the kernels' own output, every cell's output and papermill's progress bars")
    return parser


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from oomlab.core.seed import SEED_DTYPE, SEED_GPU, SEED_MODEL
    from oomlab.core.units import format_size
    from oomlab.reproduction.replay import reproduce
    from oomlab.reproduction.result import compare_with_seed

    result = reproduce(
        model=args.model,
        dtype=args.dtype,
        gpu=args.gpu,
        non_pytorch_mib=args.non_pytorch_mib,
        device=args.device,
        message_format=args.message_format,
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    print(f"model {result.model} in {result.dtype} -> one {result.gpu} ({result.device})")
    if result.raised:
        print(f"raised {result.exception}: {result.message}")
        ft = result.failing_tensor
        if ft is not None:
            print(f"failing tensor: {ft.name} {list(ft.shape)} {ft.dtype} ({format_size(ft.nbytes)})")
        print(f"moved before the failure: {format_size(result.moved_bytes)} "
              f"({result.moved_fraction:.1%} of the parameters)")
        print("frames (innermost last): " + " > ".join(result.frames))
    else:
        print(f"no error: allocated {format_size(result.allocated_bytes)}, "
              f"reserved {format_size(result.reserved_bytes)}, free {format_size(result.free_bytes)}")
    print(f"whole model: {format_size(result.model_bytes)} of tensors, "
          f"{format_size(result.model_reserved_bytes)} reserved by the allocator; "
          f"capacity {format_size(result.total_bytes)}, outside PyTorch {format_size(result.outside_pytorch_bytes)}"
          f" -> {'fits' if result.fits else 'does not fit'}")
    if (result.model, result.dtype, result.gpu) == (SEED_MODEL, SEED_DTYPE, SEED_GPU) and result.raised:
        for row in compare_with_seed(result):
            print(f"  {row.figure:<30} seed {row.seed:>12}  reproduced {row.reproduced or '-':>12}  "
                  f"{'match' if row.matches else 'DIFFERENT'}")
    return 0


def _read_explain_input(args: argparse.Namespace) -> str:
    if args.file is not None and args.text is not None:
        raise InvalidValueError(
            f"give the message as TEXT or --file, not both (got TEXT and --file {str(args.file)!r})")
    if args.file is not None:
        try:
            return args.file.read_bytes().decode("utf-8", errors="replace")
        except OSError as err:
            raise InvalidValueError(f"cannot read --file {str(args.file)!r}: {err.strerror or err}") from err
    if args.text is None or args.text == "-":
        stream = getattr(sys.stdin, "buffer", sys.stdin)
        data = stream.read() if stream is not None else ""
        return data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    return args.text


def _cmd_explain(args: argparse.Namespace) -> int:
    from oomlab.explanation.display import render_explanation
    from oomlab.explanation.explain import explain

    result = explain(_read_explain_input(args), model=args.model, gpu=args.gpu, dtype=args.dtype)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(render_explanation(result), end="")
    return 0


def _cmd_budget(args: argparse.Namespace) -> int:
    from oomlab.budget.display import render_budget
    from oomlab.budget.estimate import estimate

    result = estimate(source=args.source, **setup_kwargs(args))
    print(json.dumps(result.to_dict(), indent=2) if args.json else render_budget(result))
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from oomlab.remedies.display import render_plan
    from oomlab.remedies.plan import make_plan

    plan = make_plan(model=args.model, gpu=args.gpu, gpus=args.gpus, nodes=args.nodes, host_ram=args.host_ram,
                     seq=args.seq, batch=args.batch, precision=args.precision, optimizer=args.optimizer,
                     checkpointing=args.checkpointing, lora_rank=args.lora_rank)
    written = None
    if args.write_configs is not None:
        from oomlab.remedies.launch_dir import write_configs

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
    from oomlab.pipeline.runner import render_notebook_run, run_pipeline

    params = parse_params(args.pairs, args.params)
    out = args.out if args.out is not None else OUTPUTS_DIR
    result = run_pipeline(params, out_dir=out, progress=args.verbose and not args.no_progress, verbose=args.verbose,
                          on_notebook=lambda run: print(render_notebook_run(run), flush=True))
    print(f"report: {result.report_path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handlers: dict[str, Any] = {"reproduce": _cmd_reproduce, "explain": _cmd_explain, "budget": _cmd_budget,
                                "plan": _cmd_plan, "run": _cmd_run}
    try:
        return handlers[args.command](args)
    except OomlabError as err:
        print(f"{parser.prog} {args.command}: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except PipelineError as err:
        print(f"{parser.prog} {args.command}: failed: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
