"""One module for silencing third-party chatter while oomlab builds models: transformers' logger and progress bars,
its FutureWarnings, and accelerate's "device is not available" notices (there is no GPU here, by design)
(:func:`quiet_libraries`); every log record up to WARNING, for loggers created mid-call (:func:`no_warning_logs`)."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

# bitsandbytes' CPU backend logs a warning when its optional ``kernels`` package is missing (logger.warning in
# bitsandbytes/backends/cpu/ops.py, at import); the slower fallback it takes is the path oomlab measures.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """transformers at error level without progress bars, no FutureWarnings, accelerate's modeling logger at error.

    Everything is restored on exit; other warnings stay warnings.
    """
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    accelerate_log = logging.getLogger("accelerate.utils.modeling")
    level = accelerate_log.level
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    accelerate_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # transformers 5's gradient_checkpointing renames
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
        accelerate_log.setLevel(level)


@contextlib.contextmanager
def no_warning_logs() -> Iterator[None]:
    """No log records up to WARNING from any logger, for the duration only (``logging.disable``).

    For a logger that does not exist yet when the block starts, so that raising its level beforehand does not hold:
    DeepSpeed's (if installed) is created with level WARNING when transformers first imports it, inside a quantized
    load, and logs its accelerator choice to stdout.
    """
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)
