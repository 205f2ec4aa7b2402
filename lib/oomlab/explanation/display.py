"""An explanation for the terminal: the figures with their intervals, then the verdict (ending with the next step)."""

from __future__ import annotations

from oomlab.core.size_ranges import format_interval
from oomlab.explanation.explain import Explanation
from oomlab.explanation.printed import PrintedSize


def _figure(size: PrintedSize) -> str:
    return f"{size.text}  [{size.low_bytes:,} – {size.high_bytes:,} bytes]"


def render_explanation(e: Explanation) -> str:
    """Plain text for the terminal: the figures, then the verdict."""
    m = e.message
    rows = [("backend", m.backend.value if m.backend else "unnamed"),
            ("format", m.format.value if m.format else "unknown"),
            ("device", "-" if m.device_index is None else f"GPU {m.device_index}")]
    mps = m.mps
    for label, size in (("tried to allocate", m.tried), ("total capacity", m.total), ("free", m.free),
                        ("allocated", m.allocated), ("reserved", m.reserved), ("in use (process)", m.in_use),
                        ("reserved, unallocated", m.reserved_unallocated), ("private pools", m.private_pools),
                        ("allowed", m.allowed), ("MPS allocated", mps.allocated if mps else None),
                        ("other allocations", mps.other_allocations if mps else None),
                        ("max allowed", mps.max_allowed if mps else None)):
        if size is not None:
            rows.append((label, _figure(size)))
    for u in m.unreadable:
        rows.append((f"{u.name} (unreadable)", repr(u.text)))
    acc = e.processes
    if acc.in_use is not None and m.in_use is None:
        rows.append((f"in use (process {acc.pid})", _figure(acc.in_use)))
    if acc.candidates:
        rows.append(("this process", "one of " + ", ".join(str(p.pid) for p in acc.candidates) + " (ambiguous)"))
    if e.request_range:
        rows.append(("request (tensor) size", " or ".join(f"{lo:,} – {hi:,} bytes" for lo, hi in e.request_range)))
    if e.fragmentation is not None:
        rows.append(("reserved − allocated", format_interval(e.fragmentation)))
    if e.outside is not None:
        rows.append(("outside PyTorch", format_interval((max(e.outside[0], 0), max(e.outside[1], 0)))))
    if acc.non_pytorch is not None:
        rows.append(("  of it this process", format_interval(acc.non_pytorch)))
    if acc.other_processes is not None:
        rows.append(("  of it other processes", format_interval(acc.other_processes)))
    if e.outside is not None and e.expected_outside is not None:
        rows.append(("outside, expected", format_interval(e.expected_outside.interval)))
    if e.torch_versions:
        rows.append(("torch", ", ".join(e.torch_versions)))
    if e.anomalies:
        rows.append(("anomalies", ", ".join(a.code.value for a in e.anomalies)))
    width = max(len(label) for label, _ in rows)
    table = "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
    return f"{table}\n\n{e.verdict}\n"
