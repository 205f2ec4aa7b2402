"""What a decoder saves for backward, per layer and outside the layers: hand-derived for LLaMA, traced for every other
family.

Every family but LLaMA's (Mistral's within its window included) is inventoried by the one-layer trace of
:mod:`oomlab.budget.layer_trace`: the model's first layers at full width, on fake tensors, each saved storage scaled
in batch and sequence exactly; memoised per (config, regime, LoRA, attention) -- the first call takes about a second.
LLaMA keeps the hand-derived inventory below, as fast as before and the cross-check of the traced one (equal within
0.5 %, tests/budget/test_layer_trace.py).

The hand-derived inventory below was read off the installed transformers (``modeling_llama.py``: RMSNorm upcasts to
fp32 and saves its input and ``rsqrt``; RoPE multiplies by cos/sin, which need no gradient, so only the
rotated q/k are saved, by attention; SDPA saves q, k, v, its output and the fp32 log-sum-exp; eager
attention saves the fp32 softmax probabilities and their cast; SwiGLU saves gate, SiLU and up outputs)
and peft's LoRA layers (the adapter input is cast to the adapter dtype; ``lora_A``'s output is saved
by ``lora_B``).  Autograd only saves what a gradient needs: a frozen linear layer keeps no input.

It is not the GPT formula ``sbh(34 + 5as/h)`` (Korthikanti et al. 2022, eq. 2): LLaMA has no biases or
dropout, an RMSNorm that upcasts, a SwiGLU MLP of width ``i`` and grouped KV heads.  Each term here is
checked against ``torch.autograd.graph.saved_tensors_hooks`` on small models (tests/test_activations.py).

Sizes are bytes per token unless the name says per layer.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from oomlab.budget import states
from oomlab.budget.layer_trace import LayerTrace, Probe, trace_layers
from oomlab.budget.step import StepDTypes
from oomlab.core.choices import FSDP1_STRATEGIES, Attention, Choice, Method, Precision, Strategy
from oomlab.core.memo import BoundedMemo
from oomlab.core.models import Family, ModelSpec
from oomlab.core.setup import TrainingSetup
from oomlab.core.versions import Fact, applies

FP32 = 4  # bytes
HALF = 2
INDEX = 8  # int64 token ids / labels


class Regime(Choice):
    """How weights and compute dtypes combine, which decides every saved tensor's dtype."""

    FP32 = "fp32"  # fp32 weights, fp32 compute
    AUTOCAST = "autocast"  # torch.autocast to half around fp32 (full) or half (LoRA base) weights
    HALF = "half"  # half weights, half compute, no autocast; peft's adapters stay fp32 (a cast per adapter)
    POLICY = "policy"  # FSDP2's MixedPrecisionPolicy: every parameter gathered in half, adapters included


def regime(setup: TrainingSetup) -> Regime:
    """The regime a setup's forward runs in, as its launch sets it up (traces: tests/budget/test_agreement.py).

    ``*-mixed`` under FSDP1 runs half weights (``MixedPrecision``) inside accelerate's autocast: full fine-tuning is
    then the half regime (autocast casts nothing), LoRA the autocast regime (FSDP1 leaves the separately wrapped fp32
    adapters to autocast).  Under FSDP2 the policy gathers every parameter in half.  DeepSpeed casts every parameter
    to half, adapters included, and runs no autocast (deepspeed/runtime/engine.py:1851-1875, constants.py:189): full
    fine-tuning is the half regime, LoRA the policy regime (half adapters, no cast copies).
    """
    return _regime(setup.precision, setup.strategy, setup.method)


@functools.cache
def _regime(precision: Precision, strategy: Strategy, method: Method) -> Regime:
    if precision is Precision.FP32:
        return Regime.FP32
    if precision not in (Precision.FP16_MIXED, Precision.BF16_MIXED):
        return Regime.HALF
    if strategy.deepspeed:
        return Regime.HALF if method is Method.FULL else Regime.POLICY
    if strategy in FSDP1_STRATEGIES:
        return Regime.HALF if method is Method.FULL else Regime.AUTOCAST
    if strategy.fsdp:
        return Regime.POLICY
    return Regime.AUTOCAST


