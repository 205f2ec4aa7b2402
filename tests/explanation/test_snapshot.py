"""explanation.snapshot_format / explanation.snapshot: a hand-made torch memory snapshot with an ``oom`` entry read
back to its figures; hostile, malformed, huge and truncated pickles refused with exit code 2."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from oomlab.cli import run_cli
from oomlab.core.units import MiB
from oomlab.explanation.snapshot import (
    SnapshotCategory,
    categorize,
    explain_snapshot,
    render_snapshot_explanation,
)
from oomlab.explanation.snapshot_format import (
    MAX_SNAPSHOT_BYTES,
    SnapshotError,
    SnapshotFrame,
    load_snapshot,
    parse_snapshot,
)

SEG = 0x7F0000000000


def frame(filename: str, name: str, line: int = 1) -> dict:
    return {"filename": filename, "line": line, "name": name}


# the stacks a real training step records (python frames, innermost first)
WEIGHT = [frame("/usr/lib/python3/site-packages/torch/nn/modules/module.py", "_apply", 900),
          frame("train.py", "<module>", 10)]
ADAM = [frame("/usr/lib/python3/site-packages/torch/optim/adam.py", "_init_group", 160),
        frame("/usr/lib/python3/site-packages/torch/optim/adamw.py", "step", 200), frame("train.py", "<module>", 30)]
ACT = [frame("/usr/lib/python3/site-packages/torch/nn/modules/linear.py", "forward", 125),
       frame("modeling_llama.py", "forward", 300), frame("train.py", "<module>", 20)]
LOSS = [frame("/usr/lib/python3/site-packages/torch/nn/functional.py", "cross_entropy", 3000),
        frame("transformers/loss/loss_utils.py", "ForCausalLMLoss", 60)]
GRAD = [frame("torch/csrc/autograd/functions/accumulate_grad.h", "torch::autograd::AccumulateGrad::apply"),
        frame("/usr/lib/python3/site-packages/torch/autograd/graph.py", "_engine_run_backward", 800)]


def event(action: str, addr: int, size: int, frames: list[dict] | None = None) -> dict:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 0, "frames": frames or []}


def hand_made() -> dict:
    """One 100 MiB segment: weights 40 MiB, Adam state 20 MiB, an activation 10 MiB and a loss tensor 6 MiB freed
    after the OOM (the exception unwinding), a 4 MiB activation freed before it; an OOM asking 30 MiB with 5 MiB
    free in CUDA.  At the OOM: live 76 MiB, reserved 100 MiB; free ranges 4 MiB (the freed hole) and 20 MiB (the
    segment's end): the largest 20 MiB < 30 MiB while 24 MiB is cached -- not fragmentation alone."""
    w, a, act, hole, loss = SEG, SEG + 40 * MiB, SEG + 60 * MiB, SEG + 70 * MiB, SEG + 74 * MiB
    trace = [event("segment_alloc", SEG, 100 * MiB), event("alloc", w, 40 * MiB, WEIGHT),
             event("alloc", a, 20 * MiB, ADAM), event("alloc", act, 10 * MiB, ACT),
             event("alloc", hole, 4 * MiB, ACT), event("alloc", loss, 6 * MiB, LOSS),
             event("free_requested", hole, 4 * MiB, ACT), event("free_completed", hole, 4 * MiB, ACT),
             {"action": "oom", "size": 30 * MiB, "device_free": 5 * MiB, "stream": 0, "time_us": 0, "frames": ACT},
             event("free_requested", loss, 6 * MiB, LOSS), event("free_completed", loss, 6 * MiB, LOSS)]
    blocks = [{"address": w, "size": 40 * MiB, "requested_size": 40 * MiB, "state": "active_allocated",
               "frames": WEIGHT},
              {"address": a, "size": 20 * MiB, "requested_size": 20 * MiB, "state": "active_allocated", "frames": ADAM},
              {"address": act, "size": 10 * MiB, "requested_size": 10 * MiB, "state": "active_allocated",
               "frames": ACT},
              {"address": hole, "size": 30 * MiB, "requested_size": 0, "state": "inactive", "frames": []}]
    seg = {"device": 0, "address": SEG, "total_size": 100 * MiB, "allocated_size": 70 * MiB, "active_size": 70 * MiB,
           "requested_size": 70 * MiB, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
           "is_expandable": False, "frames": [], "blocks": blocks}
    return {"segments": [seg], "device_traces": [trace], "allocator_settings": {}, "external_annotations": []}


def test_hand_made_oom_read_back() -> None:
    """The last OOM's request and free memory, live bytes by category, reserved, allocated and the largest free block
    at the OOM (the loss tensor freed after it is live again; the hole freed before it is not)."""
    e = explain_snapshot(parse_snapshot(hand_made()))
    assert (e.moment, e.event_index, e.oom_size_bytes, e.device_free_bytes) == ("oom", 8, 30 * MiB, 5 * MiB)
    assert dict(e.categories) == {SnapshotCategory.WEIGHTS: 40 * MiB, SnapshotCategory.OPTIMIZER_STATE: 20 * MiB,
                                  SnapshotCategory.ACTIVATIONS: 10 * MiB, SnapshotCategory.LOGITS: 6 * MiB}
    assert (e.reserved_bytes, e.allocated_bytes, e.largest_free_block_bytes) == (100 * MiB, 76 * MiB, 20 * MiB)
    assert e.fragmented is False  # 24 MiB cached < 30 MiB asked
    assert [t.size_bytes for t in e.top_allocations(2)] == [40 * MiB, 20 * MiB]
    assert e.top_allocations(1)[0].shown_frames()[0].endswith("module.py:900:_apply")


def test_fragmented_oom() -> None:
    """A 22 MiB request with 24 MiB cached but no block over 20 MiB: fragmentation, named as such."""
    snap = hand_made()
    snap["device_traces"][0][8]["size"] = 22 * MiB
    e = explain_snapshot(parse_snapshot(snap))
    assert e.fragmented is True
    assert "fragmentation: 24.00 MiB was cached but the largest free block was 20.00 MiB" in \
        render_snapshot_explanation(e)


def test_no_oom_reads_the_peak() -> None:
    """Without an ``oom`` entry the trace is read at its peak of live bytes (82 MiB, after the loss tensor)."""
    snap = hand_made()
    del snap["device_traces"][0][8]
    e = explain_snapshot(parse_snapshot(snap))
    assert (e.moment, e.event_index, e.live_bytes, e.oom_size_bytes) == ("peak", 6, 80 * MiB, None)


def test_state_only_snapshot_reads_the_dump() -> None:
    """No trace (``_record_memory_history(enabled="state")``): the blocks at the dump."""
    snap = hand_made()
    snap["device_traces"] = [[]]
    e = explain_snapshot(parse_snapshot(snap))
    assert (e.moment, e.live_bytes, e.largest_free_block_bytes) == ("dump", 70 * MiB, 30 * MiB)


@pytest.mark.parametrize(("frames", "category"), [
    (WEIGHT, SnapshotCategory.WEIGHTS), (ADAM, SnapshotCategory.OPTIMIZER_STATE),
    ([frame("torch/optim/adamw.py", "_multi_tensor_adamw")], SnapshotCategory.TEMPORARIES),
    (GRAD, SnapshotCategory.GRADIENTS),
    ([frame("torch/autograd/graph.py", "_engine_run_backward")], SnapshotCategory.TEMPORARIES),  # no AccumulateGrad
    (LOSS, SnapshotCategory.LOGITS), (ACT, SnapshotCategory.ACTIVATIONS),
    ([frame("oomlab-simulated/gradients", "gradients of lm_head")], SnapshotCategory.GRADIENTS),
    ([frame("libc.so", "malloc")], SnapshotCategory.UNATTRIBUTED),
])
def test_categorize(frames: list[dict], category: SnapshotCategory) -> None:
    """Each frame rule, in order (an optimizer step's temporaries are not its state; backward without AccumulateGrad
    is a temporary)."""
    assert categorize(tuple(SnapshotFrame(**f) for f in frames)) is category


class Evil:
    def __reduce__(self):  # noqa: ANN204 - the pickle a hostile user attaches
        return (os.system, ("echo pwned",))


def write(tmp_path: Path, data: bytes, name: str = "s.pickle") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(("data", "message"), [
    (pickle.dumps(Evil()), "names the global 'posix.system'"),
    (pickle.dumps({"segments": [], "x": Evil()}), "names the global 'posix.system'"),
    (pickle.dumps({"segments": [SnapshotFrame("a", 1, "b")]}), "names the global "
                                                               "'oomlab.explanation.snapshot_format.SnapshotFrame'"),
    (pickle.dumps(hand_made())[:300], "is truncated"),
    (b"", "is empty"),
    (b"not a pickle at all", "not a valid pickle"),
    (pickle.dumps([1, 2]), "is list, not a dict"),
    (pickle.dumps({"segments": [{"address": 1}]}), "has no 'blocks'"),
    (pickle.dumps({"segments": [], "device_traces": [[{"action": "rm -rf", "addr": 0, "size": 0}]]}),
     "unknown trace action 'rm -rf'"),
    (pickle.dumps({"segments": [], "device_traces": [[{"action": "oom", "size": -5, "device_free": 0}]]}),
     "'size' is -5; sizes are >= 0"),
    (pickle.dumps(hand_made()) + b"junk", "bytes after the pickle's end"),
])
def test_refused(data: bytes, message: str) -> None:
    """Globals (os.system, any class), truncated, empty, malformed and mis-shaped pickles: a SnapshotError naming it,
    nothing executed."""
    with pytest.raises(SnapshotError) as err:
        parse_snapshot(load_snapshot(data))
    assert message in str(err.value)


def test_deeply_nested_is_refused_without_recursion() -> None:
    """A list nested 200,000 deep where a segment belongs: refused by its type (never repr'd: no RecursionError)."""
    nested = load_snapshot(b"\x80\x04]" + b"]" * 200_000 + b"a" * 200_000 + b".")
    with pytest.raises(SnapshotError, match=r"segments\[0\] is list, not a dict"):
        parse_snapshot({"segments": [nested]})


def test_cli_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI exits 2 on a hostile pickle (naming the global) and on a file over the size bound, reading no more."""
    evil = write(tmp_path, pickle.dumps(Evil()))
    assert run_cli(["explain", "--snapshot", str(evil)]) == 2
    assert "names the global 'posix.system'" in capsys.readouterr().err
    huge = tmp_path / "huge.pickle"
    with huge.open("wb") as f:
        f.truncate(MAX_SNAPSHOT_BYTES + 1)  # sparse: no disk used
    assert run_cli(["explain", "--snapshot", str(huge)]) == 2
    assert f"at most {MAX_SNAPSHOT_BYTES:,} are read" in capsys.readouterr().err


def test_cli_json_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json carries the issue's keys with the hand-made figures."""
    path = write(tmp_path, pickle.dumps(hand_made(), protocol=4))
    assert run_cli(["explain", "--snapshot", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["oom"] == {"size_bytes": 30 * MiB, "device_free_bytes": 5 * MiB}
    assert out["categories"] == {"weights": 40 * MiB, "optimizer state": 20 * MiB, "activations": 10 * MiB,
                                 "logits": 6 * MiB}
    assert (out["reserved_bytes"], out["allocated_bytes"], out["largest_free_block_bytes"]) == \
        (100 * MiB, 76 * MiB, 20 * MiB)
    assert [t["size_bytes"] for t in out["top_allocations"]] == [40 * MiB, 20 * MiB, 10 * MiB, 6 * MiB]


def test_snapshot_and_message_together_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, pickle.dumps(hand_made()))
    assert run_cli(["explain", "some message", "--snapshot", str(path)]) == 2
    assert "not both" in capsys.readouterr().err


def test_older_single_free_action() -> None:
    """A trace whose frees are a single ``free`` entry (older snapshots) replays the same: the hole is free at the OOM,
    the loss tensor freed after it is live again."""
    snap = hand_made()
    trace = snap["device_traces"][0]
    trace[6:8] = [event("free", SEG + 70 * MiB, 4 * MiB, ACT)]
    trace[8:10] = [event("free", SEG + 74 * MiB, 6 * MiB, LOSS)]
    e = explain_snapshot(parse_snapshot(snap))
    assert (e.moment, e.event_index, e.live_bytes, e.largest_free_block_bytes) == ("oom", 7, 76 * MiB, 20 * MiB)
