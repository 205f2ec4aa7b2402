"""oomlab.core.quiet: third-party chatter silenced for a block, and everything restored after it."""

import logging

from oomlab.core.quiet import no_warning_logs, quiet_libraries


def test_no_warning_logs_holds_for_a_logger_created_inside(caplog) -> None:
    """A logger first made inside the block (as DeepSpeed's is, mid-load) logs no warning; errors still show."""
    with caplog.at_level(logging.DEBUG), no_warning_logs():
        created = logging.getLogger("oomlab.tests.created-inside")
        created.warning("hidden")
        created.error("shown")
    assert [r.getMessage() for r in caplog.records] == ["shown"]


def test_no_warning_logs_restores_the_disable_level() -> None:
    """After the block, logging.disable is back where it was (also when it was set before)."""
    before = logging.root.manager.disable
    with no_warning_logs():
        assert logging.root.manager.disable == logging.WARNING
    assert logging.root.manager.disable == before


def test_quiet_libraries_restores_accelerate_modeling_level() -> None:
    """accelerate's modeling logger is at ERROR inside quiet_libraries and at its own level after."""
    log = logging.getLogger("accelerate.utils.modeling")
    level = log.level
    with quiet_libraries():
        assert log.level == logging.ERROR
    assert log.level == level