@dataclass(frozen=True)
class SavedTensor:
    """One tensor kept for backward."""

    name: str
    bytes_per_token: int  # scales with micro-batch x sequence
    bytes_fixed: int = 0  # per layer, independent of tokens (autocast weight copies)


def kbit_upcast(setup: TrainingSetup) -> bool:
    """QLoRA with peft's ``prepare_model_for_kbit_training`` upcast under autocast (:func:`.states.kbit_upcast`).

    Traced on CPU (bitsandbytes 0.50.2 NF4, peft 0.21.2, autocast bf16, tests/budget/test_qlora_upcast.py): the fp32
    embedding's output makes the residual stream fp32 (what checkpointing keeps per layer, and RoPE's cos/sin, cast to
    the stream's dtype); bitsandbytes' ``Linear4bit.forward`` returns ``.to(inp_dtype)`` (bitsandbytes/nn/
    modules.py:626-637), so the fp32 norm output makes every projection's output fp32 and the SwiGLU's saved gate,
    SiLU and up tensors fp32; the frozen fp32 LM head's half autocast copy is saved for its input's gradient.
    """
    return setup.method is Method.QLORA and regime(setup) is Regime.AUTOCAST and states.kbit_upcast(setup)


def fp32_base(setup: TrainingSetup) -> bool:
    """LoRA over a base loaded in fp32 (:func:`.states.fp32_loaded_base`) under autocast.

    The fp32 embedding's output makes the residual stream fp32 and the fp32 norms' outputs stay fp32 (as under peft's
    kbit upcast); each frozen projection's ``F.linear`` gets autocast's half casts of its input and weight -- not
    cached, as autocast caches only leaves that require a gradient (aten/src/ATen/autocast_mode.cpp
    ``cached_cast``) -- and ``mm`` keeps the weight's cast for the input's gradient wherever that gradient is needed
    (its input's own cast only when the weight needs one): a half copy of every frozen weight past the first adapter,
    the head's included; the projections' outputs are half.  Measured under FakeTensorMode by the layer trace
    (tests/budget/test_fp32_base.py).
    """
    return (setup.method is Method.LORA and regime(setup) is Regime.AUTOCAST and not setup.strategy.fsdp
            and states.fp32_loaded_base(setup))  # FSDP1 gathers the flat parameters in its half param_dtype


def saves_4bit_input(setup: TrainingSetup) -> bool:
    """QLoRA under bitsandbytes before 0.43.2: ``MatMul4Bit`` keeps every 4-bit projection's input (in the compute
    dtype) whenever it needs a gradient (:attr:`~oomlab.core.versions.Fact.BNB_DROPS_SAVED_INPUT`)."""
    return setup.method is Method.QLORA and not applies(Fact.BNB_DROPS_SAVED_INPUT, setup.versions)


def input_leaf_bytes(setup: TrainingSetup) -> int:
    """QLoRA prepared by peft with checkpointing: the embedding's output and its gradient, held all step.

    ``prepare_model_for_kbit_training(use_gradient_checkpointing=True)`` without ``use_reentrant`` in its kwargs (as
    oomlab's train.py calls it) runs ``enable_input_require_grads`` (peft/utils/other.py:229-233): a forward hook
    calls ``output.requires_grad_(True)`` on the embedding's output, which has no ``grad_fn`` -- a leaf, whose
    gradient autograd accumulates into ``.grad``.  The step's graph (its ``AccumulateGrad`` node) holds the leaf and
    its gradient for as long as the loop keeps the loss (train.py until the next step's loss replaces it), so both
    live through the next step: measured on CPU (tests/budget/test_qlora_upcast.py), ``2 x tokens x h`` in the
    stream's dtype.  NB: a loop that drops the loss after backward (the HF Trainer returns ``loss.detach()``) holds
    only the gradient, and only from the end of backward.
    """
    if not (setup.checkpointing and kbit_upcast(setup)):
        return 0
    return 2 * tokens(setup) * setup.model.hidden_size * stream_bytes(setup)


