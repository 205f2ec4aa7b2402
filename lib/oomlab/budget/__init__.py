"""Stage 3: the estimator -- the training memory per GPU: result types, activations (one traced layer scaled where
a family is not hand-derived), model states through one sharding table, workspaces, the one-pass inventory, the
analytic estimate, the traced reference (MemTracker on fake tensors, :func:`~oomlab.budget.estimate`'s other
source) and display.  The instruments that run a real step come next; the evidence that proves the estimate last."""

from oomlab.core.exports import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "estimator": ("estimate_setup",),
    "api": ("estimate",),
    "deepspeed_config": ("DeepSpeedSettings", "read_deepspeed_config"),
    "display": ("budget_variants", "configured_variants", "render_budget"),
    "result": ("BudgetResult", "Fit", "MemCategory", "Phase", "Source"),
    "traced": ("traced_budget",),
})
