# ruff: noqa: UP006, UP007, UP035, UP045, B905 -- the sources' code is copied verbatim, typing and all
"""The chunked losses' own code, copied verbatim from the releases :mod:`oomlab.budget.loss_kernels` cites, run on
CPU under torch's profiler (``profile_memory``: every CPU allocation and free, with the allocator's running total),
against :func:`oomlab.budget.loss_kernels.chunked_loss_bytes`.

Each case runs the head over a frozen weight and a hidden state that needs a gradient (the head's own gradient is
the budget's ``gradients``, not the loss's), then the loss, then backward, and reads three moments net of what
existed before: the forward's peak, what is left after forward (the loop's references dropped as each framework
drops them), the backward's peak.  Besides the (tokens × vocab) terms the budget counts, the step holds per-token
bookkeeping (labels and their chunks, int64; per-row scalars; the hidden state's gradient chunks, ``H`` = 8 wide):
it is allowed up to :data:`PER_TOKEN_SLACK` bytes per token, a tenth of one chunk's logits here.

Compiled cases use inductor (a C++ compiler on CPU): what each compiled chunk saves is measured the same way; what
its kernels allocate is read from inductor's generated code (a CPU kernel adds scratch a GPU Triton kernel does not
have, so the compiled peaks are not compared).
"""

from __future__ import annotations

import json
import math
import re
from typing import List, Optional, Union

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from oomlab.budget.api import estimate
from oomlab.budget.inventory import take_inventory
from oomlab.budget.loss_kernels import ROW_STATS, TORCHTUNE, chunk_tokens, chunked_loss_bytes, loss_note
from oomlab.core.choices import Loss
from oomlab.core.setup import make_setup

B, S, H, V = 2, 64, 8, 1000  # 128 tokens; torch.chunk(8) gives chunks of 2 x 8 = 16 rows
T, ROWS = B * S, B * S // 8
PER_TOKEN_SLACK = 80  # bytes per token of bookkeeping beside the (tokens x vocab) terms
# inductor's first import reaches torch.utils.mkldnn, whose torch.jit.script_method warns (torch's own deprecation)
INDUCTOR = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


# ---------------------------------------------------------------------------------------- the sources, verbatim


