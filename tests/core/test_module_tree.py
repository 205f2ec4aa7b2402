"""The committed module trees (``specs/module-trees.json``): re-derived through transformers, read back as the model
built on ``meta`` names its modules and tensors, and a changed or unshipped config.json built afresh."""

import json

import pytest

from oomlab.core.models import load_model, model_from_config
from oomlab.core.module_tree import (
    MODULE_TREES,
    ModuleNode,
    ModuleTree,
    TensorEntry,
    derive_table,
    module_tree,
    render_table,
    tree_from_json,
    tree_to_json,
)

REGENERATE = ".venv/bin/python -m oomlab.core.module_tree > lib/oomlab/specs/module-trees.json"
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "vocab_size": 256, "tie_word_embeddings": True}


@pytest.mark.heavy
def test_committed_table_equals_a_fresh_derivation():
    """Every shipped model built on meta in fp16, bf16 and fp32 gives the committed tree, byte for byte."""
    assert MODULE_TREES.read_text() == render_table(derive_table()), f"stale: regenerate with {REGENERATE}"


def meta_model(spec, dtype="float16"):
    from oomlab.core.dtypes import load_dtype
    from oomlab.core.modeling import build_meta_model

    return build_meta_model(spec, load_dtype(dtype))


@pytest.mark.parametrize("name", ["llama-13b", "gemma-2b", "falcon-7b", "qwen1.5-moe-a2.7b"])
def test_shipped_tree_names_what_torch_names(name):
    """The committed tree's modules, parameters (tied once) and buffers are the meta model's, in torch's order."""
    spec = load_model(name)
    tree, model = module_tree(spec), meta_model(spec)
    assert [(n, m.cls) for n, m in tree.modules()] == [(n, type(m).__name__) for n, m in model.named_modules()]
    assert [(n, e.shape, e.dtype_in("float16")) for n, e in tree.named_parameters()] == \
        [(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in model.named_parameters()]
    assert [(n, e.shape, e.dtype_in("float16")) for n, e in tree.named_buffers()] == \
        [(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in model.named_buffers()]


def test_llama_13b_parameters_hand_counted():
    """llama-13b: 13,015,864,320 parameters (40 layers, embedding and head untied, final norm), RoPE's two fp32
    buffers of 64 each, no tied tensors."""
    tree = module_tree(load_model("llama-13b"))
    layer = 4 * 5120 * 5120 + 3 * 5120 * 13824 + 2 * 5120
    assert sum(e.numel for _, e in tree.named_parameters()) == 40 * layer + 2 * 32000 * 5120 + 5120 == 13_015_864_320
    assert [(n, e.numel, e.dtype) for n, e in tree.named_buffers()] == \
        [("model.rotary_emb.inv_freq", 64, "float32"), ("model.rotary_emb.original_inv_freq", 64, "float32")]
    assert dict(tree.tied) == {} and tree.tied_groups == ()


def test_tied_embedding_named_once():
    """gemma-2b ties its LM head to the embedding: one tensor, named as the embedding; accelerate's group sorted."""
    tree = module_tree(load_model("gemma-2b"))
    assert dict(tree.tied) == {"lm_head.weight": "model.embed_tokens.weight"}
    assert "lm_head.weight" not in dict(tree.named_parameters())
    assert tree.tied_groups == (("lm_head.weight", "model.embed_tokens.weight"),)


def test_json_round_trip_stores_each_subtree_once():
    """A tree written and read back is the same; equal decoder layers are one entry of the table."""
    tree = module_tree(load_model("llama-2-70b"))
    data = tree_to_json(tree)
    assert tree_from_json(tree.model, data) == tree
    assert len(data["nodes"]) < 20  # 80 layers, one node each kind


def test_config_not_shipped_is_built(tmp_path):
    """A config.json the table does not hold (a user's path) is built on meta; its tree says what torch says."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY))
    spec = load_model(str(config))
    tree = module_tree(spec)
    model = meta_model(spec)
    assert [n for n, _ in tree.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert dict(tree.tied) == {"lm_head.weight": "model.embed_tokens.weight"}


def test_edited_shipped_config_is_built():
    """A shipped name whose fields differ from those the tree was derived from is built, not read from the table."""
    raw = dict(load_model("llama-7b").config)
    spec = model_from_config({**raw, "num_hidden_layers": 2}, "llama-7b")
    tree = module_tree(spec)
    assert [n for n, _ in tree.root.child("model").child("layers").children] == ["0", "1"]


def test_tree_reads_like_a_module():
    """A hand-built tree: pre-order modules, a tied name left out of named_parameters, a missing child a KeyError."""
    leaf = ModuleNode("Linear", (TensorEntry("weight", (4, 2), None),), (), ())
    root = ModuleNode("Root", (), (TensorEntry("scale", (1,), "float32"),), (("a", leaf), ("b", leaf)))
    tree = ModuleTree("toy", root, {"b.weight": "a.weight"})
    assert [n for n, _ in tree.modules()] == ["", "a", "b"]
    assert [n for n, _ in tree.named_parameters()] == ["a.weight"]
    assert [(n, e.dtype_in("bfloat16")) for n, e in tree.named_buffers()] == [("scale", "float32")]
    with pytest.raises(KeyError):
        root.child("c")


def test_building_a_model_leaves_its_fields_as_read():
    """transformers writes rope_theta into the rope_scaling dict it is given: a spec's own fields must not change
    with it, or its digest no longer finds the committed tree (llama-3.1-8b's was re-derived after any build)."""
    from oomlab.core.resolved import config_digest

    spec = load_model("llama-3.1-8b")
    before = config_digest(spec.config)
    meta_model(spec)
    assert config_digest(spec.config) == before and "rope_theta" not in spec.config["rope_scaling"]
