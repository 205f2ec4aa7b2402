"""oomlab.explanation.message: OOM messages (CUDA's two formats, HIP, XPU, MPS, CPU) and tracebacks, read into
figures and intervals."""

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomlab.core.choices import MessageFormat
from oomlab.core.errors import NotAnOomMessageError, OomlabError
from oomlab.core.seed import seed_report_text
from oomlab.core.units import GiB, MiB
from oomlab.explanation.backend import Backend
from oomlab.explanation.frames import parse_traceback
from oomlab.explanation.message import MAX_SCAN_CHARS, parse_oom_message
from oomlab.reproduction.allocator import OOMSnapshot, render_oom_message

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "real_oom_messages.json").read_text())
IDS = [f"{i}-{c['source'].split('github.com/')[1]}" for i, c in enumerate(FIXTURES)]
FIGURES = ("tried", "total", "free", "allocated", "reserved", "reserved_unallocated", "in_use", "allowed",
           "private_pools")


# ------------------------------------------------------------------------------------ round trips

_BYTES = st.integers(0, 100 * GiB)
OLD, NEW = MessageFormat.OLD, MessageFormat.NEW


@st.composite
def snapshots(draw: st.DrawFn) -> OOMSnapshot:
    total = draw(st.integers(MiB, 200 * GiB))
    reserved = draw(st.integers(0, total))
    allocated = draw(st.integers(0, reserved))
    free = draw(st.integers(0, total - reserved))
    return OOMSnapshot(
        tried_bytes=draw(_BYTES), request_bytes=0, device_index=draw(st.integers(0, 15)), total_bytes=total,
        free_bytes=free, allocated_bytes=allocated, reserved_bytes=reserved,
        allowed_bytes=draw(st.none() | st.integers(0, total)), outside_pytorch_bytes=total - reserved - free,
    )


def _holds(size, value: int) -> bool:
    return size is not None and size.low_bytes <= value <= size.high_bytes


@given(snapshots())
def test_old_format_round_trip(snap: OOMSnapshot) -> None:
    """render_oom_message (torch<=2.0) → parse: every figure's interval holds the true bytes."""
    msg = parse_oom_message(render_oom_message(snap, "torch<=2.0"))
    assert (msg.format, msg.device_index, msg.missing, msg.hint) == (MessageFormat.OLD, snap.device_index, (),
                                                                     "max_split_size_mb")
    for size, value in ((msg.tried, snap.tried_bytes), (msg.total, snap.total_bytes), (msg.free, snap.free_bytes),
                        (msg.allocated, snap.allocated_bytes), (msg.reserved, snap.reserved_bytes)):
        assert _holds(size, value)
    assert (msg.allowed is None) == (snap.allowed_bytes is None)
    assert snap.allowed_bytes is None or _holds(msg.allowed, snap.allowed_bytes)


@given(snapshots())
def test_new_format_round_trip(snap: OOMSnapshot) -> None:
    """render_oom_message (torch>=2.1) → parse: figures hold the truth; reserved = allocated + unallocated."""
    msg = parse_oom_message(render_oom_message(snap, "torch>=2.1"))
    assert (msg.format, msg.device_index, msg.missing, msg.hint) == (MessageFormat.NEW, snap.device_index, (),
                                                                     "expandable_segments")
    for size, value in ((msg.tried, snap.tried_bytes), (msg.total, snap.total_bytes), (msg.free, snap.free_bytes),
                        (msg.allocated, snap.allocated_bytes), (msg.in_use, snap.in_use_bytes),
                        (msg.reserved_unallocated, snap.reserved_bytes - snap.allocated_bytes)):
        assert _holds(size, value)
    low, high = msg.reserved_low_high
    assert low <= snap.reserved_bytes <= high


# ---------------------------------------------------------------------------------- real messages


def test_seed_message_figures() -> None:
    """The seed (wrapped over lines inside a rich traceback): torch<=2.0, GPU 0, the five figures, nothing missing."""
    msg = parse_oom_message(seed_report_text())
    assert (msg.format, msg.backend, msg.device_index, msg.missing) == (MessageFormat.OLD, Backend.CUDA, 0, ())
    assert [s.text for s in (msg.tried, msg.total, msg.allocated, msg.free, msg.reserved)] == [
        "136.00 MiB", "14.75 GiB", "14.16 GiB", "40.81 MiB", "14.16 GiB"]
    assert msg.tried.value_bytes == 136 * MiB and msg.hint == "max_split_size_mb"
    assert msg.message.endswith("See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF")


