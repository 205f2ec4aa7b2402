"""Every path oomlab uses, defined once."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SPECS_DIR = PACKAGE_DIR / "specs"
MODEL_SPECS_DIR = SPECS_DIR / "models"
GPU_SPECS_DIR = SPECS_DIR / "gpus"
DATA_DIR = PACKAGE_DIR / "data"
TEMPLATES_DIR = PACKAGE_DIR / "templates"
SEED_REPORT = DATA_DIR / "seed-oom-report.txt"

# The checkout (lib/oomlab -> repo root); notebooks and outputs live there.
REPO_ROOT = Path(os.environ.get("OOMLAB_ROOT", PACKAGE_DIR.parent.parent)).resolve()
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
OUTPUTS_DIR = REPO_ROOT / "outputs"
# Trace cache (hash-keyed JSON files); OOMLAB_CACHE_DIR moves it (benchmarks use a temporary one).
CACHE_DIR = Path(os.environ.get("OOMLAB_CACHE_DIR", OUTPUTS_DIR / "cache")).resolve()
