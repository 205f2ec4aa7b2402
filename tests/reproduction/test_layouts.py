"""LLaMA's layouts by transformers release: the data, and the walks rebuilt from it against the releases' real walks."""

import datetime as dt
import json
import re

import pytest
import torch

from oomlab.core.dtypes import load_dtype
from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.models import load_model
from oomlab.reproduction.layouts import (
    LLAMA_LAYOUTS,
    LaunchPath,
    build_layout_model,
    layout_walk,
    llama_layouts,
    load_layout,
    report_context,
    walk_fingerprint,
)
from oomlab.reproduction.walk import unlimited_walk

PROBED = [(lay.id, path) for lay in llama_layouts() if lay.fingerprints for path in LaunchPath]


@pytest.mark.parametrize("layout_id, path", PROBED, ids=[f"{i}-{p.value}" for i, p in PROBED])
def test_rebuilt_walk_is_the_release_walk(layout_id: str, path: LaunchPath) -> None:
    """Every tensor's name, kind, shape and dtype, in _apply order, equals the walk of the old transformers itself."""
    layout = load_layout(layout_id)
    assert walk_fingerprint(layout_walk("llama-13b", "float16", layout_id, path)) == layout.fingerprints[path]


def test_installed_transformers_is_the_5_0_layout() -> None:
    """The reproduction's own walk (installed transformers) is the shipped 5.0 layout's, tensor for tensor."""
    assert walk_fingerprint(unlimited_walk("llama-13b", "float16")) == load_layout("5.0").fingerprints[LaunchPath.TO]


def test_4_28_buffers_as_released() -> None:
    """v4.28: per layer inv_freq [64] float32 (persistent), cos/sin [1, 1, 2048, 128] float32 (not persistent)."""
    model = build_layout_model(load_model("llama-13b"), load_dtype("float16"), load_layout("4.28"), LaunchPath.TO)
    rotary = model.model.layers[0].self_attn.rotary_emb
    assert {n: (tuple(b.shape), b.dtype) for n, b in rotary.named_buffers()} == {
        "inv_freq": ((64,), torch.float32), "cos_cached": ((1, 1, 2048, 128), torch.float32),
        "sin_cached": ((1, 1, 2048, 128), torch.float32)}
    assert rotary._non_persistent_buffers_set == {"cos_cached", "sin_cached"}
    assert list(model.model.layers[0].mlp._modules) == ["gate_proj", "down_proj", "up_proj", "act_fn"]
    assert list(model.model.layers[0].self_attn._modules) == ["q_proj", "k_proj", "v_proj", "o_proj", "rotary_emb"]


def test_half_path_casts_floating_buffers_only() -> None:
    """.half() then .to(): cos/sin become float16 (512 KiB each); 4.38.0's int64 causal mask stays int64."""
    spec, fp16 = load_model("llama-13b"), load_dtype("float16")
    m = build_layout_model(spec, fp16, load_layout("4.28"), LaunchPath.HALF_THEN_TO)
    cos = m.model.layers[0].self_attn.rotary_emb.cos_cached
    assert cos.dtype == torch.float16 and cos.numel() * cos.element_size() == 512 * 1024
    m = build_layout_model(spec, fp16, load_layout("4.38.0"), LaunchPath.HALF_THEN_TO)
    assert m.model.causal_mask.dtype == torch.int64 and tuple(m.model.causal_mask.shape) == (2048, 2048)


@pytest.mark.parametrize("layout_id, per_layer", [
    ("4.28", 2 * 1024**2),  # fp32 cos + sin, [1, 1, 2048, 128] each
    ("4.31", 1024**2),  # built in the load dtype (float16)
    ("4.38.0", 0),  # 4.38.0/4.38.1 dropped them; 4.38.2 brought them back
    ("4.41", 0),
])
def test_cache_bytes_per_layer(layout_id: str, per_layer: int) -> None:
    """What .to() moves per decoder layer besides inv_freq, under from_pretrained(torch_dtype=float16)."""
    layout = load_layout(layout_id)
    assert layout.cache_bytes_per_layer(load_model("llama-13b"), load_dtype("float16"), LaunchPath.TO) == per_layer
    assert layout.moves_rotary_caches is (per_layer > 0)


def _bounds(spec: str) -> tuple[str | None, str | None]:
    low = re.search(r">=([\d.]+)", spec)
    high = re.search(r"<([\d.]+)", spec)
    return (low.group(1) if low else None), (high.group(1) if high else None)


def test_released_ranges_are_contiguous_and_dated() -> None:
    """Released layouts tile the versions from 4.28.0 on, oldest first, each starting at its first release."""
    released = [lay for lay in llama_layouts() if lay.released]
    assert _bounds(released[0].transformers)[0] == "4.28.0" and _bounds(released[-1].transformers)[1] is None
    for earlier, later in zip(released, released[1:], strict=False):
        assert _bounds(earlier.transformers)[1] == _bounds(later.transformers)[0] == later.first_release
        assert earlier.first_release_date < later.first_release_date
    for lay in released:
        assert lay.source_url.endswith(f"/v{lay.first_release}/src/transformers/models/llama/modeling_llama.py")
        assert lay.first_release in lay.probed


def test_every_layout_records_its_source() -> None:
    """Each layout names its source file (sha256 of the released file) or, unreleased, the pull request it quotes."""
    for item in json.loads(LLAMA_LAYOUTS.read_text())["layouts"]:
        source = item["source"]
        if item["released"]:
            assert re.fullmatch(r"[0-9a-f]{64}", source["sha256"]) and source["anchors"]
        else:
            assert source["pull"] == "https://github.com/huggingface/transformers/pull/22234" and source["quote"]


def test_report_context() -> None:
    """The layouts are compared with the public twin of the seed, opened on 2023-06-27."""
    ctx = report_context()
    assert ctx.opened == dt.date(2023, 6, 27) and ctx.report_url.endswith("Open-Assistant/issues/3530")
    assert load_layout("4.28").available_on(ctx.opened) and not load_layout("4.31").available_on(ctx.opened)
    assert not load_layout("pre-22234").available_on(ctx.opened)  # never in a release


def test_unknown_layout_names_the_known_ones() -> None:
    """An unknown layout id is refused with the list of shipped ones."""
    with pytest.raises(UnknownNameError) as err:
        load_layout("4.99")
    assert str(err.value) == ("unknown LLaMA layout '4.99'; known: 4.28, 4.31, 4.32, 4.35, 4.38.0, 4.38.2, 4.39, "
                              "4.41, 4.43, 4.48, 5.0, pre-22234")


def test_non_llama_model_refused() -> None:
    """The layouts are LLaMA's: another family is refused, naming it."""
    with pytest.raises(InvalidValueError) as err:
        build_layout_model(load_model("mistral-7b"), load_dtype("float16"), load_layout("4.28"), LaunchPath.TO)
    assert str(err.value) == ("invalid model 'mistral-7b' for the LLaMA layouts: it is a mistral model; the layouts "
                              "describe LLaMA (model_type 'llama') only")