@pytest.mark.parametrize("case", FIXTURES, ids=IDS)
def test_real_message_figures(case: dict) -> None:
    """Verbatim messages from public issues: format, device and every figure as printed."""
    msg = parse_oom_message(case["text"])
    expected = case["expected"]
    assert msg.format is (None if expected["format"] is None else MessageFormat(expected["format"]))
    assert msg.device_index == expected["device_index"]
    for name in FIGURES:
        if name in expected:
            size = getattr(msg, name)
            assert (size.text if size else None) == expected[name], name
    if "processes" in expected:
        assert [[p.pid, p.memory.text] for p in msg.processes] == expected["processes"]
    if "mps" in expected:
        mps = msg.mps
        assert {"allocated": mps.allocated.text, "other_allocations": mps.other_allocations.text,
                "max_allowed": mps.max_allowed.text if mps.max_allowed else None, "pool": mps.pool} == expected["mps"]
    if "host" in expected:
        assert [msg.host.code, msg.host.reason] == expected["host"]
    assert list(msg.missing) == expected.get("missing", [])
    assert msg.unreadable == ()
    assert msg.backend.value == expected.get("backend", "CUDA")


def test_t4_total_capacity_is_the_same_figure_everywhere() -> None:
    """Every T4 '14.75 GiB' among the fixtures parses to the same interval, which holds the T4's capacity."""
    from oomlab.core.gpus import load_gpu

    sizes = {parse_oom_message(c["text"]).total for c in FIXTURES if "14.75 GiB" in c["text"]}
    assert len(sizes) == 1
    (size,) = sizes
    assert size.low_bytes <= load_gpu("t4").total_memory_bytes <= size.high_bytes


def test_misspelt_capacty_parses() -> None:
    """'total capacty' (torch 2.1's spelling) is read like 'total capacity'."""
    msg = parse_oom_message("CUDA out of memory. Tried to allocate 32.00 MiB. GPU 0 has a total capacty of 4.00 GiB "
                            "of which 41.56 MiB is free.")
    assert msg.total.text == "4.00 GiB" and msg.free.text == "41.56 MiB"


# ------------------------------------------------------------------------------- cut and repeated


def test_every_prefix_of_the_seed_parses_what_is_there() -> None:
    """A message cut anywhere after 'CUDA out of memory. T' parses; figures found are the full ones; missing named."""
    full = parse_oom_message(seed_report_text())
    text = full.message
    for cut in range(len("CUDA out of memory. T"), len(text) + 1):
        msg = parse_oom_message(text[:cut])
        for name in ("tried", "total", "allocated", "free"):
            part = getattr(msg, name)
            assert part is None or part.text == getattr(full, name).text, (cut, name)
        if cut < text.index("reserved in total") + len("reserved in total by PyTorch"):
            assert msg.missing, cut


def test_prefix_stops_are_named() -> None:
    """Cut after the allocated figure: tried/total/allocated decoded, free and reserved missing."""
    msg = parse_oom_message("OutOfMemoryError: CUDA out of memory. Tried to allocate 136.00 MiB (GPU 0; 14.75 GiB "
                            "total capacity; 14.16 GiB already allocated; 40.8")
    assert msg.missing == ("free", "reserved")
    assert msg.allocated.text == "14.16 GiB"


def test_cut_before_the_format_shows() -> None:
    """'CUDA out of memory. Tried to allo' is an OOM message with no figures and an unknown format."""
    msg = parse_oom_message("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allo")
    assert (msg.format, msg.tried, msg.missing) == (None, None, ("tried", "format"))


@pytest.mark.parametrize(
    ("text", "anchor"),
    [
        ("CUDA out of memory.", "CUDA out of memory."),
        ("torch.cuda.OutOfMemoryError: CUDA out of memory", "CUDA out of memory."),  # no full stop either
        ("RuntimeError: CUDA out of memory.\n  File \"train.py\", line 3\n", "CUDA out of memory."),  # a log goes on
        ("torch.OutOfMemoryError: HIP out of memory.  \r\n", "HIP out of memory."),
        ("RuntimeError: MPS backend out of memory", "MPS backend out of memory."),
    ],
)
def test_bare_message_is_refused(text: str, anchor: str) -> None:
    """The error's first words with no figures after them: NotAnOomMessageError naming what is missing and what to
    paste."""
    with pytest.raises(NotAnOomMessageError) as info:
        parse_oom_message(text)
    assert str(info.value) == (
        f"a bare {anchor!r} with no figures: the input has the error's first words but not 'Tried to allocate …' nor "
        "the device's figures (total capacity, free, allocated, reserved), so there is nothing to decode; paste the "
        "whole message as torch printed it, on the line after 'OutOfMemoryError:', e.g. 'CUDA out of memory. Tried "
        "to allocate 136.00 MiB (GPU 0; 14.75 GiB total capacity; …)'")


