"""Run the numbered notebooks with papermill, then render the HTML report.

Parameters are declared once in :data:`PARAMETERS`; :func:`parse_params` reads a YAML file and
``key=value`` pairs into typed, validated values before any notebook runs.  :func:`run_pipeline`
executes ``notebooks/NN_*.ipynb`` in order into ``outputs/notebooks/``, checks that each wrote its
results JSON (through :func:`write_results`), and writes ``outputs/report.html`` atomically.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from oomlab import paths
from oomlab.allocator import MESSAGE_FORMAT_NAMES
from oomlab.errors import InvalidValueError, OomlabError
from oomlab.report import ReportError, render_report, write_text_atomic
from oomlab.reproduce import DEVICES
from oomlab.specs import load_dtype, load_gpu, load_model
from oomlab.training import Attention, Optimizer, Precision
from oomlab.units import parse_size

# ------------------------------------------------------------------------------------------ parameters


@dataclass(frozen=True)
class Param:
    """One pipeline parameter: its type, default, help and what values it accepts."""

    name: str
    kind: type  # str, int, float or bool; None is accepted only when the default is None
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None  # inclusive lower bound for numbers
    canonical: Callable[[Any], Any] | None = None  # validates and returns the canonical value

    @property
    def nullable(self) -> bool:
        return self.default is None


PARAMETERS: dict[str, Param] = {
    p.name: p
    for p in (
        Param("model", str, "llama-13b", "shipped model name or path to a config.json",
              canonical=lambda v: load_model(v).name),
        Param("dtype", str, "float16", "storage dtype of the weights",
              canonical=lambda v: load_dtype(v).name),
        Param("gpu", str, "t4", "GPU model", canonical=lambda v: load_gpu(v).name),
        Param("gpus", int, 4, "number of GPUs", minimum=1),
        Param("non_pytorch_mib", float, None, "MiB held on the GPU outside PyTorch (None: measured/default)",
              minimum=0),
        Param("device", str, "auto", "where to reproduce the failure", choices=DEVICES),
        Param("message_format", str, "old", "which PyTorch OOM message to print (old = torch<=2.0, new = torch>=2.1)",
              choices=MESSAGE_FORMAT_NAMES),
        Param("precision", str, "fp16-mixed", "training precision", choices=tuple(p.value for p in Precision)),
        Param("optimizer", str, "adamw", "optimizer", choices=tuple(o.value for o in Optimizer)),
        Param("batch", int, 1, "micro-batch per GPU", minimum=1),
        Param("seq", int, 2048, "sequence length in tokens", minimum=1),
        Param("checkpointing", bool, False, "activation checkpointing in the user's configuration"),
        Param("attention", str, "sdpa", "attention implementation", choices=tuple(a.value for a in Attention)),
        Param("lora_rank", int, 8, "LoRA rank for the LoRA/QLoRA remedies", minimum=1),
        Param("host_ram", str, "192GiB", "host RAM per node (assumed: a 4 x T4 g4dn.12xlarge has 192 GiB)",
              canonical=lambda v: (parse_size(v), v)[1]),
        Param("trace", bool, True, "also trace setups with PyTorch's MemTracker (seconds each, cached)"),
    )
}

# Injected into a notebook when its parameters cell declares them; not user parameters.
RESULTS_PATH_PARAM = "results_path"
OUT_DIR_PARAM = "out_dir"

_NONE_WORDS = ("none", "null", "~")
_TRUE_WORDS = ("true", "yes", "on", "1")
_FALSE_WORDS = ("false", "no", "off", "0")
_KIND_WORDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _accepted() -> str:
    return ", ".join(sorted(PARAMETERS))


def _convert(param: Param, raw: Any) -> Any:
    """Turn a YAML value or a ``key=value`` string into ``param.kind`` (or None), or raise."""
    expects = f"parameter {param.name!r} expects {_KIND_WORDS[param.kind]}"
    if param.nullable:
        expects += " or none"
    none_word = isinstance(raw, str) and raw.strip().lower() in _NONE_WORDS
    if raw is None or (none_word and (param.kind is not str or param.nullable)):
        if param.nullable:
            return None
        raise InvalidValueError(f"{expects}, got {raw!r}")
    if isinstance(raw, str) and param.kind is not str:
        text = raw.strip().lower()
        try:
            if param.kind is bool:
                if text not in _TRUE_WORDS + _FALSE_WORDS:
                    raise ValueError(text)
                return text in _TRUE_WORDS
            return param.kind(text)
        except ValueError as err:
            raise InvalidValueError(f"{expects}, got {raw!r}") from err
    if isinstance(raw, bool) and param.kind is not bool:  # bool is an int subclass: refuse `gpus: true`
        raise InvalidValueError(f"{expects}, got {raw!r}")
    if param.kind is float and isinstance(raw, int):
        return float(raw)
    if not isinstance(raw, param.kind):
        raise InvalidValueError(f"{expects}, got {raw!r}")
    return raw


def _check(param: Param, value: Any) -> Any:
    """Validate a converted value against choices, bounds and the spec loaders; return it canonical."""
    if value is None:
        return None
    if param.choices is not None and value not in param.choices:
        raise InvalidValueError(
            f"parameter {param.name!r} must be one of {', '.join(param.choices)}; got {value!r}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidValueError(f"parameter {param.name!r} must be a finite number, got {value!r}")
    if param.minimum is not None and value < param.minimum:
        raise InvalidValueError(f"parameter {param.name!r} must be >= {param.minimum:g}, got {value!r}")
    if param.canonical is not None:
        try:
            return param.canonical(value)
        except OomlabError as err:
            raise InvalidValueError(f"parameter {param.name!r}: {err}") from err
    return value


def validate_params(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Type-check and validate ``raw`` (strings or typed values), fill defaults; raise on any bad key."""
    values: dict[str, Any] = {}
    for key, value in raw.items():
        param = PARAMETERS.get(key) if isinstance(key, str) else None
        if param is None:
            raise InvalidValueError(f"unknown parameter {key!r}; accepted: {_accepted()}")
        values[key] = _check(param, _convert(param, value))
    return {name: values.get(name, param.default) for name, param in PARAMETERS.items()}


