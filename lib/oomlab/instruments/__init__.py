"""Stage 4: the instruments that run a real training step and measure it -- tiny models stepped on CPU under the
allocator's own count (:mod:`.measured`), DeepSpeed's engine on gloo CPU ranks (:mod:`.deepspeed_run`), FSDP2 / DDP
over gloo processes (:mod:`.gloo`).  The traced budget (MemTracker on fake tensors) stays in :mod:`oomlab.budget`,
one of :func:`oomlab.budget.estimate`'s two sources."""

from oomlab.core.exports import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "deepspeed_run": ("run_world",),
    "gloo": ("run_fsdp_gloo",),
    "measured": ("StepMeasurement", "measure_real", "measure_steps"),
})
