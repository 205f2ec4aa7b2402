"""Every path oomlab uses, defined once."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent
SPECS_DIR = PACKAGE_DIR / "specs"
MODEL_SPECS_DIR = SPECS_DIR / "models"
GPU_SPECS_DIR = SPECS_DIR / "gpus"
DATA_DIR = PACKAGE_DIR / "data"
TEMPLATES_DIR = PACKAGE_DIR / "templates"
SEED_REPORT = DATA_DIR / "seed-oom-report.txt"
SEED_FIGURES = DATA_DIR / "seed-figures.json"  # the figures of its OOM message, checked against the parser

# The checkout (lib/oomlab -> repo root); notebooks and outputs live there.
REPO_ROOT = Path(os.environ.get("OOMLAB_ROOT", PACKAGE_DIR.parent.parent)).resolve()
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
OUTPUTS_DIR = REPO_ROOT / "outputs"
CACHE_ENV = "OOMLAB_CACHE_DIR"


def cache_dir() -> Path:
    """The cache of traces and verifications (hash-keyed JSON files): ``$OOMLAB_CACHE_DIR``, else ``outputs/cache``.

    Read at each call, so every cache honours the variable however late it is set (benchmarks use a temporary one).
    """
    return Path(os.environ.get(CACHE_ENV) or OUTPUTS_DIR / "cache").resolve()
