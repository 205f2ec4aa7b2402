"""Liger-Kernel's own fused linear cross-entropy run on CPU under Triton's interpreter (``TRITON_INTERPRET=1``),
its allocations tracked by torch's MemTracker, against :func:`oomlab.budget.loss_kernels.liger_forward_bytes` and
the saved ``grad_input`` / ``grad_weight``.

Skipped where liger-kernel and triton are not installed (the project's environment: both are GPU packages).  Run it
in an environment that has them, e.g. a venv seeing the project's packages plus ``pip install --no-deps triton
liger-kernel==0.8.2``::

    TRITON_INTERPRET=1 PYTHONPATH=lib VENV/bin/python -m pytest tests/budget/test_loss_kernels_liger_interpret.py

The interpreter runs the kernels with numpy on CPU tensors; the allocations around them are Liger's Python, the same
code a GPU runs (fused_linear_cross_entropy.py at 0.8.2).  NB: the interpreter keeps the last kernel's arguments
alive, so what is held after forward includes one chunk and ``loss_1d``: only the forward peak is compared.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("triton")
pytest.importorskip("liger_kernel")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 (Triton's CPU interpreter) set before triton is imported",
                allow_module_level=True)

import torch  # noqa: E402
from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402

from oomlab.budget.loss_kernels import liger_forward_bytes  # noqa: E402

BT, H, V = 256, 64, 1000  # 16 rows per chunk (next_power_of_2(cdiv(256, cdiv(1000, 64)))), 16 chunks


def _cpu(snapshot) -> int:
    return sum(d["Total"] for device, d in snapshot.items() if str(device) == "cpu")


@pytest.mark.parametrize("trained", [True, False])
def test_forward_peak_matches_liger_arithmetic(trained: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(BT, H, requires_grad=True)
    w = torch.randn(V, H, requires_grad=trained)
    y = torch.randint(0, V, (BT,))
    inputs = x.nbytes + w.nbytes + y.nbytes  # MemTracker counts the inputs once they are seen
    tracker = MemTracker()
    with tracker:
        loss = LigerFusedLinearCrossEntropyFunction.apply(x, w, y)[0]
        peak = _cpu(tracker.get_tracker_snapshot("peak")) - inputs
    expected = torch.nn.functional.cross_entropy(x @ w.t(), y).item()
    assert loss.detach().item() == pytest.approx(expected, rel=1e-5)
    # fp32 throughout: no casts; the head's gradient accumulated through the V x H torch.mm product (:257)
    accumulate = V * H * 4 if trained else 0
    saved = BT * H * 4 + (V * H * 4 if trained else 0)  # grad_input (:72), grad_weight (:77)
    assert peak == liger_forward_bytes(BT, H, V, 4, False, 0, accumulate) + saved
