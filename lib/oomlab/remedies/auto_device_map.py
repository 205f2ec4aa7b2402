"""accelerate's ``device_map="auto"`` arithmetic over a module tree (:mod:`oomlab.core.module_tree`), without torch:
``compute_module_sizes``, ``get_balanced_memory`` and ``infer_auto_device_map`` as accelerate 1.15 writes them in
``accelerate/utils/modeling.py``, statement for statement, for the arguments oomlab passes (a ``dtype``, no
``special_dtypes``, integer GPU keys and ``"cpu"``/``"disk"``, ``low_zero=False``, ``clean_result=True``,
``offload_buffers=False``, ``fallback_allocation=False``, ``verbose=False``).

What is left out changes no placement: accelerate's log lines and its warning that offloaded buffers may not fit a
GPU.  ``tests/remedies/test_placement_accelerate.py`` runs accelerate itself on the meta models and compares.
"""

from __future__ import annotations

from collections.abc import Mapping

from oomlab.core.module_tree import ELEMENT_BYTES, ModuleNode, ModuleTree, TensorEntry

Member = ModuleNode | TensorEntry  # what accelerate's (name, module) pairs hold: a module or a tensor
Device = int | str
_INTEGER = ("int", "uint", "bool")


def _named_members(node: ModuleNode) -> list[tuple[str, Member]]:
    """``module.named_parameters(recurse=False) + module.named_children()``: what a split replaces a module by."""
    return [(e.name, e) for e in node.parameters] + list(node.children)


def compute_module_sizes(tree: ModuleTree, dtype: str) -> dict[str, int]:
    """``compute_module_sizes(model, dtype=dtype)``: each parameter and buffer (each tensor once) in ``dtype`` unless
    its own is smaller (an integer tensor in its own), added to every prefix of its name; in accelerate's order."""
    dtype_size = ELEMENT_BYTES[dtype]
    sizes: dict[str, int] = {}
    for name, entry in [*tree.named_parameters(), *tree.named_buffers()]:
        own = entry.dtype_in(dtype)
        element = ELEMENT_BYTES[own] if own.startswith(_INTEGER) else min(dtype_size, ELEMENT_BYTES[own])
        size = entry.numel * element
        parts = name.split(".")
        for idx in range(len(parts) + 1):
            prefix = ".".join(parts[:idx])
            sizes[prefix] = sizes.get(prefix, 0) + size
    return sizes


def _ordered(max_memory: Mapping[Device, int]) -> dict[Device, int]:
    """``get_max_memory(max_memory)``: the GPUs (integers) sorted first, then ``"mps"``, ``"cpu"``, ``"disk"``."""
    unknown = [k for k in max_memory if not isinstance(k, int) and k not in ("mps", "cpu", "disk")]
    if unknown:
        raise ValueError(f"device {unknown[0]!r} is not recognized; devices are integers (GPUs), 'mps', 'cpu' and "
                         "'disk'")
    gpus = sorted(k for k in max_memory if isinstance(k, int))
    return {k: max_memory[k] for k in gpus + [k for k in ("mps", "cpu", "disk") if k in max_memory]}


def _module_leaves(module_sizes: Mapping[str, int]) -> list[str]:
    """``get_module_leaves``."""
    children: dict[str, int] = {}
    for module in module_sizes:
        if module == "" or "." not in module:
            continue
        parent = module.rsplit(".", 1)[0]
        children[parent] = children.get(parent, 0) + 1
    return [module for module in module_sizes if children.get(module, 0) == 0 and module != ""]


def balance_buffer(tree: ModuleTree, module_sizes: Mapping[str, int], no_split_module_classes: list[str]) -> int:
    """What ``get_balanced_memory`` adds to each GPU's share of the model: 1.25 x the larger of the first no-split
    block of each class and the mean size of the final modules (the modules whose own children hold no tensor)."""
    classes = tree.module_classes
    no_split_children: dict[str, int] = {}
    if no_split_module_classes:
        for name, size in module_sizes.items():
            if name == "":
                continue
            class_name = classes.get(name, "Parameter")  # a tensor's name: not a module class
            if class_name in no_split_module_classes and class_name not in no_split_children:
                no_split_children[class_name] = size
            if set(no_split_children) == set(no_split_module_classes):
                break
    buffer = max(no_split_children.values()) if no_split_children else 0
    leaves = set(_module_leaves(module_sizes))
    module_sizes = {n: v for n, v in module_sizes.items() if n not in leaves}
    final = _module_leaves(module_sizes)
    mean_leaves = int(sum([module_sizes[n] for n in final]) / max(len(final), 1))
    return int(1.25 * max(buffer, mean_leaves))


