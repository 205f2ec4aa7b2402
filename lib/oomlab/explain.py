"""Explain a CUDA out-of-memory message the way an expert reads it, saying only what it supports.

``explain(text, model=..., gpu=..., dtype=...)`` decodes the message (:mod:`oomlab.oom_message`), then:

* the request: "Tried to allocate" is the segment asked of cudaMalloc (``get_allocation_size``), so
  it names a range of request sizes, not one tensor size;
* fragmentation (reserved − allocated) and whether the message's own hint can help;
* memory outside this process's allocator (total − free − reserved) against a CUDA context's size;
* anomalies (allocated above capacity, a request above capacity, device ≠ 0, an ``allowed`` cap …);
* with a model: the parameter tensors and dtypes whose segment prints as the request, and, when the
  traceback shows ``Module._apply``, where the allocated figure falls along the ``_apply`` walk;
* the torch releases whose ``module.py`` line numbers match the traceback (``data/torch_module_lines.json``);
* the phase (moving, loading, forward, backward, optimizer step) the traceback's frames show.

``compute``-style work returns data (:class:`Explanation`); :func:`render_explanation` formats it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from oomlab.allocator import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    get_allocation_size,
    round_size,
)
from oomlab.oom_message import (
    FORMAT_NEW,
    FORMAT_OLD,
    Frame,
    NotAnOomMessageError,
    OomMessage,
    PrintedSize,
    SourceLine,
    parse_oom_message,
    parse_traceback,
)
from oomlab.paths import DATA_DIR
from oomlab.units import GiB, MiB, format_size

TORCH_MODULE_LINES = DATA_DIR / "torch_module_lines.json"
CUDA_CONTEXT_BYTES = (300 * MiB, 600 * MiB)  # NB: typical CUDA context + cuBLAS/cuDNN handles, driver-dependent
FREE_MARGIN_BYTES = 256 * MiB  # NB: cudaMalloc needs contiguous pages; a little free above the request can fail
OUTSIDE_FLAG_BYTES = 1 * GiB  # "far above a CUDA context": flag memory outside the allocator above this
_EXACT_LIMIT = 2**50  # beyond this, torch's double-based format_size cannot be inverted exactly

# Candidate storage types: (name, bits per element).  NB: 4-bit is bitsandbytes' packed uint8 (2 per byte).
CANDIDATE_DTYPES: tuple[tuple[str, float], ...] = (
    ("float32", 32), ("float16", 16), ("bfloat16", 16), ("int8", 8), ("4-bit", 4),
)

__all__ = [
    "Anomaly",
    "Candidate",
    "Explanation",
    "ModuleLines",
    "NotAnOomMessageError",
    "Phase",
    "WalkPosition",
    "detect_phase",
    "explain",
    "load_module_lines",
    "match_torch_versions",
    "observe_module_lines",
    "render_explanation",
    "request_range",
    "tensor_candidates",
    "walk_position",
]


# ------------------------------------------------------------------------------------------ results


@dataclass(frozen=True)
class Anomaly:
    """Something in the figures an expert would remark on."""

    code: str  # short, stable: "allocated_above_total"
    text: str  # one or two plain sentences


@dataclass(frozen=True)
class Candidate:
    """Tensors of one shape, in one dtype, whose cudaMalloc segment prints as the "Tried to allocate"."""

    rank: int  # 1 = best supported
    shape: tuple[int, ...]
    dtype: str  # "float16", "int8", "4-bit", or the buffer's own dtype
    kind: str  # "parameter" or "buffer"
    tensor_bytes: int
    segment_bytes: int  # get_allocation_size(round_size(tensor_bytes))
    count: int  # tensors of this shape in the model
    names: tuple[str, ...]  # up to three of them
    roles: tuple[str, ...]  # their names with the layer index as N: "model.layers.N.mlp.gate_proj.weight"
    layers: tuple[int, ...]  # decoder layer indices they sit in
    evidence: tuple[str, ...]  # why this rank


@dataclass(frozen=True)
class WalkPosition:
    """Where the message's allocated figure falls along ``Module._apply``'s walk over the model."""

    dtype: str
    matched: bool  # True: tried, allocated (and reserved) all print as the message's at this tensor
    index: int  # position in the walk of the tensor being copied
    tensor: str
    shape: tuple[int, ...]
    tensor_bytes: int
    tried_bytes: int  # its segment
    layer: int | None  # decoder layer index (0-based), None outside the layers
    num_layers: int
    allocated_before_bytes: int
    reserved_before_bytes: int
    moved_parameters: int
    total_parameters: int
    model_bytes: int  # all tensors of the model in this dtype
    model_reserved_bytes: int  # what the allocator reserves for all of them
    usable_bytes: tuple[int, int] | None  # total capacity − memory outside PyTorch, as an interval
    fits: bool | None  # None when the figures cannot tell
    also_matching: int  # further walk positions that match as well

    @property
    def moved_fraction(self) -> float:
        return self.moved_parameters / self.total_parameters if self.total_parameters else 0.0


@dataclass(frozen=True)
class Phase:
    """What the program was doing, from the traceback's frames."""

    code: str  # "move", "load", "forward", "backward", "optimizer"
    text: str
    evidence: tuple[str, ...]  # the frames that show it


