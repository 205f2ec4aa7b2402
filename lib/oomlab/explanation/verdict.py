"""The verdict on a message, in plain paragraphs, from the findings of :func:`oomlab.explanation.explain.explain`."""

from __future__ import annotations

import math
from typing import Any

from oomlab.core.gpus import load_gpu
from oomlab.core.units import format_size
from oomlab.explanation.anomalies import FREE_MARGIN_BYTES, OUTSIDE_FLAG_BYTES
from oomlab.explanation.findings import Findings
from oomlab.explanation.message import FORMAT_NEW, FORMAT_OLD, format_interval
from oomlab.explanation.request import is_segment_interval, segment_bytes
from oomlab.reproduction.allocator import K_MIN_LARGE_ALLOC, K_SMALL_SIZE


def compose_verdict(e: Findings, gpu_spec: Any) -> str:
    m = e.message
    paras: list[str] = []
    fmt = {FORMAT_OLD: "the torch ≤ 2.0 format", FORMAT_NEW: "the torch ≥ 2.1 format"}.get(m.format or "",
                                                                                            "an undetermined format")
    where = f"GPU {m.device_index}" if m.device_index is not None else "an unnamed GPU"
    head = f"A {m.backend or 'CUDA'} out-of-memory message of PyTorch's caching allocator, in {fmt}, on {where}"
    if m.total is not None:
        head += f" ({m.total.text} total capacity"
        if e.gpu_matches:
            head += "; " + " or ".join(load_gpu(g).display_name for g in e.gpu_matches) + " reports exactly that"
        head += ")"
    paras.append(head + ".")
    if m.missing:
        paras.append("The message is cut off: it lacks " + ", ".join(m.missing) + ".")

    t = m.tried
    if t is not None:
        ranges = e.request_range
        if not is_segment_interval(t):
            paras.append(f"It tried to allocate {t.text}, which is no segment size: torch before 1.5 printed the "
                         "request itself.")
        elif ranges == ((1, K_SMALL_SIZE),):
            paras.append(f"\"Tried to allocate {t.text}\" is the smallest segment cudaMalloc is asked for: it serves "
                         "any request up to 1 MiB, so the failure came from many small tensors (the small pool), not "
                         "one big one — the GPU was already full.")
        elif len(ranges) > 1:
            spans = " or ".join(f"{format_size(lo)}–{format_size(hi)}" for lo, hi in ranges)
            paras.append(f"\"Tried to allocate {t.text}\" is the segment asked of cudaMalloc, not the tensor: the "
                         f"request was {spans}.")
        else:
            lo, hi = ranges[0]
            paras.append(f"\"Tried to allocate {t.text}\" is the segment asked of cudaMalloc, not a total still "
                         f"needed: one request (one tensor) of {format_size(lo)}–{format_size(hi)} (requests from "
                         "10 MiB are rounded up to 2 MiB).")
    if m.free is not None and t is not None and m.free.high_bytes < t.low_bytes:
        paras.append(f"Only {m.free.text} was free on the device, less than the {t.text} asked.")
    elif m.free is not None and t is not None and m.free.low_bytes < t.high_bytes + FREE_MARGIN_BYTES:
        paras.append(f"{m.free.text} was free, barely above the {t.text} asked: cudaMalloc needs contiguous "
                     "device pages, so a little more free memory than the request still fails.")

    if e.fragmentation is not None and t is not None:
        frag = format_interval(e.fragmentation)
        hint = {"max_split_size_mb": "max_split_size_mb", "expandable_segments": "expandable_segments:True"}.get(
            m.hint or "", "max_split_size_mb or expandable_segments:True")
        if e.hint_can_help is False:
            paras.append(f"Reserved minus allocated is {frag}: less than the request, so fragmentation is not the "
                         f"cause, and the message's hint ({hint}) cannot help.")
        elif e.hint_can_help:
            extra = ""
            if m.free is not None and m.free.high_bytes + e.fragmentation[0] >= t.low_bytes:
                extra = " With that cache contiguous the request would have fitted."
            paras.append(f"{frag} is reserved but unallocated — at least the request: the cache is fragmented "
                         f"and the message's hint ({hint}) can help.{extra}")
        else:
            paras.append(f"{frag} is reserved but unallocated, about the request's size: fragmentation may "
                         f"contribute; the message's hint ({hint}) may help only marginally.")
    if e.outside is not None and e.outside[1] >= 0 and e.outside[0] <= OUTSIDE_FLAG_BYTES:
        paras.append(f"Memory outside this process's PyTorch allocator (total − free − reserved): "
                     f"{format_interval((max(e.outside[0], 0), e.outside[1]))}, the size of a CUDA context: nothing "
                     "else of note held the GPU.")
    for a in e.anomalies:
        if a.code not in ("truncated", "multiple_messages", "scanned_tail"):
            paras.append(a.text)

    if e.phase is not None:
        paras.append(f"The traceback shows {e.phase.text}.")
    if e.torch_versions:
        lines = "/".join(str(line) for line in sorted({line for _, line in e.version_observations}))
        paras.append(f"The module.py line numbers ({lines}) match torch {_join(e.torch_versions)} only.")
    elif e.version_observations:
        paras.append("The module.py line numbers match no release in the shipped table (1.13.0–2.14.1).")

    if e.model is not None:
        paras.extend(_model_paragraphs(e, gpu_spec))
    elif t is not None:
        paras.append("Give --model to name the tensors that produce this request.")
    return "\n\n".join(paras)

