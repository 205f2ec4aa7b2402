"""Model and GPU specs load from the shipped JSON; unknown names list the known ones."""

import json
import re

import pytest
import torch

from oomlab.core.dtypes import load_dtype
from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.gpus import known_gpus, load_gpu
from oomlab.core.layouts import kv_dim_of, kv_heads_of, q_dim_of
from oomlab.core.modeling import build_meta_model
from oomlab.core.models import ALL_LINEAR, PROJECTIONS, Family, known_models, load_model, model_from_config
from oomlab.core.setup import make_setup
from oomlab.core.units import format_size

REQUIRED_MODELS = {"llama-7b", "llama-13b", "llama-30b", "llama-65b", "llama-2-7b", "llama-2-13b", "llama-2-70b",
                   "llama-3.1-8b", "mistral-7b"}
REQUIRED_GPUS = {"t4", "v100-16gb", "v100-32gb", "a10g", "l4", "a100-40gb", "a100-80gb", "h100-80gb", "h200"}


def test_shipped_models_and_gpus() -> None:
    """Every model and GPU the issue names is shipped."""
    assert REQUIRED_MODELS <= set(known_models())
    assert REQUIRED_GPUS <= set(known_gpus())


def test_llama_13b_parameter_count() -> None:
    """llama-13b counts 13,015,864,320 parameters, from the shapes and from the meta-built model."""
    spec = load_model("llama-13b")
    model = build_meta_model(spec, load_dtype("float16"))
    assert spec.num_parameters == 13_015_864_320
    assert sum(p.numel() for p in model.parameters()) == 13_015_864_320
    assert {p.device.type for p in model.parameters()} == {"meta"}


@pytest.mark.parametrize("name", sorted(REQUIRED_MODELS))
def test_analytic_count_matches_transformers(name: str) -> None:
    """The spec's parameter count equals the transformers model's, built on meta."""
    spec = load_model(name)
    model = build_meta_model(spec, load_dtype("bf16"))
    assert spec.num_parameters == sum(p.numel() for p in model.parameters())
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_gqa_model_has_fewer_kv_heads() -> None:
    """llama-2-70b uses grouped-query attention with 8 KV heads."""
    spec = load_model("llama-2-70b")
    assert (spec.num_attention_heads, spec.num_key_value_heads) == (64, 8)
    assert spec.num_parameters == 68_976_648_192


