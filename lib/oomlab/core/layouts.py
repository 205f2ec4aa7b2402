"""Decoder-layer layouts: each supported :class:`Family` and the parameters of its decoder layers as transformers
builds them (:class:`LayerLayout`, read off ``transformers/models/<family>/modeling_<family>.py``), from the family's
config object. :mod:`oomlab.core.models` puts them on the model spec; tests check them against the meta-built model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any

from oomlab.core.choices import Choice

# LLaMA's decoder-layer projections, in the order transformers registers them (attention, then MLP).
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ALL_LINEAR = "all-linear"  # peft's shorthand: every nn.Linear of the model but the output layer (lm_head)


class Family(Choice):
    """A decoder-only architecture oomlab budgets; the value is transformers' ``model_type``."""

    LLAMA = "llama"  # Llama 1, 2, 3.x (3.2 1B/3B tie the embeddings): SwiGLU, RMSNorm, RoPE, GQA
    MISTRAL = "mistral"  # LLaMA's layer; v0.1 has a 4,096-token sliding window
    MIXTRAL = "mixtral"  # Mistral's attention, a sparse MoE MLP: 8 SwiGLU experts, top-2
    QWEN2 = "qwen2"  # Qwen2 / Qwen2.5: LLaMA's layer with q/k/v biases
    QWEN2_MOE = "qwen2_moe"  # Qwen1.5-MoE / Qwen2-MoE: routed experts plus a gated shared expert
    QWEN3 = "qwen3"  # LLaMA's layer with per-head RMSNorm on q and k
    QWEN3_MOE = "qwen3_moe"  # Qwen3's attention, routed experts (no shared expert)
    GEMMA = "gemma"  # LLaMA-like, GeGLU, head_dim 256, tied 256k embedding scaled by sqrt(h)
    GEMMA2 = "gemma2"  # four norms per layer, alternating sliding/global attention, logit soft-capping
    PHI = "phi"  # Phi-1.5 / Phi-2: parallel attention + dense GELU MLP, one LayerNorm, partial rotary, biases
    PHI3 = "phi3"  # Phi-3 / Phi-4: fused qkv_proj and gate_up_proj
    GPT_NEOX = "gpt_neox"  # GPT-NeoX / Pythia / StableLM-alpha: fused query_key_value, dense GELU MLP, biases
    STABLELM = "stablelm"  # StableLM 2: LayerNorms with bias, q/k/v biases, partial rotary
    OLMO2 = "olmo2"  # OLMo 2: norms after attention and MLP, RMSNorm over all of q and k
    FALCON = "falcon"  # Falcon: fused query_key_value (multi-query), parallel attention, dense GELU MLP
    GRANITEMOE = "granitemoe"  # Granite 3.x MoE: LLaMA's attention, Mixtral's router and fused experts, tied embedding
    GPT_OSS = "gpt_oss"  # gpt-oss: biased GQA attention with per-head sinks, alternating sliding/full layers, biased
    # router and experts (MXFP4 in the checkpoint, dequantized to bf16 for training)

    @property
    def moe(self) -> bool:
        """Are (some) MLPs mixtures of experts?"""
        return self in (Family.MIXTRAL, Family.QWEN2_MOE, Family.QWEN3_MOE, Family.GRANITEMOE, Family.GPT_OSS)


FAMILY_NAMES = tuple(f.value for f in Family)


@dataclass(frozen=True)
class Projection:
    """One ``nn.Linear`` of a decoder layer."""

    in_features: int
    out_features: int
    bias: bool

    @property
    def params(self) -> int:
        return self.in_features * self.out_features + (self.out_features if self.bias else 0)


@dataclass(frozen=True)
class LayerLayout:
    """One decoder layer's parameters, as transformers builds them."""

    linears: tuple[tuple[str, Projection], ...]  # every nn.Linear, (module name, shape), as registered
    norm_params: int  # RMSNorm / LayerNorm weights and biases, q/k norms included
    router_params: int = 0  # the MoE router's weight (``F.linear`` on a parameter, not an nn.Linear)
    expert_params: int = 0  # the experts' fused 3-D tensors (``gate_up_proj`` E x 2i x h, ``down_proj`` E x h x i)
    experts: int = 0  # experts in the layer (0: a dense MLP)
    experts_per_token: int = 0  # top-k

    # cached: the budget reads these for every layer of every setup it estimates
    @cached_property
    def projections(self) -> Mapping[str, Projection]:
        """The nn.Linear modules by name (what LoRA can target)."""
        return MappingProxyType(dict(self.linears))

    @cached_property
    def linear_weight_params(self) -> int:
        """Weights of the layer's nn.Linear modules (what bitsandbytes quantizes)."""
        return sum(p.in_features * p.out_features for p in self.projections.values())

    @cached_property
    def linear_bias_params(self) -> int:
        return sum(p.out_features for p in self.projections.values() if p.bias)

    @cached_property
    def autocast_params(self) -> int:
        """What autocast casts in the layer: every weight and bias ``F.linear`` receives (nn.Linear and router)."""
        return self.linear_weight_params + self.linear_bias_params + self.router_params

    @cached_property
    def params(self) -> int:
        return (self.linear_weight_params + self.linear_bias_params + self.norm_params + self.router_params
                + self.expert_params)