def stream_bytes(setup: TrainingSetup) -> int:
    """Bytes per element of the residual stream between layers."""
    r = regime(setup)
    if r is Regime.FP32:
        return FP32
    if r is Regime.AUTOCAST and (setup.method is Method.FULL or kbit_upcast(setup) or fp32_base(setup)):
        return FP32  # fp32 embedding output, fp32 + half residual adds promote to fp32
    return HALF


def _lora_members(setup: TrainingSetup) -> set[str]:
    return set(setup.lora_targets) if setup.method is not Method.FULL else set()


def _key(setup: TrainingSetup) -> tuple:
    """What the inventories depend on (hashing the whole setup costs more than building them)."""
    return (setup.model, setup.precision._value_, setup.method._value_, setup.attention._value_, setup.seq,
            setup.lora_rank, setup.lora_targets, kbit_upcast(setup), saves_4bit_input(setup), fp32_base(setup))


_INVENTORIES: BoundedMemo[tuple, tuple[SavedTensor, ...]] = BoundedMemo()


def layer_inventory(setup: TrainingSetup, first: bool = False) -> tuple[SavedTensor, ...]:
    """See :func:`_layer_inventory`; cached on what it depends on."""
    key = ("layer", first, regime(setup), *_key(setup))
    if key not in _INVENTORIES:
        _INVENTORIES[key] = _layer_inventory(setup, first)
    return _INVENTORIES[key]