def test_local_config_json(tmp_path) -> None:
    """A path to a config.json (or its folder) works like a shipped name."""
    config = dict(load_model("llama-7b").config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_model(str(tmp_path)).num_parameters == 6_738_415_616
    assert load_model(str(tmp_path / "config.json")).hidden_size == 4096


def test_local_config_missing_field(tmp_path) -> None:
    """A config.json without a needed field says which."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    with pytest.raises(InvalidValueError, match="lacks the field 'num_attention_heads'"):
        load_model(str(tmp_path / "config.json"))


def test_unknown_model_lists_known() -> None:
    """An unknown model name lists the shipped ones."""
    with pytest.raises(UnknownNameError, match=r"unknown model 'llama-14b'; known: falcon-7b, .*llama-13b, llama-2-13b",
                       ):
        load_model("llama-14b")


def test_unknown_gpu_lists_known() -> None:
    """An unknown GPU lists the shipped ones."""
    with pytest.raises(UnknownNameError, match=r"^unknown GPU 'h9000'; known: a100-40gb, a100-80gb, a10g, "):
        load_gpu("h9000")


def test_unknown_dtype_lists_known() -> None:
    """An unknown dtype lists names and aliases."""
    with pytest.raises(UnknownNameError, match=r"unknown dtype 'int3'; known: .*float16"):
        load_dtype("int3")


def test_t4_as_torch_reports_it() -> None:
    """The T4: 15360 MiB in nvidia-smi, "14.75 GiB total capacity" in torch, sm_75, no bf16."""
    t4 = load_gpu("t4")
    assert format_size(t4.total_memory_bytes) == "14.75 GiB"
    assert t4.nvidia_smi_total_mib == 15360
    assert t4.compute_capability == (7, 5)
    assert t4.bf16 is False and t4.peak_bf16_flops is None


@pytest.mark.parametrize("name", sorted(REQUIRED_GPUS))
def test_gpu_specs_are_sourced_and_consistent(name: str) -> None:
    """Every figure cites a source; bf16 iff compute capability >= 8.0; torch sees less than nvidia-smi."""
    gpu = load_gpu(name)
    for key in ("total_memory_bytes", "nvidia_smi_total_mib", "compute_capability", "bf16", "peak_fp16_flops",
                "memory_bandwidth_bytes_per_s", "host_link"):
        assert gpu.sources.get(key), f"{name}: no source for {key}"
    assert gpu.bf16 == (gpu.compute_capability >= (8, 0))
    assert (gpu.peak_bf16_flops is None) == (not gpu.bf16)
    assert gpu.total_memory_bytes <= gpu.nvidia_smi_total_mib * 2**20
    assert gpu.peak_fp16_flops > gpu.peak_fp32_flops


# ------------------------------------------------------------------------------------ families (issue 12)

ALL_MODELS = known_models()


@pytest.mark.parametrize("name", ALL_MODELS)
def test_every_shipped_count_matches_transformers(name: str) -> None:
    """Every shipped spec's parameter count equals the meta-built transformers model's sum(p.numel())."""
    spec = load_model(name)
    model = build_meta_model(spec, load_dtype("bf16"))
    assert spec.num_parameters == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ALL_MODELS)
def test_every_shipped_layout_matches_transformers(name: str) -> None:
    """Layer 0's nn.Linear modules (name, shape, bias) and the spec's LoRA targets are the meta-built model's."""
    spec = load_model(name)
    model = build_meta_model(spec, load_dtype("bf16"))
    layer = next(m for m in model.modules() if type(m).__name__ in set(model._no_split_modules))
    linears = {n: m for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)}
    expected = {n.split("mlp.", 1)[-1].split(".", 1)[-1] if n.startswith("self_attn.") or n.startswith("attention.")
                else n: m for n, m in linears.items()}
    shapes = {n.rsplit(".", 1)[-1]: (m.in_features, m.out_features, m.bias is not None) for n, m in expected.items()}
    ours = {n.rsplit(".", 1)[-1]: (p.in_features, p.out_features, p.bias)
            for n, p in spec.layer_layouts[0].projections.items()}
    assert ours == shapes
    every_linear = {n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                    if isinstance(m, torch.nn.Linear) and n != "lm_head"}
    assert set(spec.lora_target_names) == every_linear


def test_shipped_specs_cover_the_families() -> None:
    """At least one shipped spec per family, each citing its source; >= 20 models beyond LLaMA 1/2."""
    specs = [load_model(n) for n in ALL_MODELS]
    assert {s.family for s in specs} == set(Family)
    assert all(s.source and "_source" in s.config for s in specs)
    assert len(specs) >= 20 + len(REQUIRED_MODELS)


def test_gemma2_ties_embeddings_by_default() -> None:
    """Gemma-2's config.json has no tie_word_embeddings: its config class says true, so the embedding counts once."""
    spec = load_model("gemma-2-9b")
    assert "tie_word_embeddings" not in spec.config
    assert spec.tie_word_embeddings is True and spec.lm_head_params == 0
    assert spec.num_parameters == 9_241_705_984


def test_falcon_legacy_aliases() -> None:
    """Falcon's n_head / n_layer are read (transformers 5 would silently default them to 71 heads, 32 layers)."""
    spec = load_model("falcon-7b")
    assert (spec.num_attention_heads, spec.num_hidden_layers, spec.num_key_value_heads) == (71, 32, 1)
    assert spec.tie_word_embeddings is True


def _k_width(spec) -> int:
    """The key projection's output width in the spec's layer layout (fused q/k/v: what the query leaves, halved)."""
    shapes = spec.projection_shapes
    if "k_proj" in shapes:
        return shapes["k_proj"][1]
    fused = shapes["qkv_proj"] if "qkv_proj" in shapes else shapes["query_key_value"]
    return (fused[1] - spec.q_dim) // 2


def test_falcon_kv_dim_is_its_one_shared_head() -> None:
    """falcon-7b is multi-query: the spec's kv_dim and layouts.kv_dim_of agree on one 64-wide head, the width the
    fused query_key_value gives k (not 71 heads x 64 = 4544)."""
    spec = load_model("falcon-7b")
    assert spec.projection_shapes["query_key_value"] == (4544, 4544 + 2 * 64)
    assert spec.kv_dim == kv_dim_of(spec.resolved) == _k_width(spec) == 64
    assert spec.q_dim == q_dim_of(spec.resolved) == 4544


