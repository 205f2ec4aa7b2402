"""What the training frameworks' own steps hold, where they differ from transformers + peft's.  litgpt: its model
states (an untied head, a quantized head, NF4 without double quantization, half adapters, bitsandbytes' paged AdamW)
and the tensors of its loop under Lightning Fabric (the logits in fp32, the previous micro-batch's graph kept into
the next forward).  torchtune: its LoRA adapters in the model's dtype (:func:`torchtune_states`).

Applies where the user's versions name litgpt (``versions.framework == "litgpt"``, :mod:`oomlab.core.versions`) and
the loss is litgpt's chunked head (``setup.loss`` ``chunked-no-upcast``: ``finetune/lora.py``'s
``model(input_ids, lm_head_chunk_size=128)`` with ``chunked_cross_entropy``).  Read from litgpt at commit 00af8b0d
(0.4.13.dev1; the same lines at fd71063c, 0.4.5), Lightning 2.4.0 and bitsandbytes 0.42.0 (the one release litgpt
supported: ``finetune/lora.py`` :132-134):

**Model states.**

- litgpt's ``GPT`` has its own ``lm_head = nn.Linear(n_embd, padded_vocab_size)`` (``litgpt/model.py`` :25) and no
  weight tying; its Llama-3.2 configs (``litgpt/config.py`` :956-972) name none, and the checkpoint conversion copies
  the tied embedding into the head (``scripts/convert_hf_checkpoint.py`` :206-207, :281-282): a tied model carries a
  second ``V × h`` matrix (:func:`litgpt_parameters`).
- ``--quantize bnb.nf4``: Fabric's ``BitsandbytesPrecision.module_init_context`` replaces every ``torch.nn.Linear``
  built under ``fabric.init_module`` with its 4-bit class (``lightning/fabric/plugins/precision/bitsandbytes.py``
  :129-144 at 2.4.0, no ``ignore_modules``): the head is quantized too.  ``nf4`` is ``compress_statistics=False``
  (no double quantization): 4 bits and one fp32 absmax per 64 values, 4.5 bits (:data:`NF4_BITS`), with the 16-value
  code per matrix.  The adapters and the other parameters are in the plugin's dtype (``bf16-true``: bfloat16,
  ``_DtypeContextManager``, :136-137), their gradients too.
- the optimizer under quantization is ``bnb.optim.PagedAdamW`` (``finetune/lora.py`` :206-207,
  ``utils.py`` :546-557 ``instantiate_bnb_optimizer``): 32-bit state (fp32 moments, whatever the parameter's dtype),
  paged -- ``cudaMallocManaged``, which ``max_memory_allocated`` does not count -- for every tensor of at least
  :data:`PAGED_MIN_ELEMENTS` elements (bitsandbytes 0.42.0 ``optim/optimizer.py`` ``get_state_buffer``: ``if not
  self.is_paged or A.numel() < 1e5``); one fused kernel per tensor, no temporary.

**The loop** (``finetune/lora.py`` :304-314 at 00af8b0d):

- Fabric converts the model's output to the default dtype: ``_FabricModule.forward`` runs
  ``output = precision.convert_output(output)`` while the half output is still bound (``lightning/fabric/wrappers.py``
  :140-143), and both ``HalfPrecision`` and ``BitsandbytesPrecision`` convert to ``torch.get_default_dtype()``,
  fp32 (``plugins/precision/half.py`` :61-62, ``bitsandbytes.py`` :155-156): at the end of the forward every half
  chunk and every fp32 chunk are alive at once, and the loss runs on fp32 chunks -- litgpt's loss does no upcast
  itself, so its log-softmax is fp32 under Fabric (``loss_kernels.chunked_tensors``).
- ``logits[-1] = logits[-1][..., :-1, :]`` (:305) and ``chunked_cross_entropy``'s ``reshape`` (``utils.py``
  :305-310): the last chunk's contiguous copy where the batch has more than one row.
- ``logits`` is rebound only when the next forward returns (:304): the fp32 logits of one micro-batch live through
  the next micro-batch's forward, and through the optimizer step between them.  Their ``grad_fn`` keeps the whole
  backward graph alive: under bitsandbytes before 0.43.2, ``MatMul4Bit.forward`` keeps its input as a ``ctx``
  attribute (``ctx.tensors = (A, B)``, ``autograd/_functions.py`` :522-523 at 0.42.0), which backward does not free
  (only ``save_for_backward``'s tensors are released): every 4-bit projection's input whose gradient was needed
  stays too (:func:`carried_input_bytes`).
- the quantized head dequantizes its weight for every chunk, forward and backward: ``dequantize_4bit`` returns the
  dtype the weight was quantized from -- fp16 (Fabric quantizes ``weight.to(torch.half)``, ``bitsandbytes.py``
  :334) -- then ``.to(A.dtype)`` (``_functions.py`` :516, :546): a ``V × h`` fp16 and a ``V × h`` bf16 copy at once.

Measured on CPU (tests/budget/test_frameworks.py): the loop's tensors -- the chunked head with a ``MatMul4Bit``
whose logic is bitsandbytes 0.42.0's, Fabric's conversion, litgpt's loss verbatim -- under a live-storage counter,
against :func:`litgpt_loop_bytes`.

NB: only litgpt's LoRA/QLoRA loop with its chunked head is budgeted (``finetune/full.py``'s unchunked head over fp32
logits is budgeted as transformers' loss); one process (FSDP's and DeepSpeed's phases do not read the carried
tensors).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from oomlab.budget import activations as act
from oomlab.budget import states
from oomlab.budget.loss_kernels import LITGPT_CHUNK
from oomlab.budget.step_parts import ModelStates, StepTensors
from oomlab.core.choices import Loss, Method, Optimizer, Precision
from oomlab.core.setup import TrainingSetup

__all__ = ["LITGPT_SOURCE", "NF4_BITS", "PAGED_MIN_ELEMENTS", "LitgptLoopBytes", "carried_input_bytes",
           "litgpt_loop_bytes", "litgpt_parameters", "litgpt_states", "litgpt_tensors", "loop_budgeted",
           "runs_litgpt", "framework_states", "torchtune_states"]

LITGPT_SOURCE = ("litgpt 00af8b0d (0.4.13.dev1) finetune/lora.py :304-314, lora.py :551-553, utils.py :293-320; "
                 "Lightning 2.4.0 fabric/wrappers.py :140-143, plugins/precision/bitsandbytes.py :129-144, :155-156, "
                 ":334; bitsandbytes 0.42.0 autograd/_functions.py :516-523")
NF4_BITS = 4.5  # bnb.nf4 (compress_statistics=False): 4 bits + one fp32 absmax per 64-value block
NF4_CODE_BYTES = 4 * 16  # the 16-value NF4 code (fp32) each QuantState holds (bitsandbytes 0.42.0 quantize_4bit)
PAGED_MIN_ELEMENTS = 100_000  # bitsandbytes 0.42.0 optim/optimizer.py get_state_buffer: smaller tensors on device
FP32, HALF = 4, 2
QKV = ("q_proj", "k_proj", "v_proj")  # litgpt fuses them into one attn.attn Linear with one lora_A, one lora_B


def runs_litgpt(setup: TrainingSetup) -> bool:
    """Does the user's stack run litgpt (named in the versions)?"""
    return setup.versions.framework == "litgpt"


