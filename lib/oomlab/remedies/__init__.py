"""Stage 5: what makes it fit -- throughput, the device-map placement, remedies and their ranking, the knob table,
fit maps, launch files, and display (their CPU runs and the small-scale checks are evidence)."""
