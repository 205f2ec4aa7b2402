"""Stage 4: the instruments that run a real training step and measure it -- tiny models stepped on CPU under the
allocator's own count (:mod:`.measured`), DeepSpeed's engine on gloo CPU ranks (:mod:`.deepspeed_run`), FSDP2 / DDP
over gloo processes (:mod:`.gloo`).  The traced budget (MemTracker on fake tensors) stays in :mod:`oomlab.budget`,
one of :func:`oomlab.budget.estimate.estimate`'s two sources."""
