"""The verdict on a message, in plain paragraphs, from the findings of :func:`oomlab.explanation.explain.explain`.

A caching allocator's message (CUDA, HIP, XPU) is read figure by figure in its own backend's words (hipMalloc and
the HIP runtime for ROCm); an MPS or CPU message says which backend it is and what oomlab can and cannot tell from
it.  Every verdict ends with the next command to run (:mod:`.next_step`).
"""

from __future__ import annotations

import math

from oomlab.core.choices import MessageFormat
from oomlab.core.gpus import GPUSpec, load_gpu
from oomlab.core.size_ranges import format_interval
from oomlab.core.units import format_size
from oomlab.explanation.aggregate_candidates import allocated_when, render_aggregate
from oomlab.explanation.anomalies import FREE_MARGIN_BYTES, TOLD_IN_VERDICT, AnomalyCode
from oomlab.explanation.backend import Backend, backend_terms
from oomlab.explanation.findings import Findings
from oomlab.explanation.message import OomMessage
from oomlab.explanation.next_step import next_step
from oomlab.explanation.outside import OutsideReading, describe_expected
from oomlab.explanation.phase import PhaseCode
from oomlab.explanation.printed import PrintedSize
from oomlab.explanation.processes import ProcessBasis
from oomlab.explanation.request import is_segment_interval, segment_bytes
from oomlab.reproduction.allocator import K_MIN_LARGE_ALLOC, K_SMALL_SIZE

# How a figure is named in prose (the "missing" and "unreadable" names are the OomMessage's field names).
FIGURE_LABELS = {
    "tried": "'Tried to allocate'", "device": "device", "format": "format", "total": "total capacity",
    "free": "free", "allocated": "allocated", "reserved": "reserved", "reserved_unallocated":
    "reserved-but-unallocated", "in_use": "this process's memory in use", "allowed": "allowed",
    "private_pools": "private pools", "mps_allocated": "MPS allocated", "other_allocations": "other allocations",
    "max_allowed": "max allowed", "pool": "pool",
}
_ACCEPTED = {
    Backend.CPU: "a whole number of bytes",
    Backend.MPS: "a number with two decimals and bytes, KB, MB or GB (KiB, MiB, GiB in newer releases)",
}
_ACCEPTED_DEVICE = "a number with two decimals and bytes, KiB, MiB or GiB"
_TOLD_HERE = (*TOLD_IN_VERDICT, AnomalyCode.HIP_BACKEND, AnomalyCode.XPU_BACKEND, AnomalyCode.WATERMARK_DISABLED)


def compose_verdict(e: Findings, gpu_spec: GPUSpec | None) -> str:
    """The verdict's paragraphs for ``e``, joined by blank lines; the last one is the next step."""
    backend = e.message.backend
    if backend is Backend.MPS:
        paras = _mps_paragraphs(e)
    elif backend is Backend.CPU:
        paras = _cpu_paragraphs(e)
    else:
        paras = _device_paragraphs(e, gpu_spec)
    paras.append(_next_step_paragraph(e))
    return "\n\n".join(paras)


def _text_paragraphs(m: OomMessage) -> list[str]:
    """What is wrong with the text itself: cut off, or a figure that cannot be read."""
    out: list[str] = []
    if m.missing:
        out.append("The message is cut off: it lacks " + ", ".join(FIGURE_LABELS.get(f, f) for f in m.missing) + ".")
    accepted = _ACCEPTED.get(m.backend, _ACCEPTED_DEVICE)
    for u in m.unreadable:
        out.append(f"The {FIGURE_LABELS.get(u.name, u.name)} figure reads {u.text!r}, which is unreadable: not a size "
                   f"as torch prints it ({accepted}); the message was edited or garbled, and that figure is left out "
                   "of what follows.")
    if m.unreadable and m.format is None and m.backend not in (Backend.MPS, Backend.CPU):
        out.append("Nothing readable follows it, so the message's format and the device's figures are unknown.")
    return out


