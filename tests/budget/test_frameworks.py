# ruff: noqa: UP006, UP035, B905 -- the sources' code is copied verbatim, typing and all
"""litgpt's loop under Lightning Fabric (:mod:`oomlab.budget.frameworks`), run on CPU: the chunked head over a 4-bit
weight (bitsandbytes' CPU NF4 kernels, ``MatMul4Bit`` with bitsandbytes 0.42.0's logic), Fabric's ``convert_output``,
litgpt's loss and loop lines, under a counter of live tensor storage -- against :func:`litgpt_loop_bytes`; and the
published litgpt rows' model states from their sources' arithmetic.

The step here: a frozen embedding output plus a trained bias (so that the 4-bit projections' inputs need a gradient,
as past litgpt's first LoRA layer), one 4-bit projection, the 4-bit head in chunks.  Besides the terms the budget
counts it holds the two projections' inputs and outputs (``tokens × h``, counted exactly below) and per-token
bookkeeping (targets, per-row losses, the hidden state's gradient chunks): allowed :data:`SLACK_PER_TOKEN` bytes per
token.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from oomlab.budget.api import estimate
from oomlab.budget.frameworks import (
    NF4_BITS,
    carried_input_bytes,
    litgpt_loop_bytes,
    litgpt_parameters,
    runs_litgpt,
)
from oomlab.budget.inventory import take_inventory
from oomlab.budget.result import MemCategory, Phase
from oomlab.core.setup import make_setup
from tests.budget.test_loss_kernels_chunked import (
    litgpt_chunked_cross_entropy,  # its list branch is unchanged at 00af8b0d
)

F4 = pytest.importorskip("bitsandbytes.functional")

B, S, H, V, CHUNK = 2, 300, 256, 512, 128  # three chunks: 128, 128 and 44 positions
T = B * S
SLACK_PER_TOKEN = 4 * H  # the hidden state's gradient chunks and their concatenation (bf16), targets, row losses


class Live(TorchDispatchMode):
    """Bytes of every storage created under the mode and still alive; the peak since :meth:`reset`."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.cur = self.peak = 0

    def _free(self, key: int) -> None:
        self.cur -= self.live.pop(key, 0)

    def reset(self) -> None:
        self.peak = self.cur

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                if id(st) not in self.live:
                    self.live[id(st)] = st.nbytes()
                    self.cur += st.nbytes()
                    weakref.finalize(st, self._free, id(st))
                    self.peak = max(self.peak, self.cur)
        return out


class MatMul4Bit042(torch.autograd.Function):
    """bitsandbytes 0.42.0 bitsandbytes/autograd/_functions.py :494-548 (the 4-bit path; bias and fp16 checks cut)."""

    @staticmethod
    def forward(ctx, A, B, out=None, bias=None, quant_state=None):
        output = torch.nn.functional.linear(A, F4.dequantize_4bit(B, quant_state).to(A.dtype), bias)  # :516
        ctx.state = quant_state
        if any(ctx.needs_input_grad[:2]):
            ctx.tensors = (A, B)  # :522-523: a ctx attribute, not save_for_backward
        else:
            ctx.tensors = (None, None)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        A, B = ctx.tensors
        grad_A = torch.matmul(grad_output, F4.dequantize_4bit(B, ctx.state).to(grad_output.dtype))  # :546
        return grad_A, None, None, None, None


def _quantized(rows: int, cols: int):
    """Fabric's quantize (Lightning 2.4.0 plugins/precision/bitsandbytes.py :334-341): from fp16, nf4, no double
    quantization."""
    w = (torch.randn(rows, cols) * 0.02).to(torch.half)
    return F4.quantize_4bit(w, blocksize=64, compress_statistics=False, quant_type="nf4")


