"""The one-layer inventory: one decoder layer traced at three sequence lengths and two batches, scaled, equals the
whole-model saved-tensor accounting; the hand-derived LLaMA inventory equals it; traces are cached by config hash."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from oomlab.budget import activations as act
from oomlab.budget import layer_trace as lt
from oomlab.budget.step import StepDTypes, tiny_setup
from oomlab.core.errors import InvalidValueError
from oomlab.core.models import Family, load_model, model_from_config
from oomlab.core.setup import make_setup

TOLERANCE = 0.005  # the target: one layer + scaling within 0.5 % of the whole-model trace


def _deep(name: str, layers: int):
    """A shipped spec cut to ``layers`` decoder layers at full width (a whole-model trace of it takes seconds)."""
    spec = load_model(name)
    return lt.prefix_spec(spec, layers) if layers < spec.num_hidden_layers else spec


def _check(setup, batch: int, seq: int) -> None:
    probe = act.probe(replace(setup, batch=batch, seq=seq))
    trace = lt.trace_layers(setup.model, probe, use_cache=False)
    whole = lt.whole_model_saved(setup.model, probe, batch, seq)
    predicted = lt.predicted_saved(trace, batch, seq)
    total = sum(whole.values())
    assert total > 0
    assert abs(sum(predicted.values()) - total) <= TOLERANCE * total, (predicted, whole)
    for part, value in whole.items():  # each part too, as a share of the total
        assert abs(predicted[part] - value) <= TOLERANCE * total, (part, predicted, whole)


@pytest.mark.heavy
@pytest.mark.parametrize(
    ("family", "knobs", "size"),
    [
        (Family.QWEN3, {"precision": "bf16-mixed"}, (3, 100)),  # autocast: fp32 weights, half copies
        (Family.PHI, {"precision": "fp32", "attention": "eager"}, (2, 77)),  # probabilities quadratic in seq
        (Family.GPT_NEOX, {"method": "lora", "precision": "fp16", "lora_targets": "all-linear"}, (5, 64)),
        (Family.FALCON, {"precision": "bf16"}, (1, 200)),  # batch 1: traced apart (a view only at batch 1)
        (Family.MIXTRAL, {"precision": "bf16-mixed"}, (2, 90)),  # grouped_mm experts
        (Family.QWEN2_MOE, {"method": "lora", "precision": "bf16"}, (3, 50)),
        (Family.GEMMA2, {"precision": "bf16", "attention": "eager"}, (2, 40)),  # inside the 64-token window
        (Family.GEMMA2, {"precision": "fp32", "attention": "eager"}, (2, 150)),  # beyond it: masks materialised
    ],
    ids=["qwen3-autocast", "phi-eager", "neox-lora-all-linear", "falcon-batch1", "mixtral", "qwen2moe-lora",
         "gemma2-in-window", "gemma2-beyond-window"],
)
def test_one_layer_scales_to_the_whole_tiny_model(family: Family, knobs: dict, size: tuple[int, int]) -> None:
    """Tiny 6-layer models of each family: the scaled one-layer trace equals the whole-model accounting at an
    untraced size (every part within 0.5 % of the total)."""
    setup = tiny_setup({"num_hidden_layers": 6}, family=family, **knobs)
    _check(setup, *size)


@pytest.mark.parametrize(
    ("name", "layers", "knobs", "size"),
    [
        ("olmo-2-7b", 4, {"precision": "bf16-mixed"}, (2, 300)),
        ("phi-3-mini-4k", 3, {"method": "lora", "precision": "fp16"}, (1, 700)),
        ("qwen3-30b-a3b", 3, {"precision": "bf16"}, (2, 256)),
    ],
)
def test_one_layer_scales_at_full_width(name: str, layers: int, knobs: dict, size: tuple[int, int]) -> None:
    """Real widths (a few layers deep): the scaled one-layer trace equals the whole-model accounting."""
    setup = make_setup(model=_deep(name, layers), gpu="a100-80gb", **knobs)
    _check(setup, *size)


@pytest.mark.parametrize(
    "knobs",
    [
        {"precision": "fp16-mixed"},
        {"precision": "fp32", "attention": "eager"},
        {"precision": "bf16", "batch": 1},
        {"method": "lora", "precision": "fp16-mixed"},
        {"method": "lora", "precision": "fp16", "lora_targets": "q_proj,v_proj,gate_proj,up_proj,down_proj"},
        {"method": "lora", "precision": "fp32", "attention": "eager", "lora_targets": "o_proj,down_proj"},
        # a base loaded in fp32 under autocast: fp32 stream and norms, autocast's half weight copies kept
        {"method": "lora", "precision": "bf16-mixed", "base_dtype": "float32", "lora_targets": "q_proj,v_proj"},
        {"method": "lora", "precision": "fp16-mixed", "base_dtype": "float32",
         "lora_targets": "o_proj,gate_proj,down_proj"},
    ],
)
@pytest.mark.parametrize("model", ["llama-7b", "llama-3.2-1b"])
def test_hand_derived_llama_equals_traced(model: str, knobs: dict) -> None:
    """The hand-derived LLaMA inventory (what the budget uses for LLaMA) equals the one-layer trace within 0.5 %."""
    setup = make_setup(model=model, gpu="a100-80gb", **{"batch": 2, "seq": 512, **knobs})
    assert act.hand_derived(setup)
    trace = act.layer_trace(setup)
    hand = {lt.FIRST: act.first_layer_activation_bytes(setup),
            lt.LATER: (setup.model.num_hidden_layers - 1) * act.layer_activation_bytes(setup),
            lt.SHARED: act.rope_bytes(setup), lt.OUTSIDE: act.model_activation_bytes(setup)}
    traced = {lt.FIRST: trace.first.at(setup.batch, setup.seq, fixed=False),
              lt.LATER: trace.later_layers(setup.batch, setup.seq), lt.SHARED: trace.shared.at(setup.batch, setup.seq),
              lt.OUTSIDE: trace.outside.at(setup.batch, setup.seq, fixed=False)}
    total = sum(hand.values())
    for part in hand:
        assert abs(hand[part] - traced[part]) <= TOLERANCE * total, (part, hand, traced)
    fixed = trace.first.fixed + trace.later_layers(setup.batch, setup.seq, fixed=True) + trace.outside.fixed
    assert abs(act.autocast_copy_bytes(setup) - fixed) <= TOLERANCE * max(total, 1)


def test_traced_families_use_the_trace() -> None:
    """Families without a hand-derived inventory budget their activations from the one-layer trace."""
    setup = make_setup(gpus=1, model="phi-2", gpu="a100-80gb", seq=512, batch=2, precision="bf16")
    assert not act.hand_derived(setup)
    trace = act.layer_trace(setup)
    assert act.saved_activation_bytes(setup) == (trace.first.at(2, 512, fixed=False) + trace.later_layers(2, 512)
                                                 + trace.shared.at(2, 512) + trace.outside.at(2, 512, fixed=False))
    # Mistral beyond its 4,096-token window materialises a sliding-window mask: traced, not hand-derived
    assert act.hand_derived(make_setup(gpus=1, model="mistral-7b", gpu="a100-80gb", seq=4095))
    assert not act.hand_derived(make_setup(gpus=1, model="mistral-7b", gpu="a100-80gb", seq=4096))


def test_polynomial_fit_is_exact() -> None:
    """The six probe sizes determine c0 + c1 b + c2 s + c3 b s + c4 s^2 + c5 b s^2 exactly."""
    spec = tiny_setup().model
    sizes = lt.probe_sizes(spec, act.probe(tiny_setup()))
    coeffs = (7, 3, 5, 11, 2, 13)

    def nbytes(b: int, s: int) -> int:
        return sum(c * b**i * s**j for c, (i, j) in zip(coeffs, lt.TERMS, strict=True))

    runs = [[lt._Saved(1, nbytes(b, s), None)] for b, s in sizes]  # noqa: SLF001 - the fitted unit itself
    parts = lt._fit(spec, sizes, runs)  # noqa: SLF001
    assert parts[1].at(9, 1000) == nbytes(9, 1000)


def test_non_polynomial_storages_are_refused() -> None:
    """Probe sizes that save different tensors are refused (the scaling would be a guess)."""
    spec = tiny_setup().model
    sizes = ((2, 32), (2, 64), (2, 96), (4, 32), (4, 64), (4, 96))
    runs = [[lt._Saved(1, 64 * b * s, None)] for b, s in sizes]  # noqa: SLF001
    runs[3].append(lt._Saved(1, 8, None))  # noqa: SLF001 - one size saves one more tensor
    with pytest.raises(InvalidValueError, match=r"^model 'tiny-llama': the probe sizes save different tensors "
                                                r"\(1, 1, 1, 2, 1, 1\); its saved activations are not a polynomial "
                                                r"in batch and sequence length, so they are not scaled$"):
        lt._fit(spec, sizes, runs)  # noqa: SLF001
    runs = [[lt._Saved(1, 64 * b * s, None)] for b, s in sizes]  # noqa: SLF001
    runs[5][0].owner = lt.SHARED  # same count, another owner
    with pytest.raises(InvalidValueError, match="not a polynomial"):
        lt._fit(spec, sizes, runs)  # noqa: SLF001


def test_cache_key_tracks_config_probe_and_version(monkeypatch) -> None:
    """The cache key changes with the config, the regime and LAYER_TRACE_VERSION, and only with them."""
    setup = tiny_setup(family=Family.QWEN2)
    probe = act.probe(setup)
    key = lt.cache_key(setup.model, probe)
    assert key == lt.cache_key(tiny_setup(family=Family.QWEN2).model, probe)  # equal config, equal key
    assert key != lt.cache_key(tiny_setup({"intermediate_size": 352}, family=Family.QWEN2).model, probe)
    assert key != lt.cache_key(setup.model, replace(probe, attention="eager"))
    assert key != lt.cache_key(setup.model, replace(probe, dtypes=StepDTypes("bfloat16", None, False, None)))
    monkeypatch.setattr(lt, "LAYER_TRACE_VERSION", lt.LAYER_TRACE_VERSION + 1)
    assert key != lt.cache_key(setup.model, probe)


def test_trace_is_cached_on_disk(tmp_path, monkeypatch) -> None:
    """A trace is written under the cache directory, named by its key, and read back instead of re-tracing."""
    monkeypatch.setenv("OOMLAB_CACHE_DIR", str(tmp_path))
    spec = model_from_config({**dict(tiny_setup(family=Family.OLMO2).model.config), "vocab_size": 520}, "olmo-v520")
    setup = make_setup(gpus=1, model=spec, gpu="a100-80gb", seq=64, batch=2)
    probe = act.probe(setup)
    first = lt.trace_layers(spec, probe)
    path = tmp_path / f"layers-{lt.cache_key(spec, probe)}.json"
    assert path.is_file() and lt.LayerTrace.from_json(json.loads(path.read_text())) == first
    lt._MEMO.clear()  # noqa: SLF001 - force the disk path
    monkeypatch.setattr(lt, "_trace", lambda *a: pytest.fail("re-traced instead of reading the cache"))
    assert lt.trace_layers(spec, probe) == first
