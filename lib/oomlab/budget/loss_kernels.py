"""The fused / chunked cross-entropy kernels that replace transformers' loss: what they allocate instead of the
(tokens × vocab) logits, their fp32 copy, the saved log-softmax and the logits' gradients.

Read from the kernels' sources (no measurement: both are Triton kernels, which do not run on CPU; liger-kernel and
cut-cross-entropy import triton at module load):

**Liger's fused linear cross-entropy** (``setup.loss`` ``liger-flce``), linkedin/Liger-Kernel 0.8.2 at commit
ead96b618e5c67bddc6a6e9bcb99bfe6b5ab661c, ``src/liger_kernel/ops/fused_linear_cross_entropy.py``
(``fused_linear_cross_entropy_forward``):

- :68-69 ``inc_factor = cdiv(V, H)``, ``chunk_size = next_power_of_2(cdiv(BT, inc_factor))``: the rows of one
  chunk (:func:`liger_chunk_rows`; a chunk never exceeds ``BT`` rows, the slice at :111 stops there);
- :72 ``grad_input = zeros_like(_input)``: ``BT × H`` in the final norm output's dtype;
- :77 ``grad_weight = zeros_like(weight)`` when the head is trained (``accum_dtype=None``, what
  ``LigerForCausalLMLoss`` passes): ``V × H`` in the head weight's dtype;
- :86 ``loss_1d``: ``BT`` fp32; :92 ``target_mask``: ``BT`` bools;
- :114 ``logits_chunk = _input_chunk @ weight.t()``: ``chunk × V`` in the compute dtype (under autocast the fp32
  input chunk is cast to half first: ``chunk × H``); the cross-entropy kernel writes the logits' gradient into it in
  place (:212 ``grad_logits_chunk = logits_chunk``): no fp32 copy of the chunk, no separate gradient buffer;
- :231 ``grad_input[...] = grad_logits_chunk @ weight``: a ``chunk × H`` product in the compute dtype, copied in;
- :233-257 the head's gradient: ``addmm(..., out_dtype=float32, out=grad_weight)`` with no temporary where torch >=
  2.8, compute capability >= 8, an fp32 ``grad_weight`` and half logits; otherwise :257
  ``grad_weight += mm(grad_logits_chunk.t(), _input_chunk).float()``: a ``V × H`` product in the compute dtype and
  its fp32 copy;
- :431 ``ctx.save_for_backward(grad_input, grad_weight, ...)``: both held until backward, which only scales them in
  place (``element_mul_kernel``): nothing new is allocated in backward.

The head's input (``lm_head: input``) is no longer saved by an ``nn.Linear`` (Liger's ``lce_forward`` never calls
``lm_head``: ``src/liger_kernel/transformers/model/llama.py`` :118-129), nor is autocast's half copy of the head kept
for backward.

**Cut Cross-Entropy** (``setup.loss`` ``cce``), apple/ml-cross-entropy 25.6.4 at commit
d42911f9b1a1f98289bb601c35c8151562603d74 (axolotl's ``cut_cross_entropy: true`` patches in this kernel):

- ``cut_cross_entropy/cce.py`` :72-73 under autocast ``e.to(half)``, ``c.to(half)``: the embeddings (``BT × H``) and
  the classifier (``V × H``) in the compute dtype, saved for backward (:141, with ``lse``, the targets, the valid
  indices and ``logit_avg``); the classifier's half copy is the same bytes as the autocast copy of the head the
  standard budget already holds (``autocast_copy_bytes``), so it is not counted twice;
- ``cce_lse_forward.py`` :193 ``lse``: ``BT`` fp32; :201 ``logit_avg``: ``V`` fp32 (``filter_eps="auto"``, the
  default, ``cce.py`` :62, :271); ``indexed_neg_dot_forward_kernel``'s ``BT`` fp32 (``cce.py`` :119);
- ``utils.py`` :38 the valid indices: ``BT`` int32; the targets: ``BT`` int64;
- backward: ``cce.py`` :172 ``vocab_ordering`` (``V`` int32); ``cce_backward.py`` :391 ``de = zeros_like(e)``
  (``BT × H``, compute dtype), :394 ``dc = zeros_like(c)`` when the head is trained (``V × H``, compute dtype), and
  their casts back to the caller's dtypes (:516, :519: fp32 ``V × H`` / ``BT × H`` where the head / the embeddings
  were fp32).

**The chunked losses** (``setup.loss`` ``chunked``, ``chunked-compiled``, ``chunked-no-upcast``,
``chunked-loss-compiled``) run plain torch ops over chunks of positions; their bytes were measured on CPU, the
sources' own code run under torch's profiler (tests/budget/test_loss_kernels_chunked.py), and read from:

- torchtune 0.4.0 (tag v0.4.0, commit 03a4b1e41adb62a4b1729c09e6f6b2792b8d7e7e)
  ``torchtune/modules/transformer.py`` :485-504 ``chunked_output``: ``self.output(chunk)`` for each of
  ``last_hidden_state.chunk(num_output_chunks, dim=1)`` (no ``.float()``, which the unchunked path :652 runs);
  ``torchtune/modules/loss/ce_chunked_output_loss.py`` :30 ``num_output_chunks=8``, :41-43
  ``F.cross_entropy(logits.float(), ..., reduction="sum")`` per chunk (:80-81);
  ``recipes/full_finetune_single_device.py`` :287-292 ``training.compile_loss`` when ``compile`` and
  ``set_num_output_chunks``, :639-640 ``del logits`` after the loss; ``torchtune/training/_compile.py`` :80-83
  compiles only ``compute_cross_entropy``.
  Eager (``chunked``): each chunk's ``.float()`` is transient, its fp32 log-softmax saved (``LogSoftmaxBackward``);
  the half chunks are no autograd input of the loss and die at ``del logits``; backward starts with one chunk's
  two fp32 gradients beside every saved log-softmax.  Compiled (``chunked-compiled``; inductor's code for
  ``compute_cross_entropy``, ``TORCH_LOGS=output_code``): forward allocates two ``rows × 1`` fp32 tensors (max and
  log-sum-exp) and saves them with the half chunk itself; backward allocates one ``rows × V`` gradient in the
  chunk's dtype.  Chunks are the largest of ``torch.chunk``: ``batch × ceil(seq / 8)`` rows.
- litgpt 0.4.0 (tag v0.4.0, commit 8ca46d2fa90eb6dcb8b683fc5cbbcbee8508c31e) ``litgpt/lora.py`` :546-548
  ``[self.lm_head(x_i) for x_i in x.split(lm_head_chunk_size, dim=1)]``; ``litgpt/finetune/lora.py`` :287-291
  ``model(input_ids, lm_head_chunk_size=128)``, the loss, then
  ``fabric.backward`` with ``logits`` still bound; ``litgpt/utils.py`` :268-277 ``cross_entropy(logit_chunk, ...,
  reduction="none")`` per chunk with no upcast: the log-softmax in the logits' dtype.  NB: litgpt's scripts run under
  Lightning Fabric, whose ``convert_output`` casts the model's output to fp32 before the loss (Lightning 2.4.0
  fabric/wrappers.py :140-143, plugins/precision/half.py :61-62, bitsandbytes.py :155-156): where the versions name
  litgpt the chunks reach the loss in fp32 (:func:`_logit_bytes`) and :mod:`.frameworks` budgets the rest of its
  loop; the half log-softmax is the loss run on its own.
- axolotl 0.18.0 (tag v0.18.0, commit 2f5cb9da62a0fe763a1ddeb7798fc9acb2f4a417)
  ``src/axolotl/monkeypatch/loss/chunked.py`` :74-79 compiles ``compute_cross_entropy`` (torchtune's, copied: :11,
  :33-35), :93-96 chunks transformers' whole logits (``source.chunk(8, dim=1)``), :127-134 replaces
  ``ForCausalLMLoss``; ``src/axolotl/loaders/patch_manager.py`` :304-311 applies it for ``chunked_cross_entropy``.
  Each compiled chunk saves its view of the logits (the whole logits live until the last chunk's backward); the
  chunk gradients wait in ``chunk``'s backward and are concatenated: two logits-sized gradients at its end.

Not modelled: Liger's ``accum_dtype`` (fp32 accumulators, off by default), ``reduction="none"`` (recomputes in
backward), CCE's ``accum_e_fp32`` / ``accum_c_fp32`` (off by default) and its vocabulary-parallel mode;
torchtune's ``num_output_chunks`` other than 8; litgpt's ``lm_head_chunk_size`` other than 128.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from oomlab.budget import activations as act
from oomlab.budget.activations import FP32, HALF, INDEX, Regime
from oomlab.budget.step_parts import StepTensors
from oomlab.core.choices import Loss, Method, Precision
from oomlab.core.layouts import Family
from oomlab.core.setup import TrainingSetup
from oomlab.core.units import format_size
from oomlab.core.versions import Fact, applies

LIGER = "Liger-Kernel 0.8.2 (linkedin/Liger-Kernel@ead96b6, src/liger_kernel/ops/fused_linear_cross_entropy.py)"
CCE = "cut-cross-entropy 25.6.4 (apple/ml-cross-entropy@d42911f, cut_cross_entropy/cce.py, cce_backward.py)"
TORCHTUNE = ("torchtune 0.4.0 (pytorch/torchtune@03a4b1e, torchtune/modules/loss/ce_chunked_output_loss.py, "
             "modules/transformer.py chunked_output)")
LITGPT = "litgpt 0.4.0 (Lightning-AI/litgpt v0.4.0, litgpt/utils.py chunked_cross_entropy, lora.py lm_head_chunk_size)"
AXOLOTL = "axolotl 0.18.0 (axolotl-ai-cloud/axolotl@2f5cb9d, src/axolotl/monkeypatch/loss/chunked.py)"
OUTPUT_CHUNKS = 8  # torchtune ce_chunked_output_loss.py :30 num_output_chunks=8; axolotl chunked.py :74, :82
LITGPT_CHUNK = 128  # litgpt/finetune/lora.py :287 lm_head_chunk_size=128 (positions per chunk)
ROW_STATS = 2 * FP32  # a compiled chunk's saved max and log-sum-exp per row (inductor's two rows x 1 fp32 buffers)
# the families Liger patches with its fused loss (src/liger_kernel/transformers/monkey_patch.py :3535-3584,
# MODEL_TYPE_TO_APPLY_LIGER_FN at ead96b6), of oomlab's
LIGER_FAMILIES = frozenset({Family.LLAMA, Family.MISTRAL, Family.MIXTRAL, Family.QWEN2, Family.QWEN3,
                            Family.QWEN3_MOE, Family.GEMMA, Family.GEMMA2, Family.PHI3, Family.OLMO2, Family.GPT_OSS})
ADDMM_OUT_DTYPE_TORCH = (2, 8)  # :18 ``_ADDMM_SUPPORTS_OUT_DTYPE = torch >= 2.8.0``
ADDMM_OUT_DTYPE_CC = 8  # :238 ``get_device_capability(...)[0] >= 8``


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else 1


def liger_chunk_rows(tokens: int, vocab: int, hidden: int) -> int:
    """Rows of one Liger chunk (:68-69): ``next_power_of_2(cdiv(BT, cdiv(V, H)))``, at most ``BT`` (the slice
    ``_input[start:end]`` stops at ``BT``).  Liger's own example (:63): BT 16384, V 32000, H 4096 → 2048."""
    inc_factor = -(-vocab // hidden)
    return min(_next_power_of_2(-(-tokens // inc_factor)), tokens)


def _compute(setup: TrainingSetup) -> int:
    return FP32 if setup.precision is Precision.FP32 else HALF


def _head_weight_bytes(setup: TrainingSetup) -> int:
    """Bytes per element of the LM head's weight as the kernel reads it: fp32 where the trained weights are fp32
    (fp32, or torch's mixed precision), half where a policy or DeepSpeed hands it half weights."""
    return FP32 if act.regime(setup) in (Regime.FP32, Regime.AUTOCAST) and setup.method is Method.FULL else HALF


def _head_copy(setup: TrainingSetup) -> int:
    """Autocast's half copy of an fp32 head, which the standard budget keeps for backward (``autocast_copy_bytes``)."""
    r = act.regime(setup)
    fp32_head = setup.method is Method.FULL or act.kbit_upcast(setup) or act.fp32_base(setup)
    return HALF * setup.model.vocab_size * setup.model.hidden_size if r is Regime.AUTOCAST and fp32_head else 0


def _head_input(setup: TrainingSetup) -> int:
    """The ``lm_head: input`` the standard budget counts among the saved activations (full fine-tuning only)."""
    if setup.method is not Method.FULL:
        return 0
    return act.tokens(setup) * setup.model.hidden_size * (FP32 if act.regime(setup) is Regime.FP32 else HALF)


def liger_accumulate_bytes(setup: TrainingSetup) -> int:
    """The head's gradient accumulation temporaries per chunk (:233-257): none on the ``addmm(out_dtype=float32)``
    path, else the ``V × H`` product in the compute dtype and its ``.float()`` copy."""
    if setup.method is not Method.FULL:
        return 0
    vh = setup.model.vocab_size * setup.model.hidden_size
    c = _compute(setup)
    torch = setup.versions.release("torch")
    addmm = (torch is None or torch >= ADDMM_OUT_DTYPE_TORCH) and \
        setup.gpu.compute_capability[0] >= ADDMM_OUT_DTYPE_CC and _head_weight_bytes(setup) == FP32 and c == HALF
    if addmm:
        return 0
    return vh * c + (vh * FP32 if c != FP32 else 0)


def liger_forward_bytes(tokens: int, hidden_size: int, vocab: int, compute: int, input_cast: bool, head_cast: int,
                        accumulate: int) -> int:
    """The forward's largest moment inside Liger's kernel, beyond what it keeps for backward: one chunk's logits
    (``rows × V`` in the compute dtype) with, at its largest, (a) the next chunk's product while the previous chunk is
    still bound (``logits_chunk = _input_chunk @ weight.t()`` rebinds once the product exists: two chunks where there
    is more than one), the input chunk's half cast and the head's per-chunk cast, (b) the ``rows × H`` ``grad_input``
    product, or (c) the accumulation temporaries; plus ``loss_1d`` (fp32) and the target mask (bools).

    Checked by running Liger-Kernel 0.8.2's own function under Triton's CPU interpreter (``TRITON_INTERPRET=1``)
    inside torch's ``MemTracker`` (tests/budget/test_loss_kernels_liger_interpret.py): the forward peak matches to
    the byte with the head trained (accumulation the largest) and frozen (two chunks the largest)."""
    rows = liger_chunk_rows(tokens, vocab, hidden_size)
    chunk = rows * vocab * compute
    cast = rows * hidden_size * compute if input_cast else 0
    matmul = (2 if rows < tokens else 1) * chunk + cast + head_cast
    return max(matmul, chunk + rows * hidden_size * compute, chunk + accumulate) + FP32 * tokens + tokens


def liger_tensors(setup: TrainingSetup, t: StepTensors) -> StepTensors:
    """``t`` with transformers' loss replaced by Liger's fused linear cross-entropy (the terms: module docstring).

    ``logits``: the forward's transient inside the kernel (:func:`liger_forward_bytes`); ``log_softmax``: what it
    saves for backward (``grad_input`` and ``grad_weight``, allocated in forward); no fp32 logits and no backward
    gradients.
    """
    spec, n = setup.model, act.tokens(setup)
    h, v, c = spec.hidden_size, spec.vocab_size, _compute(setup)
    hidden = act.stream_bytes(setup)  # the final norm's output, the kernel's ``_input``
    grad_input = n * h * hidden
    grad_weight = v * h * _head_weight_bytes(setup) if setup.method is Method.FULL else 0
    head_cast = v * h * c if _head_weight_bytes(setup) != c else 0  # ``weight.t()`` is no leaf: cast per chunk
    forward = liger_forward_bytes(n, h, v, c, hidden != c, head_cast, liger_accumulate_bytes(setup))
    return replace(t, layer_activations=t.layer_activations - _head_input(setup),
                   autocast_copies=max(t.autocast_copies - _head_copy(setup), 0), logits=forward, logits_fp32=0,
                   log_softmax=grad_input + grad_weight, loss_grad=0)


def cce_tensors(setup: TrainingSetup, t: StepTensors) -> StepTensors:
    """``t`` with transformers' loss replaced by Cut Cross-Entropy (the terms: module docstring).

    ``logits``: the forward's transients (``lse``, ``logit_avg``, the target logits); ``log_softmax``: what it saves
    (the embeddings in the compute dtype, ``lse``, ``logit_avg``, the targets and valid indices); ``2 × loss_grad``:
    the backward's gradients (``de``, ``dc``, their casts back, ``vocab_ordering``).
    """
    spec, n = setup.model, act.tokens(setup)
    h, v, c = spec.hidden_size, spec.vocab_size, _compute(setup)
    hidden = act.stream_bytes(setup)
    forward = FP32 * n + FP32 * v + FP32 * n
    saved = n * h * c + FP32 * n + FP32 * v + INDEX * n + 4 * n
    trained = setup.method is Method.FULL
    backward = 4 * v + n * h * c + (n * h * FP32 if hidden != c else 0)
    if trained:
        backward += v * h * c + (v * h * FP32 if _head_weight_bytes(setup) != c else 0)
    return replace(t, layer_activations=t.layer_activations - _head_input(setup), logits=forward, logits_fp32=0,
                   log_softmax=saved, loss_grad=-(-backward // 2))


@dataclass(frozen=True)
class ChunkedLossBytes:
    """One chunked loss's bytes in :class:`StepTensors`' terms: ``logits`` and ``logits_fp32`` live at the end of the
    loss's forward only, ``log_softmax`` (what the loss keeps) through the start of backward, where ``2 × loss_grad``
    joins it."""

    logits: int
    logits_fp32: int
    log_softmax: int
    loss_grad: int

    @property
    def forward(self) -> int:
        return self.logits + self.logits_fp32 + self.log_softmax

    @property
    def backward(self) -> int:
        return self.log_softmax + 2 * self.loss_grad


def chunk_tokens(loss: Loss, batch: int, seq: int) -> int:
    """Tokens (rows) of the largest chunk: ``torch.chunk(8, dim=1)``'s ``batch × ceil(seq / 8)`` (torchtune,
    axolotl), litgpt's ``split(128, dim=1)``: ``batch × min(128, seq)``."""
    if loss is Loss.CHUNKED_NO_UPCAST:
        return batch * min(LITGPT_CHUNK, seq)
    return batch * -(-seq // OUTPUT_CHUNKS)


def chunked_loss_bytes(loss: Loss, tokens: int, rows: int, vocab: int, logit: int, loss_dtype: int
                       ) -> ChunkedLossBytes:
    """The chunked loss's bytes for ``tokens`` positions in chunks of at most ``rows``, over ``vocab``; ``logit``:
    bytes per logit as the head returns them; ``loss_dtype``: bytes per element the eager cross-entropy runs in
    (torchtune's ``.float()``: 4; litgpt: the logits', or 4 under autocast).

    - ``chunked``: the half chunks, one chunk's fp32 copy and every chunk's fp32 log-softmax at the last chunk; after
      ``del logits`` the log-softmax alone; backward starts with one chunk's two fp32 gradients.
    - ``chunked-compiled``: the chunks themselves saved with two fp32 numbers per row; one chunk's gradient in
      backward.
    - ``chunked-no-upcast``: the logits (bound by the loop through backward) and every chunk's log-softmax in
      ``loss_dtype`` (with one chunk's cast where that is wider); one chunk's two gradients in backward.
    - ``chunked-loss-compiled``: the whole logits saved as chunk views, two fp32 numbers per row; at the end of the
      chunks' backward every chunk's gradient and their concatenation.
    """
    tv, chunk = tokens * vocab, rows * vocab
    if loss is Loss.CHUNKED:
        return ChunkedLossBytes(logits=logit * tv, logits_fp32=FP32 * chunk if logit != FP32 else 0,
                                log_softmax=FP32 * tv, loss_grad=FP32 * chunk)
    if loss is Loss.CHUNKED_COMPILED:
        return ChunkedLossBytes(0, 0, logit * tv + ROW_STATS * tokens, -(-logit * chunk // 2))
    if loss is Loss.CHUNKED_NO_UPCAST:
        return ChunkedLossBytes(0, loss_dtype * chunk if loss_dtype != logit else 0, (logit + loss_dtype) * tv,
                                loss_dtype * chunk)
    if loss is Loss.CHUNKED_LOSS_COMPILED:
        return ChunkedLossBytes(0, 0, logit * tv + ROW_STATS * tokens, -(-logit * tv // 2))
    raise ValueError(f"loss {loss.value!r} is not chunked; chunked: "
                     f"{', '.join(m.value for m in Loss if m.chunked)}")


def _logit_bytes(setup: TrainingSetup) -> int:
    """Bytes per logit as the loss receives them: the compute dtype; fp32 where transformers before 4.46 upcast them
    in the model's forward (axolotl's loss runs on transformers' head), and litgpt's under Lightning Fabric, whose
    ``convert_output`` casts the model's output to the default dtype (Lightning 2.4.0 fabric/wrappers.py :140-143,
    plugins/precision/half.py :61-62, bitsandbytes.py :155-156)."""
    upcast = setup.loss is Loss.CHUNKED_LOSS_COMPILED and not applies(Fact.LOSS_UPCASTS_LOGITS, setup.versions)
    fabric = setup.loss is Loss.CHUNKED_NO_UPCAST and setup.versions.framework == "litgpt"
    return FP32 if upcast or fabric else _compute(setup)


def chunked_tensors(setup: TrainingSetup, t: StepTensors) -> StepTensors:
    """``t`` with the logits' terms of ``setup.loss``'s chunked loss (:func:`chunked_loss_bytes`); the head's saved
    input and autocast's copies stay as transformers' head has them (the head still runs, chunk by chunk)."""
    logit = _logit_bytes(setup)
    autocast = act.regime(setup) is Regime.AUTOCAST
    loss_dtype = FP32 if setup.loss is Loss.CHUNKED or autocast else logit
    b = chunked_loss_bytes(setup.loss, act.tokens(setup), chunk_tokens(setup.loss, setup.batch, setup.seq),
                           setup.model.vocab_size, logit, loss_dtype)
    return replace(t, logits=b.logits, logits_fp32=b.logits_fp32, log_softmax=b.log_softmax, loss_grad=b.loss_grad)


def loss_tensors(setup: TrainingSetup, t: StepTensors) -> StepTensors:
    """``t`` (transformers' loss) as ``setup.loss`` computes it."""
    if setup.loss is Loss.LIGER_FLCE:
        return liger_tensors(setup, t)
    if setup.loss is Loss.CCE:
        return cce_tensors(setup, t)
    if setup.loss.chunked:
        return chunked_tensors(setup, t)
    return t


def loss_note(setup: TrainingSetup) -> str | None:
    """One line for the budget's notes: which kernel computes the loss and what it allocates, with its source."""
    spec, n = setup.model, act.tokens(setup)
    if setup.loss is Loss.LIGER_FLCE:
        rows = liger_chunk_rows(n, spec.vocab_size, spec.hidden_size)
        chunk = rows * spec.vocab_size * _compute(setup)
        return (f"loss: Liger's fused linear cross-entropy, chunks of {rows} rows × {spec.vocab_size} "
                f"({format_size(chunk)}), no (tokens × vocab) logits ({LIGER}); NB: its other kernels (RMSNorm, "
                "SwiGLU, RoPE, on by default with use_liger_kernel) are budgeted as transformers' own")
    if setup.loss is Loss.CCE:
        return f"loss: Cut Cross-Entropy, blockwise log-sum-exp, no (tokens × vocab) logits ({CCE})"
    if setup.loss.chunked:
        rows = chunk_tokens(setup.loss, setup.batch, setup.seq)
        what, source = CHUNKED_NOTES[setup.loss]
        if setup.loss is Loss.CHUNKED_NO_UPCAST and setup.versions.framework == "litgpt":
            what = ("litgpt's chunked head and chunked_cross_entropy under Lightning Fabric: fp32 logits "
                    "(convert_output) and an fp32 log-softmax, the previous micro-batch's logits held into the next "
                    "forward; litgpt's own model: a separate head (4-bit under QLoRA, NF4 without double "
                    "quantization, PagedAdamW), half adapters (oomlab.budget.frameworks)")
        return f"loss: {what}, chunks of {rows} rows × {spec.vocab_size} ({source})"
    return None


CHUNKED_NOTES = {
    Loss.CHUNKED: ("torchtune's CEWithChunkedOutputLoss, eager: every chunk's fp32 log-softmax kept for backward",
                   TORCHTUNE),
    Loss.CHUNKED_COMPILED: ("torchtune's CEWithChunkedOutputLoss compiled per chunk: the half chunks kept, no fp32 "
                            "logits", TORCHTUNE),
    Loss.CHUNKED_NO_UPCAST: ("litgpt's chunked head and chunked_cross_entropy: the logits and their log-softmax in the "
                             "logits' dtype kept", LITGPT),
    Loss.CHUNKED_LOSS_COMPILED: ("axolotl's chunked_cross_entropy: transformers' whole logits, the loss compiled per "
                                 "chunk", AXOLOTL),
}