@pytest.mark.parametrize("name", ALL_MODELS)
def test_q_and_kv_dims_are_the_layouts(name: str) -> None:
    """ModelSpec.q_dim / kv_dim are layouts.q_dim_of / kv_dim_of of the config, and the widths the layer's layout
    gives the query and key projections."""
    spec = load_model(name)
    assert (spec.q_dim, spec.kv_dim) == (q_dim_of(spec.resolved), kv_dim_of(spec.resolved))
    assert spec.kv_dim == spec.num_key_value_heads * spec.head_dim == _k_width(spec)
    if "q_proj" in spec.projection_shapes:
        assert spec.projection_shapes["q_proj"][1] == spec.q_dim


@pytest.mark.parametrize(("multi_query", "new_architecture", "extra", "kv_heads"), [
    (True, False, {"num_kv_heads": 2}, 1),  # Falcon-7B: one shared k/v head, whatever num_kv_heads says
    (False, False, {}, 4),  # every head its own k/v
    (False, True, {"num_kv_heads": 2}, 2),  # Falcon-40B's new decoder architecture: num_kv_heads groups
    (True, True, {"num_kv_heads": 2}, 2),  # the new architecture ignores multi_query
])
def test_falcon_kv_heads_match_the_built_attention(multi_query: bool, new_architecture: bool, extra: dict,
                                                   kv_heads: int) -> None:
    """Each Falcon attention layout: the spec's KV heads and dims are what transformers builds (query_key_value's
    width, FalconAttention.num_kv_heads)."""
    spec = model_from_config({"model_type": "falcon", "hidden_size": 128, "num_attention_heads": 4,
                              "num_hidden_layers": 1, "vocab_size": 512, "multi_query": multi_query,
                              "new_decoder_architecture": new_architecture, **extra}, "tiny-falcon")
    attention = build_meta_model(spec, load_dtype("bf16")).transformer.h[0].self_attention
    assert spec.num_key_value_heads == kv_heads_of(spec.resolved) == attention.num_kv_heads == kv_heads
    assert attention.query_key_value.out_features == spec.q_dim + 2 * spec.kv_dim == 128 + 2 * 32 * kv_heads
    assert spec.projection_shapes["query_key_value"][1] == attention.query_key_value.out_features


@pytest.mark.parametrize(("name", "experts", "top_k"), [("mixtral-8x7b", 8, 2), ("qwen1.5-moe-a2.7b", 60, 4),
                                                        ("qwen3-30b-a3b", 128, 8)])