def _layout(projections: dict[str, tuple[int, int, bool]], norm_params: int, **moe: int) -> LayerLayout:
    return LayerLayout(tuple((k, Projection(*v)) for k, v in projections.items()), norm_params, **moe)


def _attention(cfg: Any, bias_qkv: bool, bias_o: bool, names: tuple[str, ...] = PROJECTIONS[:4]) -> dict:
    h, q, kv = cfg.hidden_size, q_dim_of(cfg), kv_dim_of(cfg)
    return {names[0]: (h, q, bias_qkv), names[1]: (h, kv, bias_qkv), names[2]: (h, kv, bias_qkv),
            names[3]: (q, h, bias_o)}


def _swiglu(h: int, i: int, bias: bool = False, prefix: str = "") -> dict:
    return {f"{prefix}gate_proj": (h, i, bias), f"{prefix}up_proj": (h, i, bias), f"{prefix}down_proj": (i, h, bias)}


def head_dim_of(cfg: Any) -> int:
    return int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)


def kv_heads_of(cfg: Any) -> int:
    """Key (and value) heads as the family's attention builds them: the GQA groups (every head without GQA); Falcon's
    ``num_kv_heads``, but one shared head under multi-query in the old architecture (modeling_falcon.py
    ``FalconAttention.__init__``)."""
    if cfg.model_type == Family.FALCON.value:
        return int(cfg.num_kv_heads) if cfg.new_decoder_architecture or not cfg.multi_query else 1
    return int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)


def q_dim_of(cfg: Any) -> int:
    """Width of the query projection's output: heads x head dimension."""
    return int(cfg.num_attention_heads) * head_dim_of(cfg)


def kv_dim_of(cfg: Any) -> int:
    """Width of the key (and value) projection's output: KV heads x head dimension (Falcon's multi-query: one head)."""
    return kv_heads_of(cfg) * head_dim_of(cfg)


def _sparse(cfg: Any, index: int) -> bool:
    """Qwen-MoE's rule (modeling_qwen2_moe.py ``Qwen2MoeDecoderLayer.__init__``): which layers are sparse."""
    return index not in (cfg.mlp_only_layers or ()) and cfg.num_experts > 0 \
        and (index + 1) % cfg.decoder_sparse_step == 0


def _experts(cfg: Any, moe_i: int) -> dict[str, int]:
    e, h = cfg.num_experts if hasattr(cfg, "num_experts") else cfg.num_local_experts, cfg.hidden_size
    return {"router_params": e * h, "expert_params": e * (2 * moe_i * h + h * moe_i), "experts": e,
            "experts_per_token": cfg.num_experts_per_tok}