def _layer_inventory(setup: TrainingSetup, first: bool) -> tuple[SavedTensor, ...]:
    """Tensors one decoder layer saves for backward.

    ``first``: the first layer under LoRA, whose input (the frozen embedding's output) needs no gradient;
    nothing upstream of its first adapter is saved.  Every other layer's input needs a gradient.
    """
    spec, r = setup.model, regime(setup)
    h, i, a = spec.hidden_size, spec.intermediate_size, spec.num_attention_heads
    qd, kvd = spec.q_dim, spec.kv_dim
    s = setup.seq
    full = setup.method is Method.FULL
    lora = _lora_members(setup)
    c = FP32 if r is Regime.FP32 else HALF  # compute dtype of activations
    stream = stream_bytes(setup)
    upcast = kbit_upcast(setup)
    frozen32 = fp32_base(setup)  # frozen fp32 projections: autocast's half weight copies kept for backward
    mlp = FP32 if upcast else c  # Linear4bit hands back its input's dtype: fp32 gate and up under the upcast
    old_bnb = saves_4bit_input(setup)
    rank = setup.lora_rank
    dims = spec.projection_shapes
    out: list[SavedTensor] = []
    grad = full or not first  # does the tensor flowing through here need a gradient?

    def norm(label: str) -> None:
        if not grad:
            return
        out.append(SavedTensor(f"{label}: fp32 input and rsqrt", FP32 * h + FP32))
        if full:  # weight * normed needs normed for the weight's gradient
            out.append(SavedTensor(f"{label}: normalised input", (FP32 if stream == FP32 else HALF) * h))

    def linear_inputs(label: str, members: tuple[str, ...], n_in: int, input_bytes: int, kept: bool) -> bool:
        """Inputs kept by the linear layers and LoRA adapters of one group sharing an input.

        ``kept``: the input tensor is already saved by someone else.  Returns whether the group's
        output needs a gradient.
        """
        if full:
            if r is Regime.AUTOCAST and input_bytes == FP32:
                # autocast casts the fp32 input once per linear (it caches only weights)
                out.append(SavedTensor(f"{label}: half input casts x{len(members)}", len(members) * HALF * n_in))
            elif not kept:
                out.append(SavedTensor(f"{label}: input", input_bytes * n_in))
        if frozen32 and grad:  # mm keeps the weight's half cast for the input's gradient
            copies = sum(n_in * dims[m][1] for m in members)
            out.append(SavedTensor(f"{label}: autocast half copies of the frozen fp32 weights", 0, HALF * copies))
        if old_bnb and grad:  # MatMul4Bit's ctx.tensors = (A, B): A in the compute dtype, once per call
            if input_bytes != HALF:  # Linear4bit casts an fp32 input to the compute dtype: a copy per projection
                out.append(SavedTensor(f"{label}: 4-bit input casts x{len(members)}", len(members) * HALF * n_in))
            else:
                out.append(SavedTensor(f"{label}: 4-bit input (bitsandbytes < 0.43.2)", HALF * n_in))
        targeted = [m for m in members if m in lora]
        for m in targeted:
            n_out = dims[m][1]
            if r in (Regime.FP32, Regime.POLICY):
                if not kept:  # adapters in the input's dtype: the input itself is kept, once
                    out.append(SavedTensor(f"{label}: adapter input", input_bytes * n_in))
                    kept = True
            elif r is Regime.AUTOCAST:  # peft casts to fp32, autocast back to half: a new copy per adapter
                out.append(SavedTensor(f"{m}: adapter input cast", HALF * n_in))
            else:  # peft casts the half input to the fp32 adapter: a copy per adapter
                out.append(SavedTensor(f"{m}: adapter input cast", FP32 * n_in))
            a_out = HALF if r in (Regime.AUTOCAST, Regime.POLICY) else FP32
            # autocast's half copies of B (for lora_A's output gradient) and of A (only when the input
            # itself needs a gradient)
            fixed = HALF * rank * (n_out + (n_in if grad else 0)) if r is Regime.AUTOCAST else 0
            out.append(SavedTensor(f"{m}: lora_A output", a_out * rank, fixed))
        return full or bool(targeted)

    norm_out = FP32 if (r is Regime.FP32 or (r is Regime.AUTOCAST and (full or upcast or frozen32))) else HALF
    norm("input_layernorm")
    grad = linear_inputs("q/k/v", ("q_proj", "k_proj", "v_proj"), h, norm_out, kept=False) or grad
    output_kept = False  # is the attention output (o_proj's input) saved by the attention itself?
    if grad:
        if setup.attention is Attention.SDPA:
            out.append(SavedTensor("sdpa: rotated q, rotated k, v", c * (qd + 2 * kvd)))
            out.append(SavedTensor("sdpa: output", c * qd))
            out.append(SavedTensor("sdpa: log-sum-exp (fp32)", FP32 * a))
            output_kept = True
        else:  # the two matmuls save q, k, the probabilities and v -- not their output
            out.append(SavedTensor("eager: q, repeated k and v", c * 3 * qd))
            probs = FP32 * a * s + (0 if r is Regime.FP32 else HALF * a * s)  # fp32 softmax (+ its cast)
            out.append(SavedTensor("eager: softmax probabilities", probs))
    # o_proj's input is the attention output: SDPA keeps it; after eager attention o_proj (or its adapter) does
    grad = linear_inputs("o_proj", ("o_proj",), qd, c, kept=output_kept) or grad
    norm("post_attention_layernorm")
    gate_grad = grad or "gate_proj" in lora
    up_grad = grad or "up_proj" in lora
    grad = linear_inputs("gate/up", ("gate_proj", "up_proj"), h, norm_out, kept=False) or grad
    # silu(gate) * up: SiLU keeps gate; the product keeps up (for SiLU's gradient) and SiLU's output
    # (for up's gradient) -- each only when that gradient is needed
    kept = (2 if gate_grad else 0) + (1 if up_grad else 0)
    if kept:
        out.append(SavedTensor("mlp: gate, SiLU and up outputs" if kept == 3 else "mlp: part of gate/SiLU/up",
                               kept * mlp * i))
    linear_inputs("down_proj", ("down_proj",), i, mlp, kept=False)  # the SwiGLU product, not kept above
    if r is Regime.AUTOCAST and full:
        out.append(SavedTensor("autocast half copies of the layer's weights", 0, HALF * spec.layer_matmul_params))
    return tuple(out)


