"""What a LLaMA-family decoder saves for backward, tensor by tensor, as transformers implements it.

The inventory below was read off the installed transformers (``modeling_llama.py``: RMSNorm upcasts to
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

import enum
from dataclasses import dataclass

from oomlab.core.choices import FSDP1_STRATEGIES, Attention, Method, Precision
from oomlab.core.setup import TrainingSetup

FP32 = 4  # bytes
HALF = 2
INDEX = 8  # int64 token ids / labels


class Regime(enum.Enum):
    """How weights and compute dtypes combine, which decides every saved tensor's dtype."""

    FP32 = "fp32"  # fp32 weights, fp32 compute
    AUTOCAST = "autocast"  # torch.autocast to half around fp32 (full) or half (LoRA base) weights
    HALF = "half"  # half weights, half compute, no autocast; peft's adapters stay fp32 (a cast per adapter)
    POLICY = "policy"  # FSDP2's MixedPrecisionPolicy: every parameter gathered in half, adapters included


def regime(setup: TrainingSetup) -> Regime:
    """The regime a setup's forward runs in, as its launch sets it up (traces: tests/budget/test_agreement.py).

    ``*-mixed`` under FSDP1 runs half weights (``MixedPrecision``) inside accelerate's autocast: full fine-tuning is
    then the half regime (autocast casts nothing), LoRA the autocast regime (FSDP1 leaves the separately wrapped fp32
    adapters to autocast).  Under FSDP2 the policy gathers every parameter in half.
    """
    if setup.precision is Precision.FP32:
        return Regime.FP32
    if setup.precision not in (Precision.FP16_MIXED, Precision.BF16_MIXED):
        return Regime.HALF
    if setup.strategy in FSDP1_STRATEGIES:
        return Regime.HALF if setup.method is Method.FULL else Regime.AUTOCAST
    if setup.strategy.fsdp:
        return Regime.POLICY
    return Regime.AUTOCAST


@dataclass(frozen=True)
class SavedTensor:
    """One tensor kept for backward."""

    name: str
    bytes_per_token: int  # scales with micro-batch x sequence
    bytes_fixed: int = 0  # per layer, independent of tokens (autocast weight copies)


def stream_bytes(setup: TrainingSetup) -> int:
    """Bytes per element of the residual stream between layers."""
    r = regime(setup)
    if r is Regime.FP32:
        return FP32
    if r is Regime.AUTOCAST and setup.method is Method.FULL:
        return FP32  # fp32 embedding output, fp32 + half residual adds promote to fp32
    return HALF


def _lora_members(setup: TrainingSetup) -> set[str]:
    return set(setup.lora_targets) if setup.method is not Method.FULL else set()


def _key(setup: TrainingSetup) -> tuple:
    """What the inventories depend on (hashing the whole setup costs more than building them)."""
    return (setup.model, setup.precision._value_, setup.method._value_, setup.attention._value_, setup.seq,
            setup.lora_rank, setup.lora_targets)


_INVENTORIES: dict[tuple, tuple[SavedTensor, ...]] = {}


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

    norm_out = FP32 if (r is Regime.FP32 or (r is Regime.AUTOCAST and full)) else HALF
    norm("input_layernorm")
    grad = linear_inputs("q/k/v", ("q_proj", "k_proj", "v_proj"), h, norm_out, kept=False) or grad
    if grad:
        if setup.attention is Attention.SDPA:
            out.append(SavedTensor("sdpa: rotated q, rotated k, v", c * (qd + 2 * kvd)))
            out.append(SavedTensor("sdpa: output", c * qd))
            out.append(SavedTensor("sdpa: log-sum-exp (fp32)", FP32 * a))
        else:
            out.append(SavedTensor("eager: q, repeated k and v", c * 3 * qd))
            out.append(SavedTensor("eager: output", c * qd))
            probs = FP32 * a * s + (0 if r is Regime.FP32 else HALF * a * s)  # fp32 softmax (+ its cast)
            out.append(SavedTensor("eager: softmax probabilities", probs))
    # o_proj's input is the attention output, already kept when attention saved anything
    grad = linear_inputs("o_proj", ("o_proj",), qd, c, kept=grad) or grad
    norm("post_attention_layernorm")
    gate_grad = grad or "gate_proj" in lora
    up_grad = grad or "up_proj" in lora
    grad = linear_inputs("gate/up", ("gate_proj", "up_proj"), h, norm_out, kept=False) or grad
    # silu(gate) * up: SiLU keeps gate; the product keeps up (for SiLU's gradient) and SiLU's output
    # (for up's gradient) -- each only when that gradient is needed
    kept = (2 if gate_grad else 0) + (1 if up_grad else 0)
    if kept:
        out.append(SavedTensor("mlp: gate, SiLU and up outputs" if kept == 3 else "mlp: part of gate/SiLU/up",
                               kept * c * i))
    linear_inputs("down_proj", ("down_proj",), i, c, kept=False)  # the SwiGLU product, not kept above
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
    out.append(SavedTensor("loss: fp32 log-softmax of the logits", FP32 * v))
    out.append(SavedTensor("loss: labels", INDEX))
    return tuple(out)