def _read_params_file(params_file: str | os.PathLike[str]) -> dict[Any, Any]:
    import yaml

    path = Path(params_file)
    try:
        text = path.read_text()
    except FileNotFoundError as err:
        raise InvalidValueError(f"params file {str(path)!r} does not exist") from err
    except OSError as err:
        raise InvalidValueError(f"params file {str(path)!r} cannot be read: {err.strerror}") from err
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise InvalidValueError(f"params file {str(path)!r} is not valid YAML: {err}") from err
    if loaded is None:  # an empty file: no overrides
        return {}
    if not isinstance(loaded, dict):
        raise InvalidValueError(
            f"params file {str(path)!r} must be a mapping of parameter: value, got {type(loaded).__name__};"
            f" accepted: {_accepted()}"
        )
    return loaded


def parse_params(
    pairs: Iterable[str] = (), params_file: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """Read ``params_file`` (YAML mapping) then ``key=value`` pairs (which win); return every parameter."""
    raw: dict[Any, Any] = {} if params_file is None else _read_params_file(params_file)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidValueError(
                f"malformed parameter {pair!r}: expected key=value; accepted: {_accepted()}"
            )
        raw[key.strip()] = value.strip()
    return validate_params(raw)


# ------------------------------------------------------------------------------------------- results


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "to_dict") and callable(obj.to_dict):
        return obj.to_dict()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        # NB: not dataclasses.asdict, which deep-copies fields and fails on MappingProxyType.
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if isinstance(obj, (MappingProxyType, Mapping)):
        return dict(obj)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"write_results cannot store {type(obj).__name__} ({obj!r}) as JSON")


def write_results(results_path: str | os.PathLike[str], data: Mapping[str, Any]) -> Path:
    """Write a notebook's results as JSON, atomically (dataclasses, tuples and paths allowed)."""
    text = json.dumps(data, indent=2, default=_json_default, allow_nan=False) + "\n"
    return write_text_atomic(results_path, text)


def read_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a results JSON written by :func:`write_results`."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as err:
        raise FileNotFoundError(f"no results at {str(path)!r}; run the notebook that writes them") from err


# ------------------------------------------------------------------------------------------ pipeline

REPORT_NOTEBOOK = "04_report.ipynb"  # rendered as the report when present, else the first notebook
REPORT_NAME = "report.html"
KERNEL_NAME = "python3"
_NUMBERED = re.compile(r"^\d\d_.+\.ipynb$")


class PipelineError(RuntimeError):
    """A notebook failed (error, timeout or dead kernel) or did not write its results."""


@dataclass(frozen=True)
class PipelineResult:
    """What one pipeline run produced."""

    executed_paths: tuple[Path, ...]  # executed copies of the notebooks, in run order
    results_paths: tuple[Path, ...]  # each notebook's results JSON, same order
    report_path: Path
    seconds: float  # wall time of the whole run


def notebook_paths(notebooks_dir: str | os.PathLike[str] = paths.NOTEBOOKS_DIR) -> list[Path]:
    """The numbered notebooks ``NN_*.ipynb`` in run order (``explore.ipynb`` and others left out)."""
    return sorted(p for p in Path(notebooks_dir).glob("*.ipynb") if _NUMBERED.match(p.name))


def _first_line(source: str) -> str:
    lines = [line.strip() for line in source.splitlines() if line.strip()]
    return lines[0] if lines else "<empty cell>"


