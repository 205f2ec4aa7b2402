"""A custom training script's own defaults, read from its source without running it: the fields of its dataclasses
(``model_max_length: int = field(default=512)`` in a ``TrainingArguments`` subclass, as Stanford Alpaca's train.py
writes it) and its argparse options (``parser.add_argument("--max_length", type=int, default=1024)``).

Only the settings oomlab models are taken (the sequence length, the micro-batch, checkpointing, the optimizer), each
a default with its file and line: a flag on the command line wins, and they win over transformers' own defaults.
The source is parsed with :mod:`ast` (never imported or executed), read within the launch files' bounds.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from oomlab.core.errors import LaunchFileError
from oomlab.launch import keys as K
from oomlab.launch.claims import Claims, Strength
from oomlab.launch.command import LaunchCommand
from oomlab.launch.files import read_launch_text
from oomlab.launch.origin import Origin, file_origin
from oomlab.launch.read import MAX_BATCH, MAX_SEQ, bool_value, int_value, optimizer_of

# the script options read, by the field they set
_FIELDS = {**{k: "seq" for k in K.SEQ_KEYS}, **{k: "batch" for k in K.BATCH_KEYS},
           **{k: "checkpointing" for k in K.CHECKPOINTING_KEYS}, "optim": "optimizer"}


def script_defaults(path: Path) -> dict[str, tuple[Any, int]]:
    """``{option: (default, line)}`` of the options :data:`_FIELDS` names, from the dataclass fields and argparse
    calls of the script at ``path`` ({} where it cannot be parsed: a script need not be Python oomlab can read)."""
    try:
        tree = ast.parse(read_launch_text(path, "training script"))
    except (SyntaxError, ValueError, LaunchFileError):
        return {}
    found: dict[str, tuple[Any, int]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            name, value = node.target.id, _default_of(node.value)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args:
            first = node.args[0]
            name = first.value.lstrip("-").replace("-", "_") if isinstance(first, ast.Constant) and \
                isinstance(first.value, str) else ""
            value = next((_literal(k.value) for k in node.keywords if k.arg == "default"), None)
        else:
            continue
        if name in _FIELDS and value is not None:
            found.setdefault(name, (value, node.lineno))
    return found


def _default_of(value: ast.expr) -> Any:
    """``field(default=X)`` or a bare literal ``X``."""
    if isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", "")) == "field":
        return next((_literal(k.value) for k in value.keywords if k.arg == "default"), None)
    return _literal(value)


def _literal(node: ast.expr) -> Any:
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, (int, str, bool)) else None


def script_claims(claims: Claims, cmd: LaunchCommand, command_dir: str | None) -> None:
    """The script's own defaults of what its flags leave out, each with its line (a script not beside the command
    says nothing)."""
    if not cmd.script.endswith(".py"):
        return
    path = Path(cmd.script).expanduser()
    if not path.is_absolute() and command_dir:
        path = Path(command_dir) / path
    if not path.is_file():
        return
    given = {flag.lstrip("-").replace("-", "_") for flag, _ in cmd.flags}
    for name, (value, line) in script_defaults(path).items():
        field_name = _FIELDS[name]
        if given & {k for k, f in _FIELDS.items() if f == field_name}:
            continue  # a flag on the command line sets it
        origin = file_origin(str(path), f"{name} default", line)
        claims.say(field_name, _value(field_name, value, origin), origin, Strength.DEFAULT)


def _value(field_name: str, value: Any, origin: Origin) -> Any:
    if field_name == "seq":
        return int_value(value, origin, MAX_SEQ)
    if field_name == "batch":
        return int_value(value, origin, MAX_BATCH)
    if field_name == "checkpointing":
        return bool_value(value, origin)
    return optimizer_of(value, origin)