def test_moe_counts_every_expert(name: str, experts: int, top_k: int) -> None:
    """MoE specs keep every expert resident (num_parameters) and count the routed ones as active."""
    spec = load_model(name)
    assert spec.family.moe and (spec.layer.experts, spec.layer.experts_per_token) == (experts, top_k)
    assert spec.active_parameters < spec.num_parameters
    inactive = sum(lay.expert_params * (experts - top_k) // experts for lay in spec.layer_layouts)
    assert spec.num_parameters - spec.active_parameters == inactive


def test_mixtral_weights_are_its_tensors() -> None:
    """Mixtral-8x7B: 46.7 B parameters, ~87 GiB of bf16 tensors (not a dense LLaMA's 13.5 GiB)."""
    assert load_model("mixtral-8x7b").num_parameters == 46_702_792_704


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"model_type": "t5", "d_model": 512, "is_encoder_decoder": True,
          "architectures": ["T5ForConditionalGeneration"]},
         r"is model_type 't5' \(T5ForConditionalGeneration\): an encoder-decoder model\. oomlab budgets decoder-only "
         r"causal LMs of the families llama, mistral, .*; pass a shipped model"),
        ({"model_type": "llava", "text_config": {"model_type": "llama"}, "vision_config": {},
          "architectures": ["LlavaForConditionalGeneration"]},
         r"a vision-language model \(its language model is 'llama': save text_config as a config\.json to budget "
         r"it\); its vision tower is not budgeted"),
        ({"model_type": "my_own_lm", "hidden_size": 64},
         r"model_type 'my_own_lm' \(no architectures listed\): unknown to transformers [0-9.]+; oomlab builds models "
         r"with transformers' own classes only"),
        ({"model_type": "my_own_lm", "auto_map": {"AutoModelForCausalLM": "modeling_mine.MineForCausalLM"}},
         r"custom code \(auto_map: modeling_mine\.MineForCausalLM, which needs trust_remote_code\)"),
        ({"model_type": "bert", "architectures": ["BertForMaskedLM"]}, r"'bert' .*: not a decoder-only causal LM"),
        ({"hidden_size": 64}, r"lacks the field 'model_type' \(it names the transformers config class\)"),
    ],
    ids=["encoder-decoder", "vision-language", "unknown", "trust-remote-code", "encoder", "no-model-type"],
)
def test_unsupported_configs_are_refused(tmp_path, raw: dict, message: str) -> None:
    """Encoder-decoder, vision-language, unknown and custom-code configs are refused, saying what is supported."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(InvalidValueError, match=message):
        load_model(str(path))


@pytest.mark.parametrize(
    ("name", "default", "all_linear"),
    [
        ("llama-7b", ("q_proj", "k_proj", "v_proj", "o_proj"), PROJECTIONS),
        ("gpt-neox-20b", ("query_key_value", "dense"), ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h")),
        ("falcon-7b", ("query_key_value", "dense"), ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h")),
        ("phi-2", ("q_proj", "k_proj", "v_proj", "dense"), ("q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2")),
        ("phi-3-mini-4k", ("qkv_proj", "o_proj"), ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")),
        ("mixtral-8x7b", ("q_proj", "k_proj", "v_proj", "o_proj"), ("q_proj", "k_proj", "v_proj", "o_proj")),
        ("qwen1.5-moe-a2.7b", ("q_proj", "k_proj", "v_proj", "o_proj"), (*PROJECTIONS, "shared_expert_gate")),
    ],
)
def test_lora_targets_per_family(name: str, default: tuple, all_linear: tuple) -> None:
    """LoRA's default means the family's attention projections; all-linear every nn.Linear but lm_head (peft)."""
    setup = make_setup(gpus=1, model=name, gpu="a100-80gb", method="lora")
    assert setup.lora_targets == default
    every = make_setup(gpus=1, model=name, gpu="a100-80gb", method="lora", lora_targets=ALL_LINEAR)
    assert every.lora_targets == all_linear


def test_unknown_lora_target_lists_the_models_own() -> None:
    """A LoRA target the model does not have lists the model's real nn.Linear names."""
    with pytest.raises(UnknownNameError, match=r"^unknown LoRA target module 'q_proj'; known: all-linear, dense, "
                                               r"dense_4h_to_h, dense_h_to_4h, query_key_value \(the nn\.Linear "
                                               r"modules of gpt-neox-20b's gpt_neox layers\)$"):
        make_setup(gpus=1, model="gpt-neox-20b", gpu="a100-80gb", method="lora", lora_targets="q_proj,v_proj")


def test_lora_adapter_count_per_family() -> None:
    """Trainable LoRA parameters are r (in + out) per targeted nn.Linear, as peft builds them."""
    from peft import LoraConfig, get_peft_model

    for name in ("phi-2", "gpt-neox-20b", "qwen1.5-moe-a2.7b"):
        setup = make_setup(gpus=1, model=name, gpu="a100-80gb", method="lora", lora_targets=ALL_LINEAR, lora_rank=4)
        model = get_peft_model(build_meta_model(setup.model, load_dtype("bf16")),
                               LoraConfig(r=4, target_modules=list(setup.lora_targets)))
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        assert setup.model.lora_parameters(4, setup.lora_targets) == trained, name


def test_gemma2_runs_eager_attention() -> None:
    """Gemma-2 has no SDPA in transformers (it cannot soft-cap): its setups run eager; building sdpa is refused."""
    spec = load_model("gemma-2-9b")
    assert spec.attention_implementations() == ("eager",)
    assert make_setup(gpus=1, model="gemma-2-9b", gpu="a100-80gb").attention.value == "eager"
    with pytest.raises(InvalidValueError, match=r"cannot run attention 'sdpa': transformers supports only 'eager' "
                                                r"for it \(SDPA cannot soft-cap attention logits\)"):
        spec.check_attention("sdpa")


