"""Families people fine-tune now, shipped (issue 24): gpt-oss (20b, 120b), Granite MoE (granite-3.0-3b-a800m) and
Phi-3's long-rope configuration (phi-3.5-mini; Phi-3-mini-128k's first "su" configs read too): each spec's count
against its model card, a budget and a ``check`` of each."""

import json

import pytest

import oomlab
from oomlab.budget import estimate
from oomlab.budget.result import MemCategory
from oomlab.core.errors import InvalidValueError
from oomlab.core.models import Family, load_model

# (spec, family, total from the model card, relative tolerance: the card's significant figures, active from the card
# (parameters a token runs through, the embedding lookup not counted), its tolerance)
PUBLISHED = [
    # OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (arXiv:2508.10925), table 1: total / active parameters
    ("gpt-oss-20b", Family.GPT_OSS, 20.91e9, 0.0005, 3.61e9, 0.002),
    ("gpt-oss-120b", Family.GPT_OSS, 116.83e9, 0.0001, 5.13e9, 0.002),
    # https://huggingface.co/ibm-granite/granite-3.0-3b-a800m-instruct: "# Parameters 3.3B, # Active Parameters 800M"
    ("granite-3.0-3b-a800m", Family.GRANITEMOE, 3.3e9, 0.02, 0.8e9, 0.02),
    # https://huggingface.co/microsoft/Phi-3.5-mini-instruct: "3.8B parameters" (dense: every parameter active)
    ("phi-3.5-mini", Family.PHI3, 3.8e9, 0.02, None, None),
]


@pytest.mark.parametrize(("name", "family", "total", "rel", "active", "active_rel"), PUBLISHED)
def test_published_parameter_counts(name, family, total, rel, active, active_rel) -> None:
    """Each new spec's parameter count (and an MoE's active count, the embedding lookup aside) is its model card's."""
    spec = load_model(name)
    assert spec.family is family
    assert spec.num_parameters == pytest.approx(total, rel=rel)
    if active is not None:
        assert spec.family.moe
        assert spec.active_parameters - spec.embedding_params == pytest.approx(active, rel=active_rel)


def test_exact_counts() -> None:
    """The layouts' counts to the parameter (checked against the meta-built models in test_models.py)."""
    assert load_model("gpt-oss-20b").num_parameters == 20_914_757_184
    assert load_model("gpt-oss-120b").num_parameters == 116_829_156_672
    assert load_model("granite-3.0-3b-a800m").num_parameters == 3_298_793_472
    assert load_model("phi-3.5-mini").num_parameters == 3_821_079_552


def test_gpt_oss_layer_is_its_tensors() -> None:
    """gpt-oss-20b's layer: biased q/k/v/o (64 x 64 queries, 8 x 64 keys), 64 sinks, 2 RMSNorms, a biased router over
    32 experts, and the experts' gate_up (32 x 2880 x 5760) and down (32 x 2880 x 2880) projections with biases."""
    layer = load_model("gpt-oss-20b").layer
    h, i, e = 2880, 2880, 32
    assert {k: (p.in_features, p.out_features, p.bias) for k, p in layer.projections.items()} == {
        "q_proj": (h, 4096, True), "k_proj": (h, 512, True), "v_proj": (h, 512, True), "o_proj": (4096, h, True)}
    assert layer.norm_params == 2 * h + 64
    assert layer.router_params == e * h + e
    assert layer.expert_params == e * (h * 2 * i + 2 * i + i * h + h)
    assert (layer.experts, layer.experts_per_token) == (32, 4)


def test_gpt_oss_checkpoint_quantization_is_kept_aside() -> None:
    """The checkpoint's MXFP4 quantization_config is kept as data, not read as the training's: training dequantizes
    the experts to bf16 (Mxfp4Config(dequantize=True)), the model oomlab budgets."""
    spec = load_model("gpt-oss-20b")
    assert "quantization_config" not in spec.config
    assert spec.config["_quantization_config"]["quant_method"] == "mxfp4"


def test_gpt_oss_refuses_sdpa() -> None:
    """transformers has no SDPA for gpt-oss (attention sinks): asked for, it is refused naming why and what to pass."""
    spec = load_model("gpt-oss-20b")
    assert spec.attention_implementations() == ("eager",)
    with pytest.raises(InvalidValueError, match=r"cannot run attention 'sdpa'.*\(SDPA has no attention sinks\); "
                                                r"pass attention='eager'"):
        spec.check_attention("sdpa")