def model_inventory(setup: TrainingSetup) -> tuple[SavedTensor, ...]:
    """See :func:`_model_inventory`; cached on what it depends on."""
    key = ("model", regime(setup), *_key(setup))
    if key not in _INVENTORIES:
        _INVENTORIES[key] = _model_inventory(setup)
    return _INVENTORIES[key]


def _model_inventory(setup: TrainingSetup) -> tuple[SavedTensor, ...]:
    """Tensors saved outside the decoder layers: embedding, final norm, LM head and loss."""
    spec, r = setup.model, regime(setup)
    h, v = spec.hidden_size, spec.vocab_size
    full = setup.method is Method.FULL
    out: list[SavedTensor] = []
    if full:
        out.append(SavedTensor("embedding: token ids", INDEX))
    out.append(SavedTensor("final norm: fp32 input and rsqrt", FP32 * h + FP32))
    if full:
        stream = stream_bytes(setup)
        out.append(SavedTensor("final norm: normalised input", (FP32 if stream == FP32 else HALF) * h))
        out.append(SavedTensor("lm_head: input", (FP32 if r is Regime.FP32 else HALF) * h))
        if r is Regime.AUTOCAST:
            out.append(SavedTensor("autocast half copy of lm_head", 0, HALF * v * h))
    elif kbit_upcast(setup) or fp32_base(setup):  # the frozen fp32 head: its half autocast copy, kept for the input
        why = "peft's upcast" if kbit_upcast(setup) else "loaded in fp32"  # gradient
        out.append(SavedTensor(f"autocast half copy of the fp32 lm_head ({why})", 0, HALF * v * h))
    out.append(SavedTensor("loss: fp32 log-softmax of the logits", FP32 * v))
    out.append(SavedTensor("loss: labels", INDEX))
    return tuple(out)


def _hand_rope_bytes(setup: TrainingSetup) -> int:
    """RoPE cos and sin, ``(1, s, head_dim)`` each in the stream dtype, shared by every layer's attention.

    NB: saved only if some attention needs a gradient: always, except a one-layer LoRA model without
    q/k/v adapters.
    """
    qkv = {"q_proj", "k_proj", "v_proj"} & _lora_members(setup)
    if setup.method is not Method.FULL and setup.model.num_hidden_layers == 1 and not qkv:
        return 0
    return 2 * setup.seq * setup.model.head_dim * stream_bytes(setup)


_SUMS: BoundedMemo[int, tuple[tuple[SavedTensor, ...], tuple[int, int]]] = BoundedMemo()


def _sums(inventory: tuple[SavedTensor, ...]) -> tuple[int, int]:
    """(bytes per token, fixed bytes) of an inventory, memoised by identity of the cached tuple.  Each entry keeps its
    tuple alive and is checked to be it: an id is reused once its object is freed (an inventory evicted from
    ``_INVENTORIES``), and a bare id key then returned another inventory's sums."""
    entry = _SUMS.get(id(inventory))
    if entry is None or entry[0] is not inventory:
        entry = (inventory, (sum(t.bytes_per_token for t in inventory), sum(t.bytes_fixed for t in inventory)))
        _SUMS[id(inventory)] = entry
    return entry[1]


def tokens(setup: TrainingSetup) -> int:
    return setup.batch * setup.seq


# ------------------------------------------------------------------------------- which inventory, and the traced one

HAND_DERIVED = frozenset({Family.LLAMA, Family.MISTRAL})  # the layer the inventory above was derived for