def test_message_wrapped_after_its_first_words_is_not_bare() -> None:
    """'CUDA out of memory.' ending a line, the figures on the next (a wrapped terminal): decoded in full."""
    msg = parse_oom_message("CUDA out of memory.\nTried to allocate 136.00 MiB (GPU 0; 14.75 GiB total capacity; "
                            "14.16 GiB already allocated; 40.81 MiB free; 14.16 GiB reserved in total by PyTorch)")
    assert msg.tried.text == "136.00 MiB" and msg.missing == ()


_OLD_TAIL = " (GPU 0; 14.75 GiB total capacity; 14.16 GiB already allocated; 40.81 MiB free; 14.16 GiB reserved in " \
            "total by PyTorch)"


@pytest.mark.parametrize(
    ("text", "unreadable", "missing"),
    [
        ("CUDA out of memory. Tried to allocate banana MiB", [("tried", "banana MiB")], []),  # alone: not "cut off"
        ("CUDA out of memory. Tried to allocate banana MiB" + _OLD_TAIL, [("tried", "banana MiB")], []),
        ("CUDA out of memory. Tried to allocate 1,024.00 MiB" + _OLD_TAIL, [("tried", "1,024.00 MiB")], []),
        ("CUDA out of memory. Tried to allocate 136.00 MiB (GPU 0; 14.75 GiB total capacity; lots already allocated; "
         "40.81 MiB free; 14.16 GiB reserved in total by PyTorch)", [("allocated", "lots")], []),
        ("CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacity of 39.49 GiB of which plenty "
         "is free. Of the allocated memory 4.98 GiB is allocated by PyTorch, and 28.38 MiB is reserved by PyTorch but "
         "unallocated.", [("free", "plenty")], []),
        ("DefaultCPUAllocator: can't allocate memory: you tried to allocate many bytes. Error code 12 (Cannot "
         "allocate memory)", [("tried", "many bytes")], []),
        ("MPS backend out of memory (MPS allocated: lots, other allocations: 3.95 MB, max allowed: 18.13 GB). Tried "
         "to allocate 1024.00 MB on private pool.", [("mps_allocated", "lots")], []),
    ],
)
def test_unreadable_figure_is_named_not_missing(text: str, unreadable: list, missing: list) -> None:
    """A figure whose label is there but whose value is no size is unreadable (with its text), not missing."""
    msg = parse_oom_message(text)
    assert [(u.name, u.text) for u in msg.unreadable] == unreadable
    assert list(msg.missing) == missing


@pytest.mark.parametrize(
    ("text", "missing"),
    [
        ("CUDA out of memory. Tried to allocate 136.0", ("tried", "format")),  # cut inside the number
        ("CUDA out of memory. Tried to allocate 136.00 Mi", ("tried", "format")),  # cut inside the unit
        ("CUDA out of memory. Tried to allocate 160.00 MiB. GPU 0 has a total capacity of 14.7",
         ("total", "free", "allocated", "reserved_unallocated")),
        ("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1324", ("tried",)),
    ],
)
def test_figure_cut_by_the_input_end_is_missing_not_unreadable(text: str, missing: tuple) -> None:
    """A size cut off by the end of the input (a prefix of a valid size) is missing, not unreadable."""
    msg = parse_oom_message(text)
    assert (msg.unreadable, msg.missing) == ((), missing)


@pytest.mark.parametrize(
    ("text", "backend", "fmt"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has", Backend.CUDA, NEW),
        ("HIP out of memory. Tried to allocate 2.00 MiB (GPU 0; 15.98 GiB total capacity;", Backend.HIP, OLD),
        ("XPU out of memory. Tried to allocate 4.66 GiB. GPU 0 has a total capacity of", Backend.XPU, NEW),
        ("MPS backend out of memory (MPS allocated: 5.56 GB, other allocations: 1.10 GB", Backend.MPS, None),
        ("DefaultCPUAllocator: can't allocate memory: you tried to allocate 64 bytes.", Backend.CPU, None),
        ("DefaultCPUAllocator: not enough memory: you tried to allocate 64 bytes.", Backend.CPU, None),  # Windows
        ("torch.OutOfMemoryError: Out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total", None, NEW),
    ],
)
def test_backend_is_named_by_the_message(text: str, backend: Backend | None, fmt: MessageFormat | None) -> None:
    """The message's first words name its backend; MPS and CPU messages have neither caching-allocator format."""
    msg = parse_oom_message(text)
    assert (msg.backend, msg.format) == (backend, fmt)


