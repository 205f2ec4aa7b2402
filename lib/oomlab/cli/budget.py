"""``python -m oomlab budget``: the per-GPU memory of one training step."""

from __future__ import annotations

import argparse
import json

from oomlab.budget.result import SOURCES
from oomlab.cli.common import (
    Formatter,
    add_setup_arguments,
    path_argument,
    setup_kwargs,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    bud = sub.add_parser("budget", help="per-GPU memory of one training step, component by component",
                         formatter_class=Formatter)
    add_setup_arguments(bud)
    bud.add_argument("--source", choices=SOURCES, default="analytic",
                     help="analytic (formulas, microseconds) or traced (PyTorch's MemTracker on fake tensors)")
    bud.add_argument("--snapshot", type=path_argument, default=None, metavar="OUT.pickle",
                     help="also write the simulated step as a torch memory snapshot (open it with "
                          "torch.cuda._memory_viz or pytorch.org/memory_viz); never over a file oomlab did not write")
    bud.add_argument("--json", action="store_true", help="print the result as JSON")


def command(args: argparse.Namespace) -> int:
    from oomlab.budget.api import estimate
    from oomlab.budget.display import render_budget

    result = estimate(source=args.source, **setup_kwargs(args))
    written = None
    if args.snapshot is not None:
        from oomlab.budget.snapshot import write_snapshot

        written = write_snapshot(result, args.snapshot)
    if args.json:
        print(json.dumps({**result.to_dict(), **({"snapshot": str(written)} if written else {})}, indent=2))
    else:
        print(render_budget(result) + (f"\nsnapshot of the simulated step written to {written}" if written else ""))
    return 0