def get_balanced_memory(tree: ModuleTree, module_sizes: Mapping[str, int], max_memory: Mapping[Device, int],
                        no_split_module_classes: list[str], buffer: int | None = None) -> dict[Device, int]:
    """``get_balanced_memory(model, max_memory, no_split_module_classes, dtype)`` with ``max_memory`` given
    (``module_sizes``: :func:`compute_module_sizes` of ``tree`` in ``dtype``, read only; ``buffer``: its
    :func:`balance_buffer`, where the caller keeps it): each GPU but the last capped at the model's share plus the
    buffer."""
    max_memory = _ordered(max_memory)
    num_devices = len([d for d in max_memory if isinstance(d, int) and max_memory[d] > 0])
    if num_devices == 0:
        return max_memory
    per_gpu = module_sizes[""] // num_devices
    per_gpu += balance_buffer(tree, module_sizes, no_split_module_classes) if buffer is None else buffer
    gpus = sorted(d for d, mem in max_memory.items() if isinstance(d, int) and mem > 0)
    for idx in gpus[:-1]:  # the last device keeps its max_memory in case the buffer is not enough
        max_memory[idx] = min(per_gpu, max_memory[idx])
    return max_memory


def get_max_layer_size(modules: list[tuple[str, Member]], module_sizes: Mapping[str, int],
                       no_split_module_classes: list[str]) -> tuple[int, list[str]]:
    """``get_max_layer_size``: the largest module with no children or of a no-split class, and every such one."""
    max_size, layer_names = 0, []
    todo = list(modules)
    while todo:
        name, member = todo.pop(0)
        children = list(member.children) if isinstance(member, ModuleNode) else []
        if not children or member.cls in no_split_module_classes:
            size = module_sizes.get(name, 0)
            if size > max_size:
                max_size, layer_names = size, [name]
            elif size == max_size:
                layer_names.append(name)
        else:
            todo = [(f"{name}.{n}", v) for n, v in children] + todo
    return max_size, layer_names


def _size_with_ties(tied_params: list[str], module_size: int, module_sizes: Mapping[str, int],
                    modules_to_treat: list[tuple[str, Member]]) -> tuple[int, list[str], list[Member]]:
    """``get_module_size_with_ties``."""
    if not tied_params:
        return module_size, [], []
    names, members = [], []
    for tied_param in tied_params:
        index = [i for i, (n, _) in enumerate(modules_to_treat) if tied_param.startswith(n + ".")][0]
        names.append(modules_to_treat[index][0])
        members.append(modules_to_treat[index][1])
    size = module_size
    for tied_param, name in zip(tied_params, names, strict=True):
        size += module_sizes.get(name, 0) - module_sizes.get(tied_param, 0)
    return size, names, members


def _modules_only(modules: list[tuple[str, Member]]) -> list[tuple[str, Member]]:
    return [(n, m) for n, m in modules if isinstance(m, ModuleNode)]


def clean_device_map(device_map: dict[str, Device], module_name: str = "") -> dict[str, Device]:
    """``clean_device_map``: a module whose every placed part is on one device is placed whole (NB: accelerate
    visits the children in a set's order, so a regrouped module's place in the dict follows it; so does this)."""
    prefix = "" if module_name == "" else f"{module_name}."
    values = [v for k, v in device_map.items() if k.startswith(prefix)]
    if len(set(values)) == 1 and len(values) > 1:
        for k in [k for k in device_map if k.startswith(prefix)]:
            del device_map[k]
        device_map[module_name] = values[0]
    children = [k for k in device_map.keys() if k.startswith(prefix) and len(k) > len(module_name)]
    idx = len(module_name.split(".")) + 1 if len(module_name) > 0 else 1
    for child in set(".".join(k.split(".")[:idx]) for k in children):
        clean_device_map(device_map, module_name=child)
    return device_map


