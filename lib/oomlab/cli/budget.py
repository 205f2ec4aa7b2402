"""``python -m oomlab budget``: the per-GPU memory of one training step."""

from __future__ import annotations

import argparse
import json

from oomlab.budget.result import SOURCES
from oomlab.cli.common import (
    Formatter,
    add_setup_arguments,
    setup_kwargs,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    bud = sub.add_parser("budget", help="per-GPU memory of one training step, component by component",
                         formatter_class=Formatter)
    add_setup_arguments(bud)
    bud.add_argument("--source", choices=SOURCES, default="analytic",
                     help="analytic (formulas, microseconds) or traced (PyTorch's MemTracker on fake tensors)")
    bud.add_argument("--json", action="store_true", help="print the result as JSON")


def command(args: argparse.Namespace) -> int:
    from oomlab.budget.api import estimate
    from oomlab.budget.display import render_budget

    result = estimate(source=args.source, **setup_kwargs(args))
    print(json.dumps(result.to_dict(), indent=2) if args.json else render_budget(result))
    return 0
