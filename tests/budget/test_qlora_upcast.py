"""QLoRA as peft prepares it (prepare_model_for_kbit_training's fp32 upcast) and the QLoRA terms that depend on the
user's versions: bitsandbytes' saved 4-bit input, MoE experts by transformers release, the logits at the loss."""

from __future__ import annotations

import pytest

from oomlab.budget import activations as act
from oomlab.budget import states
from oomlab.budget.inventory import logits_at_loss
from oomlab.core.setup import make_setup

# llama-7b: h 4,096, i 11,008, V 32,000, 32 layers, 6,738,415,616 parameters; r8 on q and v: 4,194,304 adapters
H, FFN, V, LAYERS, PARAMS, ADAPTERS = 4096, 11008, 32000, 32, 6_738_415_616, 4_194_304
QUANTIZED = LAYERS * (4 * H * H + 3 * H * FFN)
NO_UPCAST = {"peft": "0.3.0"}  # before peft 0.4.0: no prepare_model_for_kbit_training


def qlora(**kw):
    base = dict(model="llama-7b", gpu="a100-80gb", method="qlora", precision="bf16-mixed", seq=512,
                lora_targets="q_proj,v_proj")
    return make_setup(**{**base, **kw})


def test_unquantized_weights_are_fp32_after_the_upcast() -> None:
    """Embedding, norms and LM head in fp32 (4 bytes), the projections at 4.127 bits, adapters fp32."""
    s = qlora()
    assert states.kbit_upcast(s)
    packed = round(QUANTIZED * 4.127 / 8)
    assert states.weight_bytes_total(s) == packed + 4 * (PARAMS - QUANTIZED) + 4 * ADAPTERS
    assert states.weight_bytes_total(qlora(versions=NO_UPCAST)) == packed + 2 * (PARAMS - QUANTIZED) + 4 * ADAPTERS


@pytest.mark.parametrize(("kw", "upcast"), [
    ({}, True),  # one process under autocast: what oomlab's train.py and TRL run
    ({"strategy": "ddp", "gpus": 2}, True),
    ({"strategy": "fsdp", "gpus": 2}, False),  # TRL skips the preparation for sharded QLoRA
    ({"strategy": "zero2", "gpus": 2}, False),  # DeepSpeed casts every parameter back to half
    ({"precision": "bf16"}, False),  # pure half: no autocast (NB: not modelled with the upcast)
    ({"versions": NO_UPCAST}, False),
    ({"versions": {"litgpt": "0.4.0"}}, False),  # litgpt's own model: no peft
    ({"method": "lora"}, False),
])
def test_where_the_upcast_applies(kw: dict, upcast: bool) -> None:
    assert act.kbit_upcast(qlora(**kw)) is upcast


def test_saved_residual_is_fp32_under_the_upcast() -> None:
    """Checkpointing keeps each layer's input: fp32 under the upcast (4 bytes x h per token), half without."""
    s = qlora(checkpointing=True)
    assert act.stream_bytes(s) == 4
    assert act.checkpoint_layer_bytes(s) == 512 * H * 4
    assert act.checkpoint_layer_bytes(qlora(checkpointing=True, versions=NO_UPCAST)) == 512 * H * 2
    # RoPE's cos and sin follow the stream's dtype
    assert act.rope_bytes(s) == 2 * 512 * 128 * 4


def test_swiglu_saved_tensors_are_fp32_under_the_upcast() -> None:
    """Linear4bit returns its fp32 input's dtype: gate, SiLU and up are saved in fp32."""
    mlp = {t.name: t.bytes_per_token for t in act.layer_inventory(qlora())}["mlp: gate, SiLU and up outputs"]
    assert mlp == 3 * 4 * FFN
    half = {t.name: t.bytes_per_token for t in act.layer_inventory(qlora(versions=NO_UPCAST))}
    assert half["mlp: gate, SiLU and up outputs"] == 3 * 2 * FFN


def test_head_half_copy_is_kept_for_backward() -> None:
    """The frozen fp32 head runs under autocast: its half copy is saved for the input's gradient."""
    assert act.model_fixed_bytes(qlora()) == 2 * V * H
    assert act.model_fixed_bytes(qlora(versions=NO_UPCAST)) == 0


def test_input_leaf_held_with_checkpointing() -> None:
    """enable_input_require_grads: the embedding output (an fp32 leaf) and its gradient, 2 x tokens x h x 4."""
    assert act.input_leaf_bytes(qlora(checkpointing=True, batch=2)) == 2 * 1024 * H * 4
    assert act.input_leaf_bytes(qlora(batch=2)) == 0


