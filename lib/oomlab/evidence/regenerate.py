"""The one command that regenerates each committed document: ``python -m oomlab.evidence NAME`` (or ``all``).

Each generator is a module of this stage with a ``regenerate()`` that rewrites its committed files and returns 0 when
every figure agrees; :data:`GENERATORS` names them, says what each run does, which files it rewrites and roughly how
long it takes.  ``--help`` prints that list without importing any generator (no torch); an unknown NAME is refused
with exit status 2 and the valid choices; nothing else in the library writes into the checkout.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType

PROG = "python -m oomlab.evidence"
ALL = "all"


def _plain(module: ModuleType, _: argparse.Namespace) -> int:
    return int(module.regenerate())


@dataclass(frozen=True)
class Generator:
    """One committed document and the run that rewrites it."""

    name: str  # on the command line
    module: str  # oomlab.evidence.<module>, whose regenerate() does the run
    does: str  # what the run does, one sentence
    writes: tuple[str, ...]  # the committed files it rewrites, relative to the repository
    takes: str  # roughly how long, on two cores
    flags: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # its own store_true options
    run: Callable[[ModuleType, argparse.Namespace], int] = _plain  # regenerate() called with the parsed flags


GENERATORS: tuple[Generator, ...] = (
    Generator("published", "published",
              "Estimate every published measurement (lib/oomlab/data/published-measurements.json) again and set "
              "each beside the oomlab figure for the counter its source read.",
              ("docs/published-measurements.md",), "a few seconds"),
    Generator("margins", "margins",
              "Derive the margin a fit must keep per training method from the published measurements (the largest "
              "excess of a trusted real-GPU peak over the estimate, plus fragmentation).",
              ("lib/oomlab/data/margins.json",), "a few seconds"),
    Generator("nf4-events", "nf4_events",
              "Record torchao 0.1's NF4 quantization (to_nf4, get_original_weight) again on CPU: every tensor it "
              "allocates and frees, per weight element (what the torchtune < 0.2 QLoRA init budget replays).",
              ("lib/oomlab/data/torchao-nf4-events.json",), "a few seconds"),
    Generator("deepspeed-estimators", "deepspeed_estimators",
              "Run DeepSpeed's own ZeRO memory estimators again and set oomlab's DeepSpeed budget beside them, "
              "every difference sized.", ("docs/deepspeed-estimators.md",), "about a second"),
    Generator("deepspeed-measured", "deepspeed_measured",
              "Train the tiny DeepSpeed ZeRO-1/2/3 cases for real on gloo CPU processes (two steps each) and set "
              "every rank's measured bytes beside the analytic budget; results cached under outputs/cache by the "
              "cases and library versions.",
              ("lib/oomlab/data/deepspeed-small-scale.json", "docs/deepspeed-small-scale.md"),
              "about a minute, plus DeepSpeed's first JIT build of its CPU op",
              MappingProxyType({"--no-cache": "run every case again, ignoring the cached measurements"}),
              lambda module, args: int(module.regenerate(use_cache=not args.no_cache))),
    Generator("small-scale", "small_scale",
              "Train the tiny setups for real on CPU (two steps each) and set the analytic budget beside each.",
              ("docs/small-scale-measured.md",), "about five minutes"),
    Generator("trainers", "trainers",
              "Train the tiny DPO cases with TRL's own DPOTrainer on CPU (two steps each; needs trl and datasets "
              "installed) and set the trainers' analytic budget beside each.",
              ("docs/trainers-small-scale.md",), "about two minutes"),
    Generator("families", "families",
              "Budget and trace every family's spec (cut to a few layers at full width) and train each family's "
              "tiny config for two real CPU steps; traces cached under outputs/cache.",
              ("lib/oomlab/data/family-agreement.json", "docs/family-agreement.md"), "a few minutes"),
    Generator("agreement", "agreement",
              "Trace the agreement matrix again (PyTorch's MemTracker on fake tensors at full size, cached under "
              "outputs/cache by the library versions), budget it and the analytic-only setups, and set the "
              "committed DeepSpeed small-scale measurements beside today's budget (run deepspeed-measured first "
              "to measure them again).", ("lib/oomlab/data/agreement.json", "docs/budget-agreement.md"),
              "a few minutes with the trace cache warm; tens of minutes cold"),
)
BY_NAME: Mapping[str, Generator] = MappingProxyType({g.name: g for g in GENERATORS})


def describe(generator: Generator) -> str:
    """What ``--help`` says of one generator: what it does, what it rewrites, how long it takes."""
    return f"{generator.does} Rewrites {', '.join(generator.writes)}. Takes {generator.takes}."


def build_parser() -> argparse.ArgumentParser:
    """``python -m oomlab.evidence {NAME,all} [flags]``, one sub-command per generator."""
    listing = "\n".join(textwrap.fill(describe(g), 100, initial_indent=f"  {g.name:<21} ", subsequent_indent=" " * 24,
                                      break_long_words=False, break_on_hyphens=False) for g in GENERATORS)
    parser = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Regenerate a committed document of the evidence (the proof of the estimator), or all of them.",
        epilog=f"generators:\n{listing}\n  {ALL:<21} every generator above, in this order.")
    names = parser.add_subparsers(dest="name", metavar="NAME", required=True,
                                  help="a generator listed below, or all of them")
    every_flag: dict[str, str] = {}
    for g in GENERATORS:
        sub = names.add_parser(g.name, formatter_class=argparse.RawDescriptionHelpFormatter,
                               description=textwrap.fill(describe(g), 100, break_long_words=False,
                                                         break_on_hyphens=False))  # whole paths
        for flag, text in g.flags.items():
            sub.add_argument(flag, action="store_true", help=text)
            every_flag.setdefault(flag, f"{text} ({g.name})")
    everything = names.add_parser(ALL, description="Run every generator, in the order listed by --help.")
    for flag, text in every_flag.items():
        everything.add_argument(flag, action="store_true", help=text)
    return parser


def run(generator: Generator, args: argparse.Namespace) -> int:
    """One generator's run (its module imported now: torch and the rest load only for the run asked for)."""
    module = importlib.import_module(f"oomlab.evidence.{generator.module}")
    return generator.run(module, args)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (``sys.argv[1:]`` when ``None``) and run the generator it names, or ``all`` of them in order,
    returning 0 when every run agrees.  ``--help`` returns 0 and a usage error (an unknown NAME or flag) 2, before any
    work (argparse prints either)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:  # --help (status 0) or a usage error (status 2), already printed by argparse
        return int(stop.code or 0)
    if args.name != ALL:
        return run(BY_NAME[args.name], args)
    failed = []
    for g in GENERATORS:
        flags = argparse.Namespace(**{flag.lstrip("-").replace("-", "_"): getattr(args, flag.lstrip("-").replace(
            "-", "_")) for flag in g.flags})
        if run(g, flags):
            failed.append(g.name)
    if failed:
        print(f"outside the tolerance: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0
