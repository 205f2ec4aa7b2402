"""Stage 3: the training memory per GPU -- result types, activations, model states through one sharding table,
workspaces, the one-pass inventory, the analytic estimate, the traced reference (MemTracker on fake tensors), real
small-scale measurements, the agreement matrices, and display."""
