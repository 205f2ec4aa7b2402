"""What the frameworks' readers share: the result of reading one framework's launch (:class:`FrameworkRead`), the
framework a command runs (:func:`framework_of`), a config file named by the command, and the lookup of a key on the
command line over the config file (the command line wins, as each framework merges them).

The readers themselves: :mod:`.llamafactory`, :mod:`.axolotl`, :mod:`.trl_config`, :mod:`.torchtune`.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oomlab.core.errors import InvalidValueError
from oomlab.core.user_input import shown
from oomlab.core.versions import Versions
from oomlab.launch.claims import Claims, Strength
from oomlab.launch.command import LaunchCommand, Launcher
from oomlab.launch.files import LaunchFile, read_file
from oomlab.launch.origin import Origin, Sourced, Unmodelled, default_origin
from oomlab.launch.read import Lookup, flag_lookup


class Framework(enum.Enum):
    """A fine-tuning framework whose command and config decide the whole setup."""

    LLAMAFACTORY = "LLaMA-Factory"  # llamafactory-cli train [config.yaml] [key=value | --key value]
    AXOLOTL = "axolotl"  # axolotl train config.yml; accelerate launch / python -m axolotl.cli.train config.yml
    TRL = "TRL"  # trl sft|dpo|...; python / accelerate launch of trl/scripts/<name>.py
    TORCHTUNE = "torchtune"  # tune run <recipe> --config C [key=value ...]: its own recipes, not the HF Trainer


_TRL_SCRIPTS = ("sft", "dpo", "grpo", "kto", "reward", "rloo", "ppo", "orpo")


def trl_script(cmd: LaunchCommand) -> str | None:
    """The TRL trainer script a command runs: ``trl dpo``, ``trl/scripts/dpo.py``, ``python -m trl.scripts.dpo``,
    ``examples/scripts/dpo.py`` of TRL's repository (None: none of them)."""
    if cmd.launcher is Launcher.TRL:
        return cmd.script
    script = cmd.script.replace("\\", "/")
    if script.startswith("trl.scripts."):
        name = script.rsplit(".", 1)[-1]
    elif script.endswith(".py") and ("trl/scripts/" in script or "examples/scripts/" in script):
        name = script.rsplit("/", 1)[-1][:-3]
    else:
        return None
    return name if name in _TRL_SCRIPTS else None


def framework_of(cmd: LaunchCommand) -> Framework | None:
    """Which framework ``cmd`` runs (None: a plain script, read as a transformers-style script)."""
    if cmd.launcher is Launcher.LLAMAFACTORY:
        return Framework.LLAMAFACTORY
    if cmd.launcher is Launcher.AXOLOTL or cmd.script in ("axolotl.cli.train", "axolotl.cli.main"):
        return Framework.AXOLOTL
    if trl_script(cmd) is not None:
        return Framework.TRL
    if cmd.launcher is Launcher.TUNE:
        return Framework.TORCHTUNE
    return None


@dataclass
class FrameworkRead:
    """What a framework's reader found besides its claims: the references a transformers-style launch makes (the
    DeepSpeed JSON, FSDP, the model, the accumulation), the keys not modelled, the files read, the trainer kind."""

    framework: Framework
    version: str  # the release whose defaults filled what the user left out ("LLaMA-Factory 0.9.5")
    trainer: Sourced  # the Trainer kind, with its origin
    reference: Sourced | None = None  # the reference model as the config sets it (None: the trainer's default)
    refs: dict[str, Any] = field(default_factory=dict)
    launcher_refs: dict[str, Any] = field(default_factory=dict)  # the distributed kind a framework's own config sets
    unmodelled: list[Unmodelled] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    versions: Versions | None = None  # the releases the framework's own read fixes (torchtune's), None: the user's
    release: Sourced | None = None  # the framework's release, with where it comes from (torchtune's)
    values: dict[str, Any] = field(default_factory=dict)  # what its fixes need (UserLaunch.framework_values)


def command_path(command_dir: str | None, value: str) -> Path:
    """A path the command names, as the command reads it: relative to the folder holding the command."""
    path = Path(value).expanduser()
    return path if path.is_absolute() or not command_dir else Path(command_dir) / path


def config_file(command_dir: str | None, value: str | None) -> LaunchFile | None:
    """The framework's config file (YAML or JSON by its suffix), read bounded as every launch file."""
    return None if value is None else read_file(command_path(command_dir, value))


def layered_lookup(cmd: LaunchCommand, config: LaunchFile | None, unmodelled: list[Unmodelled], merge: str) -> Lookup:
    """A key on the command line, else in ``config``: the command line wins, as ``merge`` (the framework's code that
    merges them) does; a config key the command line replaces is listed as overridden."""
    flags = flag_lookup(cmd)
    replaced: set[str] = set()

    def look(key: str) -> tuple[bool, Any, Origin]:
        hit = flags(key)
        if config is None or not config.has(key):
            return hit
        if hit[0]:
            if key not in replaced:
                replaced.add(key)
                unmodelled.append(Unmodelled(config.origin(key), config.get(key),
                                             f"overridden by {hit[2]} on the command line ({merge})"))
            return hit
        return True, config.get(key), config.origin(key)
    return look


def say_default(claims: Claims, name: str, value: Any, version: str, what: str) -> None:
    """A framework's default for a field nobody stated (it gives way to any statement, and wins over transformers'
    own defaults: :func:`oomlab.launch.resolve.read_launch` says those only where no default is said)."""
    claims.say(name, value, default_origin(version, what), Strength.DEFAULT)


def number_of(value: Any, origin: Origin) -> float:
    """A finite number the user states (GRPO's ``beta``), refused naming ``origin`` and the value otherwise."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number):
        raise InvalidValueError(f"{origin}: expected a number, got {shown(value)}")
    return number