def _half_true(setup: TrainingSetup) -> bool:
    """Fabric's ``bf16-true`` / ``16-true`` (and the bitsandbytes plugin's dtype): parameters stored in half."""
    return setup.precision in (Precision.BF16, Precision.FP16)


def litgpt_parameters(setup: TrainingSetup) -> int:
    """The base model's parameters as litgpt builds it: a separate head where the checkpoint ties it."""
    spec = setup.model
    return spec.num_parameters + (spec.embedding_params if spec.tie_word_embeddings else 0)


def _adapter_tensors(setup: TrainingSetup) -> list[int]:
    """Element counts of every LoRA tensor litgpt creates in one layer: the fused qkv's ``lora_A`` (``r × k`` rows
    for ``k`` enabled of q, k, v) and ``lora_B`` (their outputs × ``r``), ``lora.py`` :230-242; one ``A`` (``r ×
    in``) and one ``B`` (``out × r``) per other target."""
    dims, r = setup.model.projection_shapes, setup.lora_rank
    fused = [t for t in setup.lora_targets if t in QKV]
    sizes = []
    if fused:
        sizes += [r * len(fused) * dims[fused[0]][0], r * sum(dims[t][1] for t in fused)]
    for t in setup.lora_targets:
        if t not in QKV:
            sizes += [r * dims[t][0], r * dims[t][1]]
    return sizes


