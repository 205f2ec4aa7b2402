"""``python -m oomlab run``: run the notebooks with papermill and render the report."""

from __future__ import annotations

import argparse
import logging
import sys

from oomlab.cli.common import (
    path_argument,
)
from oomlab.pipeline.params import render_params_help


def add_parser(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run the notebooks with papermill and render outputs/report.html",
                         epilog=render_params_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--params", type=path_argument, default=None, help="YAML file of parameters")
    run.add_argument("-p", dest="pairs", action="append", default=[], metavar="KEY=VALUE",
                     help="a parameter (repeatable; overrides --params; the keys are listed below)")
    run.add_argument("--out", default=None, help="output folder (default outputs/)")  # a str: '' is refused
    run.add_argument("--no-progress", action="store_true", help="hide papermill's progress bars under --verbose")
    run.add_argument("--verbose", action="store_true",
                     help="also show the kernels' own output, every cell's output and papermill's progress bars")


def command(args: argparse.Namespace) -> int:
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
