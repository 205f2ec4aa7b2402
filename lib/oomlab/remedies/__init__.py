"""Stage 5: what makes it fit -- throughput, the device-map placement, remedies and their ranking, the knob table,
fit maps, launch files, and display (their CPU runs and the small-scale checks are evidence)."""

from oomlab.core.exports import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "display": ("render_plan",),
    "hardware": ("HardwareSearch", "search_hardware"),
    "knobs": ("KnobChange", "knob_table"),
    "ladder": ("Decision", "climb"),
    "launch_writer": ("write_configs",),
    "placement": ("DeviceMapPlacement", "place_device_map"),
    "plan": ("Outcome", "Plan", "make_plan"),
    "remedy": ("Remedy", "evaluate_remedy"),
    "throughput": ("Assumptions",),
})
