"""Stage 3: the estimator -- the training memory per GPU: result types, activations (one traced layer scaled where
a family is not hand-derived), model states through one sharding table, workspaces, the one-pass inventory, the
analytic estimate, the traced reference (MemTracker on fake tensors, :func:`~oomlab.budget.estimate.estimate`'s other
source) and display.  The instruments that run a real step come next; the evidence that proves the estimate last."""
