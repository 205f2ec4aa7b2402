"""``python -m oomlab reproduce``: move a model to one GPU as ``model.to('cuda')`` does."""

from __future__ import annotations

import argparse
import json

from oomlab.cli.common import (
    PARAMS,
    Formatter,
    gpu_help,
    message_format_argument,
    model_help,
    nonnegative_float,
)
from oomlab.core.choices import Device
from oomlab.core.defaults import DEFAULTS


def add_parser(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser("reproduce", help="move a model to one GPU as model.to('cuda') does; report the OOM",
                         formatter_class=Formatter)
    rep.add_argument("--model", default=DEFAULTS.model, help=model_help())
    rep.add_argument("--dtype", default=DEFAULTS.dtype, help="storage dtype: float16, bfloat16 or float32")
    rep.add_argument("--gpu", default=DEFAULTS.gpu, help=gpu_help())
    rep.add_argument(
        "--non-pytorch-mib",
        type=nonnegative_float,
        default=None,
        help="memory held outside PyTorch on the GPU, MiB (none: derived from the seed's message for the seed's "
        "case, else the shipped figure for the GPU)",
    )
    rep.add_argument("--device", choices=[d.value for d in Device], default=PARAMS["device"].default,
                     help="auto: cuda if available, else simulated")
    rep.add_argument("--message-format", type=message_format_argument, choices=("auto", "old", "new"),
                     default=PARAMS["message_format"].default,
                     help="OOM message of the simulated device: old = torch<=2.0, new = torch>=2.1, auto = old for the "
                     "seed's case (which printed it), else new")
    rep.add_argument("--json", action="store_true", help="print the result as JSON")


def command(args: argparse.Namespace) -> int:
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
