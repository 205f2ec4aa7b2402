"""The command line every ``python -m oomlab.budget.<generator>`` shares (agreement, families, published, small_scale,
deepspeed_measured, deepspeed_estimators): an argparse parser whose ``--help`` says what the run regenerates, which
committed files it rewrites and how long it takes, and which -- like an argument the generator does not take -- stops
before any work is done."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

from oomlab.core.paths import REPO_ROOT


def shown(path: Path) -> str:
    """A committed file's path as the help text names it: relative to the repository where it lies inside it."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def doc_main(prog: str, description: str, writes: Sequence[Path], run: Callable[[argparse.Namespace], int],
             argv: Sequence[str] | None = None, flags: Mapping[str, str] = MappingProxyType({})) -> int:
    """Parse ``argv`` (``sys.argv[1:]`` when ``None``) as ``python -m <prog>`` and then ``run`` the regeneration with
    the parsed arguments, returning its exit status.

    ``description``: what the run regenerates and how long it takes; ``writes``: the committed files it rewrites
    (named in ``--help``); ``flags``: the generator's own ``store_true`` options, ``{"--no-cache": help}``.
    ``--help`` prints the help and returns 0, an argument the generator does not take returns 2 (argparse names it on
    stderr); neither calls ``run``.
    """
    rewrites = f" Rewrites {', '.join(shown(p) for p in writes)}." if writes else ""
    text = textwrap.fill(description + rewrites, 100, break_long_words=False, break_on_hyphens=False)  # whole paths
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=text,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, text in flags.items():
        parser.add_argument(flag, action="store_true", help=text)
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help (status 0) or a usage error (status 2), already printed by argparse
        return int(stop.code or 0)
    return run(args)
