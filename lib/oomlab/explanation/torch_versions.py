"""Which torch releases a traceback comes from: ``torch/nn/modules/module.py`` line numbers per release."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache

from oomlab.core.paths import DATA_DIR
from oomlab.explanation.frames import Frame, SourceLine

TORCH_MODULE_LINES = DATA_DIR / "torch_module_lines.json"


@dataclass(frozen=True)
class ModuleLines:
    """One torch release's line numbers in ``torch/nn/modules/module.py`` (None where unverified)."""

    version: str
    apply_recurse: int | None  # Module._apply: module._apply(fn)
    param_applied: int | None  # Module._apply: param_applied = fn(param)
    convert_return: int | None  # convert: return t.to(device, dtype …, non_blocking)
    convert_return_memory_format: int | None  # convert: return t.to(…, memory_format=…)
    to_return: int | None  # Module.to: return self._apply(convert)
    verified: bool
    source: str  # how the row was verified


@cache
def load_module_lines() -> tuple[ModuleLines, ...]:
    """The shipped table of ``module.py`` line numbers per torch release."""
    raw = json.loads(TORCH_MODULE_LINES.read_text())
    rows = []
    for r in raw["releases"]:
        src = r["source"]
        how = src.get("how", "")
        if "wheel" in src:
            how = f"{src['wheel']} (sha256 {src['wheel_sha256'][:12]}…): {how}"
        if "cross_check" in src:
            how += f"; {src['cross_check']}"
        rows.append(ModuleLines(r["version"], r["apply_recurse"], r["param_applied"], r["convert_return"],
                                r["convert_return_memory_format"], r["to_return"], bool(r["verified"]), how))
    return tuple(rows)

_MODULE_PY = "torch/nn/modules/module.py"


def is_module_py(path: str) -> bool:
    return path.replace("\\", "/").endswith(_MODULE_PY)


def observe_module_lines(frames: tuple[Frame, ...], sources: tuple[SourceLine, ...]) -> tuple[tuple[str, int], ...]:
    """``(anchor, line)`` pairs the traceback shows for ``module.py``'s ``_apply``/``convert``/``to``.

    Numbered source lines are recognised by their code (``module._apply(fn)``, ``param_applied =
    fn(param)``, ``return self._apply(convert)``; ``return t.to(`` only under a ``module.py`` header),
    frame headers without code by their function (``convert``, ``to``).  Anchor ``"convert"`` may be
    either of convert's two returns.
    """
    seen: dict[tuple[str, int], None] = {}
    for s in sources:
        in_module = is_module_py(s.file)
        if not (in_module or s.file == ""):
            continue
        code = s.code
        if code.startswith("module._apply(fn)"):
            seen[("apply_recurse", s.line)] = None
        elif code.startswith("param_applied = fn(param)"):
            seen[("param_applied", s.line)] = None
        elif code.startswith("return self._apply(convert)"):
            seen[("to_return", s.line)] = None
        elif code.startswith("return t.to(") and in_module:
            seen[("convert", s.line)] = None
    for f in frames:
        if is_module_py(f.file) and not f.code and f.line:
            if f.function == "convert":
                seen[("convert", f.line)] = None
            elif f.function == "to":
                seen[("to_return", f.line)] = None
    return tuple(seen)


def match_torch_versions(observations: tuple[tuple[str, int], ...]) -> tuple[str, ...]:
    """Verified releases whose ``module.py`` has every observed anchor on the observed line."""
    if not observations:
        return ()
    matches = []
    for row in load_module_lines():
        if not row.verified:
            continue
        expected = {"apply_recurse": {row.apply_recurse}, "param_applied": {row.param_applied},
                    "to_return": {row.to_return}, "convert": {row.convert_return, row.convert_return_memory_format}}
        if all(line in expected[anchor] for anchor, line in observations):
            matches.append(row.version)
    return tuple(matches)
