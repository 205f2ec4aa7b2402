"""Stage 2: decode an out-of-memory message and its traceback the way an expert reads them -- figures as
intervals, the request, fragmentation, anomalies, tensor candidates, the phase, the torch release, the verdict."""

from oomlab.core.exports import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "display": ("render_explanation",),
    "explain": ("Explanation",),  # not explain(): a module of that name (oomlab.explain is the function)
    "frames": ("Frame", "parse_traceback"),
    "message": ("OomMessage", "parse_oom_message"),
    "phase": ("PhaseCode", "detect_phase"),
})
