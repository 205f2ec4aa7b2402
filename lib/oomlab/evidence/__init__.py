"""Stage 7: the evidence that proves the estimator -- the agreement matrices (analytic beside traced), the published
measurements, small-scale and DeepSpeed runs measured on CPU beside the analytic budget, DeepSpeed's own estimators,
the remedies' checks, and the one command (``python -m oomlab.evidence NAME``, :mod:`.regenerate`) that rewrites each
committed document.  Nothing before this stage writes into the checkout."""

from oomlab.core.exports import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "agreement": ("run_matrix",),
    "checks": ("verification",),
    "checks_cache": ("cached_verification",),
    "published": ("compare_all",),
    "regenerate": ("GENERATORS", "Generator"),
})