# Phi-3-mini-128k-instruct's first configuration: rope scaling "su" with these factors (transformers 4.x ran it)
SU_LONG = [1.0299999713897705, 1.0499999523162842, 1.0499999523162842, 1.0799999237060547, 1.2299998998641968,
           1.2299998998641968, 1.2999999523162842, 1.4499999284744263, 1.5999999046325684, 1.6499998569488525,
           1.8999998569488525, 2.859999895095825, 3.68999981880188, 5.419999599456787, 5.489999771118164,
           5.489999771118164, 9.09000015258789, 11.579999923706055, 15.65999984741211, 15.769999504089355,
           15.789999961853027, 18.360000610351562, 21.989999771118164, 23.079999923706055, 30.009998321533203,
           32.35000228881836, 32.590003967285156, 35.56000518798828, 39.95000457763672, 53.840003967285156,
           56.20000457763672, 57.95000457763672, 59.29000473022461, 59.77000427246094, 59.920005798339844,
           61.190006256103516, 61.96000671386719, 62.50000762939453, 63.3700065612793, 63.48000717163086,
           63.48000717163086, 63.66000747680664, 63.850006103515625, 64.08000946044922, 64.760009765625,
           64.80001068115234, 64.81001281738281, 64.81001281738281]
SU_SHORT = [1.05, 1.05, 1.05, 1.1, 1.1, 1.1, 1.2500000000000002, 1.2500000000000002, 1.4000000000000004,
            1.4500000000000004, 1.5500000000000005, 1.8500000000000008, 1.9000000000000008] + [2.000000000000001] * 19 \
    + [2.1000000000000005, 2.1000000000000005, 2.2, 2.3499999999999996, 2.3499999999999996, 2.3499999999999996,
       2.3499999999999996, 2.3999999999999995, 2.3999999999999995, 2.6499999999999986, 2.6999999999999984,
       2.8999999999999977, 2.9499999999999975, 3.049999999999997, 3.049999999999997, 3.049999999999997]


def test_phi3_mini_128k_su_config_is_read(tmp_path) -> None:
    """A Phi-3-mini-128k config with the first revision's "su" rope scaling (transformers 5 raises KeyError on it) is
    read as LongRoPE: Phi-3.5-mini's geometry, 3.82 B parameters, its 131,072 positions."""
    raw = {k: v for k, v in load_model("phi-3.5-mini").config.items() if not k.startswith("_")}
    raw.update(rope_scaling={"long_factor": SU_LONG, "short_factor": SU_SHORT, "type": "su"},
               _name_or_path="Phi-3-mini-128k-instruct")
    assert len(SU_LONG) == len(SU_SHORT) == 48
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    spec = load_model(str(path))
    assert spec.num_parameters == 3_821_079_552 and spec.max_position_embeddings == 131_072
    assert spec.resolved.rope_parameters["rope_type"] == "longrope"
    assert spec.config["rope_scaling"]["type"] == "longrope"  # the spec's copy: later meta builds read it too
    assert json.loads(path.read_text())["rope_scaling"]["type"] == "su"  # the user's file untouched


@pytest.mark.heavy
def test_gpt_oss_lora_budget_holds_bf16_experts() -> None:
    """gpt-oss-20b LoRA (attention) in bf16 on one H100: every expert resident in bf16 -- 2 bytes per parameter,
    39 GiB, not MXFP4's ~4.25 bits -- the eager attention transformers runs, and it fits 80 GB."""
    spec = load_model("gpt-oss-20b")
    result = estimate(model="gpt-oss-20b", gpu="h100-80gb", seq=1024, method="lora", precision="bf16",
                      checkpointing=True)
    weights = result.components[MemCategory.WEIGHTS]
    assert 2 * spec.num_parameters <= weights < 2 * spec.num_parameters + 32 * 2**20  # + peft's adapters
    assert any("attention: eager" in note for note in result.notes)
    assert sum(result.components.values()) < result.capacity_bytes


# (model, gpu, gpus, the launch, where it fails (None: it runs), the verdict)
CHECKS = [
    ("gpt-oss-20b", "h100-80gb", 1, "python train.py --bf16 --per_device_train_batch_size 1 --gradient_checkpointing",
     "step", "does not fit"),  # full fine-tuning: 20.9 B x (2 + 4 + 4 + 8) bytes
    ("gpt-oss-120b", "h100-80gb", 8, "torchrun --nproc_per_node 8 train.py --bf16 --per_device_train_batch_size 1",
     "load", "does not fit"),  # DDP moves a whole 218 GiB bf16 replica to each GPU
    ("granite-3.0-3b-a800m", "a100-80gb", 1,
     "python train.py --bf16 --per_device_train_batch_size 1 --gradient_checkpointing", None, "fits"),
    ("phi-3.5-mini", "a100-80gb", 1, "python train.py --bf16 --per_device_train_batch_size 1 --gradient_checkpointing",
     None, "fits"),
]


@pytest.mark.heavy
@pytest.mark.parametrize(("model", "gpu", "gpus", "launch", "fails_at", "verdict"), CHECKS)
def test_check_each_new_family(model, gpu, gpus, launch, fails_at, verdict) -> None:
    """``oomlab check`` reads a launch of each new family and answers where it fails, with a fix where it does."""
    result = oomlab.check(gpu=gpu, launch=launch, model=model, gpus=gpus).to_dict()
    assert result["fails_at"] == fails_at and result["verdict"] == verdict
    assert (result["smallest_fix"] is None) == (fails_at is None)