def test_mps_message_without_the_watermark_cap() -> None:
    """The MPS wording without 'max allowed' (the limit disabled): decoded, max_allowed None, nothing missing."""
    msg = parse_oom_message("MPS backend out of memory (MPS allocated: 30.12 GB, other allocations: 1.20 GB). Tried to "
                            "allocate 2.00 GB on private pool.")
    assert (msg.mps.allocated.text, msg.mps.max_allowed, msg.mps.pool, msg.missing) == ("30.12 GB", None, "private", ())


def test_xpu_4gb_block_refusal_is_told_apart() -> None:
    """IPEX's 'can NOT allocate memory block with size larger than 4GB' is named as a platform limit, not an OOM."""
    with pytest.raises(NotAnOomMessageError, match="refusing one XPU block larger than 4 GB"):
        parse_oom_message("RuntimeError: Current platform can NOT allocate memory block with size larger than 4GB! "
                          "Tried to allocate 6.85 GiB (GPU  0; 15.56 GiB total capacity; 0 bytes already allocated; "
                          "0 bytes reserved in total by PyTorch)")


def test_most_complete_of_several_messages_is_decoded() -> None:
    """A log with a cut message then a complete one: the complete one wins; both are counted."""
    cut = "CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; 14.75 GiB total"
    whole = FIXTURES[0]["text"]
    msg = parse_oom_message(f"{cut}\nretrying…\n{whole}\n{cut}")
    assert msg.occurrences == 3 and msg.tried.text == "50.00 MiB" and msg.missing == ()


# -------------------------------------------------------------------------------------- not an OOM


@pytest.mark.parametrize(
    "text",
    ["", "hello", "RuntimeError: expected scalar type Half but found Float", "CUDA out of memory errors are common",
     "\x00\xff" * 100],
)
def test_not_an_oom_message(text: str) -> None:
    """Anything without the allocator's message raises NotAnOomMessageError, an OomlabError, naming the fix."""
    with pytest.raises(NotAnOomMessageError, match="not a CUDA out-of-memory message") as info:
        parse_oom_message(text)
    assert isinstance(info.value, OomlabError)


def test_cuda_error_out_of_memory_is_told_apart() -> None:
    """'CUDA error: out of memory' is named as a CUDA call outside the allocator, with no figures."""
    with pytest.raises(NotAnOomMessageError, match="'CUDA error: out of memory', raised by a CUDA call outside"):
        parse_oom_message("RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously")


def test_bytes_input_is_decoded() -> None:
    """Bytes (a file read raw, invalid UTF-8 included) are decoded with replacement."""
    msg = parse_oom_message(b"\xff\xfe " + FIXTURES[0]["text"].encode())
    assert msg.tried.text == "50.00 MiB"


def test_huge_input_scans_its_tail() -> None:
    """Megabytes of log before the message: found, flagged as tail-scanned; the cap is MAX_SCAN_CHARS."""
    text = "x" * (MAX_SCAN_CHARS + 1_000_000) + "\n" + FIXTURES[1]["text"]
    msg = parse_oom_message(text)
    assert msg.scanned_tail and msg.tried.text == "2.00 MiB"


# --------------------------------------------------------------------------------------- tracebacks


def test_rich_traceback_of_the_seed() -> None:
    """The seed's rich frames: _apply at 820 and convert at 1143 with their code; gutter lines 797 and 1145."""
    frames, sources = parse_traceback(seed_report_text())
    assert [(f.function, f.line, f.code[:25]) for f in frames] == [
        ("_apply", 820, "param_applied = fn(param)"), ("convert", 1143, "return t.to(device, dtype")]
    lines = {(s.line, s.code) for s in sources}
    assert (797, "module._apply(fn)") in lines and (1145, "return self._apply(convert)") in lines


def test_python_traceback_frames() -> None:
    """Python's own format: file, line, function and the source line below it (Windows paths too)."""
    frames, _ = parse_traceback(next(c["text"] for c in FIXTURES if "oobabooga" in c["source"]))
    assert frames[0].file.endswith("torch\\nn\\modules\\module.py")
    assert (frames[0].line, frames[0].function) == (1143, "convert")
    assert frames[0].code.startswith("return t.to(device")