def _failing_cell(executed: Path) -> tuple[int, str] | None:
    """Index in the *source* notebook and source of the cell that failed or was running, if known.

    Papermill marks a raising cell ``metadata.papermill.exception``; after a timeout or a dead kernel
    the failing cell is the last one that started.  The injected-parameters cell and papermill's
    error-marker cells are not in the source notebook, so they are skipped when counting.
    """
    import nbformat

    try:
        nb = nbformat.read(executed, as_version=4)
    except (OSError, ValueError):
        return None
    own = [c for c in nb.cells
           if not {"injected-parameters", "papermill-error-cell-tag"} & set(c.metadata.get("tags", []))]
    started = None
    for index, cell in enumerate(own):
        meta = cell.metadata.get("papermill", {})
        if meta.get("exception") is True:
            return index, cell.source
        if cell.cell_type == "code" and meta.get("start_time"):
            started = (index, cell.source)
    return started


def _mark_interrupted(executed: Path, error: str) -> None:
    """Record a timeout or dead kernel in the kept notebook, as an error output on the running cell."""
    import nbformat

    try:
        nb = nbformat.read(executed, as_version=4)
    except (OSError, ValueError):
        return
    running = [
        c for c in nb.cells if c.cell_type == "code" and c.metadata.get("papermill", {}).get("start_time")
    ]
    if not running:
        return
    cell = running[-1]
    ename, _, evalue = error.partition(": ")
    cell.outputs.append(nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[error]))
    cell.metadata.papermill["exception"] = True
    cell.metadata.papermill["status"] = "failed"
    nbformat.write(nb, executed)


def _failure(notebook: Path, executed: Path, error: str) -> PipelineError:
    cell = _failing_cell(executed)
    where = "" if cell is None else f" at cell {cell[0]} ({_first_line(cell[1])!r})"
    return PipelineError(
        f"notebook {notebook.name} failed{where}: {error}; the executed notebook is kept at {executed}"
    )


def _run_notebook(notebook: Path, executed: Path, params: dict[str, Any], results_path: Path, out_dir: Path,
                  progress: bool, cell_timeout: int) -> None:
    import papermill
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    declared = papermill.inspect_notebook(str(notebook))
    available = {**params, RESULTS_PATH_PARAM: str(results_path), OUT_DIR_PARAM: str(out_dir)}
    inject = {name: available[name] for name in declared if name in available}
    try:
        papermill.execute_notebook(
            str(notebook), str(executed), parameters=inject, kernel_name=KERNEL_NAME,
            progress_bar=progress, execution_timeout=cell_timeout,
            # NB: the notebooks folder, as in Jupyter, so relative paths resolve the same both ways;
            # every output goes through the absolute results_path / out_dir.
            cwd=str(notebook.parent),
        )
    except PapermillExecutionError as err:
        raise _failure(notebook, executed, f"{err.ename}: {err.evalue}") from err
    except CellTimeoutError as err:
        # nbclient raises this past execution_timeout; papermill passes it through unwrapped.
        error = f"CellTimeoutError: cell execution timed out after {cell_timeout} s"
        _mark_interrupted(executed, error)
        raise _failure(notebook, executed, error) from err
    except DeadKernelError as err:
        error = f"DeadKernelError: {err}"
        _mark_interrupted(executed, error)
        raise _failure(notebook, executed, error) from err


def run_pipeline(
    params: Mapping[str, Any],
    out_dir: str | os.PathLike[str] = paths.OUTPUTS_DIR,
    notebooks_dir: str | os.PathLike[str] = paths.NOTEBOOKS_DIR,
    progress: bool = True,
    cell_timeout: int = 600,
) -> PipelineResult:
    """Execute every numbered notebook into ``out_dir/notebooks``, then write ``out_dir/report.html``."""
    start = time.perf_counter()
    params = validate_params(params)
    out_dir = Path(out_dir).resolve()
    notebooks = notebook_paths(notebooks_dir)
    if not notebooks:
        raise PipelineError(f"no numbered notebooks (NN_*.ipynb) in {Path(notebooks_dir).resolve()}")
    (out_dir / "notebooks").mkdir(parents=True, exist_ok=True)
    (out_dir / "results").mkdir(parents=True, exist_ok=True)
    executed_paths, results_paths = [], []
    for notebook in notebooks:
        notebook = notebook.resolve()
        executed = out_dir / "notebooks" / notebook.name
        results_path = out_dir / "results" / f"{notebook.stem}.json"
        results_path.unlink(missing_ok=True)  # a stale file must not pass for this run's results
        _run_notebook(notebook, executed, params, results_path, out_dir, progress, cell_timeout)
        if not results_path.is_file():
            raise PipelineError(
                f"notebook {notebook.name} ran but wrote no results at {results_path}; it should call"
                f" oomlab.pipeline.write_results({RESULTS_PATH_PARAM}, ...) with its parameter;"
                f" the executed notebook is kept at {executed}"
            )
        executed_paths.append(executed)
        results_paths.append(results_path)
    source = next((p for p in executed_paths if p.name == REPORT_NOTEBOOK), executed_paths[0])
    try:
        report = render_report(source, out_dir / REPORT_NAME)
    except ReportError as err:
        raise PipelineError(f"rendering the report from {source} failed: {err}") from err
    return PipelineResult(tuple(executed_paths), tuple(results_paths), report, time.perf_counter() - start)
