"""torchao 0.1's NF4 quantization, recorded: every tensor its ``to_nf4`` and ``NF4Tensor.get_original_weight``
allocate and free, in order, as bytes per weight element -- the data :mod:`oomlab.budget.nf4_init` replays through
the caching-allocator model to budget torchtune < 0.2.0's QLoRA init
(:attr:`~oomlab.core.versions.Fact.TORCHAO_CHUNKED_NF4`).

The recorder runs the real code on CPU with real bf16 tensors: a ``TorchDispatchMode`` sees every aten op, and each
new storage an op returns (views excluded) is an allocation; a ``weakref.finalize`` on the tensor marks its free.  A
weight of two shapes is quantized and dequantized; each event's bytes are ``fixed + per_unit x elements / UNIT``,
solved from the two recordings and checked exact on both (the sequence itself must be the same for both shapes).

The code recorded is ``tests/fixtures/torchao-0.1/nf4tensor.py``: the wheel's file byte for byte (its README; a test
checks it against the wheel's RECORD hash).  ``python -m oomlab.evidence nf4-events`` records it again and rewrites
``lib/oomlab/data/torchao-nf4-events.json``; a test checks the committed file is what the recording gives.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
import weakref
from pathlib import Path
from typing import Any

from oomlab.core.files import write_text_atomic
from oomlab.core.paths import DATA_DIR, REPO_ROOT

__all__ = ["NF4_EVENTS_JSON", "VERBATIM", "UNIT", "SHAPES", "record_file", "events_data", "render", "regenerate"]

NF4_EVENTS_JSON = DATA_DIR / "torchao-nf4-events.json"
VERBATIM = REPO_ROOT / "tests" / "fixtures" / "torchao-0.1" / "nf4tensor.py"
WHEEL_RECORD = "torchao/dtypes/nf4tensor.py,sha256=8nWKKVE62gkRUi8vs6eYejrqYUV3K7-VlZmKw_a7Q34,20810"
UNIT = 64 * 256  # elements: one scaler block of scaler blocks (to_nf4's block_size x scaler_block_size defaults)
SHAPES = ((4096, 4096), (11008, 4096))  # Llama-2-7B's attention and MLP weights; both multiples of UNIT


def _load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("oomlab_recorded_nf4tensor", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recorder() -> Any:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        """Every new plain-tensor storage an op returns ("alloc", id, bytes), and its release ("free", id)."""

        def __init__(self) -> None:
            super().__init__()
            self.events: list[tuple] = []
            self._ids = itertools.count()
            self._live: set[int] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if type(t) is not torch.Tensor or func.is_view:
                    continue
                storage = t.untyped_storage()
                ptr, size = storage.data_ptr(), storage.nbytes()
                if ptr in self._live or size == 0:
                    continue
                handle = next(self._ids)
                self._live.add(ptr)
                self.events.append(("alloc", handle, size))
                weakref.finalize(t, self._freed, handle, ptr)
            return out

        def _freed(self, handle: int, ptr: int) -> None:
            self.events.append(("free", handle))
            self._live.discard(ptr)

    return Recorder


def _record_one(module: Any, shape: tuple[int, int]) -> dict[str, list[tuple]]:
    import torch
    recorder = _recorder()
    weight = torch.randn(*shape, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    with recorder() as quantizing:
        quantized = module.to_nf4(weight)
    to_nf4 = list(quantizing.events)  # copied now: later frees of the kept tensors would append to it
    with recorder() as dequantizing:
        restored = module.NF4Tensor.get_original_weight(quantized)
    dequant = list(dequantizing.events)
    del restored, quantized
    return {"to_nf4": to_nf4, "get_original_weight": dequant}


def _per_element(recordings: list[dict[str, list[tuple]]]) -> dict[str, list[list]]:
    """Each event as ``[kind, id, fixed bytes, bytes per UNIT elements]``, solved from the two shapes' recordings."""
    (n1, n2) = (a * b for a, b in SHAPES)
    out: dict[str, list[list]] = {}
    for name in recordings[0]:
        first, second = recordings[0][name], recordings[1][name]
        if [e[:2] for e in first] != [e[:2] for e in second]:
            raise AssertionError(f"{name}: the two shapes' event sequences differ; bytes per element cannot be read")
        events: list[list] = []
        for a, b in zip(first, second, strict=True):
            if a[0] == "free":
                events.append(["free", a[1]])
                continue
            per_unit, rest = divmod((b[2] - a[2]) * UNIT, n2 - n1)
            fixed = a[2] - per_unit * n1 // UNIT
            if rest or fixed < 0 or fixed + per_unit * n2 // UNIT != b[2]:
                raise AssertionError(f"{name} allocation {a[1]}: {a[2]} and {b[2]} bytes are not fixed + a whole "
                                     f"number of bytes per {UNIT} elements")
            events.append(["alloc", a[1], fixed, per_unit])
        out[name] = events
    return out


def record_file(path: str | Path = VERBATIM) -> dict[str, list[list]]:
    """The event sequences of the ``nf4tensor.py`` at ``path`` (torchao 0.1's), per :data:`UNIT` elements."""
    module = _load(Path(path))
    return _per_element([_record_one(module, shape) for shape in SHAPES])


def events_data(path: str | Path = VERBATIM) -> dict[str, Any]:
    """The committed document: the sequences with what recorded them."""
    import torch
    sequences = record_file(path)
    kept = {name: sorted({e[1] for e in events if e[0] == "alloc"} - {e[1] for e in events if e[0] == "free"})
            for name, events in sequences.items()}
    return {
        "about": "Every tensor torchao 0.1's to_nf4 (block_size 64, scaler_block_size 256) and "
                 "NF4Tensor.get_original_weight allocate and free on a bf16 weight, in order: [\"alloc\", id, fixed "
                 f"bytes, bytes per {UNIT} weight elements] or [\"free\", id]. 'kept' lists what each returns (the "
                 "NF4 tensor's pieces; the bf16 weight). Replayed by oomlab.budget.nf4_init.",
        "source": {"package": "torchao 0.1 (PyPI wheel)", "file": "torchao/dtypes/nf4tensor.py",
                   "wheel_record": WHEEL_RECORD, "recorded_copy": "tests/fixtures/torchao-0.1/nf4tensor.py",
                   "recorder": "oomlab.evidence.nf4_events (TorchDispatchMode on CPU, real tensors)",
                   "torch": torch.__version__.split("+")[0], "shapes": [list(s) for s in SHAPES]},
        "unit_elements": UNIT,
        "sequences": sequences,
        "kept": kept,
    }


def render(data: dict[str, Any]) -> str:
    """The document as JSON, one event (or one list of scalars) per line."""
    return re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]",
                  json.dumps(data, indent=1)) + "\n"


def regenerate() -> int:
    write_text_atomic(NF4_EVENTS_JSON, render(events_data()))
    print(f"wrote {NF4_EVENTS_JSON}")
    return 0
