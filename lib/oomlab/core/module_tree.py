"""The module tree of a model as transformers builds it on ``meta``: each module's class, its children in
registration order, its own parameters and buffers (shape, dtype), and which tensors are tied -- everything
accelerate's ``device_map`` placement and ``Module._apply``'s load walk read off a model, without torch.

For a shipped model the tree is committed data (``specs/module-trees.json``), so the placement
(:mod:`oomlab.remedies.auto_device_map`) and the load walk (:mod:`oomlab.reproduction.apply_walk`) import no torch;
a model whose ``config.json`` is not the one the tree was derived from (a user's path, an edited spec) is built on
``meta`` (torch, transformers) and read the same way.

The table is generated, never edited: ``python -m oomlab.core.module_tree > lib/oomlab/specs/module-trees.json``
builds every shipped model in each of :data:`BUILD_DTYPES`; ``tests/core/test_module_tree.py`` re-derives it and
fails when it is stale.  Each subtree is stored once (a model's decoder layers are one entry), so the table is small.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache, cached_property, lru_cache
from types import MappingProxyType
from typing import Any

from oomlab.core.dtypes import load_dtype
from oomlab.core.models import ModelSpec, known_models, load_model
from oomlab.core.paths import SPECS_DIR
from oomlab.core.resolved import config_digest

MODULE_TREES = SPECS_DIR / "module-trees.json"
BUILD_DTYPES = ("float16", "bfloat16", "float32")  # every dtype core.dtypes knows: a tree holds for each
# bytes per element of the dtypes a meta model's tensors take (a tensor in any other is refused when deriving)
ELEMENT_BYTES = MappingProxyType({"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4,
                                  "int16": 2, "int8": 1, "uint8": 1})


@dataclass(frozen=True)
class TensorEntry:
    """One parameter or buffer registered directly on a module."""

    name: str  # as registered on its module ("weight", "inv_freq")
    shape: tuple[int, ...]
    dtype: str | None  # None: the dtype the model is built in; else its own whatever that is (RoPE's inv_freq)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def dtype_in(self, model_dtype: str) -> str:
        """Its dtype in a model built in ``model_dtype``."""
        return model_dtype if self.dtype is None else self.dtype


@dataclass(frozen=True)
class ModuleNode:
    """One ``nn.Module``: what ``named_children``, ``_parameters`` and ``_buffers`` hold, in their order."""

    cls: str  # the class name (accelerate's ``no_split_module_classes`` match on it)
    parameters: tuple[TensorEntry, ...]  # its own, in registration order (a ``None`` slot, e.g. no bias, left out)
    buffers: tuple[TensorEntry, ...]  # its own, persistent or not
    children: tuple[tuple[str, ModuleNode], ...]  # ``named_children()``

    def child(self, name: str) -> ModuleNode:
        for child_name, node in self.children:
            if child_name == name:
                return node
        raise KeyError(name)


@dataclass(frozen=True)
class ModuleTree:
    """A whole model: its root module, and its tied tensors (every name of a tensor after its first)."""

    model: str
    root: ModuleNode
    tied: Mapping[str, str]  # a tensor's later qualified name -> its first (``lm_head.weight`` -> the embedding's)

    def modules(self) -> Iterator[tuple[str, ModuleNode]]:
        """``named_modules()``: every module with its qualified name, pre-order (the root is ``""``)."""
        stack = [("", self.root)]
        while stack:
            name, node = stack.pop()
            yield name, node
            stack.extend((f"{name}.{c}" if name else c, child) for c, child in reversed(node.children))

    def named_parameters(self) -> Iterator[tuple[str, TensorEntry]]:
        """``named_parameters()``: each parameter once, under its first name (a tied name left out)."""
        for prefix, node in self.modules():
            for entry in node.parameters:
                name = f"{prefix}.{entry.name}" if prefix else entry.name
                if name not in self.tied:
                    yield name, entry

    def named_buffers(self) -> Iterator[tuple[str, TensorEntry]]:
        """``named_buffers()``: each buffer once, under its first name."""
        for prefix, node in self.modules():
            for entry in node.buffers:
                name = f"{prefix}.{entry.name}" if prefix else entry.name
                if name not in self.tied:
                    yield name, entry

    @cached_property
    def module_classes(self) -> Mapping[str, str]:
        """Each module's qualified name -> its class name."""
        return MappingProxyType({name: node.cls for name, node in self.modules()})

    @cached_property
    def tied_groups(self) -> tuple[tuple[str, ...], ...]:
        """accelerate's ``find_tied_parameters``: each tied parameter's names, sorted; the groups sorted too (NB:
        accelerate orders the groups by a set's iteration order; every shipped model has at most one group)."""
        params = {name for prefix, node in self.modules() for name in
                  (f"{prefix}.{e.name}" if prefix else e.name for e in node.parameters)}
        groups: dict[str, set[str]] = {}
        for later, first in self.tied.items():
            if later in params:
                groups.setdefault(first, set()).add(later)
        return tuple(sorted(tuple(sorted({first, *later})) for first, later in groups.items()))