def _context_paragraphs(e: Findings) -> list[str]:
    """The traceback's phase and torch release, and the anomalies not told elsewhere."""
    out = [a.text for a in e.anomalies if a.code not in _TOLD_HERE]
    if e.phase is not None:
        out.append(f"The traceback shows {e.phase.text}.")
    if e.torch_versions:
        lines = "/".join(str(line) for line in sorted({line for _, line in e.version_observations}))
        out.append(f"The module.py line numbers ({lines}) match torch {_join(e.torch_versions)} only.")
    elif e.version_observations:
        out.append("The module.py line numbers match no release in the shipped table (1.13.0–2.14.1).")
    return out


def _next_step_paragraph(e: Findings) -> str:
    step = next_step(e)
    text = f"Next step: {step.command} — {step.answers}."
    if step.unknown:
        text += " Fill in the placeholders: " + "; ".join(step.unknown) + "."
    return text


# --------------------------------------------------------------------------------- caching allocators


def _device_paragraphs(e: Findings, gpu_spec: GPUSpec | None) -> list[str]:
    """A CUDA, HIP or XPU caching-allocator message, figure by figure."""
    m = e.message
    terms = backend_terms(m.backend)
    paras: list[str] = []
    fmt = {MessageFormat.OLD: "the torch ≤ 2.0 format", MessageFormat.NEW: "the torch ≥ 2.1 format"}.get(
        m.format, "an undetermined format")
    where = f"GPU {m.device_index}" if m.device_index is not None else "an unnamed GPU"
    kind = {Backend.HIP: "A HIP (ROCm) out-of-memory message of PyTorch's caching allocator, hipified",
            Backend.XPU: "An XPU (Intel GPU) out-of-memory message of PyTorch's XPU caching allocator"}.get(
        m.backend, f"A {(m.backend or Backend.CUDA).value} out-of-memory message of PyTorch's caching allocator")
    head = f"{kind}, in {fmt}, on {where}"
    if m.total is not None:
        head += f" ({m.total.text} total capacity"
        if e.gpu_matches:
            head += "; " + " or ".join(load_gpu(g).display_name for g in e.gpu_matches) + " reports exactly that"
        head += ")"
    paras.append(head + ".")
    paras += _text_paragraphs(m)

    t = m.tried
    if t is not None:
        ranges = e.request_range
        if not is_segment_interval(t):
            paras.append(f"It tried to allocate {t.text}, which is no segment size: torch before 1.5 printed the "
                         "request itself.")
        elif ranges == ((1, K_SMALL_SIZE),):
            paras.append(f"\"Tried to allocate {t.text}\" is the smallest segment {terms.malloc} is asked for: it "
                         "serves any request up to 1 MiB, so the failure came from many small tensors (the small "
                         "pool), not one big one — the GPU was already full.")
        elif len(ranges) > 1:
            spans = " or ".join(format_interval(r) for r in ranges)
            paras.append(f"\"Tried to allocate {t.text}\" is the segment asked of {terms.malloc}, not the tensor: "
                         f"the request was {spans}.")
        else:
            paras.append(f"\"Tried to allocate {t.text}\" is the segment asked of {terms.malloc}, not a total still "
                         f"needed: one request (one tensor) of {format_interval(ranges[0])} (requests from "
                         "10 MiB are rounded up to 2 MiB).")
    if m.free is not None and t is not None and m.free.high_bytes < t.low_bytes:
        paras.append(f"Only {m.free.text} was free on the device, less than the {t.text} asked.")
    elif m.free is not None and t is not None and m.free.low_bytes < t.high_bytes + FREE_MARGIN_BYTES:
        paras.append(f"{m.free.text} was free, barely above the {t.text} asked: {terms.malloc} needs contiguous "
                     "device pages, so a little more free memory than the request still fails.")

    if e.fragmentation is not None and t is not None:
        frag = format_interval(e.fragmentation)
        named = {"max_split_size_mb": "max_split_size_mb", "expandable_segments": "expandable_segments:True"}
        hint = (f"the message's hint ({named[m.hint]})" if m.hint in named else
                f"the allocator's fragmentation settings (max_split_size_mb, expandable_segments:True in "
                f"{terms.alloc_conf})")
        if e.hint_can_help is False:
            paras.append(f"Reserved minus allocated is {frag}: less than the request, so fragmentation is not the "
                         f"cause, and {hint} cannot help.")
        elif e.hint_can_help:
            extra = ""
            if m.free is not None and m.free.high_bytes + e.fragmentation[0] >= t.low_bytes:
                extra = " With that cache contiguous the request would have fitted."
            paras.append(f"{frag} is reserved but unallocated — at least the request: the cache is fragmented "
                         f"and {hint} can help.{extra}")
        else:
            paras.append(f"{frag} is reserved but unallocated, about the request's size: fragmentation may "
                         f"contribute; {hint} may help only marginally.")
    if e.outside is not None and e.outside[1] >= 0 and not any(a.code is AnomalyCode.OUTSIDE_LARGE
                                                                for a in e.anomalies):
        paras.append(_outside_paragraph(e))
    paras += _process_paragraphs(e)
    paras += _context_paragraphs(e)
    paras += _backend_paragraphs(m)

    if e.model is not None:
        paras.extend(_model_paragraphs(e, gpu_spec))
    elif t is not None:
        paras.append("Give --model to name the tensors that produce this request.")
    return paras


