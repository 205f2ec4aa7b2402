"""Set-up files agree with each other; generated outputs are not tracked."""

import re
import subprocess

import tomllib
import yaml

from oomlab.core.paths import REPO_ROOT


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_lists_the_same_packages_as_pyproject() -> None:
    """environment.yml (for conda users) installs exactly pyproject's dependencies and dev extras."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]}
    env = yaml.safe_load((REPO_ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    conda = {_name(d) for d in env["dependencies"] if isinstance(d, str)} - {"python", "pip"}
    listed = {_name(r) for r in pip_section if not r.startswith("-")} | conda
    assert listed == wanted


def test_torch_is_pinned_in_every_install_step() -> None:
    """The Makefile and environment.yml pin torch==2.13.0 (a loose torch pulls a CUDA build)."""
    assert "torch==2.13.0" in (REPO_ROOT / "Makefile").read_text()
    assert "torch==2.13.0" in (REPO_ROOT / "environment.yml").read_text()


def test_outputs_are_ignored() -> None:
    """Git ignores generated files under outputs/."""
    proc = subprocess.run(["git", "check-ignore", "-q", "outputs/report.html"], cwd=REPO_ROOT)
    assert proc.returncode == 0
