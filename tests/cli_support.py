"""Running the CLI in a test: exit code and stderr of ``python -m oomlab ARGV``, with a function that must not run."""

from __future__ import annotations

from unittest import mock

from oomlab.cli import main


def run_refused(argv: list[str], capsys, never_called: str) -> tuple[int, str]:
    """Exit code and stderr of ``main(argv)``, failing if ``never_called`` (a dotted path) runs: bad input is refused
    before any work."""
    with mock.patch(never_called, side_effect=AssertionError(f"{never_called} ran")):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, capsys.readouterr().err

# A test that guards against a hang (a blocking read, unbounded work) fails past this many seconds: far above any
# real answer's time even on a busy machine, so it fails for a hang, never for a slow machine (benchmarks/ time things).
HANG_S = 60
