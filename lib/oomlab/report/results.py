"""The results JSON each notebook writes, built here (the notebooks only call these), and read back by the report.

:func:`reproduce_results`, :func:`budget_results` and :func:`plan_results` build notebooks 01–03's results from
computed objects; :func:`write_results` writes one atomically; :func:`load_results` reads all three for the report
(notebook 04), whose :mod:`.story` reads nothing these builders do not write (a test checks it).  The notebooks'
summaries in words are not stored: the story words each answer with the same sentence functions of
:mod:`oomlab.budget.display` and :mod:`oomlab.remedies.display`, from the stored figures.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from oomlab.budget.display import capacity_rows
from oomlab.budget.result import BudgetResult
from oomlab.core.files import write_text_atomic
from oomlab.core.gpus import GPUSpec
from oomlab.core.setup import TrainingSetup
from oomlab.explanation.explain import Explanation
from oomlab.launch.read import UserLaunch
from oomlab.launch.record import SETUP_RECORD_NAME, read_launch_record
from oomlab.remedies.fit_map import FitMap
from oomlab.remedies.placement import DeviceMapPlacement
from oomlab.remedies.plan import Plan
from oomlab.remedies.verdict import VerdictFacts
from oomlab.remedies.verification import Verification
from oomlab.reproduction.honesty import HonestReproduction
from oomlab.reproduction.result import ReproduceResult, compare_with_seed

NOTEBOOK_RESULTS = {"reproduce": "01_reproduce_oom", "budget": "02_memory_budget", "plan": "03_remediations"}


# ------------------------------------------------------------------------------------------- builders


def setup_case(setup: TrainingSetup, **extra: Any) -> dict[str, Any]:
    """A results JSON's ``case``: the user's setup as notebook 01 read or assumed it (names, not objects), then
    ``extra`` (the notebook's own parameters)."""
    return {"model": setup.model.name, "gpu": setup.gpu.name, "gpus": setup.gpus, "nodes": setup.nodes,
            "strategy": setup.strategy.value, "method": setup.method.value, "precision": setup.precision.value,
            "optimizer": setup.optimizer.value, "batch": setup.batch, "seq": setup.seq,
            "checkpointing": setup.checkpointing, "attention": setup.attention.value, "lora_rank": setup.lora_rank,
            "lora_targets": ",".join(setup.lora_targets), **extra}


def reproduce_results(case: Mapping[str, Any], result: ReproduceResult, float32: ReproduceResult,
                      smallest_fitting_gpu: str | None, fits_case: ReproduceResult | None,
                      decoded: Explanation | None, decoded_label: str | None, gpus: int,
                      honesty: HonestReproduction | None = None,
                      launch: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Notebook 01's results: the reproduction, the same model in float32, what would have fitted, the decoding,
    (the user's case) which of the message's figures are inputs, fitted and predicted, and the user's launch as
    notebook 01 read or assumed it (plain data: fields with origins, assumptions, the launch-path account).
    ``gpus`` is no longer stored (the case holds it); the parameter stays for notebook 01's positional call."""
    return {
        "case": dict(case),
        "reproduce": result.to_dict(),
        "seed_comparison": [{"figure": c.figure, "seed": c.seed, "reproduced": c.reproduced, "matches": c.matches}
                            for c in compare_with_seed(result)],
        "float32": float32.to_dict(),
        "smallest_fitting_gpu": smallest_fitting_gpu,
        "fits_case": fits_case.to_dict() if fits_case else None,
        "explain": decoded.to_dict() if decoded else None,
        "explain_label": decoded_label,
        "honesty": honesty.to_dict() if honesty else None,
        "launch": dict(launch) if launch else None,
    }


def budget_results(case: Mapping[str, Any], gpu: GPUSpec, gpus: int, outside_bytes: int,
                   variants: Sequence[tuple[str, BudgetResult]], committed: Mapping[str, Any],
                   worst: Mapping[str, Any], traced: Mapping[str, Any], small_scale: Sequence[Mapping[str, Any]]
                   ) -> dict[str, Any]:
    """Notebook 02's results: the configured budget and its variants, the agreement evidence, traces, measurements."""
    return {
        "case": dict(case),
        "capacity": capacity_rows(gpu, gpus, outside_bytes),
        "configured": variants[0][1].to_dict(),
        "variants": [{"label": label, **r.to_dict()} for label, r in variants],
        "agreement": {"setups": len(committed["rows"]), "worst_ratio": worst["ratio"], "worst_setup": worst["setup"],
                      "tolerance": committed["tolerance"]},
        "traced": {label: t.to_json() | {"timeline": []} for label, t in traced.items()},
        "small_scale": [dict(row) for row in small_scale],
    }


def plan_results(case: Mapping[str, Any], plan: Plan, launch_command: str | None, config_dir: Path,
                 written: Mapping[str, Path], placement: DeviceMapPlacement | None, fit_maps: Sequence[FitMap],
                 checks: Mapping[str, Verification], run_dir: str | Path | None = None,
                 own_launch: str | None = None) -> dict[str, Any]:
    """Notebook 03's results: every remedy, the knob table, the fix and its launch files, the small-scale checks;
    paths relative to ``run_dir`` (the run's folder, where the report lives) when given; ``own_launch``: the user's
    own framework command with the fix (:func:`oomlab.launch.check.own_framework_launch`; None: oomlab's files)."""
    rec = plan.recommended

    def where(path: Path) -> str:
        return str(path) if run_dir is None else os.path.relpath(path, run_dir)

    return {
        "case": dict(case),
        "configured": plan.configured.to_dict(),
        "remedies": [r.to_dict() for r in plan.shown],  # the ladder's fix first, then by speed
        "dropped": [r.to_dict() for r in plan.dropped],
        "knobs": [k.to_dict() for k in plan.knobs],
        "recommended": rec.to_dict() if rec else None,
        "launch_command": launch_command,
        "own_launch": own_launch,
        "config_dir": where(config_dir),
        "config_files": {name: where(path) for name, path in written.items()},
        "device_map": placement.to_dict() if placement else None,
        "fit_maps": [m.to_dict() for m in fit_maps],
        "verification": {name: v.to_dict() for name, v in checks.items()},
        "assumptions": list(plan.assumptions),
        "outcome": plan.outcome.value,
        "decision": None if plan.decision is None else plan.decision.to_dict(),  # the ladder: verdict, margin, steps
        "verdict": VerdictFacts.of(plan).to_dict(),  # typed: the report renders it (remedies.verdict)
        "recommendation_note": plan.recommendation_note,
        "recommended_rank": None if rec is None else plan.shown.index(rec) + 1,
        "host_ram_bytes": plan.host_ram_bytes,
        "host_ram_source": plan.host_ram_source,
        "host_ram_assumed": plan.host_ram_assumed,
        "notes": list(plan.notes),
    }


# --------------------------------------------------------------------------------------- read and write


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


def load_results(out_dir: str | Path) -> dict[str, dict[str, Any]]:
    """``{"reproduce": ..., "budget": ..., "plan": ...}`` from ``out_dir/results/*.json``; missing ones fail."""
    results_dir = Path(out_dir) / "results"
    loaded = {}
    for key, stem in NOTEBOOK_RESULTS.items():
        path = results_dir / f"{stem}.json"
        if not path.is_file():
            raise FileNotFoundError(f"no results at {str(path)!r}: run notebook {stem} first (python -m oomlab run)")
        loaded[key] = json.loads(path.read_text())
    return loaded


def load_launch(out_dir: str | Path) -> UserLaunch | None:
    """The launch the run recorded once (``out_dir/results/setup.json``, :mod:`oomlab.launch.record`), typed; None
    for results written without the runner."""
    path = Path(out_dir) / "results" / SETUP_RECORD_NAME
    return read_launch_record(path) if path.is_file() else None