# ------------------------------------------------------------------------------------------------ the table


def _entry(raw: list[Any]) -> TensorEntry:
    name, shape, dtype = raw
    return TensorEntry(name, tuple(shape), dtype)


def tree_from_json(model: str, data: Mapping[str, Any]) -> ModuleTree:
    """A tree from its table entry: ``nodes`` (each subtree once, children by index, leaves first) and ``root``."""
    nodes: list[ModuleNode] = []
    for raw in data["nodes"]:
        nodes.append(ModuleNode(raw["class"], tuple(map(_entry, raw["parameters"])),
                                tuple(map(_entry, raw["buffers"])),
                                tuple((name, nodes[index]) for name, index in raw["children"])))
    return ModuleTree(model, nodes[data["root"]], MappingProxyType(dict(data["tied"])))


def tree_to_json(tree: ModuleTree) -> dict[str, Any]:
    """The table entry of a tree: each distinct subtree stored once."""
    nodes: list[dict[str, Any]] = []
    index: dict[str, int] = {}

    def add(node: ModuleNode) -> int:
        children = [[name, add(child)] for name, child in node.children]
        raw = {"class": node.cls, "parameters": [[e.name, list(e.shape), e.dtype] for e in node.parameters],
               "buffers": [[e.name, list(e.shape), e.dtype] for e in node.buffers], "children": children}
        key = json.dumps(raw, sort_keys=True)
        if key not in index:
            index[key] = len(nodes)
            nodes.append(raw)
        return index[key]

    root = add(tree.root)
    return {"nodes": nodes, "root": root, "tied": dict(sorted(tree.tied.items()))}


@cache
def _table() -> Mapping[str, Any]:
    return json.loads(MODULE_TREES.read_text())


def module_tree(spec: ModelSpec) -> ModuleTree:
    """``spec``'s module tree: the committed one where its ``config.json`` is the one the table was derived from,
    else read off the model built on ``meta`` (torch, transformers)."""
    return _tree(spec, config_digest(spec.config))


@lru_cache(maxsize=256)  # keyed by user input (a config.json path): bounded
def _tree(spec: ModelSpec, digest: str) -> ModuleTree:
    """Keyed by the config's digest too: two specs of one name and equal fields may differ in what else their
    config.json says (a bias, a tie)."""
    entry = _table()["models"].get(spec.name)
    if entry is not None and entry["config_sha256"] == digest:
        return tree_from_json(spec.name, entry)
    return derive_tree(spec)


# ------------------------------------------------------------------------------------ derived from torch


def _dtype_name(tensor: Any) -> str:
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in ELEMENT_BYTES:
        raise ValueError(f"a meta model's tensor in {name}; known dtypes: {', '.join(ELEMENT_BYTES)}")
    return name