def hand_derived(setup: TrainingSetup) -> bool:
    """Is the setup's layer the one the hand-derived inventory describes? LLaMA's, and Mistral's while the sequence
    is shorter than its window (from ``seq >= window`` on transformers materialises a sliding-window mask)."""
    spec = setup.model
    return spec.family in HAND_DERIVED and (spec.sliding_window is None or setup.seq < spec.sliding_window)


def probe(setup: TrainingSetup) -> Probe:
    """The dtypes, LoRA and attention the setup's regime traces one layer with (:mod:`oomlab.budget.layer_trace`)."""
    r, lora = regime(setup), setup.method is not Method.FULL
    half = setup.precision.compute_dtype
    if r is Regime.FP32:
        dtypes = StepDTypes("float32", None, False, None)
    elif r is Regime.AUTOCAST:
        dtypes = StepDTypes(half if lora and not fp32_base(setup) else "float32", half, lora, None)
    elif r is Regime.HALF:
        dtypes = StepDTypes(half, None, lora, None)
    else:  # POLICY: every parameter gathered in half, adapters included
        dtypes = StepDTypes(half, None, False, None)
    window = setup.model.sliding_window
    return Probe(dtypes, setup.lora_rank if lora else 0, setup.lora_targets if lora else (), setup.attention.value,
                 window is not None and setup.seq >= window, setup.batch == 1)


_TRACES: BoundedMemo[tuple, LayerTrace] = BoundedMemo()


def layer_trace(setup: TrainingSetup) -> LayerTrace:
    """The setup's one-layer trace, memoised on what it depends on (QLoRA's frozen 4-bit base saves as LoRA's)."""
    window = setup.model.sliding_window
    key = (setup.model, regime(setup), setup.method is Method.FULL, setup.precision._value_, setup.attention._value_,
           setup.lora_rank, setup.lora_targets, window is not None and setup.seq >= window, setup.batch == 1,
           fp32_base(setup))
    found = _TRACES.get(key)
    if found is None:
        found = _TRACES[key] = trace_layers(setup.model, probe(setup))
    return found


# -------------------------------------------------------------------------------------------------- public figures


def layer_activation_bytes(setup: TrainingSetup) -> int:
    """Bytes one decoder layer keeps for backward (without checkpointing), autocast copies excluded.

    NB: traced families whose layers differ (Gemma-2's sliding and global ones): the mean of the later layers.
    """
    if hand_derived(setup):
        return tokens(setup) * _sums(layer_inventory(setup))[0]
    return layer_trace(setup).mean_layer(setup.batch, setup.seq)


def layer_fixed_bytes(setup: TrainingSetup) -> int:
    """Per-layer bytes kept for backward that do not scale with tokens (autocast weight copies)."""
    if hand_derived(setup):
        return _sums(layer_inventory(setup))[1]
    return layer_trace(setup).mean_layer(setup.batch, setup.seq, fixed=True)


def checkpoint_layer_bytes(setup: TrainingSetup) -> int:
    """With (non-reentrant) checkpointing a layer keeps only its input hidden states."""
    own = hand_derived(setup) or kbit_upcast(setup)  # NB: a traced family under peft's upcast: its fp32 stream
    stream = stream_bytes(setup) if own else layer_trace(setup).stream_bytes
    return tokens(setup) * stream * setup.model.hidden_size


def model_activation_bytes(setup: TrainingSetup) -> int:
    """Saved tensors outside the layers (token-scaled part)."""
    if hand_derived(setup):
        return tokens(setup) * _sums(model_inventory(setup))[0]
    return layer_trace(setup).outside.at(setup.batch, setup.seq, fixed=False)


def model_fixed_bytes(setup: TrainingSetup) -> int:
    if hand_derived(setup):
        return _sums(model_inventory(setup))[1]
    # NB: a traced family under peft's upcast: the fp32 head's half copy added; its fp32 MLP outputs are not traced
    head = HALF * setup.model.vocab_size * setup.model.hidden_size if kbit_upcast(setup) else 0
    return layer_trace(setup).outside.fixed + head