def infer_auto_device_map(tree: ModuleTree, module_sizes: Mapping[str, int], max_memory: Mapping[Device, int],
                          no_split_module_classes: list[str]) -> dict[str, Device]:
    """``infer_auto_device_map(model, max_memory, no_split_module_classes, dtype)`` (``module_sizes``:
    :func:`compute_module_sizes` of ``tree`` in ``dtype``, read only): modules in order onto the GPUs, then the CPU,
    then the disk, each device keeping room for the largest remaining layer where it is a main device (the first GPU
    and the CPU), a module split into its parameters and children where it does not fit and may be, tied parameters
    kept with the module they are tied to."""
    max_memory = _ordered(max_memory)
    devices: list[Device] = list(max_memory)
    if "disk" not in devices:
        devices.append("disk")
    gpus = [d for d in devices if d not in ("cpu", "disk")]
    main_devices = ["mps"] if "mps" in gpus else [gpus[0], "cpu"] if gpus else ["cpu"]
    tied_parameters = tree.tied_groups
    root = tree.root
    modules_to_treat: list[tuple[str, Member]] = [
        *((e.name, e) for e in root.parameters), *root.children, *((e.name, e) for e in root.buffers)]

    device_map: dict[str, Device] = {}
    current_device = 0
    device_memory_used = {device: 0 for device in devices}
    max_layer_size, max_layer_names = get_max_layer_size(modules_to_treat, module_sizes, no_split_module_classes)

    while modules_to_treat:
        name, module = modules_to_treat.pop(0)
        max_layer_names = [n for n in max_layer_names if n != name and not n.startswith(name + ".")]
        if not max_layer_names:
            max_layer_size, max_layer_names = get_max_layer_size(_modules_only(modules_to_treat), module_sizes,
                                                                 no_split_module_classes)
        module_size = module_sizes.get(name, 0)
        # the tied groups with one name inside this module and one outside ("." added: substring tests, as accelerate)
        tied_param_groups = [g for g in tied_parameters
                             if any(name + "." in k + "." for k in g) and not all(name + "." in k + "." for k in g)]
        tied_params = sum([[p for p in g if name + "." not in p + "."] for g in tied_param_groups], [])

        device = devices[current_device]
        current_max_size = max_memory[device] if device != "disk" else None
        current_memory_reserved = 0
        if device in main_devices:
            current_max_size = current_max_size - max_layer_size
            current_memory_reserved = max_layer_size

        module_size_with_ties, tied_module_names, tied_modules = _size_with_ties(
            tied_params, module_size, module_sizes, modules_to_treat)

        if current_max_size is None or device_memory_used[device] + module_size_with_ties <= current_max_size:
            device_memory_used[device] += module_size_with_ties
            device_map[name] = device
            for tied_module_name in tied_module_names:
                if tied_module_name in [m[0] for m in modules_to_treat]:
                    index = next(i for i, (n, _) in enumerate(modules_to_treat) if n == tied_module_name)
                    modules_to_treat.pop(index)
                device_map[tied_module_name] = device
            continue

        if tied_params and device_memory_used[device] + module_size <= current_max_size:
            split_happened = False
            for tied_module_name, tied_module in zip(tied_module_names, tied_modules, strict=True):
                children = list(tied_module.children) if isinstance(tied_module, ModuleNode) else []
                if not children or tied_module.cls in no_split_module_classes:
                    continue
                tied_children = [(f"{tied_module_name}.{n}", v) for n, v in _named_members(tied_module)]
                index = [i for i, (n, _) in enumerate(modules_to_treat) if n == tied_module_name][0]
                modules_to_treat = ([(name, module)] + modules_to_treat[:index] + tied_children
                                    + modules_to_treat[index + 1:])
                max_layer_size, max_layer_names = get_max_layer_size(_modules_only(modules_to_treat), module_sizes,
                                                                     no_split_module_classes)
                split_happened = True
                break
            if split_happened:
                continue

        if device_memory_used[device] + module_size >= current_max_size:
            children = list(module.children) if isinstance(module, ModuleNode) else []
            if children and module.cls not in no_split_module_classes:
                modules_to_treat = [(f"{name}.{n}", v) for n, v in _named_members(module)] + modules_to_treat
                max_layer_size, max_layer_names = get_max_layer_size(_modules_only(modules_to_treat), module_sizes,
                                                                     no_split_module_classes)
                continue

        device_memory_used[device] = device_memory_used[device] + current_memory_reserved
        current_device += 1
        modules_to_treat = [(name, module)] + modules_to_treat

    return clean_device_map(device_map)