def layer_layout(family: Family, cfg: Any, index: int) -> LayerLayout:
    """The parameters of decoder layer ``index`` of a ``family`` model configured by ``cfg`` (a transformers config)."""
    h, hd = cfg.hidden_size, head_dim_of(cfg)
    i = getattr(cfg, "intermediate_size", None)
    f = Family
    if family in (f.LLAMA, f.GEMMA, f.GEMMA2):
        bias = bool(getattr(cfg, "attention_bias", False))
        norms = 4 * h if family is f.GEMMA2 else 2 * h
        return _layout({**_attention(cfg, bias, bias), **_swiglu(h, i, bool(getattr(cfg, "mlp_bias", False)))}, norms)
    if family in (f.MISTRAL, f.MIXTRAL):
        if family is f.MIXTRAL:
            return _layout(_attention(cfg, False, False), 2 * h, **_experts(cfg, i))
        return _layout({**_attention(cfg, False, False), **_swiglu(h, i)}, 2 * h)
    if family is f.QWEN2:
        return _layout({**_attention(cfg, True, False), **_swiglu(h, i)}, 2 * h)
    if family in (f.QWEN3, f.QWEN3_MOE):
        bias = bool(cfg.attention_bias)
        attention = _attention(cfg, bias, bias)
        if family is f.QWEN3_MOE and _sparse(cfg, index):
            return _layout(attention, 2 * h + 2 * hd, **_experts(cfg, cfg.moe_intermediate_size))
        return _layout({**attention, **_swiglu(h, i)}, 2 * h + 2 * hd)
    if family is f.QWEN2_MOE:
        attention = _attention(cfg, bool(cfg.qkv_bias), False)
        if not _sparse(cfg, index):
            return _layout({**attention, **_swiglu(h, i)}, 2 * h)
        shared = {**_swiglu(h, cfg.shared_expert_intermediate_size, prefix="shared_expert."),
                  "shared_expert_gate": (h, 1, False)}
        return _layout({**attention, **shared}, 2 * h, **_experts(cfg, cfg.moe_intermediate_size))
    if family is f.GRANITEMOE:  # modeling_granitemoe.py: GraniteMoeAttention, GraniteMoeTopKRouter, GraniteMoeExperts
        bias = bool(cfg.attention_bias)
        return _layout(_attention(cfg, bias, bias), 2 * h, **_experts(cfg, i))
    if family is f.GPT_OSS:
        # modeling_gpt_oss.py: q/k/v/o with bias (GptOssAttention), sinks (one per head), GptOssTopKRouter's weight and
        # bias, GptOssExperts' gate_up_proj (E x h x 2i) + bias (E x 2i) and down_proj (E x i x h) + bias (E x h).
        # NB: the sinks are counted with the norms (per-layer vectors neither quantized nor LoRA-targeted)
        e, bias = cfg.num_local_experts, bool(cfg.attention_bias)
        moe = _experts(cfg, i)
        moe.update(router_params=moe["router_params"] + e, expert_params=moe["expert_params"] + e * (2 * i + h))
        return _layout(_attention(cfg, bias, bias), 2 * h + cfg.num_attention_heads, **moe)
    if family is f.OLMO2:
        bias = bool(cfg.attention_bias)
        return _layout({**_attention(cfg, bias, bias), **_swiglu(h, i)}, 2 * h + q_dim_of(cfg) + kv_dim_of(cfg))
    if family is f.PHI3:
        q, kv = q_dim_of(cfg), kv_dim_of(cfg)
        return _layout({"qkv_proj": (h, q + 2 * kv, False), "o_proj": (q, h, False), "gate_up_proj": (h, 2 * i, False),
                        "down_proj": (i, h, False)}, 2 * h)
    if family is f.PHI:
        qk_norms = 2 * 2 * (h // cfg.num_attention_heads) if cfg.qk_layernorm else 0
        return _layout({**_attention(cfg, True, True, ("q_proj", "k_proj", "v_proj", "dense")),
                        "fc1": (h, i, True), "fc2": (i, h, True)}, 2 * h + qk_norms)
    if family is f.GPT_NEOX:
        bias = bool(cfg.attention_bias)
        return _layout({"query_key_value": (h, 3 * h, bias), "dense": (h, h, bias), "dense_h_to_4h": (h, i, True),
                        "dense_4h_to_h": (i, h, True)}, 4 * h)
    if family is f.STABLELM:
        norms = 2 * h * (1 if cfg.use_parallel_residual else 2)
        if cfg.qk_layernorm:
            norms += q_dim_of(cfg) + kv_dim_of(cfg)  # per-head LayerNorms without bias
        return _layout({**_attention(cfg, bool(cfg.use_qkv_bias), False), **_swiglu(h, i)}, norms)
    # Falcon (modeling_falcon.py FalconAttention / FalconDecoderLayer); the fused projection's width is
    # q_dim_of + 2 kv_dim_of (FalconAttention refuses h != heads x hd; tests/core/test_models.py checks it)
    if cfg.new_decoder_architecture:
        qkv = (2 * cfg.num_kv_heads + cfg.num_attention_heads) * hd
    elif cfg.multi_query:
        qkv = h + 2 * hd
    else:
        qkv = 3 * h
    two_norms = not cfg.parallel_attn or cfg.num_ln_in_parallel_attn == 2 \
        or (cfg.num_ln_in_parallel_attn is None and cfg.new_decoder_architecture)
    ffn, bias = cfg.ffn_hidden_size, bool(cfg.bias)
    return _layout({"query_key_value": (h, qkv, bias), "dense": (h, h, bias), "dense_h_to_4h": (h, ffn, bias),
                    "dense_4h_to_h": (ffn, h, bias)}, 2 * h * (2 if two_norms else 1))


LAYERNORM_FAMILIES = (Family.PHI, Family.GPT_NEOX, Family.STABLELM, Family.FALCON)  # final norm has a bias
