"""Stage 4: what makes it fit -- throughput, the device-map placement, remedies and their ranking, the knob table,
fit maps, launch files and their CPU runs, the small-scale checks, and display."""