def rope_bytes(setup: TrainingSetup) -> int:
    """RoPE cos and sin, ``(1, s, head_dim)`` each in the stream dtype, shared by every layer's attention.

    NB: saved only if some attention needs a gradient: always, except a one-layer LoRA model without
    q/k/v adapters.
    """
    qkv = {"q_proj", "k_proj", "v_proj"} & _lora_members(setup)
    if setup.method is not Method.FULL and setup.model.num_hidden_layers == 1 and not qkv:
        return 0
    return 2 * setup.seq * setup.model.head_dim * stream_bytes(setup)


_SUMS: dict[tuple, tuple[int, int]] = {}


def _sums(inventory: tuple[SavedTensor, ...]) -> tuple[int, int]:
    """(bytes per token, fixed bytes) of an inventory, memoised by identity of the cached tuple."""
    key = id(inventory)
    if key not in _SUMS:
        _SUMS[key] = (sum(t.bytes_per_token for t in inventory), sum(t.bytes_fixed for t in inventory))
    return _SUMS[key]


def tokens(setup: TrainingSetup) -> int:
    return setup.batch * setup.seq


def layer_activation_bytes(setup: TrainingSetup) -> int:
    """Bytes one decoder layer keeps for backward (without checkpointing), autocast copies excluded."""
    return tokens(setup) * _sums(layer_inventory(setup))[0]


def layer_fixed_bytes(setup: TrainingSetup) -> int:
    """Per-layer bytes kept for backward that do not scale with tokens (autocast weight copies)."""
    return _sums(layer_inventory(setup))[1]


def checkpoint_layer_bytes(setup: TrainingSetup) -> int:
    """With (non-reentrant) checkpointing a layer keeps only its input hidden states."""
    return tokens(setup) * stream_bytes(setup) * setup.model.hidden_size


def model_activation_bytes(setup: TrainingSetup) -> int:
    """Saved tensors outside the layers (token-scaled part)."""
    return tokens(setup) * _sums(model_inventory(setup))[0]


def model_fixed_bytes(setup: TrainingSetup) -> int:
    return _sums(model_inventory(setup))[1]


def first_layer_activation_bytes(setup: TrainingSetup) -> int:
    """The first layer's saved bytes: less under LoRA, where its input needs no gradient."""
    return tokens(setup) * _sums(layer_inventory(setup, first=True))[0]


def saved_activation_bytes(setup: TrainingSetup) -> int:
    """Everything saved for backward at the end of the forward pass (token-scaled part)."""
    layers = setup.model.num_hidden_layers
    outside = model_activation_bytes(setup) + rope_bytes(setup)
    if setup.checkpointing:
        return layers * checkpoint_layer_bytes(setup) + outside
    rest = (layers - 1) * layer_activation_bytes(setup)
    return first_layer_activation_bytes(setup) + rest + outside


def autocast_cache_bytes(setup: TrainingSetup) -> int:
    """Half copies of every fp32 weight in autocast's cache at the end of forward (full fine-tuning).

    Held until the outermost ``torch.autocast`` exits, whether or not checkpointing frees the layers'
    saved tensors.
    """
    if regime(setup) is not Regime.AUTOCAST or setup.method is not Method.FULL:
        return 0
    spec = setup.model
    return HALF * (spec.num_hidden_layers * spec.layer_matmul_params + spec.lm_head_params)


def autocast_copy_bytes(setup: TrainingSetup) -> int:
    """Half copies of weights autocast made in forward and that backward still needs."""
    if setup.checkpointing:
        return model_fixed_bytes(setup)  # recomputed layers cast again in backward, one at a time
    first = _sums(layer_inventory(setup, first=True))[1]
    return first + (setup.model.num_hidden_layers - 1) * layer_fixed_bytes(setup) + model_fixed_bytes(setup)
