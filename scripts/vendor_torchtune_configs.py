"""Copy torchtune's built-in fine-tuning configs (as data, verbatim) into ``lib/oomlab/data/torchtune-configs``.

``tune run <recipe> --config llama3_2/3B_qlora_single_device`` names a config shipped inside torchtune's wheel; oomlab
reads it as ``oomlab.launch.torchtune`` reads a user's YAML.  This copies, from a clone of pytorch/torchtune at the
tag in :data:`TAG`, the configs of its four fine-tuning recipes (``torchtune/_recipe_registry.py``) whose model builder
names a model oomlab ships (``oomlab.launch.torchtune.BUILDERS``), and writes ``index.json``: each config's file, the
recipes the registry lists it under, and the source commit.  Run once per torchtune release read (needs the clone):

    python scripts/vendor_torchtune_configs.py /path/to/torchtune
"""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from oomlab.core.paths import DATA_DIR
from oomlab.launch.torchtune import RECIPES, builder_model

TAG = "v0.6.1"
OUT = DATA_DIR / "torchtune-configs"


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


def main(repo: str) -> None:
    commit = _git(repo, "rev-parse", f"{TAG}^{{commit}}").strip()
    namespace: dict = {}
    exec(compile(_git(repo, "show", f"{TAG}:torchtune/_recipe_registry.py"), "_recipe_registry.py", "exec"),
         namespace)
    index: dict[str, dict] = {}
    for recipe in namespace["get_all_recipes"]():
        if recipe.name not in RECIPES:
            continue
        for config in recipe.configs:
            text = _git(repo, "show", f"{TAG}:recipes/configs/{config.file_path}")
            component = (yaml.safe_load(text).get("model") or {}).get("_component_", "")
            if builder_model(component) is None:
                continue
            entry = index.setdefault(config.name, {"file": config.file_path, "recipes": []})
            entry["recipes"].append(recipe.name)
            path = OUT / config.file_path
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    about = (f"torchtune's built-in configs of its fine-tuning recipes, copied verbatim from pytorch/torchtune "
             f"{TAG} (commit {commit}) recipes/configs by scripts/vendor_torchtune_configs.py; the recipes each is "
             f"listed under are torchtune/_recipe_registry.py's at that commit. Only configs whose model builder "
             f"names a model oomlab ships. BSD-3-Clause, (c) Meta Platforms, Inc. and affiliates.")
    (OUT / "index.json").write_text(json.dumps({"about": about, "release": TAG.lstrip("v"), "commit": commit,
                                                "configs": dict(sorted(index.items()))}, indent=1) + "\n")
    print(f"{len(index)} configs from torchtune {TAG} ({commit}) into {OUT}")


if __name__ == "__main__":
    main(sys.argv[1])