def _outside_paragraph(e: Findings) -> str:
    """Memory outside the allocator that is no anomaly: within (or below) what the GPU should show."""
    terms = backend_terms(e.message.backend)
    x = e.expected_outside
    text = (f"Memory outside this process's PyTorch allocator (total − free − reserved): "
            f"{format_interval((max(e.outside[0], 0), e.outside[1]))}, the size of {terms.context} with its "
            f"{terms.handles}" + (" and NCCL's buffers" if x is not None and x.nccl else ""))
    if x is not None:
        reading = x.reading(e.outside)
        text += (f" — within the {describe_expected(x)}" if reading is OutsideReading.WITHIN else
                 f" — below the {describe_expected(x)}, as early in a run, before every kernel is loaded")
    return text + ": nothing else of note held the GPU."


def _process_paragraphs(e: Findings) -> list[str]:
    """This process's memory in use, when the message lets it be told (the ambiguous case is an anomaly)."""
    acc, m = e.processes, e.message
    if acc.in_use is None or acc.basis is None:
        return []
    terms = backend_terms(m.backend)
    who = {
        ProcessBasis.NAMED: "This process",
        ProcessBasis.ONLY_ONE_LISTED: (f"Process {acc.pid}, the only process the message lists, is this one (no "
                                       f"line says 'this process': in a container {terms.process_lister} names it "
                                       "by its host PID); it"),
        ProcessBasis.ONLY_ONE_LARGE_ENOUGH: (f"Process {acc.pid} is this one: of the {acc.listed} processes listed, "
                                             "only it holds at least this process's reserved memory; it"),
    }[acc.basis]
    text = f"{who} has {acc.in_use.text} in use, non-PyTorch memory included"
    if acc.non_pytorch is not None:
        text += (f"; {format_interval(acc.non_pytorch)} of it is outside PyTorch's allocator ({terms.context}, "
                 f"{terms.handles}, {terms.libraries})")
    if acc.other_processes is not None:
        text += f"; other processes hold {format_interval(acc.other_processes)}"
    return [text + "."]


def _backend_paragraphs(m: OomMessage) -> list[str]:
    """What oomlab can and cannot tell from a HIP or XPU message."""
    if m.backend is Backend.HIP:
        return ["What oomlab can tell from a ROCm message: the hipified caching allocator rounds hipMalloc segments "
                "exactly as the CUDA build does and its figures mean the same, so the request range, fragmentation "
                "and the _apply replay hold. What it "
                "cannot: it ships no AMD GPU spec, so it matches no GPU to the total capacity, and its budgets and "
                "plans are for NVIDIA GPUs — their per-component sizes hold under ROCm, their fit verdicts need your "
                "GPU's capacity."]
    if m.backend is Backend.XPU:
        text = ("What oomlab can tell from an XPU message: the XPU caching allocator keeps CUDA's block and segment "
                "sizes (c10/xpu/XPUCachingAllocator.cpp), so the request range, fragmentation and the _apply replay "
                "hold. What it cannot: it ships no Intel GPU spec, so it matches no GPU to the total capacity, and "
                "its budgets and plans are for NVIDIA GPUs — their per-component sizes hold, their fit verdicts need "
                "your GPU's capacity.")
        if m.format is MessageFormat.OLD:
            text += (" Intel's extension (IPEX) printed no free figure, so the memory outside PyTorch cannot be "
                     "derived.")
        return [text]
    return []