def first_layer_activation_bytes(setup: TrainingSetup) -> int:
    """The first layer's saved bytes: less under LoRA, where its input needs no gradient."""
    if hand_derived(setup):
        return tokens(setup) * _sums(layer_inventory(setup, first=True))[0]
    return layer_trace(setup).first.at(setup.batch, setup.seq, fixed=False)


def rope_bytes(setup: TrainingSetup) -> int:
    """Saved tensors every layer shares, counted once: RoPE's cos and sin (and a materialised attention mask)."""
    if hand_derived(setup):
        return _hand_rope_bytes(setup)
    return layer_trace(setup).shared.at(setup.batch, setup.seq)


def _later_layers_bytes(setup: TrainingSetup) -> int:
    if hand_derived(setup):
        return (setup.model.num_hidden_layers - 1) * layer_activation_bytes(setup)
    return layer_trace(setup).later_layers(setup.batch, setup.seq)


def saved_activation_bytes(setup: TrainingSetup) -> int:
    """Everything saved for backward at the end of the forward pass (token-scaled part)."""
    layers = setup.model.num_hidden_layers
    outside = model_activation_bytes(setup) + rope_bytes(setup)
    if setup.checkpointing:
        return layers * checkpoint_layer_bytes(setup) + outside
    return first_layer_activation_bytes(setup) + _later_layers_bytes(setup) + outside


def softcap_saved_bytes(setup: TrainingSetup) -> int:
    """Gemma-2's final logit soft-capping (``tanh(logits / cap) * cap``, modeling_gemma2.py): tanh saves its
    (tokens x vocab) output, in the logits' dtype, until backward reaches it -- a logits-sized tensor, counted with the
    loss's (the traced inventory has it among the tensors outside the layers)."""
    if getattr(setup.model.resolved, "final_logit_softcapping", None) is None:
        return 0
    return tokens(setup) * setup.model.vocab_size * (FP32 if setup.precision is Precision.FP32 else HALF)


@functools.lru_cache(maxsize=256)
def _autocast_layer_params(spec: ModelSpec) -> int:
    """The layers' parameters autocast casts (summed once per model: the budget asks for every setup)."""
    return sum(layout.autocast_params for layout in spec.layer_layouts)


def autocast_cache_bytes(setup: TrainingSetup) -> int:
    """Half copies of every fp32 weight in autocast's cache at the end of forward (full fine-tuning).

    Held until the outermost ``torch.autocast`` exits, whether or not checkpointing frees the layers'
    saved tensors. What autocast casts is every weight and bias ``F.linear`` receives -- the layers' nn.Linear
    modules, MoE routers, the LM head (the embedding's weight when tied) -- and nothing else: MoE experts run
    ``grouped_mm``, which autocast does not cast (transformers casts the tokens to the experts' dtype instead).
    """
    if regime(setup) is not Regime.AUTOCAST or setup.method is not Method.FULL:
        return 0
    spec = setup.model
    layers = _autocast_layer_params(spec)
    head_bias = spec.lm_head_params - (0 if spec.tie_word_embeddings else spec.embedding_params)
    return HALF * (layers + spec.embedding_params + head_bias)


def autocast_copy_bytes(setup: TrainingSetup) -> int:
    """Half copies of weights autocast made in forward and that backward still needs."""
    if setup.checkpointing:
        return model_fixed_bytes(setup)  # recomputed layers cast again in backward, one at a time
    if not hand_derived(setup):
        trace = layer_trace(setup)
        return trace.first.fixed + trace.later_layers(setup.batch, setup.seq, fixed=True) + trace.outside.fixed
    first = _sums(layer_inventory(setup, first=True))[1]
    return first + (setup.model.num_hidden_layers - 1) * layer_fixed_bytes(setup) + model_fixed_bytes(setup)
