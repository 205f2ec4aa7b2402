"""An explanation for the terminal: the figures with their intervals, then the verdict."""

from __future__ import annotations

from oomlab.explanation.explain import Explanation
from oomlab.explanation.message import format_interval


def render_explanation(e: Explanation) -> str:
    """Plain text for the terminal: the figures, then the verdict."""
    m = e.message
    rows = [("format", m.format or "unknown"), ("device", "-" if m.device_index is None else f"GPU {m.device_index}")]
    for label, size in (("tried to allocate", m.tried), ("total capacity", m.total), ("free", m.free),
                        ("allocated", m.allocated), ("reserved", m.reserved), ("in use (process)", m.in_use),
                        ("reserved, unallocated", m.reserved_unallocated), ("private pools", m.private_pools),
                        ("allowed", m.allowed)):
        if size is not None:
            rows.append((label, f"{size.text}  [{size.low_bytes:,} – {size.high_bytes:,} bytes]"))
    if e.request_range:
        rows.append(("request (tensor) size", " or ".join(f"{lo:,} – {hi:,} bytes" for lo, hi in e.request_range)))
    if e.fragmentation is not None:
        rows.append(("reserved − allocated", format_interval(e.fragmentation)))
    if e.outside is not None:
        rows.append(("outside PyTorch", format_interval((max(e.outside[0], 0), max(e.outside[1], 0)))))
    if e.torch_versions:
        rows.append(("torch", ", ".join(e.torch_versions)))
    if e.anomalies:
        rows.append(("anomalies", ", ".join(a.code for a in e.anomalies)))
    width = max(len(label) for label, _ in rows)
    table = "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
    return f"{table}\n\n{e.verdict}\n"
