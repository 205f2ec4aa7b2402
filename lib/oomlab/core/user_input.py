"""Bounded reads of what a user supplies: regular files of a capped size, strict UTF-8, JSON without NaN or
Infinity, YAML without aliases, nesting and numbers within bounds, and values echoed into messages clipped.

Every function here turns a bad input into an :class:`~oomlab.core.errors.InvalidValueError` (the CLI's exit 2)
naming the input (``what``) and saying what is accepted -- in milliseconds, whatever the input is: a FIFO or a
device is refused before it is read (it is opened non-blocking and ``fstat``-ed), a file over the cap is refused by
its size, a YAML alias bomb by its first alias, a 100,000-deep nesting by its depth.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import IO, Any

import yaml

from oomlab.core.errors import InvalidValueError

USER_FILE_MAX_BYTES = 4 * 2**20  # a launch file, config.json, price table or OOM message: kilobytes in practice
MAX_NESTING = 64  # JSON / YAML depth: DeepSpeed's and accelerate's configs nest 3 deep
MAX_INT_DIGITS = 30  # an integer a user may write (10**30 bytes is far beyond any GPU or host)
SHOWN_CHARS = 120  # the longest piece of a user's value an error message repeats


_SHELL_WORD = re.compile(r"""(?:[^\s'"]+|'[^']*'|"[^"]*")+""")  # quoted spaces stay inside their word


def shell_words(text: str) -> list[str]:
    """A command line's words as the shell splits them, each kept as written (its quotes too): a command can be cut
    or edited between words without changing a quoted value."""
    return _SHELL_WORD.findall(text)


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` clipped to ``limit`` characters, saying how long it was: a 35 MB value makes a short error."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters)"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_user_bytes(path: str | os.PathLike[str], what: str, max_bytes: int = USER_FILE_MAX_BYTES) -> bytes:
    """The bytes of the regular file ``path`` (at most ``max_bytes``); anything else is refused naming ``what``.

    NB: opened with ``O_NONBLOCK`` so that a FIFO with no writer cannot block the open; ``fstat`` of the opened
    descriptor (not the name) decides, so a name swapped between the check and the read changes nothing.
    """
    name = shown(str(path))
    try:
        fd = os.open(Path(path).expanduser(), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError as err:
        raise InvalidValueError(f"{what} {name}: file not found") from err
    except IsADirectoryError as err:
        raise InvalidValueError(f"{what} {name} is a folder; give a regular file") from err
    except OSError as err:
        raise InvalidValueError(f"{what} {name} cannot be read: {err.strerror or err}") from err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidValueError(f"{what} {name} is {_kind(info.st_mode)}; give a regular file")
        if info.st_size > max_bytes:
            raise InvalidValueError(f"{what} {name} has {info.st_size:,} bytes; at most {max_bytes:,} are read")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    except OSError as err:
        raise InvalidValueError(f"{what} {name} cannot be read: {err.strerror or err}") from err
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # grew since fstat
        raise InvalidValueError(f"{what} {name} has more than {max_bytes:,} bytes; at most {max_bytes:,} are read")
    return data


def decode_utf8(data: bytes, what: str) -> str:
    """``data`` as UTF-8 text; other bytes are refused naming the first bad byte and its offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidValueError(f"{what} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start});"
                                " save it as UTF-8") from err


def read_user_text(path: str | os.PathLike[str], what: str, max_bytes: int = USER_FILE_MAX_BYTES) -> str:
    """:func:`read_user_bytes` decoded as strict UTF-8 (a leading byte-order mark dropped)."""
    text = decode_utf8(read_user_bytes(path, what, max_bytes), f"{what} {shown(str(path))}")
    return text.removeprefix("\ufeff")


def read_stream_text(stream: IO[Any] | None, what: str, max_bytes: int = USER_FILE_MAX_BYTES) -> str:
    """At most ``max_bytes`` of a stream (standard input), decoded as UTF-8; more is refused."""
    if stream is None:
        return ""
    data = getattr(stream, "buffer", stream).read(max_bytes + 1)
    if isinstance(data, str):
        data = data.encode("utf-8", errors="surrogateescape")
    if len(data) > max_bytes:
        raise InvalidValueError(f"{what} has more than {max_bytes:,} bytes; at most {max_bytes:,} are read")
    return decode_utf8(data, what)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-')):,} digits (at most {MAX_INT_DIGITS} are accepted)")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is out of range for a number")
    return value


def _depth_ok(text: str, what: str) -> None:
    """Refuse ``[``/``{`` nested deeper than :data:`MAX_NESTING` (strings skipped), before any parser recurses."""
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_NESTING:
                raise InvalidValueError(f"{what} nests deeper than {MAX_NESTING} levels; launch files nest a few")
        elif ch in "]}":
            depth -= 1


def load_user_json(text: str, what: str) -> Any:
    """``json.loads`` for a user's file: no ``NaN``/``Infinity``, integers of at most :data:`MAX_INT_DIGITS` digits,
    floats finite, nesting at most :data:`MAX_NESTING`; a malformed file names ``what:line:column``.

    :class:`json.JSONDecodeError` of malformed text propagates (callers word it with the line); every other refusal
    is an :class:`InvalidValueError`.
    """
    _depth_ok(text, what)
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_int=_bounded_int, parse_float=_finite_float)
    except json.JSONDecodeError:
        raise
    except (ValueError, RecursionError) as err:
        raise InvalidValueError(f"{what}: {err}") from err


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases (``*name``): 648 bytes of nested aliases expand to billions of nodes."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"an alias (*{event.anchor}) -- YAML aliases are not accepted in user files; write the "
                "value out", event.start_mark)
        self._oomlab_depth = getattr(self, "_oomlab_depth", 0) + 1
        try:
            if self._oomlab_depth > MAX_NESTING:
                raise yaml.composer.ComposerError(None, None, f"nesting deeper than {MAX_NESTING} levels",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._oomlab_depth -= 1


def _yaml_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = node.value.replace("_", "").lstrip("+-")
    if len(text) > MAX_INT_DIGITS:
        raise yaml.constructor.ConstructorError(
            None, None, f"an integer of {len(text):,} digits (at most {MAX_INT_DIGITS} are accepted)", node.start_mark)
    return yaml.SafeLoader.construct_yaml_int(loader, node)


_NoAliasLoader.add_constructor("tag:yaml.org,2002:int", _yaml_int)


def compose_user_yaml(text: str) -> yaml.Node | None:
    """The node tree of a user's YAML (aliases and deep nesting refused): :func:`yaml.compose` with the guards."""
    return yaml.compose(text, Loader=_NoAliasLoader)


def load_user_yaml(text: str) -> Any:
    """``yaml.safe_load`` for a user's file, refusing aliases, deep nesting and huge integers.

    Raises :class:`yaml.YAMLError` (a :class:`yaml.MarkedYAMLError` with the line where known) for callers to word
    with the file's name, as they do for malformed YAML.
    """
    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 -- a SafeLoader subclass
    except RecursionError as err:
        raise yaml.YAMLError(f"nesting deeper than {MAX_NESTING} levels") from err


def finite_number(value: Any, what: str, *, low: float = 0.0, high: float = 1e30) -> float:
    """``value`` as a finite float in ``[low, high]``; a bool, NaN, an infinity or a number outside is refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidValueError(f"{what} must be a number, got {shown(value)}")
    if not (math.isfinite(value) and low <= value <= high):
        raise InvalidValueError(f"{what} must be a finite number in [{low:g}, {high:g}], got {shown(value)}")
    return float(value)