def test_ipython_traceback_frames() -> None:
    """IPython 7 ('file.py in func(args)' with '--> 722' gutters) and IPython 8 ('File f.py:1130, in F.func')."""
    text = ("~/anaconda3/lib/python3.7/site-packages/torch/nn/modules/module.py in _call_impl(self, *input)\n"
            "    720             result = self._slow_forward(*input, **kwargs)\n"
            "--> 722             result = self.forward(*input, **kwargs)\n"
            "File ~/venv/lib/python3.10/site-packages/torch/optim/adamw.py:184, in AdamW.step(self, closure)\n")
    frames, _ = parse_traceback(text)
    assert [(f.function, f.line, f.code) for f in frames] == [
        ("_call_impl", 722, "result = self.forward(*input, **kwargs)"), ("step", 184, "")]
    assert frames[1].file.endswith("torch/optim/adamw.py")


# ------------------------------------------------------------------------------------ units, whole messages


@pytest.mark.parametrize(
    ("unit", "tried", "total"),
    [
        # torch's own binary units: exact powers of 1024
        ("MiB", 136 * MiB, None),
        ("GiB", None, round(14.75 * GiB)),
        # retyped decimal units: powers of 1000 (a user pasting "136.00 MB" by hand, or another tool's log)
        ("MB", 136_000_000, None),
        ("GB", None, 14_750_000_000),
        ("KB", 136_000, None),
        ("KiB", 136 * 1024, None),
    ],
)
def test_units_in_a_whole_message(unit: str, tried: int | None, total: int | None) -> None:
    """Each unit spelling is read at its own scale, inside a full torch<=2.0 message (MB != MiB, GB != GiB)."""
    tried_text = f"136.00 {unit}" if tried is not None else "136.00 MiB"
    total_text = f"14.75 {unit}" if total is not None else "14.75 GiB"
    msg = parse_oom_message(f"CUDA out of memory. Tried to allocate {tried_text} (GPU 0; {total_text} total capacity; "
                            "14.16 GiB already allocated; 40.81 MiB free; 14.16 GiB reserved in total by PyTorch)")
    if tried is not None:
        assert msg.tried.value_bytes == tried and msg.tried.low_bytes <= tried <= msg.tried.high_bytes
        assert msg.tried.canonical == unit.endswith("iB")  # torch prints binary units only
    if total is not None:
        assert msg.total.value_bytes == total
        assert msg.total.canonical == unit.endswith("iB")
    assert msg.allocated.value_bytes == round(14.16 * GiB) and msg.free.value_bytes == round(40.81 * MiB)


@pytest.mark.parametrize(
    ("text", "figure", "value"),
    [
        # the new format in decimal units: each figure at 1000-based scale
        ("CUDA out of memory. Tried to allocate 2.50 GB. GPU 0 has a total capacity of 79.15 GB of which 1.20 GB is "
         "free. Of the allocated memory 75.00 GB is allocated by PyTorch, and 1.50 GB is reserved by PyTorch but "
         "unallocated.", "total", 79_150_000_000),
        ("CUDA out of memory. Tried to allocate 2.50 GB. GPU 0 has a total capacity of 79.15 GB of which 1.20 GB is "
         "free. Of the allocated memory 75.00 GB is allocated by PyTorch, and 1.50 GB is reserved by PyTorch but "
         "unallocated.", "reserved_unallocated", 1_500_000_000),
        ("CUDA out of memory. Tried to allocate 512.00 MB. GPU 0 has a total capacity of 79.15 GiB of which 300.00 MB "
         "is free. Of the allocated memory 75.00 GiB is allocated by PyTorch, and 1.50 GiB is reserved by PyTorch "
         "but unallocated.", "free", 300_000_000),
        ("CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 79.15 GiB of which 300.00 "
         "MiB is free. Of the allocated memory 75.00 GiB is allocated by PyTorch, and 1.50 GiB is reserved by PyTorch "
         "but unallocated.", "free", 300 * MiB),
    ],
)
def test_decimal_units_in_the_new_format(text: str, figure: str, value: int) -> None:
    """torch>=2.1's wording with MB/GB (retyped) and MiB/GiB (as printed): each read at its own scale."""
    assert getattr(parse_oom_message(text), figure).value_bytes == value