# ------------------------------------------------------------------------------------ bad config values (issue 15)

LLAMA_7B = dict(load_model("llama-7b").config)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({**LLAMA_7B, "hidden_size": "abc"}, r": field 'hidden_size' is \"abc\" \(a string\); accepted: a positive "
                                             r"integer up to 131,072$"),
        ({**LLAMA_7B, "hidden_size": "4096"}, r"field 'hidden_size' is \"4096\" \(a string\)"),  # a number as text
        ({**LLAMA_7B, "hidden_size": 0}, r"field 'hidden_size' is 0 \(an integer below 1\); accepted: a positive "
                                         r"integer up to 131,072$"),
        ({**LLAMA_7B, "hidden_size": -4096}, r"field 'hidden_size' is -4096 \(an integer below 1\)"),
        ({**LLAMA_7B, "hidden_size": 4096.5}, r"field 'hidden_size' is 4096.5 \(a fractional number\)"),
        ({**LLAMA_7B, "num_hidden_layers": True}, r"field 'num_hidden_layers' is true \(a boolean\)"),
        ({**LLAMA_7B, "hidden_size": None}, r"field 'hidden_size' is null \(null\); accepted: a positive integer up to "
                                            r"131,072$"),
        ({**LLAMA_7B, "intermediate_size": 0},
         r"field 'intermediate_size' is 0 .*accepted: a positive integer up to 524,288 \(or null, to let the config "
         r"class derive it\)"),
        ({**LLAMA_7B, "vocab_size": -1}, r"field 'vocab_size' is -1"),
        ({**LLAMA_7B, "num_key_value_heads": 3},
         r"num_key_value_heads 3 does not divide num_attention_heads 32; accepted: a divisor of 32 \(1, 2, 4, 8, 16, "
         r"32\)"),
        ({**LLAMA_7B, "num_attention_heads": 7}, r"refused by transformers' llama config class: .*The hidden size "
                                                 r"\(4096\) is not a multiple of the number of attention heads \(7\)"),
        ({k: v for k, v in LLAMA_7B.items() if k != "vocab_size"},
         r"lacks the field 'vocab_size' \(required: hidden_size, num_attention_heads, num_hidden_layers, vocab_size; "
         r"accepted: a positive integer\)"),
        ({**LLAMA_7B, "model_type": 5}, r"field 'model_type' is 5; accepted: a transformers model type string, one "
                                        r"of llama, mistral"),
        ([LLAMA_7B], r"must be a JSON object of config fields \(\{\"model_type\": \"llama\", \"hidden_size\": 4096, "
                     r"\.\.\.\}\); got a list$"),
        ("llama", r"must be a JSON object of config fields .*; got a a string|must be a JSON object"),
    ],
    ids=["string", "number-as-string", "zero", "negative", "fraction", "boolean", "null", "zero-mlp",
         "negative-vocab", "kv-heads", "heads", "missing", "model-type", "list", "string-document"],
)
def test_bad_config_values_are_named(tmp_path, raw, message: str) -> None:
    """A config.json with a bad value names the field, the value and what is accepted (InvalidValueError)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(InvalidValueError, match=message):
        load_model(str(path))


def test_invalid_json_is_named(tmp_path) -> None:
    """A config.json that is not JSON says so."""
    path = tmp_path / "config.json"
    path.write_text("{'hidden_size': 4096,")
    with pytest.raises(InvalidValueError, match=r"^model config '.*config\.json' is not valid JSON: "):
        load_model(str(path))


@pytest.mark.parametrize("given", ["my/confg.json", "configs/llama.json", "llama-7b.json", "./llama-7b"])
def test_mistyped_path_says_file_not_found(given: str) -> None:
    """Something that looks like a path (a '/', or .json) is a missing file, not an unknown model name."""
    with pytest.raises(InvalidValueError, match=rf"^file not found: {re.escape(given)} \(accepted: a shipped model "
                                                r"name -- falcon-7b, .* or the path to an existing config\.json"):
        load_model(given)


def test_folder_without_config(tmp_path) -> None:
    """A folder with no config.json in it says so."""
    with pytest.raises(InvalidValueError, match=rf"^no config\.json in the folder: {re.escape(str(tmp_path))} "):
        load_model(str(tmp_path))
