"""``python -m oomlab explain``: decode an out-of-memory message and explain it, or explain a memory snapshot
(``--snapshot``: torch.cuda.memory._dump_snapshot's pickle) beside the budget of the same setup."""

from __future__ import annotations

import argparse
import json
import sys

from oomlab.cli.common import (
    Formatter,
    gpu_help,
    model_help,
    path_argument,
    positive_int,
)
from oomlab.core.choices import Method, Optimizer, Strategy
from oomlab.core.errors import InvalidValueError


def add_parser(sub: argparse._SubParsersAction) -> None:
    exp = sub.add_parser("explain", help="decode an out-of-memory message (and its traceback) and explain it",
                         formatter_class=Formatter)
    exp.add_argument("text", nargs="?", default=None,
                     help="the message (or a whole traceback/log); '-' or nothing reads standard input")
    exp.add_argument("--file", type=path_argument, default=None, help="read the message from this file instead")
    exp.add_argument("--model", default=None, help=model_help() + ": name the tensors")
    exp.add_argument("--gpu", default=None, help=gpu_help() + " (none: inferred from the total capacity)")
    exp.add_argument("--dtype", default=None, help="float16, bfloat16 or float32 (none: every dtype that fits)")
    for flag, what in (("--gpus", "GPUs per node"), ("--nodes", "nodes"), ("--batch", "micro-batch per GPU"),
                       ("--seq", "sequence length")):  # the run's, which no message states: none = solved if it can be
        exp.add_argument(flag, type=positive_int, default=None, help=f"{what} (none: not known)")
    for flag, kind in (("--strategy", Strategy), ("--method", Method), ("--optimizer", Optimizer)):
        exp.add_argument(flag, choices=[c.value for c in kind], default=None, help="the run's (none: not known)")
    exp.add_argument("--snapshot", type=path_argument, default=None,
                     help="a torch.cuda.memory._dump_snapshot pickle: what was live at its last OOM (read with a "
                          "restricted unpickler); with --model, beside the budget of the same setup")
    exp.add_argument("--snapshot-device", type=int, default=None, metavar="N",
                     help="the snapshot's device (none: the first with an OOM)")
    exp.add_argument("--json", action="store_true", help="print the explanation as JSON")


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


def _snapshot_command(args: argparse.Namespace, run: dict[str, object]) -> int:
    from oomlab.explanation.snapshot import explain_snapshot, render_snapshot_explanation

    if args.text is not None or args.file is not None:
        raise InvalidValueError("give a message (TEXT or --file) or --snapshot, not both")
    result = explain_snapshot(args.snapshot, device=args.snapshot_device)
    comparison = None
    if args.model is not None:
        from oomlab.budget.api import estimate
        from oomlab.budget.snapshot_compare import compare_snapshot
        from oomlab.core.defaults import DEFAULTS

        given = {k: v for k, v in run.items() if v is not None}
        comparison = compare_snapshot(result, estimate(model=args.model, gpu=args.gpu or DEFAULTS.gpu, **given))
    if args.json:
        print(json.dumps({**result.to_dict(), "budget": None if comparison is None else comparison.to_dict()},
                         indent=2))
        return 0
    print(render_snapshot_explanation(result), end="")
    if comparison is not None:
        from oomlab.budget.snapshot_compare import render_comparison

        print("\n" + render_comparison(comparison), end="")
    else:
        print("\n(give --model, and --gpu and the run's settings, to set it beside the budget of the same setup)")
    return 0


def command(args: argparse.Namespace) -> int:
    from oomlab.explanation.display import render_explanation
    from oomlab.explanation.explain import explain

    run = {k: getattr(args, k) for k in ("gpus", "nodes", "strategy", "method", "optimizer", "batch", "seq")}
    if args.snapshot is not None:
        return _snapshot_command(args, run)
    result = explain(_read_explain_input(args), model=args.model, gpu=args.gpu, dtype=args.dtype, **run)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(render_explanation(result), end="")
    return 0