def tree_of(model: Any, name: str, model_dtype: str) -> ModuleTree:
    """The tree of a model built in ``model_dtype`` (a tensor in that dtype is stored as "the model's dtype").

    Refused (``ValueError``) where the tree would not say what torch does: a module reached twice (shared), a module
    class with its own ``_apply``, a tensor registered both as a parameter and as a buffer.
    """
    import torch

    seen: set[int] = set()

    def node_of(module: Any) -> ModuleNode:
        if id(module) in seen:
            raise ValueError(f"{name}: module {type(module).__name__} is shared: a tree cannot say so")
        seen.add(id(module))
        if type(module)._apply is not torch.nn.Module._apply:
            raise ValueError(f"{name}: {type(module).__name__} overrides Module._apply")

        def entries(slots: Mapping[str, Any]) -> tuple[TensorEntry, ...]:
            return tuple(TensorEntry(key, tuple(t.shape), None if _dtype_name(t) == model_dtype else _dtype_name(t))
                         for key, t in slots.items() if t is not None)

        return ModuleNode(type(module).__name__, entries(module._parameters), entries(module._buffers),
                          tuple((n, node_of(child)) for n, child in module.named_children()))

    root = node_of(model)
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for kind, named in (("parameter", model.named_parameters(remove_duplicate=False)),
                        ("buffer", model.named_buffers(remove_duplicate=False))):
        for qualified, tensor in named:
            if id(tensor) in first:
                if kind == "buffer" and first[id(tensor)] in dict(model.named_parameters(remove_duplicate=False)):
                    raise ValueError(f"{name}: {qualified} is a buffer and a parameter")
                tied[qualified] = first[id(tensor)]
            else:
                first[id(tensor)] = qualified
    return ModuleTree(name, root, MappingProxyType(tied))


def _concrete(tree: ModuleTree, model_dtype: str) -> list[tuple[str, tuple[int, ...], str]]:
    return [(name, e.shape, e.dtype_in(model_dtype)) for name, e in [*tree.named_parameters(), *tree.named_buffers()]]


def derive_tree(spec: ModelSpec) -> ModuleTree:
    """``spec``'s tree, read off the model built on ``meta`` in each of :data:`BUILD_DTYPES`: a tensor that follows
    the build's dtype is stored as the model's dtype, any other with its own; the three builds must agree."""
    from oomlab.core.modeling import build_meta_model  # torch, transformers: what the table spares

    trees = {dtype: tree_of(build_meta_model(spec, load_dtype(dtype)), spec.name, dtype) for dtype in BUILD_DTYPES}
    symbolic = trees["float16"]
    for dtype, tree in trees.items():  # a float32 buffer of the float32 build reads as "the model's dtype": compare
        if _concrete(tree, dtype) != _concrete(symbolic, dtype) or tree.tied != symbolic.tied:
            raise ValueError(f"{spec.name}: the meta model built in {dtype} is not the float16 build's in {dtype}")
    return symbolic


def derive_table() -> dict[str, Any]:
    """The table, derived afresh through the installed transformers: every shipped model built on ``meta``."""
    import transformers

    models = {}
    for name in known_models():
        spec = load_model(name)
        models[name] = {"config_sha256": config_digest(spec.config), **tree_to_json(derive_tree(spec))}
    return {"_source": f"derived by oomlab.core.module_tree.derive_table with transformers {transformers.__version__}:"
                       " each shipped model built on meta in float16, bfloat16 and float32 (AutoModelForCausalLM"
                       ".from_config), its modules, their own parameters and buffers, and its tied tensors",
            "models": models}


def render_table(table: Mapping[str, Any]) -> str:
    """The table as committed: one model to a line (a changed model is a one-line diff)."""
    models = ",\n".join(f" {json.dumps(name)}: {json.dumps(entry, sort_keys=True, separators=(',', ':'))}"
                         for name, entry in sorted(table["models"].items()))
    return f'{{"_source": {json.dumps(table["_source"])},\n"models": {{\n{models}\n}}}}\n'


if __name__ == "__main__":
    sys.stdout.write(render_table(derive_table()))
