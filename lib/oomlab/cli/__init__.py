"""``python -m oomlab``: the library's functions on the command line.

Bad input exits with code 2 and a message naming the bad value and what is accepted, before any work; a failed
pipeline run exits with code 1.  Building the parser loads no torch (--help answers at once); each command
imports the stage it runs.  Every option named like a pipeline parameter defaults to that parameter's default, but
where its value comes from elsewhere (None: ``explain`` infers the names, ``check`` reads the launch, ``plan
--any-gpu`` searches every method).  One module per command (``oomlab.cli.budget`` ...): its options
(``add_parser``) and its handler (``command``); ``oomlab.cli.common`` holds what they share.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from oomlab.cli import budget, check, explain, plan, reproduce, run
from oomlab.cli.common import EXIT_BAD_INPUT, Parser, add_setup_arguments, join_dash_values, setup_kwargs
from oomlab.core.errors import OomlabError, PipelineError
from oomlab.core.terminal import terminal_streams

COMMANDS = {"reproduce": reproduce, "explain": explain, "budget": budget, "plan": plan, "check": check, "run": run}
__all__ = ["COMMANDS", "EXIT_BAD_INPUT", "add_setup_arguments", "build_parser", "main", "run_cli", "setup_kwargs"]


def build_parser() -> Parser:
    parser = Parser(prog="python -m oomlab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in COMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """:func:`run_cli` with standard output and error in the terminal's encoding (:func:`terminal_streams`)."""
    with terminal_streams():
        return run_cli(argv)


def run_cli(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run its command: 0, 2 for bad input (:class:`OomlabError`), 1 for a failed run."""
    parser = build_parser()
    args = parser.parse_args(join_dash_values(sys.argv[1:] if argv is None else argv))
    try:
        return COMMANDS[args.command].command(args)
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
