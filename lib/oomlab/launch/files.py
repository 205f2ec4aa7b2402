"""The user's files read with the line of every key: JSON (DeepSpeed, TrainingArguments, adapter_config.json,
config.json, a quantization_config) and YAML (accelerate).  A malformed file is an error naming the file and the line;
a file that is not a mapping is refused saying what it holds.  Every file is read through
:mod:`oomlab.core.user_input`: a regular file under its size cap, strict UTF-8, JSON without NaN/Infinity or huge
integers, YAML without aliases, nesting bounded -- a FIFO or a YAML alias bomb is refused in milliseconds."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from oomlab.core.errors import InvalidValueError, LaunchFileError
from oomlab.core.user_input import compose_user_yaml, load_user_json, load_user_yaml, read_user_text
from oomlab.launch.origin import Origin, file_origin


@dataclass(frozen=True)
class LaunchFile:
    """One file's mapping and the 1-based line of each dotted key."""

    path: str
    data: Mapping[str, Any] = field(repr=False)
    lines: Mapping[str, int] = field(repr=False, default_factory=dict)

    def get(self, dotted: str, default: Any = None) -> Any:
        node: Any = self.data
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return default
            node = node[part]
        return node

    def has(self, dotted: str) -> bool:
        marker = object()
        return self.get(dotted, marker) is not marker

    def origin(self, dotted: str) -> Origin:
        return file_origin(self.path, dotted, self.lines.get(dotted))

    def leaves(self) -> Iterator[tuple[str, Any]]:
        """Every ``(dotted key, value)`` whose value is not a mapping."""
        def walk(prefix: str, node: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
            for key, value in node.items():
                dotted = f"{prefix}{key}"
                if isinstance(value, Mapping) and value:
                    yield from walk(dotted + ".", value)
                else:
                    yield dotted, value
        yield from walk("", self.data)


def _node_lines(node: yaml.Node, prefix: str = "", out: dict[str, int] | None = None) -> dict[str, int]:
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            dotted = f"{prefix}{key.value}"
            out.setdefault(dotted, key.start_mark.line + 1)
            _node_lines(value, dotted + ".", out)
    return out


def _key_lines(text: str) -> dict[str, int]:
    """Lines of the keys, read through YAML's composer (JSON is YAML for this purpose); {} where it cannot."""
    try:
        node = compose_user_yaml(text)
    except yaml.YAMLError:
        return {}
    return {} if node is None else _node_lines(node)


def read_launch_text(path: str | Path, what: str = "launch file") -> str:
    """The text of one of the user's files (a launch command, a config): a regular file, at most
    :data:`~oomlab.core.user_input.USER_FILE_MAX_BYTES`, UTF-8; anything else is refused naming ``what`` and the
    path."""
    if not Path(path).expanduser().exists():
        raise LaunchFileError(f"{what} {str(path)!r} does not exist")
    try:
        return read_user_text(path, what)
    except InvalidValueError as err:
        raise LaunchFileError(str(err)) from err


def _text(path: str | Path, what: str) -> tuple[str, str]:
    return str(path), read_launch_text(path, what)


def _mapping(name: str, data: Any, kind: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise LaunchFileError(f"{name}: expected a {kind} mapping of keys, got {type(data).__name__}")
    return data


def read_json(path: str | Path, what: str = "launch file") -> LaunchFile:
    """A JSON file as a :class:`LaunchFile`; malformed JSON is an error naming ``file:line:column`` (an unreadable
    file names ``what``)."""
    name, text = _text(path, what)
    try:
        data = load_user_json(text, name)
    except json.JSONDecodeError as err:
        raise LaunchFileError(f"{name}:{err.lineno}:{err.colno}: malformed JSON: {err.msg}") from err
    return LaunchFile(name, _mapping(name, data, "JSON"), _key_lines(text))


def read_yaml(path: str | Path, what: str = "launch file") -> LaunchFile:
    """A YAML file as a :class:`LaunchFile`; malformed YAML is an error naming ``file:line:column`` (an unreadable
    file names ``what``)."""
    name, text = _text(path, what)
    try:
        data = load_user_yaml(text)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark is not None else name
        # an alias, deep nesting or a huge integer is well-formed YAML that is refused; the rest is malformed
        refused = isinstance(err, (yaml.composer.ComposerError, yaml.constructor.ConstructorError))
        raise LaunchFileError(f"{where}: {'' if refused else 'malformed YAML: '}{err.problem or err.context}") from err
    except yaml.YAMLError as err:
        raise LaunchFileError(f"{name}: malformed YAML: {err}") from err
    return LaunchFile(name, _mapping(name, data or {}, "YAML"), _key_lines(text))


def read_file(path: str | Path) -> LaunchFile:
    """JSON or YAML by the file's suffix (``.json``; ``.yaml``/``.yml``)."""
    suffix = Path(path).suffix.lower()
    if suffix == ".json":
        return read_json(path)
    if suffix in (".yaml", ".yml"):
        return read_yaml(path)
    raise LaunchFileError(f"launch file {str(path)!r}: unknown kind {suffix or '(no suffix)'!r}; known: .json, "
                          ".yaml, .yml")
