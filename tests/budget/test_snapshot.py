"""budget.timeline / budget.snapshot / budget.snapshot_compare: the budgeted step as a torch memory snapshot -- its
peak is the budget's, it reads back to the budget category by category, and torch's own _memory_viz accepts it."""

from __future__ import annotations

import json
import pickle
import pickletools
from pathlib import Path

import pytest

from oomlab.budget.api import estimate
from oomlab.budget.result import ALLOCATED, MemCategory, Phase
from oomlab.budget.snapshot import (
    PICKLE_PROTOCOL,
    SNAPSHOT_CATEGORY,
    simulate_allocator,
    snapshot_bytes,
    snapshot_dict,
    write_snapshot,
)
from oomlab.budget.snapshot_compare import budget_categories, compare_snapshot
from oomlab.budget.timeline import step_timeline
from oomlab.cli import run_cli
from oomlab.core.errors import InvalidValueError
from oomlab.explanation.snapshot import SnapshotCategory, explain_snapshot
from oomlab.explanation.snapshot_format import load_snapshot, parse_snapshot, read_snapshot

FITS = {"model": "llama-2-7b", "gpu": "a100-80gb", "gpus": 1, "method": "lora", "precision": "bf16-mixed"}
# the opcodes MemoryViz.js's unpickle (torch/utils/viz/MemoryViz.js) handles
MEMORY_VIZ_OPCODES = {"PROTO", "APPEND", "APPENDS", "LIST", "TUPLE", "NEWFALSE", "NEWTRUE", "NONE", "BINGET", "BININT",
                      "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME", "LONG1", "LONG_BINGET", "MARK",
                      "MEMOIZE", "BINPUT", "LONG_BINPUT", "SETITEMS", "SETITEM", "DICT", "SHORT_BINUNICODE",
                      "BINUNICODE", "STOP", "EMPTY_TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "BINFLOAT"}


@pytest.mark.parametrize("kw", [
    FITS,
    {},  # the seed: llama-13b on 4 x T4, DDP, full fine-tuning
    {"model": "llama-2-7b", "gpu": "a100-80gb", "gpus": 8, "strategy": "fsdp", "checkpointing": True},
    {"model": "llama-2-7b", "gpu": "a100-80gb", "gpus": 4, "strategy": "zero3", "precision": "bf16-mixed"},
    {"model": "mistral-7b", "gpu": "a10g", "gpus": 1, "method": "qlora", "optimizer": "adamw-8bit"},
])
def test_timeline_peak_is_the_budget(kw: dict) -> None:
    """The timeline's largest live total is the budget's allocated peak, and each phase's last state is the phase's
    own figures; the step ends holding what it began with."""
    result = estimate(**kw)
    t = step_timeline(result)
    assert t.peak_bytes == result.allocated_peak_bytes
    last_of = {phase: end - 1 for phase, _, end in t.phase_spans() if phase is not None}
    for phase, index in last_of.items():
        assert dict(t.live_after[index]) == {c: b for c, b in result.phases[phase].items() if b and c in ALLOCATED}
    held_until = t.phase_spans()[0][2] - 1  # the last event of the states held between steps
    assert t.events[held_until].phase is None and dict(t.live_after[-1]) == dict(t.live_after[held_until])


def test_written_snapshot_reads_back_to_the_budget(tmp_path: Path) -> None:
    """A setup that fits: explain reads the written file at its peak, with the budget's bytes in every category."""
    result = estimate(**FITS)
    path = write_snapshot(result, tmp_path / "step.pickle")
    e = explain_snapshot(path)
    assert (e.moment, e.oom_size_bytes) == ("peak", None)
    assert e.live_bytes == result.allocated_peak_bytes == 25_165_635_584
    assert dict(e.categories) == budget_categories(result, result.peak_phase)
    comparison = compare_snapshot(e, result)
    assert comparison.phase is result.peak_phase is Phase.BACKWARD
    assert all(r.difference_bytes == 0 and not r.note for r in comparison.rows)
    assert e.simulated_by.startswith("oomlab analytic budget: llama-2-7b on 1 x a100-80gb")


def test_seed_snapshot_ooms_where_the_allocator_model_does() -> None:
    """The seed (llama-13b, a full fp32 replica on a T4): the model's load dies on the 13th layer's weights, 1.18 GiB
    asked with 454.81 MiB free -- the oom entry, and the live weights before it, read back."""
    result = estimate()
    replay = simulate_allocator(result)
    e = explain_snapshot(parse_snapshot(load_snapshot(snapshot_bytes(result, replay))))
    assert e.moment == "oom"
    assert (e.oom_size_bytes, e.device_free_bytes) == (replay.oom_size_bytes, replay.device_free_bytes)
    assert replay.timeline.events[replay.oom_event].tensor.module == "model.layers.11"
    assert e.device_free_bytes == result.capacity_bytes - result.components[MemCategory.OUTSIDE_PYTORCH] \
        - e.reserved_bytes
    assert dict(e.categories) == {SnapshotCategory.WEIGHTS: sum(
        ev.tensor.size_bytes for ev in replay.timeline.events[:replay.oom_event])}
    assert e.fragmented is False


def test_memory_viz_accepts_it() -> None:
    """torch.cuda._memory_viz's segsum (which asserts its accounting), trace and trace_plot take the snapshot; the
    pickle uses only the opcodes MemoryViz.js reads."""
    from torch.cuda import _memory_viz

    result = estimate(**FITS)
    data = snapshot_bytes(result)
    ops = {op.name for op, _, _ in pickletools.genops(data)}
    assert ops <= MEMORY_VIZ_OPCODES, ops - MEMORY_VIZ_OPCODES
    assert data[:2] == bytes([0x80, PICKLE_PROTOCOL])
    snap = pickle.loads(data)
    summary = _memory_viz.segsum(snap)
    reserved = sum(s["total_size"] for s in snap["segments"])
    assert f"segments: {len(snap['segments'])}" in summary
    assert reserved == sum(b["size"] for s in snap["segments"] for b in s["blocks"])
    text = _memory_viz.trace(snap)
    assert text.startswith("Device 0 ----------------\n")
    assert f"{len(snap['device_traces'][0])} entries" in text
    assert "oomlab-simulated" in str(snap["device_traces"][0][1]["frames"])
    assert "MemoryViz.js" in _memory_viz.trace_plot(snap)


def test_seed_trace_shows_the_oom() -> None:
    """torch's trace printout of the seed's snapshot ends with its OutOfMemoryError line."""
    from torch.cuda import _memory_viz

    text = _memory_viz.trace(snapshot_dict(estimate()))
    assert "raise OutOfMemoryError # 1.2GiB requested, 454.8MiB free in CUDA" in text


def test_frames_name_category_and_module() -> None:
    """Every alloc entry's first frame names its snapshot category by file and the budget category and module."""
    replay = simulate_allocator(estimate(**FITS))
    allocs = [e for e in replay.trace if e["action"] == "alloc"]
    tensors = [ev.tensor for ev in replay.timeline.events if ev.alloc]
    assert len(allocs) == len(tensors)
    for entry, t in zip(allocs, tensors, strict=True):
        assert entry["frames"][0] == {"filename": f"oomlab-simulated/{SNAPSHOT_CATEGORY[t.category].name.lower()}",
                                      "line": 0, "name": f"{t.category.value} of {t.module}"}
        assert entry["size"] == t.size_bytes


def test_never_overwrites_a_users_file(tmp_path: Path) -> None:
    """A user's file (here a real-looking snapshot without oomlab's marker) is refused; oomlab's own is replaced."""
    users = tmp_path / "theirs.pickle"
    users.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]]}))
    before = users.read_bytes()
    with pytest.raises(InvalidValueError, match="exists and is not a snapshot oomlab wrote"):
        write_snapshot(estimate(**FITS), users)
    assert users.read_bytes() == before
    ours = write_snapshot(estimate(**FITS), tmp_path / "ours.pickle")
    write_snapshot(estimate(), ours)  # replaced: it is oomlab's
    assert read_snapshot(ours).simulated_by.startswith("oomlab analytic budget: llama-13b")
    with pytest.raises(InvalidValueError, match="does not exist"):
        write_snapshot(estimate(**FITS), tmp_path / "no" / "such.pickle")