def _join(items: tuple[str, ...] | list[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# ------------------------------------------------------------------------------------------- MPS, CPU


def _sum(sizes: list[PrintedSize]) -> tuple[int, int]:
    return sum(s.low_bytes for s in sizes), sum(s.high_bytes for s in sizes)


def _mps_paragraphs(e: Findings) -> list[str]:
    """An MPS message: which limit refused the request, and what oomlab cannot tell on unified memory."""
    m = e.message
    mps, t = m.mps, m.tried
    paras = ["An MPS (Apple silicon GPU, Metal) out-of-memory message of PyTorch's MPS heap allocator, not CUDA's "
             "caching allocator: the GPU shares the Mac's unified memory with macOS and every application."]
    paras += _text_paragraphs(m)
    if t is not None:
        pool = {"private": " from the private pool (buffers only the GPU reads)",
                "shared": " from the shared pool (buffers the CPU reads too)"}.get(mps.pool if mps else "", "")
        paras.append(f"\"Tried to allocate {t.text}\" is the Metal buffer asked for{pool}: the tensor's size aligned "
                     "to Metal's heap alignment, not a CUDA-style 2 MiB segment.")
    figures = [s for s in ((mps.allocated, mps.other_allocations, t) if mps else ()) if s is not None]
    if mps is not None and len(figures) == 3:
        need = _sum(figures)
        held = (f"MPS allocated {mps.allocated.text} (the Metal heaps PyTorch holds, cached buffers included) + other "
                f"allocations {mps.other_allocations.text} (what else Metal has allocated for this process) + the "
                f"{t.text} asked = {format_interval(need)}")
        cap = mps.max_allowed
        if cap is None and not m.missing:
            paras.append(f"{held}, and no high-watermark limit is set (PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0): Metal "
                         "itself refused the heap — unified memory was exhausted, and macOS was likely swapping.")
        elif cap is not None and need[0] > cap.high_bytes:
            paras.append(f"{held}, above the max allowed {cap.text}: the high-watermark limit "
                         "(PYTORCH_MPS_HIGH_WATERMARK_RATIO, default 1.7, × the device's recommended working-set "
                         "size) refused the request, not the hardware. Setting it to 0.0 lifts the limit at the risk "
                         "of swapping or freezing macOS; torch.mps.empty_cache() returns cached heaps first.")
        elif cap is not None and need[1] <= cap.low_bytes:
            paras.append(f"{held}, within the max allowed {cap.text}: the limit did not refuse it; Metal could not "
                         "create the heap — unified memory was exhausted by other applications or too fragmented.")
        elif cap is not None:
            paras.append(f"{held}, about the max allowed {cap.text}: too close to tell whether the limit or Metal "
                         "refused it.")
        if mps.other_allocations.low_bytes > mps.allocated.high_bytes:
            paras.append("Other allocations exceed PyTorch's own heaps: most of the memory is held outside the MPS "
                         "allocator (MPSGraph's own buffers, other Metal users in the process).")
    paras.append("What oomlab can tell from an MPS message: which limit refused the request and how much PyTorch's "
                 "heaps held. What it cannot: how much memory the Mac has or had free (the message prints no "
                 "capacity and no free figure, and unified memory is shared), tensor candidates or an _apply replay "
                 "(both model CUDA's segment rounding, which Metal heaps do not follow), or a GPU match (oomlab ships "
                 "NVIDIA GPU specs only); its budgets' per-component sizes hold on MPS, their fit verdicts do not.")
    paras += _context_paragraphs(e)
    return paras


def _cpu_paragraphs(e: Findings) -> list[str]:
    """A CPU allocator message: host RAM refused an exact byte count."""
    m = e.message
    t, host = m.tried, m.host
    paras = ["A CPU out-of-memory message of PyTorch's DefaultCPUAllocator: host RAM ran out, not the GPU."]
    paras += _text_paragraphs(m)
    if t is not None:
        answer = ""
        if host is not None and host.code is not None:
            answer = f" (error code {host.code}{': ' + host.reason if host.reason else ''})"
        elif host is not None:
            answer = " (the Windows wording, 'not enough memory', which prints no error code)"
        paras.append(f"The operating system refused {t.value_bytes:,} bytes ({format_size(t.value_bytes)}){answer}. "
                     "The CPU allocator asks for a tensor's exact size — no segments, no cache — so one tensor of "
                     "exactly that size failed.")
    paras.append("In LLM training host RAM runs out when a checkpoint is loaded whole into RAM (torch.load, or "
                 "from_pretrained without low_cpu_mem_usage or a device_map — once per rank in a multi-GPU job), "
                 "when states are offloaded to the CPU (FSDP or DeepSpeed offload), or in a CPU-side copy of a large "
                 "tensor.")
    paras.append("What oomlab can tell from a CPU message: the exact request and, from the traceback, the phase. What "
                 "it cannot: how much RAM the host has or had free, or whether a container's or cgroup's memory limit "
                 "refused it (the message prints neither; `free -g` and the container's limit do); no GPU figure is "
                 "involved, so no GPU is matched and no tensor is replayed.")
    paras += _context_paragraphs(e)
    return paras


def _model_paragraphs(e: Findings, gpu_spec: GPUSpec | None) -> list[str]:
    out: list[str] = []
    m, t = e.message, e.message.tried
    if t is None:
        return out
    if not e.candidates and not e.aggregates:
        out.append(f"No parameter tensor of {e.model} gives a {t.text} segment in float32, float16/bfloat16, int8 "
                   "or 4-bit, and no aggregate of it does (a whole copy, a partition or shard, an optimizer state, a "
                   "flat buffer or bucket, the logits, a dequantized weight): the request is something else "
                   "(activations, a temporary buffer).")
    elif not e.candidates:
        out.append(f"No single parameter tensor of {e.model} gives a {t.text} segment; aggregates of it do.")
    else:
        shown = e.candidates[:4]
        parts = []
        for c in shown:
            names = ", ".join(c.roles)
            parts.append(f"{c.rank}. {' × '.join(map(str, c.shape))} in {c.dtype} ({format_size(c.tensor_bytes)}; "
                         f"{c.count} such {c.kind.value}s, e.g. {names})")
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
        if e.phase is not None and e.phase.code in (PhaseCode.BACKWARD, PhaseCode.OPTIMIZER):
            out.append("In this phase a match may also be that parameter's gradient or optimizer state.")
    out += _aggregate_paragraphs(e)
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
    elif e.phase is not None and e.phase.code is PhaseCode.MOVE and m.allocated is None:
        out.append("The message lacks the allocated figure, so the _apply walk cannot be located.")
    return out


def _aggregate_paragraphs(e: Findings) -> list[str]:
    """The aggregates whose request sizes match, best supported first, with the evidence for the first.

    Those the traceback's phase rules out are told only when nothing else is (no tensor, no aggregate of the phase),
    and none when the ``_apply`` replay reached the message's figures exactly: the replay names the tensor.
    """
    if not e.aggregates or (e.walk is not None and e.walk.matched):
        return []
    listed = [c for c in e.aggregates if c.in_phase is not False]
    if not listed and e.candidates:
        return []
    listed = listed or list(e.aggregates)
    shown = listed[:4]
    more = f" — and {len(listed) - len(shown)} more" if len(listed) > len(shown) else ""
    head = (f"As an aggregate of {e.model}, the {e.message.tried.text if e.message.tried else ''} request matches, "
            "best supported first: ")
    out = [head + "; ".join(f"{i}. {render_aggregate(c)}" for i, c in enumerate(shown, 1)) + more + "."]
    top = shown[0]
    out.append(f"Why {top.aggregate.what} comes first: " + "; ".join(top.evidence[1:]) + ".")
    if top.in_phase is False:
        out.append(f"None of them is allocated in {e.phase.text if e.phase else 'this phase'}: the arithmetic "
                   "matches, the moment does not.")
    strategy = e.context.strategy
    ruled = [c for c in e.aggregates if c.in_phase is False and top.in_phase and c.aggregate.nbytes ==
             top.aggregate.nbytes and (strategy is None or c.aggregate.strategies is None
                                       or strategy in c.aggregate.strategies)][:2]
    if ruled:
        out.append("Of the same size but ruled out by the phase: " + "; ".join(
            f"{c.aggregate.what}, {allocated_when(c.aggregate.phases)}" for c in ruled) + ".")
    return out
