"""Set-up files agree with each other; generated outputs are not tracked."""

import re
import subprocess
from importlib.metadata import distributions
from pathlib import Path

import tomllib
import yaml

from oomlab.core.paths import REPO_ROOT
from oomlab.report.story import versions


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


LOCK = REPO_ROOT / "constraints.txt"


def _lock() -> dict[str, str]:
    """``{normalised name: version}`` of constraints.txt; every line a comment or ``name==version``."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.+!-]*)", line.strip())
            assert match, f"constraints.txt: {line!r} is not an exact name==version pin"
            pins[_normalised(match.group(1))] = match.group(2)
    return pins


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _public(version: str) -> str:
    """A version without its local label: ``2.13.0+cpu`` -> ``2.13.0``."""
    return version.partition("+")[0]


def test_lock_pins_every_dependency_exactly() -> None:
    """constraints.txt pins every dependency, dev and deepspeed extra of pyproject.toml to one version."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = {_normalised(_name(r)) for r in project["dependencies"] + extras["dev"] + extras["deepspeed"]}
    assert wanted - set(_lock()) == set()


def test_lock_pins_the_cpu_torch_release() -> None:
    """The lock pins torch==2.13.0 (the local CPU wheel, 2.13.0+cpu, matches it) and leaves the project out."""
    assert _lock()["torch"] == "2.13.0"
    assert "oomlab" not in _lock()


def test_environment_yml_pins_the_lock_versions() -> None:
    """Each package environment.yml lists is pinned == the lock's version, and the lock constrains the rest."""
    env = yaml.safe_load((REPO_ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    lock = _lock()
    for requirement in (r for r in pip_section if not r.startswith("-")):
        name, sep, pinned = requirement.partition("==")
        assert sep and pinned == lock[_normalised(name)], requirement
    assert "-c constraints.txt" in pip_section


def test_makefile_installs_through_the_lock() -> None:
    """Every pip install of the Makefile's install recipe goes through -c constraints.txt, torch first, and a
    change to the lock reinstalls (the stamp depends on it)."""
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert re.search(r"^LOCK := constraints\.txt$", makefile, re.M)
    assert re.search(r"^PIP := \$\(PY\) -m pip install --quiet -c \$\(LOCK\)$", makefile, re.M)
    recipe = re.search(r"^\$\(STAMP\): (.*)\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe and "$(LOCK)" in recipe.group(1).split()
    installs = [line.strip() for line in recipe.group(2).splitlines() if "pip" in line or "$(PIP)" in line]
    assert installs and all("$(PIP)" in line and "pip install" not in line for line in installs), installs
    assert [i for i, line in enumerate(installs) if "torch==2.13.0" in line] == [1]  # after pip itself, first
    assert installs[-1] == "DS_BUILD_OPS=0 $(PIP) --no-build-isolation 'deepspeed>=0.14'"


def test_running_environment_matches_the_lock() -> None:
    """Every locked package installed here has the locked version, so the report's versions table (read from the
    environment) shows what the lock pins."""
    lock = _lock()
    installed: dict[str, str] = {}
    for d in distributions():  # the first on sys.path, the one an import loads: setuptools >= 71 appends its
        installed.setdefault(_normalised(d.metadata["Name"]), d.version)  # _vendor (packaging 26.3 ...) once imported
    drifted = {name: (installed[name], pinned) for name, pinned in lock.items()
               if name in installed and _public(installed[name]) != pinned}
    assert drifted == {}
    for package, shown in versions():
        if package != "oomlab":
            assert _public(shown) == lock[_normalised(package)], package


def test_every_shipped_data_file_is_package_data() -> None:
    """A non-editable install carries every data file the library reads: each file under specs/, data/ and
    templates/ matches a package-data glob of pyproject.toml (specs/module-trees.json was missed once)."""
    import fnmatch

    import tomllib

    root = Path(__file__).resolve().parents[1]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["oomlab"]
    package = root / "lib" / "oomlab"
    shipped = [p.relative_to(package).as_posix() for folder in ("specs", "data", "templates")
               for p in (package / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts]

    def matches(path: str, pattern: str) -> bool:  # setuptools' ** spans folders; fnmatch's * already does
        return fnmatch.fnmatch(path, pattern.replace("**/", "")) or fnmatch.fnmatch(path, pattern)

    missing = [path for path in shipped if not any(matches(path, g) and
                                                   path.count("/") >= g.count("/") - g.count("**")
                                                   for g in globs)]
    assert shipped and missing == []