def test_cli_budget_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """budget --snapshot writes the file and says so; over a user's file it exits 2."""
    out = tmp_path / "s.pickle"
    args = ["budget", "--model", "llama-2-7b", "--gpu", "a100-80gb", "--gpus", "1", "--method", "lora"]
    assert run_cli([*args, "--snapshot", str(out)]) == 0
    assert f"written to {out}" in capsys.readouterr().out
    assert read_snapshot(out).simulated_by is not None
    mine = tmp_path / "mine.txt"
    mine.write_text("mine")
    assert run_cli([*args, "--snapshot", str(mine)]) == 2
    assert mine.read_text() == "mine"


def test_cli_explain_beside_the_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """explain --snapshot --model --json: the written step beside the budget of the same setup, no category apart;
    the same file beside a full fine-tune names what differs (the LoRA snapshot holds far less optimizer state)."""
    path = write_snapshot(estimate(**FITS), tmp_path / "s.pickle")
    same = ["--model", "llama-2-7b", "--gpu", "a100-80gb", "--gpus", "1", "--method", "lora"]
    assert run_cli(["explain", "--snapshot", str(path), *same, "--json"]) == 0
    budget = json.loads(capsys.readouterr().out)["budget"]
    assert budget["phase"] == "backward"
    assert [r["difference_bytes"] for r in budget["rows"]] == [0] * len(budget["rows"])
    assert run_cli(["explain", "--snapshot", str(path), *same[:-1], "full"]) == 0
    text = capsys.readouterr().out
    assert "optimizer state: less than budgeted -- the first step" in text