def _run_loop(mode: Live) -> dict[str, int]:
    torch.manual_seed(0)
    emb = torch.randn(B, S, H, dtype=torch.bfloat16)  # the frozen embedding's output
    bias = torch.zeros(H, dtype=torch.bfloat16, requires_grad=True)  # trained: the 4-bit inputs need a gradient
    proj, proj_state = _quantized(H, H)
    head, head_state = _quantized(V, H)

    def model(idx):
        x0 = emb + bias
        x = MatMul4Bit042.apply(x0, proj, None, None, proj_state)
        out = [MatMul4Bit042.apply(x_i, head, None, None, head_state)
               for x_i in x.split(CHUNK, dim=1)]  # litgpt lora.py :551-553
        return [o.to(torch.get_default_dtype()) for o in out]  # Fabric convert_output with `out` still bound

    targets = torch.randint(0, V, (B, S + 1))
    gc.collect()
    moments = {"base": mode.cur}
    logits = None
    for _ in range(2):
        mode.reset()
        logits = model(targets)  # finetune/lora.py :304: the previous `logits` rebound only now
        moments["forward"] = mode.peak
        mode.reset()
        logits[-1] = logits[-1][..., :-1, :]  # :305 (the view of a 44-position chunk)
        loss = litgpt_chunked_cross_entropy(logits, targets[..., 1:S])  # :307
        moments["loss"] = mode.peak
        mode.reset()
        loss.backward()  # :308
        moments["backward"] = mode.peak
        loss = loss.item()
        gc.collect()
        moments["carried"] = mode.cur
    return {k: v - moments["base"] for k, v in moments.items() if k != "base"}


@pytest.fixture(scope="module")
def measured() -> dict[str, int]:
    mode = Live()
    with mode:
        return _run_loop(mode)


def _close(measured: int, budgeted: int) -> bool:
    """Within the per-token slack above; below by at most the shifted-out position (``B × V``, fp32), which the
    budget counts in full."""
    return budgeted - 4 * B * V <= measured <= budgeted + SLACK_PER_TOKEN * T


ACTS = 2 * T * H * 2  # the projection's output and the bias add's output, bf16, both the 4-bit layers' inputs
b = litgpt_loop_bytes(B, S, V, H, quantized_head=True)


def test_the_loop_carries_the_fp32_logits_and_every_4bit_input(measured) -> None:
    """After backward the loop still binds ``logits``: the fp32 chunks and, through their graph, both 4-bit inputs."""
    assert _close(measured["carried"], b.carried + ACTS), (measured["carried"], b.carried + ACTS)


def test_the_forward_peak_is_the_head_with_the_previous_micro_batch(measured) -> None:
    """The second forward: the previous logits and inputs, this micro-batch's inputs, Fabric's fp32 copies beside the
    half chunks (the largest of the head's moments here)."""
    want = b.carried + ACTS + ACTS + b.head_forward
    assert _close(measured["forward"], want), (measured["forward"], want)


def test_the_loss_holds_fp32_logits_and_an_fp32_log_softmax(measured) -> None:
    """litgpt's loss on Fabric's fp32 chunks: an fp32 log-softmax per chunk, the shifted last chunk's copy."""
    want = ACTS + b.loss_forward
    assert _close(measured["loss"], want), (measured["loss"], want)


def test_the_backward_peak_is_budgeted(measured) -> None:
    """Backward: the loss's chunks or the head's dequantized weight beside every half gradient, whichever is larger."""
    want = ACTS + max(b.loss_backward, b.head_backward)
    assert _close(measured["backward"], want), (measured["backward"], want)


def test_the_quantized_head_dequantizes_in_fp16_then_bf16() -> None:
    """The head's transient is two ``V × h`` copies (fp16 dequantize, bf16 .to): the forward's last chunk."""
    plain = litgpt_loop_bytes(B, S, V, H, quantized_head=False)
    assert b.head_backward - plain.head_backward == 4 * V * H


# ------------------------------------------------------------------------------ the published rows' model states

LITGPT_1B = dict(model="llama-3.2-1b", gpu="a10g", method="qlora", precision="bf16", batch=2, seq=512,
                 lora_rank=32, lora_targets=("q_proj", "v_proj"), loss="chunked-no-upcast",
                 versions={"litgpt": "0.4.13", "bitsandbytes": "0.42.0"})