class CEWithChunkedOutputLoss(torch.nn.Module):
    """torchtune v0.4.0 torchtune/modules/loss/ce_chunked_output_loss.py :13-83 (docstrings cut)."""

    def __init__(self, num_output_chunks: int = 8, ignore_index: int = -100):
        super().__init__()
        self.num_output_chunks = num_output_chunks
        self.ignore_index = ignore_index

    def compute_cross_entropy(
        self, logits: torch.Tensor, labels: torch.Tensor, normalize: bool = True
    ) -> torch.Tensor:
        return F.cross_entropy(
            logits.float(), labels, ignore_index=self.ignore_index, reduction="sum"
        )

    def forward(self, logits: List[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        total_elements = (labels != self.ignore_index).sum()

        # chunk and reshape labels (bsz, num_tokens, vocab) -> [(bsz*num_tokens/num_chunks, vocab)]
        labels = [
            target_chunk.reshape(-1)
            for target_chunk in labels.chunk(self.num_output_chunks, dim=1)
        ]
        # reshape logits [(bsz, num_tokens/num_chunks, vocab)] -> [(bsz*num_tokens/num_chunks, vocab)]
        logits = [
            logit_chunk.reshape(-1, logit_chunk.size(-1)) for logit_chunk in logits
        ]

        # compute one chunk at a time
        total_loss = 0.0
        for logits_chunk, labels_chunk in zip(logits, labels):
            total_loss += self.compute_cross_entropy(logits_chunk, labels_chunk)

        return total_loss / total_elements


def torchtune_chunked_output(output, num_output_chunks: int, last_hidden_state: torch.Tensor) -> List[torch.Tensor]:
    """torchtune v0.4.0 torchtune/modules/transformer.py :485-504 ``TransformerDecoder.chunked_output``."""
    return [
        output(chunk)
        for chunk in last_hidden_state.chunk(num_output_chunks, dim=1)
    ]


def litgpt_chunked_cross_entropy(
    logits: Union[torch.Tensor, List[torch.Tensor]],
    targets: torch.Tensor,
    chunk_size: int = 128,
    ignore_index: int = -100,
) -> torch.Tensor:
    """litgpt v0.4.0 (8ca46d2) litgpt/utils.py :248-277, the list branch (lm_head chunked)."""
    if isinstance(logits, list):
        # don't want to chunk cross entropy
        if chunk_size == 0:
            logits = torch.cat(logits, dim=1)
            logits = logits.reshape(-1, logits.size(-1))
            targets = targets.reshape(-1)
            return torch.nn.functional.cross_entropy(logits, targets, ignore_index=ignore_index)

        # chunk cross entropy
        logit_chunks = [logit_chunk.reshape(-1, logit_chunk.size(-1)) for logit_chunk in logits]
        target_chunks = [target_chunk.reshape(-1) for target_chunk in targets.split(logits[0].size(1), dim=1)]
        loss_chunks = [
            torch.nn.functional.cross_entropy(logit_chunk, target_chunk, ignore_index=ignore_index, reduction="none")
            for logit_chunk, target_chunk in zip(logit_chunks, target_chunks)
        ]
        non_masked_elems = (targets != ignore_index).sum()
        # See [non_masked_elems div note]
        return torch.cat(loss_chunks).sum() / non_masked_elems.maximum(torch.ones_like(non_masked_elems))
    raise NotImplementedError("only the chunked-head branch is copied")


class AxolotlCEWithChunkedOutputLoss(torch.nn.Module):
    """axolotl v0.18.0 (2f5cb9d) src/axolotl/monkeypatch/loss/chunked.py :12-71 (docstrings cut)."""

    def __init__(self, num_output_chunks: int = 8, ignore_index: int = -100):
        super().__init__()
        self.num_output_chunks = num_output_chunks
        self.ignore_index = ignore_index

    def compute_cross_entropy(
        self,
        logits: torch.Tensor,
        labels: torch.Tensor,
        normalize: bool = True,
    ) -> torch.Tensor:
        return F.cross_entropy(
            logits.float(), labels, ignore_index=self.ignore_index, reduction="sum"
        )

    def forward(
        self, logits: List[torch.Tensor], labels: torch.Tensor, reduction="sum"
    ) -> torch.Tensor:
        total_elements = (labels != self.ignore_index).sum()

        # chunk and reshape labels (bsz, num_tokens, vocab) -> [(bsz*num_tokens/num_chunks, vocab)]
        labels = [
            target_chunk.reshape(-1)
            for target_chunk in labels.chunk(self.num_output_chunks, dim=1)
        ]
        # reshape logits [(bsz, num_tokens/num_chunks, vocab)] -> [(bsz*num_tokens/num_chunks, vocab)]
        logits = [
            logit_chunk.reshape(-1, logit_chunk.size(-1)) for logit_chunk in logits
        ]

        # compute one chunk at a time
        total_loss = 0.0
        for logits_chunk, labels_chunk in zip(logits, labels, strict=False):
            total_loss += self.compute_cross_entropy(logits_chunk, labels_chunk)

        if reduction == "sum":
            return total_loss
        return total_loss / total_elements


def axolotl_causal_lm_loss(num_output_chunks: int = 8, ignore_index: int = -100):
    """axolotl v0.18.0 chunked.py :74-124 (``_build_chunked_ce_loss_fn`` and ``get_causal_lm_loss``)."""
    loss_fn_ce = AxolotlCEWithChunkedOutputLoss(num_output_chunks, ignore_index)
    loss_fn_ce.compute_cross_entropy = torch.compile(
        loss_fn_ce.compute_cross_entropy, backend="inductor"
    )

    def chunked_fix_cross_entropy(
        source,
        target,
        num_items_in_batch: int = None,
        ignore_index: int = -100,
        **kwargs,
    ):
        reduction = "sum" if num_items_in_batch is not None else "mean"
        logit_chunks = [
            chunk for chunk in source.chunk(loss_fn_ce.num_output_chunks, dim=1)
        ]
        loss = loss_fn_ce(logit_chunks, target, reduction=reduction)
        if reduction == "sum":
            loss = loss / num_items_in_batch
        return loss

    def for_causal_lm_chunked_loss(
        logits,
        labels,
        vocab_size: int = None,
        num_items_in_batch: Optional[int] = None,
        ignore_index: int = -100,
        shift_labels: Optional[torch.Tensor] = None,
        **kwargs,
    ) -> torch.Tensor:
        # skip the upcast to float since we handle that in the chunking loss
        if shift_labels is None:
            # Shift so that tokens < n predict n
            labels = F.pad(labels, (0, 1), value=ignore_index)
            shift_labels = labels[..., 1:].contiguous()

        # Skip Flattening the tokens
        # Enable model parallelism
        shift_labels = shift_labels.to(logits.device)
        loss = chunked_fix_cross_entropy(
            logits, shift_labels, num_items_in_batch, ignore_index, **kwargs
        )
        return loss

    return for_causal_lm_chunked_loss


# -------------------------------------------------------------------------------------------------- measuring


class _Head(torch.autograd.Function):
    """A frozen head ``F.linear(x, w)`` whose backward hands back a zero input gradient without the matmul: the head's
    own backward is not the loss's (the budget counts it elsewhere), and on CPU a bf16 ``bmm`` allocates a transient
    about twice its incoming gradient (133,760 bytes for a 64,000-byte one) that would sit on top of the loss's."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.shape = x.shape
        return F.linear(x, w)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.new_zeros(ctx.shape), None


def _inputs(dtype: torch.dtype) -> tuple[torch.Tensor, object, torch.Tensor]:
    torch.manual_seed(0)
    hidden = torch.randn(B, S, H, dtype=dtype, requires_grad=True)
    weight = torch.randn(V, H, dtype=dtype)
    return hidden, lambda x: _Head.apply(x, weight), torch.randint(0, V, (B, S))


def _measure(step, tmp_path) -> tuple[int, int, int]:
    """(forward peak, left after forward, backward peak), bytes net of what existed before; ``step()`` returns the
    loss after dropping what the framework's loop drops."""
    trace = tmp_path / "trace.json"
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function("FORWARD"):
            loss = step()
        with record_function("BACKWARD"):
            loss.backward()
        del loss
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    memory = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    spans = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") in ("FORWARD", "BACKWARD")
             and "dur" in e}
    base = memory[0]["args"]["Total Allocated"] - memory[0]["args"]["Bytes"]

    def peak(span: tuple[float, float]) -> int:
        return max(e["args"]["Total Allocated"] for e in memory if span[0] <= e["ts"] <= span[1]) - base

    end = [e["args"]["Total Allocated"] for e in memory if e["ts"] <= spans["FORWARD"][1]][-1] - base
    return peak(spans["FORWARD"]), end, peak(spans["BACKWARD"])


def _close(measured: int, budgeted: int) -> bool:
    return 0 <= measured - budgeted <= PER_TOKEN_SLACK * T


def _torchtune_step(hidden, head, labels, loss_fn):
    def step():
        logits = torchtune_chunked_output(head, loss_fn.num_output_chunks, hidden)
        loss = loss_fn(logits, labels)
        del logits  # full_finetune_single_device.py :639-640 at v0.4.0
        return loss
    return step


# ---------------------------------------------------------------------------------------------------- the tests


def test_chunk_rows_follow_torch_chunk_and_litgpt_split() -> None:
    """torch.chunk(8) of 4,096 positions gives 512 per chunk (4,097 gives 513); litgpt splits at 128."""
    assert chunk_tokens(Loss.CHUNKED, 2, 4096) == 1024
    assert chunk_tokens(Loss.CHUNKED_COMPILED, 1, 4097) == 513  # ceil: the largest chunk
    assert chunk_tokens(Loss.CHUNKED_NO_UPCAST, 2, 512) == 256
    assert chunk_tokens(Loss.CHUNKED_NO_UPCAST, 1, 100) == 100  # one chunk shorter than 128
    assert chunk_tokens(Loss.CHUNKED, B, S) == ROWS


def test_standard_loss_is_refused_by_the_chunked_arithmetic() -> None:
    """Asking the chunked arithmetic about a loss that is not chunked names the chunked ones."""
    with pytest.raises(ValueError, match="loss 'standard' is not chunked; chunked: chunked, chunked-compiled"):
        chunked_loss_bytes(Loss.STANDARD, T, ROWS, V, 2, 4)


@pytest.mark.parametrize("num_chunks", [1, 4, 8, 16])
def test_torchtune_eager_matches_its_budget(num_chunks: int, tmp_path) -> None:
    """torchtune's eager chunked loss (bf16 chunks, .float() per chunk): the three moments as budgeted; one chunk is
    transformers' standard loss over fp32 logits (10 and 12 logits' worth of bf16)."""
    hidden, head, labels = _inputs(torch.bfloat16)
    loss_fn = CEWithChunkedOutputLoss(num_output_chunks=num_chunks)
    forward, end, backward = _measure(_torchtune_step(hidden, head, labels, loss_fn), tmp_path)
    b = chunked_loss_bytes(Loss.CHUNKED, T, T // num_chunks, V, 2, 4)
    assert _close(forward, b.forward), (forward, b.forward)
    assert _close(end, b.log_softmax), (end, b.log_softmax)
    assert _close(backward, b.backward), (backward, b.backward)


def test_litgpt_bf16_true_matches_its_budget(tmp_path) -> None:
    """litgpt's chunked head (16 positions per chunk here, 128 in its scripts) and chunked_cross_entropy in bf16: the
    logits kept by the loop and a bf16 log-softmax per chunk."""
    hidden, head, labels = _inputs(torch.bfloat16)
    chunk = 16
    kept = []

    def step():
        logits = [head(x_i) for x_i in hidden.split(chunk, dim=1)]  # litgpt/lora.py :546-548
        kept.append(logits)  # finetune/lora.py :287-291: `logits` still bound at fabric.backward
        return litgpt_chunked_cross_entropy(logits, labels)

    forward, end, backward = _measure(step, tmp_path)
    b = chunked_loss_bytes(Loss.CHUNKED_NO_UPCAST, T, B * chunk, V, 2, 2)
    assert _close(forward, b.forward), (forward, b.forward)
    assert _close(end, b.log_softmax), (end, b.log_softmax)
    assert _close(backward, b.backward), (backward, b.backward)


@pytest.mark.heavy
@INDUCTOR
def test_torchtune_compiled_keeps_the_half_chunks(tmp_path) -> None:
    """torchtune with compile: True (training.compile_loss compiles compute_cross_entropy): after forward only the
    bf16 chunks and two fp32 numbers per row are held -- no fp32 log-softmax."""
    hidden, head, labels = _inputs(torch.bfloat16)
    loss_fn = CEWithChunkedOutputLoss()
    loss_fn.compute_cross_entropy = torch.compile(loss_fn.compute_cross_entropy, backend="inductor")  # _compile.py
    _torchtune_step(hidden, head, labels, loss_fn)().backward()  # compile outside the measurement
    hidden.grad = None
    _, end, _ = _measure(_torchtune_step(hidden, head, labels, loss_fn), tmp_path)
    b = chunked_loss_bytes(Loss.CHUNKED_COMPILED, T, ROWS, V, 2, 2)
    assert _close(end, b.log_softmax), (end, b.log_softmax)
    assert b.log_softmax == 2 * T * V + ROW_STATS * T


@pytest.mark.heavy
@INDUCTOR
def test_axolotl_compiled_chunks_keep_the_whole_logits(tmp_path) -> None:
    """axolotl's chunked_cross_entropy over transformers' whole bf16 logits: after forward the logits (as the compiled
    chunks' saved views) and two fp32 numbers per row; backward gathers every chunk's gradient and concatenates them."""
    hidden, head, labels = _inputs(torch.bfloat16)
    loss_fn = axolotl_causal_lm_loss()
    loss_fn(head(hidden), labels, num_items_in_batch=T).backward()  # compile outside the measurement
    hidden.grad = None

    def step():
        logits = head(hidden)
        return loss_fn(logits, labels, num_items_in_batch=T)  # the Trainer keeps only the loss

    _, end, backward = _measure(step, tmp_path)
    b = chunked_loss_bytes(Loss.CHUNKED_LOSS_COMPILED, T, ROWS, V, 2, 2)
    assert _close(end, b.log_softmax), (end, b.log_softmax)
    # the peak is the concatenation of the chunk gradients (eager), where the row statistics are already freed
    assert abs(backward - b.backward) <= PER_TOKEN_SLACK * T, (backward, b.backward)


_ALLOC = re.compile(r"empty_strided_cpu\(\(([^)]*)\), \([^)]*\), torch\.(\w+)\)")
_SIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8}


@pytest.mark.heavy
@INDUCTOR
def test_compiled_chunk_kernels_allocate_no_fp32_logits() -> None:
    """Inductor's code for compute_cross_entropy on a bf16 chunk: forward allocates two rows x 1 fp32 buffers and the
    scalar loss; backward one rows x V bf16 gradient and one rows x 1 fp32 buffer -- the budget's row statistics and
    half chunk gradient, no fp32 (rows x vocab) tensor."""
    from torch._inductor.utils import run_and_get_code

    def compute_cross_entropy(logits, labels):  # ce_chunked_output_loss.py :35-43
        return F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum")

    torch._dynamo.reset()
    logits = torch.randn(ROWS, V, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, V, (ROWS,))
    compiled = torch.compile(compute_cross_entropy, backend="inductor")
    _, codes = run_and_get_code(lambda: compiled(logits, labels).backward())
    sizes = []
    for code in codes:
        call = code[code.index("def call("):]
        sizes.append(sorted(math.prod(int(d) for d in dims.split(",") if d.strip()) * _SIZE[dtype]
                            for dims, dtype in _ALLOC.findall(call)))
    forward, backward = sizes
    assert forward == sorted([ROWS * 4, ROWS * 4, 4])  # == ROW_STATS per row, and the loss
    assert backward == sorted([ROWS * 4, ROWS * V * 2])
    assert chunked_loss_bytes(Loss.CHUNKED_COMPILED, T, ROWS, V, 2, 2).loss_grad * 2 == ROWS * V * 2


# ---------------------------------------------------------------------------------------------- in the budget

TUNE = {"model": "llama-3.2-3b", "gpu": "a100-80gb", "gpus": 1, "method": "full", "precision": "bf16", "batch": 2,
        "seq": 4096, "versions": {"torchtune": "0.4.0"}}  # torchtune's README flags table, 128,256-token vocabulary
TOKENS, VOCAB = 2 * 4096, 128256


def test_torchtune_compiled_chunks_in_the_inventory() -> None:
    """Llama-3.2-3B at 2 x 4,096 with chunked-compiled: the bf16 logits (2,101,346,304 bytes) and 65,536 bytes of
    row statistics kept, one 1,024-row bf16 chunk gradient in backward; no fp32 copy."""
    t = take_inventory(make_setup(**TUNE, loss="chunked-compiled")).tensors
    assert (t.logits, t.logits_fp32) == (0, 0)
    assert t.log_softmax == 2 * TOKENS * VOCAB + 8 * TOKENS == 2_101_411_840
    assert 2 * t.loss_grad == 2 * 1024 * VOCAB == 262_668_288


def test_torchtune_eager_chunks_in_the_inventory() -> None:
    """chunked (compile: False): the bf16 logits and one chunk's fp32 copy in forward, every chunk's fp32 log-softmax
    kept, one chunk's two fp32 gradients in backward."""
    t = take_inventory(make_setup(**TUNE, loss="chunked")).tensors
    assert (t.logits, t.logits_fp32) == (2 * TOKENS * VOCAB, 4 * 1024 * VOCAB)
    assert (t.log_softmax, t.loss_grad) == (4 * TOKENS * VOCAB, 4 * 1024 * VOCAB)


@pytest.mark.parametrize("loss", ["chunked", "chunked-compiled", "chunked-no-upcast", "chunked-loss-compiled"])
def test_every_chunked_loss_is_below_the_standard_one(loss: str) -> None:
    """Chunking never adds memory: each chunked loss's forward and backward terms are below transformers' standard
    loss over the same (tokens x vocab), and the budget's peak follows."""
    std = take_inventory(make_setup(**TUNE)).tensors
    t = take_inventory(make_setup(**TUNE, loss=loss)).tensors
    assert t.logits_forward < std.logits_forward and t.loss_backward < std.loss_backward
    assert estimate(**TUNE, loss=loss).allocated_peak_bytes < estimate(**TUNE).allocated_peak_bytes


def test_axolotl_chunks_fp32_logits_before_transformers_4_46() -> None:
    """axolotl's loss runs on transformers' head: before 4.46 the model returns fp32 logits (Fact.LOSS_UPCASTS_LOGITS),
    which the compiled chunks keep instead of half ones."""
    kw = {**TUNE, "precision": "bf16-mixed", "versions": {"transformers": "4.45.2"}, "loss": "chunked-loss-compiled"}
    old = take_inventory(make_setup(**kw)).tensors
    new = take_inventory(make_setup(**{**kw, "versions": {"transformers": "4.46.0"}})).tensors
    assert old.log_softmax - 8 * TOKENS == 4 * TOKENS * VOCAB
    assert new.log_softmax - 8 * TOKENS == 2 * TOKENS * VOCAB


def test_the_note_names_the_chunks_and_the_source() -> None:
    """The budget's note says which chunked loss, the chunk's rows and the release it is read from."""
    note = loss_note(make_setup(**TUNE, loss="chunked-compiled"))
    assert note == ("loss: torchtune's CEWithChunkedOutputLoss compiled per chunk: the half chunks kept, no fp32 "
                    f"logits, chunks of 1024 rows × 128256 ({TORCHTUNE})")
    assert "chunks of 256 rows" in loss_note(make_setup(**{**TUNE, "seq": 512}, loss="chunked-no-upcast"))