def _quantized_matrices(setup: TrainingSetup) -> int:
    """4-bit matrices: each layer's linears (litgpt fuses q, k, v into one) and the head."""
    spec = setup.model
    per_layer = sum(1 for name in spec.projection_shapes if name not in QKV) + 1
    return spec.num_hidden_layers * per_layer + 1


def litgpt_states(setup: TrainingSetup, s: ModelStates) -> ModelStates:
    """``s`` (peft's model states) as litgpt holds them, on one process (module docstring)."""
    if not runs_litgpt(setup) or setup.strategy.fsdp or setup.strategy.deepspeed:
        return s
    spec = setup.model
    base = FP32 if setup.precision is Precision.FP32 else HALF
    params = litgpt_parameters(setup)
    if setup.method is Method.FULL:
        extra = params - spec.num_parameters  # the untied head: its weight, gradient and optimizer state
        per = s.grad_bytes
        moments = 2 if setup.optimizer.adam else 1
        return replace(s, weights=s.weights + base * extra, replica=s.replica + base * extra,
                       gradients=s.gradients + per * extra, optimizer_state=s.optimizer_state + moments * per * extra,
                       optimizer_temps=s.optimizer_temps + (per * extra if s.optimizer_temps else 0))
    adapter = HALF if _half_true(setup) else FP32
    lora = spec.num_hidden_layers * sum(_adapter_tensors(setup))
    if setup.method is Method.QLORA:
        quantized = states.quantized_parameters(setup) + spec.embedding_params  # every layer linear and the head
        weights = round(quantized * NF4_BITS / 8) + NF4_CODE_BYTES * _quantized_matrices(setup) \
            + base * (params - quantized) + adapter * lora
        small = spec.num_hidden_layers * sum(n for n in _adapter_tensors(setup) if n < PAGED_MIN_ELEMENTS)
        optimizer, temps = 2 * FP32 * small, 0  # PagedAdamW: device state only for small tensors, fused
    else:
        weights = base * params + adapter * lora
        moments = 2 if setup.optimizer.adam else 1
        optimizer = 0 if setup.optimizer is Optimizer.ADAMW_8BIT else moments * adapter * lora
        optimizer = optimizer or s.optimizer_state
        temps = adapter * lora if setup.optimizer is Optimizer.ADAMW else 0  # foreach: one state-sized sqrt
    return replace(s, weights=weights, replica=weights, gradients=adapter * lora, grad_bytes=adapter,
                   optimizer_state=optimizer, optimizer_temps=temps)