@pytest.mark.parametrize(("versions", "per_token"), [
    # half stream: q/k/v share the normed input once (2h), o_proj's input (2h), gate/up's (2h), down's (2i)
    ({**NO_UPCAST, "bitsandbytes": "0.43.1"}, 2 * H + 2 * H + 2 * H + 2 * FFN),
    # fp32 stream: Linear4bit casts the fp32 input per projection (3 + 2 copies of 2h), o_proj's half input (2h),
    # down's fp32 product cast (2i)
    ({"bitsandbytes": "0.43.1"}, 3 * 2 * H + 2 * H + 2 * 2 * H + 2 * FFN),
])
def test_old_bitsandbytes_keeps_each_4bit_input(versions: dict, per_token: int) -> None:
    """bitsandbytes < 0.43.2: MatMul4Bit's ctx.tensors = (A, B) keeps the compute-dtype input (commit 9e75374)."""
    old, new = qlora(versions=versions), qlora(versions={**versions, "bitsandbytes": "0.43.2"})
    assert act.layer_activation_bytes(old) - act.layer_activation_bytes(new) == 512 * per_token


def test_moe_experts_by_transformers_version() -> None:
    """Mixtral's experts: nn.Linear quantized to 4 bits in transformers 4.x, 3-D half parameters in 5.x."""
    v4 = make_setup("mixtral-8x7b", gpu="a100-80gb", method="qlora", precision="bf16-mixed",
                    versions={"transformers": "4.46.0", **NO_UPCAST}, gpus=1)
    v5 = v4.with_(versions={"transformers": "5.0.0", **NO_UPCAST})
    experts = 32 * 8 * 3 * 4096 * 14336  # layers x experts x (w1, w2, w3) x h x i
    assert states.quantized_parameters(v4) - states.quantized_parameters(v5) == experts
    assert states.weight_bytes_total(v5) - states.weight_bytes_total(v4) == \
        2 * experts - (round(states.quantized_parameters(v4) * 4.127 / 8)
                       - round(states.quantized_parameters(v5) * 4.127 / 8))
    # under peft's upcast the 3-D experts become fp32 too (prepare_model_for_kbit_training casts every non-4-bit one)
    upcast = v5.with_(versions={"transformers": "5.0.0"})
    assert states.weight_bytes_total(upcast) - states.weight_bytes_total(v5) >= 2 * experts
    assert states.nf4_state_fixed_bytes(v4) - states.nf4_state_fixed_bytes(v5) == 1092 * 32 * 8 * 3


@pytest.mark.parametrize(("transformers", "half", "fp32_copies"), [
    ("5.0.0", 2, 1),  # loss upcasts the returned half logits and shifts the labels
    ("4.48.3", 2, 2),  # ... but shifts the fp32 logits with a contiguous copy
    ("4.45.2", 0, 2),  # forward upcasts: the half logits are freed at once
])
def test_logits_at_the_loss_by_transformers_version(transformers: str, half: int, fp32_copies: int) -> None:
    s = make_setup("llama-7b", gpu="a100-80gb", precision="bf16-mixed", seq=512,
                   versions={"transformers": transformers}, gpus=1)
    tv = 512 * V
    assert logits_at_loss(s, 2 * tv, 4 * tv) == (half * tv, fp32_copies * 4 * tv)


@pytest.mark.heavy
def test_traced_checkpointed_input_is_fp32_on_cpu() -> None:
    """A real tiny QLoRA (bitsandbytes 0.50 NF4 on CPU, peft's preparation as train.py calls it, autocast bf16,
    checkpointing): every tensor saved at the top level -- the checkpointed layer inputs -- is fp32 and h wide."""
    import torch

    from oomlab.budget.step import tiny_setup
    from oomlab.instruments.measured import qlora_model

    setup = tiny_setup(method="qlora", precision="bf16-mixed", checkpointing=True, batch=2, seq=32)
    model = qlora_model(setup)
    assert model.get_base_model().model.embed_tokens.weight.dtype == torch.float32
    saved: list[torch.Tensor] = []
    ids = torch.randint(0, setup.model.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        model(input_ids=ids, labels=ids)
    layer_inputs = [t for t in saved if t.shape == (2, 32, setup.model.hidden_size)]
    assert len(layer_inputs) >= setup.model.num_hidden_layers
    assert {t.dtype for t in layer_inputs} == {torch.float32}


@pytest.mark.parametrize("model", ["granite-3.0-3b-a800m", "gpt-oss-20b"])
def test_experts_stored_3d_in_every_release_are_never_quantized(model: str) -> None:
    """Granite MoE's and gpt-oss's experts are 3-D parameters under transformers 4.x too: QLoRA leaves them in the
    load dtype whatever the release (Mixtral's are nn.Linear before 5.0 and quantized then)."""
    from oomlab.budget.states import experts_quantized

    old = {"transformers": "4.45.0"}
    assert not experts_quantized(make_setup(model=model, gpu="a100-80gb", method="qlora", versions=old, gpus=1))
    assert experts_quantized(make_setup(model="mixtral-8x7b", gpu="a100-80gb", method="qlora", versions=old, gpus=1))