def test_litgpt_unties_llama_3_2s_head() -> None:
    """Llama-3.2-1B ties its head; litgpt's GPT has a separate one: 1,235,814,400 + 128,256 × 2,048 parameters."""
    setup = make_setup(**LITGPT_1B)
    assert runs_litgpt(setup)
    assert setup.model.num_parameters == 1_235_814_400
    assert litgpt_parameters(setup) == 1_235_814_400 + 128_256 * 2_048


def test_litgpt_qlora_weights_are_nf4_without_double_quantization() -> None:
    """Every layer linear and the head at 4.5 bits, the embedding and norms bf16, the adapters bf16."""
    setup = make_setup(**LITGPT_1B)
    s = take_inventory(setup).states
    L, h, i, kv, V_, r = 16, 2048, 8192, 512, 128_256, 32
    quantized = L * (h * (h + 2 * kv) + h * h + 3 * h * i) + V_ * h
    matrices = L * 5 + 1  # qkv fused, proj, fc_1, fc_2, mlp.proj; the head
    lora = L * r * (3 * h + kv)
    want = round(quantized * NF4_BITS / 8) + 64 * matrices + 2 * (V_ * h + (2 * L + 1) * h) + 2 * lora
    assert s.weights == want
    assert s.gradients == 2 * lora
    assert s.optimizer_state == 8 * L * (h + kv) * r  # PagedAdamW: lora_B (81,920 elements) under 1e5 on device
    assert s.optimizer_temps == 0


def test_the_carried_inputs_follow_the_bitsandbytes_release() -> None:
    """bitsandbytes 0.43.2 dropped the kept input: nothing carried but the logits."""
    kept = make_setup(**LITGPT_1B)
    assert carried_input_bytes(kept) == 1024 * 16 * (3 * 2048 + 8192) * 2
    dropped = make_setup(**{**LITGPT_1B, "versions": {"litgpt": "0.4.13", "bitsandbytes": "0.43.2"}})
    assert carried_input_bytes(dropped) == 0


def test_the_carried_tensors_enter_the_forward_and_the_step() -> None:
    """The previous micro-batch's logits are in the forward's and the optimizer step's totals."""
    r = estimate(**LITGPT_1B)
    carried = 4 * 1024 * 128_256
    assert r.phases[Phase.OPTIMIZER][MemCategory.LOGITS_LOSS] == carried
    assert r.phases[Phase.FORWARD][MemCategory.LOGITS_LOSS] >= carried


# ------------------------------------------------------------------------------------------ torchtune's adapters

TUNE_LORA = dict(model="llama-3.2-3b", gpu="a100-80gb", method="lora", precision="bf16", batch=2, seq=4096,
                 lora_rank=64, lora_targets=("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
                 versions={"torchtune": "0.4.0"})


@pytest.mark.parametrize(("optimizer", "temps"), [("adamw", 1), ("adamw-fused", 0)])
def test_torchtune_adapters_are_bf16(optimizer: str, temps: int) -> None:
    """torchtune's adapters, their gradients and AdamW state in bf16: 8 bytes per adapter parameter (peft: 16); foreach
    AdamW's temporary one bf16 moment."""
    tune = take_inventory(make_setup(**TUNE_LORA, optimizer=optimizer)).states
    peft = take_inventory(make_setup(**{**TUNE_LORA, "versions": {"peft": "0.13.2"}}, optimizer=optimizer)).states
    lora = 28 * 64 * (2 * 3072 + (3072 + 1024) + 2 * 3072 + 3 * (3072 + 8192))  # 89,899,008
    assert (tune.gradients, tune.optimizer_state, tune.optimizer_temps) == (2 * lora, 4 * lora, temps * 2 * lora)
    assert peft.weights - tune.weights == 2 * lora
    assert peft.gradients == 4 * lora