def torchtune_states(setup: TrainingSetup, s: ModelStates) -> ModelStates:
    """``s`` (peft's fp32 adapters) with torchtune's: its recipes build the model -- ``LoRALinear``'s ``lora_a`` and
    ``lora_b`` ``nn.Linear`` modules included (``torchtune/modules/peft/lora.py`` :91-92 at v0.4.0, :68-69 at v0.1.0)
    -- under ``training.set_default_dtype(self._dtype)`` (``recipes/lora_finetune_single_device.py`` :419-420 at
    v0.4.0; ``utils.set_default_dtype`` :254-255 at v0.1.0): with ``dtype: bf16`` the adapters, their gradients and
    their optimizer state are bf16 (foreach AdamW's temporary one bf16 moment)."""
    if setup.versions.framework != "torchtune" or setup.method is Method.FULL or not _half_true(setup) \
            or setup.strategy.fsdp or setup.strategy.deepspeed:
        return s
    lora = states.lora_parameters(setup)
    narrower = (FP32 - HALF) * lora
    eight_bit = setup.optimizer is Optimizer.ADAMW_8BIT  # its state is 8-bit whatever the parameter's dtype
    return replace(s, weights=s.weights - narrower, replica=s.replica - narrower, gradients=HALF * lora,
                   grad_bytes=HALF, optimizer_state=s.optimizer_state if eight_bit else s.optimizer_state // 2,
                   optimizer_temps=s.optimizer_temps // 2)


def framework_states(setup: TrainingSetup, s: ModelStates) -> ModelStates:
    """``s`` as the framework the versions name holds its model states (litgpt's, torchtune's; else ``s``)."""
    return torchtune_states(setup, litgpt_states(setup, s))


def carried_input_bytes(setup: TrainingSetup) -> int:
    """QLoRA under bitsandbytes before 0.43.2: the inputs ``MatMul4Bit`` keeps on ``ctx`` that outlive backward --
    per layer the fused qkv's (``h``; not the first layer's, whose input needs no gradient), the output projection's
    (``h``), the MLP's shared ``fc_1``/``fc_2`` input (``h``) and ``mlp.proj``'s (``i``); and the head's (``h``):
    ``L (3h + i)`` values per token, in the compute dtype."""
    if not act.saves_4bit_input(setup):
        return 0
    spec = setup.model
    per_token = spec.num_hidden_layers * (3 * spec.hidden_size + spec.intermediate_size)
    return act.tokens(setup) * per_token * (FP32 if setup.precision is Precision.FP32 else HALF)


@dataclass(frozen=True)
class LitgptLoopBytes:
    """The loop's (tokens × vocab) moments under Fabric, beyond the weights and the saved activations.

    ``head_forward``: the model's forward at its largest moment past the last layer (the head's chunks, a quantized
    head's dequantized weight, Fabric's fp32 copies beside the half chunks); ``loss_forward``: the end of the loss (the
    fp32 logits, every chunk's fp32 log-softmax, the last chunk's copy); ``loss_backward``: inside the loss's
    backward (one chunk's two fp32 gradients more); ``head_backward``: inside the head's backward (the fp32 logits
    still bound, every chunk's half gradient, the dequantized weight); ``carried``: what the loop keeps from one
    micro-batch into the next (the fp32 logits)."""

    head_forward: int
    loss_forward: int
    loss_backward: int
    head_backward: int
    carried: int


def litgpt_loop_bytes(batch: int, seq: int, vocab: int, hidden: int, quantized_head: bool,
                      chunk: int = LITGPT_CHUNK) -> LitgptLoopBytes:
    """:class:`LitgptLoopBytes` for ``batch × seq`` positions split into chunks of ``chunk`` (bf16 compute, fp32
    default dtype)."""
    tv = batch * seq * vocab
    last = seq - chunk * ((seq - 1) // chunk)  # the last split's positions
    dequant = (HALF + HALF) * vocab * hidden if quantized_head else 0  # fp16 dequantize + its bf16 .to()
    head = HALF * tv
    if quantized_head:  # the last chunk: the earlier chunks with both copies, or every chunk with the bf16 one
        head = max(HALF * batch * (seq - last) * vocab + dequant, HALF * tv + HALF * vocab * hidden)
    converted = HALF * tv + FP32 * tv  # convert_output: the half list still bound beside the fp32 one
    copy = FP32 * batch * (last - 1) * vocab if batch > 1 else 0  # reshape of the shifted last chunk
    rows = batch * min(chunk, seq)
    loss_forward = FP32 * tv + FP32 * tv + copy
    loss_backward = FP32 * tv + FP32 * tv + 2 * FP32 * rows * vocab
    head_backward = FP32 * tv + HALF * tv + dequant
    return LitgptLoopBytes(head_forward=max(head, converted), loss_forward=loss_forward, loss_backward=loss_backward,
                           head_backward=head_backward, carried=FP32 * tv)


def loop_budgeted(setup: TrainingSetup) -> bool:
    """Is litgpt's LoRA/QLoRA loop with its chunked head budgeted here (one process per replica)?"""
    return (runs_litgpt(setup) and setup.loss is Loss.CHUNKED_NO_UPCAST and setup.method is not Method.FULL
            and not setup.strategy.fsdp and not setup.strategy.deepspeed)


def litgpt_tensors(setup: TrainingSetup, t: StepTensors) -> StepTensors:
    """``t`` with litgpt's loop under Fabric (:func:`litgpt_loop_bytes`, :func:`carried_input_bytes`) where the
    setup runs litgpt's chunked head on one process; else ``t``."""
    if not loop_budgeted(setup):
        return t
    spec = setup.model
    b = litgpt_loop_bytes(setup.batch, setup.seq, spec.vocab_size, spec.hidden_size,
                          setup.method is Method.QLORA)
    inputs = carried_input_bytes(setup)
    head_input = act.tokens(setup) * spec.hidden_size * HALF if inputs else 0  # the 4-bit head's, on ctx
    fp32 = FP32 * act.tokens(setup) * spec.vocab_size
    return replace(t, layer_activations=t.layer_activations + head_input, logits=0,
                   logits_fp32=b.loss_forward - 2 * fp32, log_softmax=2 * fp32,
                   loss_grad=(b.loss_backward - 2 * fp32) // 2, head_forward=b.head_forward,
                   head_backward=b.head_backward, carried_activations=inputs, carried_logits=b.carried)