def _join(items: tuple[str, ...] | list[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]

def _model_paragraphs(e: Findings, gpu_spec: Any) -> list[str]:
    out: list[str] = []
    m, t = e.message, e.message.tried
    if t is None:
        return out
    if not e.candidates:
        out.append(f"No parameter tensor of {e.model} gives a {t.text} segment in float32, float16/bfloat16, int8 "
                   "or 4-bit: the request is something else (activations, a temporary buffer).")
    else:
        shown = e.candidates[:4]
        parts = []
        for c in shown:
            names = ", ".join(c.roles)
            parts.append(f"{c.rank}. {' × '.join(map(str, c.shape))} in {c.dtype} ({format_size(c.tensor_bytes)}; "
                         f"{c.count} such {c.kind}s, e.g. {names})")
        more = f" — and {len(e.candidates) - len(shown)} more" if len(e.candidates) > len(shown) else ""
        out.append(f"Tensors of {e.model} whose segment prints as {t.text}, best supported first: "
                   + "; ".join(parts) + more + ".")
        if any(lo <= K_MIN_LARGE_ALLOC for lo, _ in e.request_range):
            out.append("A small segment like this fits many tensors: the candidates say little.")
        shape = e.candidates[0].shape
        same_shape = {c.dtype for c in e.candidates if c.shape == shape}
        if "float32" not in same_shape and all(c.dtype in ("float16", "bfloat16") for c in e.candidates[:1]):
            numel = math.prod(shape)
            out.append(f"In float32 the same tensor would ask for {format_size(segment_bytes(numel * 4))}.")
        if e.phase is not None and e.phase.code in ("backward", "optimizer"):
            out.append("In this phase a match may also be that parameter's gradient or optimizer state.")
    w = e.walk
    if w is not None:
        layer = f" (layer {w.layer} of {w.num_layers}, 0-based)" if w.layer is not None else ""
        if w.matched:
            out.append(f"Replaying model.to('cuda') of {e.model} in {w.dtype}: the allocated figure "
                       f"{m.allocated.text if m.allocated else ''} is reached just before {w.tensor}{layer}, "
                       f"{' × '.join(map(str, w.shape))} = {format_size(w.tensor_bytes)}, after "
                       f"{w.moved_fraction:.1%} of the parameters moved"
                       + (f" ({w.also_matching} more positions match too)" if w.also_matching else "") + ".")
        else:
            out.append(f"Replaying model.to('cuda') of {e.model} in {w.dtype}, no copy gives these exact figures; "
                       f"the allocated figure falls near {w.tensor}{layer}, after {w.moved_fraction:.1%} of the "
                       "parameters: something besides this model's weights is on the GPU, or it is another "
                       "model or dtype.")
        need = (f"The whole model needs {format_size(w.model_bytes)} of tensors "
                f"({format_size(w.model_reserved_bytes)} reserved by the allocator)")
        total = m.total.text if m.total else "the GPU"
        if w.fits is False:
            out.append(f"{need} > {total}: it cannot fit this GPU in {w.dtype}, whatever the allocator settings.")
        elif w.fits:
            out.append(f"{need}, within the {total}: the model alone fits; something else held the memory.")
        else:
            out.append(f"{need}, about the usable memory of {total}: too close to call from these figures.")
    elif e.phase is not None and e.phase.code == "move" and m.allocated is None:
        out.append("The message lacks the allocated figure, so the _apply walk cannot be located.")
    return out