@dataclass(frozen=True)
class ModuleLines:
    """One torch release's line numbers in ``torch/nn/modules/module.py`` (None where unverified)."""

    version: str
    apply_recurse: int | None  # Module._apply: module._apply(fn)
    param_applied: int | None  # Module._apply: param_applied = fn(param)
    convert_return: int | None  # convert: return t.to(device, dtype …, non_blocking)
    convert_return_memory_format: int | None  # convert: return t.to(…, memory_format=…)
    to_return: int | None  # Module.to: return self._apply(convert)
    verified: bool
    source: str  # how the row was verified


@dataclass(frozen=True)
class Explanation:
    """Everything ``oomlab explain`` says about one message."""

    message: OomMessage
    model: str | None
    gpu: str | None
    dtype: str | None
    request_range: tuple[tuple[int, int], ...]  # tensor sizes (bytes, inclusive) that give the "Tried to allocate"
    fragmentation: tuple[int, int] | None  # reserved − allocated, as an interval
    fragmentation_bytes: int | None
    outside: tuple[int, int] | None  # total − free − reserved, as an interval
    outside_bytes: int | None
    hint_can_help: bool | None  # whether max_split_size_mb / expandable_segments can help (None: cannot tell)
    anomalies: tuple[Anomaly, ...]
    candidates: tuple[Candidate, ...]
    walk: WalkPosition | None
    phase: Phase | None
    torch_versions: tuple[str, ...]
    version_observations: tuple[tuple[str, int], ...]  # (anchor, line) pairs read from the traceback
    gpu_matches: tuple[str, ...]  # shipped GPUs whose capacity prints as the message's total
    frames: tuple[Frame, ...]
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every figure in bytes with its ``*_interval`` ([low, high], inclusive)."""
        m = self.message
        data: dict[str, Any] = {"format": m.format, "backend": m.backend or None, "device_index": m.device_index}

        def put(key: str, size: PrintedSize | None) -> None:
            data[f"{key}_bytes"] = None if size is None else size.value_bytes
            data[f"{key}_interval"] = None if size is None else size.interval
            data[f"{key}_printed"] = None if size is None else size.text

        put("tried", m.tried)
        put("total", m.total)
        put("free", m.free)
        put("allocated", m.allocated)
        put("in_use", m.in_use)
        put("reserved_unallocated", m.reserved_unallocated)
        put("private_pools", m.private_pools)
        put("reserved", m.reserved)
        if m.reserved is None:  # new format: reserved = allocated + reserved-but-unallocated
            reserved = m.reserved_low_high
            data["reserved_bytes"] = m.reserved_bytes
            data["reserved_interval"] = list(reserved) if reserved else None
        data["reserved_derived"] = m.reserved is None and m.reserved_bytes is not None
        put("allowed", m.allowed)
        data["processes"] = [{"pid": p.pid, "bytes": p.memory.value_bytes, "interval": p.memory.interval,
                              "printed": p.memory.text} for p in m.processes]
        data["missing"] = list(m.missing)
        data["hint"] = m.hint
        data["hint_can_help"] = self.hint_can_help
        data["request_range"] = [list(r) for r in self.request_range]
        data["fragmentation_bytes"] = self.fragmentation_bytes
        data["fragmentation_interval"] = list(self.fragmentation) if self.fragmentation else None
        data["outside_pytorch_bytes"] = self.outside_bytes
        data["outside_pytorch_interval"] = list(self.outside) if self.outside else None
        split = _outside_split(m)
        data["non_pytorch_this_process_interval"] = list(split[0]) if split else None
        data["other_processes_interval"] = list(split[1]) if split else None
        data["anomalies"] = [{"code": a.code, "text": a.text} for a in self.anomalies]
        data["model"], data["gpu"], data["dtype"] = self.model, self.gpu, self.dtype
        data["gpu_matches"] = list(self.gpu_matches)
        data["candidates"] = [
            {"rank": c.rank, "shape": list(c.shape), "dtype": c.dtype, "kind": c.kind, "tensor_bytes": c.tensor_bytes,
             "segment_bytes": c.segment_bytes, "count": c.count, "names": list(c.names), "roles": list(c.roles),
             "layers": list(c.layers),
             "evidence": list(c.evidence)}
            for c in self.candidates
        ]
        w = self.walk
        data["walk"] = None if w is None else {
            "dtype": w.dtype, "matched": w.matched, "index": w.index, "tensor": w.tensor, "shape": list(w.shape),
            "tensor_bytes": w.tensor_bytes, "tried_bytes": w.tried_bytes, "layer": w.layer,
            "num_layers": w.num_layers, "allocated_before_bytes": w.allocated_before_bytes,
            "reserved_before_bytes": w.reserved_before_bytes, "moved_parameters": w.moved_parameters,
            "total_parameters": w.total_parameters, "moved_fraction": w.moved_fraction,
            "model_bytes": w.model_bytes, "model_reserved_bytes": w.model_reserved_bytes,
            "usable_interval": list(w.usable_bytes) if w.usable_bytes else None, "fits": w.fits,
            "also_matching": w.also_matching,
        }
        data["phase"] = None if self.phase is None else {
            "code": self.phase.code, "text": self.phase.text, "evidence": list(self.phase.evidence)}
        data["torch_versions"] = list(self.torch_versions)
        data["torch_version_evidence"] = [f"module.py:{line} {anchor}" for anchor, line in self.version_observations]
        data["occurrences"] = m.occurrences
        data["scanned_tail"] = m.scanned_tail
        data["message"] = m.message
        data["verdict"] = self.verdict
        return data


# ------------------------------------------------------------------------------------ the request


def request_range(tried: PrintedSize) -> tuple[tuple[int, int], ...]:
    """Request sizes (bytes, inclusive intervals) whose cudaMalloc segment prints as ``tried``.

    ``get_allocation_size``: a rounded request ≤ 1 MiB gets a 2 MiB segment, one under 10 MiB a
    20 MiB segment, a larger one its size rounded up to 2 MiB — so a printed X ≥ 10 MiB means a
    request in (X − 2 MiB, X].  "20.00 MiB" is two ranges: (1 MiB, 10 MiB) and (18 MiB, 20 MiB].
    An interval that holds no segment size at all (torch before 1.5 printed the request itself) is
    returned as is.
    """
    low, high = tried.low_bytes, tried.high_bytes
    ranges: list[tuple[int, int]] = []
    if low <= K_SMALL_BUFFER <= high:
        ranges.append((1, K_SMALL_SIZE))
    if low <= K_LARGE_BUFFER <= high:
        ranges.append((K_SMALL_SIZE + 1, K_MIN_LARGE_ALLOC - K_MIN_BLOCK_SIZE))
    first = max(K_ROUND_LARGE * math.ceil(max(low, K_MIN_LARGE_ALLOC) / K_ROUND_LARGE), K_MIN_LARGE_ALLOC)
    last = K_ROUND_LARGE * (high // K_ROUND_LARGE)
    if first <= last:
        ranges.append((max(first - K_ROUND_LARGE, K_MIN_LARGE_ALLOC - K_MIN_BLOCK_SIZE) + 1, last))
    ranges.sort()
    merged: list[tuple[int, int]] = []
    for r in ranges:
        if merged and r[0] <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], r[1]))
        else:
            merged.append(r)
    return tuple(merged) if merged else ((low, high),)


def _is_segment_interval(tried: PrintedSize) -> bool:
    """Whether some size get_allocation_size can return prints as ``tried``."""
    low, high = tried.low_bytes, tried.high_bytes
    if low <= K_SMALL_BUFFER <= high or low <= K_LARGE_BUFFER <= high:
        return True
    first = K_ROUND_LARGE * math.ceil(max(low, K_MIN_LARGE_ALLOC) / K_ROUND_LARGE)
    return first <= high


def _segment(nbytes: int) -> int:
    return get_allocation_size(round_size(nbytes))


# ---------------------------------------------------------------------------------- torch versions


@cache
def load_module_lines() -> tuple[ModuleLines, ...]:
    """The shipped table of ``module.py`` line numbers per torch release."""
    raw = json.loads(TORCH_MODULE_LINES.read_text())
    rows = []
    for r in raw["releases"]:
        src = r["source"]
        how = src.get("how", "")
        if "wheel" in src:
            how = f"{src['wheel']} (sha256 {src['wheel_sha256'][:12]}…): {how}"
        if "cross_check" in src:
            how += f"; {src['cross_check']}"
        rows.append(ModuleLines(r["version"], r["apply_recurse"], r["param_applied"], r["convert_return"],
                                r["convert_return_memory_format"], r["to_return"], bool(r["verified"]), how))
    return tuple(rows)


_MODULE_PY = "torch/nn/modules/module.py"


def _is_module_py(path: str) -> bool:
    return path.replace("\\", "/").endswith(_MODULE_PY)


def observe_module_lines(frames: tuple[Frame, ...], sources: tuple[SourceLine, ...]) -> tuple[tuple[str, int], ...]:
    """``(anchor, line)`` pairs the traceback shows for ``module.py``'s ``_apply``/``convert``/``to``.

    Numbered source lines are recognised by their code (``module._apply(fn)``, ``param_applied =
    fn(param)``, ``return self._apply(convert)``; ``return t.to(`` only under a ``module.py`` header),
    frame headers without code by their function (``convert``, ``to``).  Anchor ``"convert"`` may be
    either of convert's two returns.
    """
    seen: dict[tuple[str, int], None] = {}
    for s in sources:
        in_module = _is_module_py(s.file)
        if not (in_module or s.file == ""):
            continue
        code = s.code
        if code.startswith("module._apply(fn)"):
            seen[("apply_recurse", s.line)] = None
        elif code.startswith("param_applied = fn(param)"):
            seen[("param_applied", s.line)] = None
        elif code.startswith("return self._apply(convert)"):
            seen[("to_return", s.line)] = None
        elif code.startswith("return t.to(") and in_module:
            seen[("convert", s.line)] = None
    for f in frames:
        if _is_module_py(f.file) and not f.code and f.line:
            if f.function == "convert":
                seen[("convert", f.line)] = None
            elif f.function == "to":
                seen[("to_return", f.line)] = None
    return tuple(seen)


def match_torch_versions(observations: tuple[tuple[str, int], ...]) -> tuple[str, ...]:
    """Verified releases whose ``module.py`` has every observed anchor on the observed line."""
    if not observations:
        return ()
    matches = []
    for row in load_module_lines():
        if not row.verified:
            continue
        expected = {"apply_recurse": {row.apply_recurse}, "param_applied": {row.param_applied},
                    "to_return": {row.to_return}, "convert": {row.convert_return, row.convert_return_memory_format}}
        if all(line in expected[anchor] for anchor, line in observations):
            matches.append(row.version)
    return tuple(matches)


# -------------------------------------------------------------------------------------------- phase

_PHASES = {
    "move": "moving the model to the GPU (Module.to → _apply → convert), not training it",
    "load": "loading weights onto the GPU",
    "forward": "the forward pass",
    "backward": "the backward pass (autograd)",
    "optimizer": "the optimizer step",
}
_LOAD_FUNCS = {"load_state_dict", "_load_state_dict_into_meta_model", "set_module_tensor_to_device",
               "load_checkpoint_and_dispatch", "load_checkpoint_in_model", "_load_from_state_dict"}
_FORWARD_FUNCS = {"forward", "_call_impl", "_wrapped_call_impl", "generate", "__call__"}
_BACKWARD_FUNCS = {"backward", "run_backward", "_engine_run_backward", "grad"}
_CODE_HINTS = (
    (re.compile(r"\.backward\(|run_backward\(|autograd\.grad\("), "backward"),
    (re.compile(r"(?:optimizer|optim|opt)\w{0,20}\.step\("), "optimizer"),
    (re.compile(r"\bmodel\w{0,20}\.(?:to|cuda)\("), "move"),
)


def _frame_phase(f: Frame) -> str | None:
    path = f.file.replace("\\", "/")
    if _is_module_py(path) and f.function in {"_apply", "convert", "to", "cuda", "half", "float", "bfloat16"}:
        return "move"
    if f.function in _LOAD_FUNCS or (path.endswith("torch/serialization.py") and f.function == "load"):
        return "load"
    if "/torch/optim/" in path or f.function in {"_multi_tensor_adam", "_multi_tensor_adamw", "_single_tensor_adam",
                                                 "_single_tensor_adamw", "_init_group"}:
        return "optimizer"
    if f.function in _BACKWARD_FUNCS or "/torch/autograd/" in path:
        return "backward"
    for pattern, phase in _CODE_HINTS:
        if pattern.search(f.code):
            return phase
    if f.function in _FORWARD_FUNCS:
        return "forward"
    return None


def detect_phase(frames: tuple[Frame, ...]) -> Phase | None:
    """The phase the outermost phase-telling frame shows (a forward inside a backward is recomputation)."""
    for i, f in enumerate(frames):
        phase = _frame_phase(f)
        if phase is not None:
            evidence = tuple(
                f"{g.file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{g.line} in {g.function}"
                + (f": {g.code[:80]}" if g.code else "")
                for g in frames[i:i + 4] if _frame_phase(g) is not None
            )
            return Phase(phase, _PHASES[phase], evidence)
    return None


# ----------------------------------------------------------------------------------- model tensors


def _layer_of(name: str) -> int | None:
    m = re.search(r"\.layers?\.(\d+)\.", name) or re.search(r"\.h\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def _roles(names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(re.sub(r"\.(\d+)\.", ".N.", n) for n in names))


def _walk(model: str, dtype: str) -> tuple[Any, ...]:
    from oomlab.reproduce import unlimited_walk

    return unlimited_walk(model, dtype)


def tensor_candidates(
    msg: OomMessage, model: str, dtype: str | None = None, gpu_bf16: bool | None = None,
    walks: tuple[WalkPosition, ...] = (),
) -> tuple[Candidate, ...]:
    """Tensors of ``model`` (by shape) × dtypes whose segment prints as the message's "Tried to allocate".

    Ranked by the evidence for each: the dtype given, an ``_apply`` walk that reaches a tensor of that
    shape and dtype exactly at the message's figures, a GPU without bfloat16, parameter over buffer;
    ties keep the larger group first.
    """
    if msg.tried is None:
        return ()
    from oomlab.specs import load_model

    spec = load_model(model)
    steps = _walk(spec.name, "float16")
    low, high = msg.tried.low_bytes, msg.tried.high_bytes
    groups: dict[tuple[tuple[int, ...], str, str], list[Any]] = {}
    for step in steps:
        numel = math.prod(step.shape)
        options = ([(name, math.ceil(numel * bits / 8)) for name, bits in CANDIDATE_DTYPES]
                   if step.kind == "parameter" else [(step.dtype, step.nbytes)])
        for dt, nbytes in options:
            if nbytes and low <= _segment(nbytes) <= high:
                groups.setdefault((step.shape, dt, step.kind), []).append((step.name, nbytes))
    scored = []
    for (shape, dt, kind), members in groups.items():
        nbytes = members[0][1]
        score, evidence = 0, [f"a {' × '.join(map(str, shape))} {dt} tensor is {format_size(nbytes)}; its segment "
                                  f"prints as {format_size(_segment(nbytes))}"]
        if dtype is not None and dt == dtype:
            score += 4
            evidence.append(f"{dt} is the dtype given")
        for walk in walks:
            if walk.matched and walk.dtype == dt and tuple(walk.shape) == shape:
                score += 8
                evidence.append(f"the _apply walk in {dt} reaches {walk.tensor} exactly at the message's figures")
        if dt == "bfloat16" and gpu_bf16 is False:
            score -= 1
            evidence.append("the GPU has no native bfloat16 (same bytes as float16: the sizes cannot tell them apart)")
        elif dt in ("float16", "bfloat16"):
            evidence.append("float16 and bfloat16 have the same size: the message cannot tell them apart")
        if kind == "parameter":
            score += 1
        names = tuple(n for n, _ in members)
        layers = tuple(sorted({lay for lay in map(_layer_of, names) if lay is not None}))
        scored.append((score, len(members), shape, dt, kind, nbytes, names, layers, tuple(evidence)))
    scored.sort(key=lambda s: (-s[0], -s[1], s[3], s[2]))
    return tuple(
        Candidate(rank=i + 1, shape=shape, dtype=dt, kind=kind, tensor_bytes=nbytes, segment_bytes=_segment(nbytes),
                  count=len(names), names=names[:3], roles=_roles(names), layers=layers, evidence=evidence)
        for i, (_, _, shape, dt, kind, nbytes, names, layers, evidence) in enumerate(scored)
    )


def _contains(size: PrintedSize | None, value: int) -> bool:
    return size is None or size.low_bytes <= value <= size.high_bytes


def walk_position(msg: OomMessage, model: str, dtype: str, outside: tuple[int, int] | None) -> WalkPosition | None:
    """Replay ``model.to('cuda')`` in ``dtype`` on an unlimited device; find the copy the message describes.

    A position matches when the tensor's segment prints as the "Tried to allocate" and the allocated
    (and reserved) figures just before it print as the message's.  Without an exact match, the position
    where the allocated figure is first exceeded is returned with ``matched=False``.
    """
    if msg.allocated is None:
        return None
    from oomlab.specs import load_model

    spec = load_model(model)
    steps = _walk(spec.name, dtype)
    if not steps:
        return None
    reserved = msg.reserved_low_high
    matches = []
    for i, step in enumerate(steps):
        before_alloc = steps[i - 1].allocated_bytes if i else 0
        before_res = steps[i - 1].reserved_bytes if i else 0
        if not (_contains(msg.tried, step.tried_bytes) and _contains(msg.allocated, before_alloc)):
            continue
        if reserved is not None and not reserved[0] <= before_res <= reserved[1]:
            continue
        matches.append(i)
    matched = bool(matches)
    if matched:
        index = matches[0]
    else:
        over = [i for i, s in enumerate(steps) if s.allocated_bytes > msg.allocated.high_bytes]
        if not over:
            return None
        index = over[0]
    step = steps[index]
    before = steps[index - 1] if index else None
    last = steps[-1]
    usable = None
    fits = None
    if msg.total is not None and outside is not None:
        usable = (msg.total.low_bytes - max(outside[1], 0), msg.total.high_bytes - max(outside[0], 0))
        fits = True if last.reserved_bytes <= usable[0] else False if last.reserved_bytes > usable[1] else None
    elif msg.total is not None:
        fits = False if last.reserved_bytes > msg.total.high_bytes else None
    return WalkPosition(
        dtype=dtype, matched=matched, index=index, tensor=step.name, shape=tuple(step.shape),
        tensor_bytes=step.nbytes, tried_bytes=step.tried_bytes, layer=_layer_of(step.name),
        num_layers=spec.num_hidden_layers,
        allocated_before_bytes=before.allocated_bytes if before else 0,
        reserved_before_bytes=before.reserved_bytes if before else 0,
        moved_parameters=before.moved_parameters if before else 0, total_parameters=last.moved_parameters,
        model_bytes=last.moved_bytes, model_reserved_bytes=last.reserved_bytes, usable_bytes=usable, fits=fits,
        also_matching=max(0, len(matches) - 1),
    )


# ----------------------------------------------------------------------------------------- analysis


def _interval_sub(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return a[0] - b[1], a[1] - b[0]


def _fmt_interval(iv: tuple[int, int]) -> str:
    lo, hi = iv
    if format_size(max(lo, 0)) == format_size(max(hi, 0)):
        return format_size(max(lo, 0))
    return f"{format_size(max(lo, 0))}–{format_size(max(hi, 0))}"


def _gpu_matches(total: PrintedSize | None) -> tuple[str, ...]:
    if total is None:
        return ()
    from oomlab.specs import known_gpus, load_gpu

    return tuple(g for g in known_gpus() if total.low_bytes <= load_gpu(g).total_memory_bytes <= total.high_bytes)


def _outside_split(msg: OomMessage) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """New format with "this process has U in use": (U − reserved, total − free − U), clamped at 0."""
    reserved = msg.reserved_low_high
    if msg.in_use is None or reserved is None or msg.total is None or msg.free is None:
        return None
    own = _interval_sub((msg.in_use.low_bytes, msg.in_use.high_bytes), reserved)
    others = _interval_sub(_interval_sub((msg.total.low_bytes, msg.total.high_bytes),
                                         (msg.free.low_bytes, msg.free.high_bytes)),
                           (msg.in_use.low_bytes, msg.in_use.high_bytes))
    return (max(own[0], 0), max(own[1], 0)), (max(others[0], 0), max(others[1], 0))


def _anomalies(msg: OomMessage, outside: tuple[int, int] | None, gpu: Any) -> list[Anomaly]:
    out: list[Anomaly] = []
    t, total, alloc = msg.tried, msg.total, msg.allocated
    reserved = msg.reserved_low_high
    if msg.missing:
        out.append(Anomaly("truncated", "The message is cut off or edited: it lacks "
                           + ", ".join(msg.missing) + "; what follows uses only the figures present."))
    if total is not None and alloc is not None and alloc.low_bytes > total.high_bytes:
        out.append(Anomaly("allocated_above_total",
                           f"{alloc.text} allocated exceeds the {total.text} total capacity: the driver is spilling "
                           "into system memory (Windows WDDM 'shared GPU memory', or unified memory), which is slow; "
                           "the capacity figure is the GPU's own memory."))
    elif total is not None and reserved is not None and reserved[0] > total.high_bytes:
        out.append(Anomaly("reserved_above_total",
                           f"reserved memory ({_fmt_interval(reserved)}) exceeds the {total.text} total capacity: "
                           "the driver is spilling into system memory (WDDM shared memory, or unified memory)."))
    if t is not None and total is not None and t.low_bytes > total.high_bytes:
        text = (f"The single request of {t.text} is larger than the whole GPU ({total.text}): no allocator setting "
                "and no freeing can make it fit; a shape is far larger than intended, or the work must be split "
                "into chunks.")
        if t.low_bytes >= 2**50:
            text += " A request this absurd usually comes from an overflowing or negative size computation."
        out.append(Anomaly("request_above_total", text))
    if t is not None and not _is_segment_interval(t):
        out.append(Anomaly("tried_not_a_segment",
                           f"{t.text} is no size the caching allocator asks cudaMalloc for (2 MiB, 20 MiB or a "
                           "multiple of 2 MiB from 10 MiB): torch before 1.5 printed the request itself, or the "
                           "message was edited."))
    if msg.device_index not in (None, 0):
        out.append(Anomaly("device_not_zero",
                           f"The failure is on GPU {msg.device_index}, not GPU 0: in a multi-GPU job, check which "
                           "rank or device this is (the index is relative to CUDA_VISIBLE_DEVICES)."))
    if msg.allowed is not None:
        text = (f"A cap of {msg.allowed.text} is set (torch.cuda.set_per_process_memory_fraction, or "
                "per_process_memory_fraction in PYTORCH_CUDA_ALLOC_CONF): this process may reserve no more, "
                "whatever the GPU has free.")
        if reserved is not None and t is not None and reserved[0] + t.low_bytes > msg.allowed.high_bytes:
            text += " Reserved memory plus the request exceeds the cap: the cap, not the GPU, refused it."
        out.append(Anomaly("allowed_cap", text))
    if msg.free is not None and t is not None and msg.free.low_bytes >= t.high_bytes + FREE_MARGIN_BYTES:
        out.append(Anomaly("free_above_request",
                           f"{msg.free.text} was free, at least the {t.text} asked: the device was not full when the "
                           "message was written — an allowed cap, memory released by another process in between, "
                           "or a driver reservation refused the request."))
    if outside is not None and outside[1] < 0:
        out.append(Anomaly("negative_outside",
                           "total − free − reserved is negative: the figures are inconsistent (memory spilled to "
                           "system memory, or the message was edited)."))
    elif outside is not None and outside[0] > OUTSIDE_FLAG_BYTES:
        text = (f"{_fmt_interval(outside)} of the GPU is held outside this process's PyTorch allocator, far above "
                f"a CUDA context ({format_size(CUDA_CONTEXT_BYTES[0])}–{format_size(CUDA_CONTEXT_BYTES[1])}).")
        split = _outside_split(msg)
        if split is not None:
            own, others = split
            text += (f" Of it, {_fmt_interval(own)} is this process's own memory outside PyTorch (CUDA context, "
                     f"cuBLAS/cuDNN workspaces, NCCL buffers, other libraries) and {_fmt_interval(others)} is held "
                     "by other processes.")
        text += (" Usually that is another process on the GPU, or in a multi-GPU job every rank initialising CUDA "
                 "(or putting tensors) on GPU 0 before calling torch.cuda.set_device(local_rank).")
        out.append(Anomaly("outside_large", text))
    if msg.processes:
        listed = ", ".join(f"process {p.pid}: {p.memory.text}" for p in msg.processes)
        text = f"NVML lists processes on this GPU ({listed})."
        if msg.in_use is None and len(msg.processes) == 1:
            text += (" No line says 'this process': in a container NVML shows this process under its host PID, "
                     "so the listed process may be this one.")
        out.append(Anomaly("other_processes", text))
    if msg.private_pools is not None and msg.private_pools.high_bytes > 0:
        out.append(Anomaly("private_pools",
                           f"{msg.private_pools.text} is allocated in private pools (CUDA Graphs / torch.compile "
                           "'reduce-overhead'): memory the ordinary cache cannot reuse."))
    if msg.backend == "HIP":
        out.append(Anomaly("hip_backend", "A ROCm (HIP) build: the same caching-allocator rules and figures apply."))
    odd = [s.text for s in (t, total, msg.free, alloc, msg.reserved, msg.reserved_unallocated, msg.in_use)
           if s is not None and not s.canonical and s.value_bytes < _EXACT_LIMIT]
    if odd:
        out.append(Anomaly("not_torch_format",
                           f"{', '.join(odd)} is not how torch prints sizes (two decimals, KiB/MiB/GiB): the message "
                           "was retyped or edited, so its intervals are wider."))
    if gpu is not None and total is not None and not total.low_bytes <= gpu.total_memory_bytes <= total.high_bytes:
        out.append(Anomaly("gpu_mismatch",
                           f"A {gpu.display_name} reports {format_size(gpu.total_memory_bytes)}, not the message's "
                           f"{total.text}: the message comes from another GPU, or this one under another "
                           "driver, ECC setting or MIG slice."))
    if msg.occurrences > 1:
        out.append(Anomaly("multiple_messages",
                           f"The input holds {msg.occurrences} OOM messages; the most complete (the last on ties) "
                           "is decoded."))
    if msg.scanned_tail:
        out.append(Anomaly("scanned_tail", "The input is very long; only its last 4,000,000 characters were read."))
    return out


def explain(
    text: str | bytes, model: str | None = None, gpu: str | None = None, dtype: str | None = None
) -> Explanation:
    """Decode the CUDA OOM message in ``text`` and say what it supports.

    Raises :class:`NotAnOomMessageError` (an :class:`~oomlab.errors.OomlabError`) when ``text`` holds none,
    and ``UnknownNameError`` for an unknown model, GPU or dtype — all checked before any work.
    """
    from oomlab.specs import load_dtype, load_gpu, load_model

    spec = load_model(model) if model is not None else None
    gpu_spec = load_gpu(gpu) if gpu is not None else None
    dt = load_dtype(dtype).name if dtype is not None else None
    msg = parse_oom_message(text)
    frames, sources = parse_traceback(text)

    reserved = msg.reserved_low_high
    fragmentation = None
    if msg.reserved_unallocated is not None:
        fragmentation = (msg.reserved_unallocated.low_bytes, msg.reserved_unallocated.high_bytes)
    elif msg.reserved is not None and msg.allocated is not None:
        lo, hi = _interval_sub(reserved, (msg.allocated.low_bytes, msg.allocated.high_bytes))
        fragmentation = (max(lo, 0), max(hi, 0))
    frag_bytes = None
    if msg.reserved_unallocated is not None:
        frag_bytes = msg.reserved_unallocated.value_bytes
    elif msg.reserved is not None and msg.allocated is not None:
        frag_bytes = max(msg.reserved.value_bytes - msg.allocated.value_bytes, 0)
    outside = outside_bytes = None
    if msg.total is not None and msg.free is not None and reserved is not None:
        outside = _interval_sub(_interval_sub((msg.total.low_bytes, msg.total.high_bytes),
                                              (msg.free.low_bytes, msg.free.high_bytes)), reserved)
        outside_bytes = msg.total.value_bytes - msg.free.value_bytes - (msg.reserved_bytes or 0)
    hint_can_help = None
    if fragmentation is not None and msg.tried is not None:
        if fragmentation[1] < msg.tried.low_bytes:
            hint_can_help = False
        elif fragmentation[0] >= msg.tried.high_bytes:
            hint_can_help = True

    gpu_matches = _gpu_matches(msg.total)
    bf16 = gpu_spec.bf16 if gpu_spec is not None else (
        load_gpu(gpu_matches[0]).bf16 if len({load_gpu(g).bf16 for g in gpu_matches}) == 1 and gpu_matches else None)
    phase = detect_phase(frames)
    observations = observe_module_lines(frames, sources)
    versions = match_torch_versions(observations)

    walk = None
    candidates: tuple[Candidate, ...] = ()
    if spec is not None:
        candidates = tensor_candidates(msg, spec.name, dt, bf16)
        if phase is not None and phase.code == "move":
            replay = [dt] if dt else [c.dtype for c in candidates if c.dtype in ("float32", "float16", "bfloat16")]
            tried_dtypes = list(dict.fromkeys(replay or ["float16", "bfloat16", "float32"]))
            positions = [p for p in (walk_position(msg, spec.name, d, outside) for d in tried_dtypes) if p]
            exact = [p for p in positions if p.matched]
            walk = (exact or positions or [None])[0]
            if exact:
                candidates = tensor_candidates(msg, spec.name, dt, bf16, tuple(exact))

    anomalies = tuple(_anomalies(msg, outside, gpu_spec))
    explanation = Explanation(
        message=msg, model=spec.name if spec else None, gpu=gpu_spec.name if gpu_spec else None, dtype=dt,
        request_range=request_range(msg.tried) if msg.tried is not None else (),
        fragmentation=fragmentation, fragmentation_bytes=frag_bytes, outside=outside, outside_bytes=outside_bytes,
        hint_can_help=hint_can_help, anomalies=anomalies, candidates=candidates, walk=walk, phase=phase,
        torch_versions=versions, version_observations=observations, gpu_matches=gpu_matches, frames=frames, verdict="",
    )
    from dataclasses import replace

    return replace(explanation, verdict=_verdict(explanation, gpu_spec))


# ------------------------------------------------------------------------------------------ verdict


def _verdict(e: Explanation, gpu_spec: Any) -> str:
    m = e.message
    paras: list[str] = []
    fmt = {FORMAT_OLD: "the torch ≤ 2.0 format", FORMAT_NEW: "the torch ≥ 2.1 format"}.get(m.format or "",
                                                                                            "an undetermined format")
    where = f"GPU {m.device_index}" if m.device_index is not None else "an unnamed GPU"
    head = f"A {m.backend or 'CUDA'} out-of-memory message of PyTorch's caching allocator, in {fmt}, on {where}"
    if m.total is not None:
        head += f" ({m.total.text} total capacity"
        if e.gpu_matches:
            from oomlab.specs import load_gpu

            head += "; " + " or ".join(load_gpu(g).display_name for g in e.gpu_matches) + " reports exactly that"
        head += ")"
    paras.append(head + ".")
    if m.missing:
        paras.append("The message is cut off: it lacks " + ", ".join(m.missing) + ".")

    t = m.tried
    if t is not None:
        ranges = e.request_range
        if not _is_segment_interval(t):
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
        frag = _fmt_interval(e.fragmentation)
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
                     f"{_fmt_interval((max(e.outside[0], 0), e.outside[1]))}, the size of a CUDA context: nothing "
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


def _model_paragraphs(e: Explanation, gpu_spec: Any) -> list[str]:
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
            out.append(f"In float32 the same tensor would ask for {format_size(_segment(numel * 4))}.")
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


# ------------------------------------------------------------------------------------------- render


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
        rows.append(("reserved − allocated", _fmt_interval(e.fragmentation)))
    if e.outside is not None:
        rows.append(("outside PyTorch", _fmt_interval((max(e.outside[0], 0), max(e.outside[1], 0)))))
    if e.torch_versions:
        rows.append(("torch", ", ".join(e.torch_versions)))
    if e.anomalies:
        rows.append(("anomalies", ", ".join(a.code for a in e.anomalies)))
    width = max(len(label) for label, _ in rows)
    table = "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
    return f"{table}\n\n{e.verdict}\n"
