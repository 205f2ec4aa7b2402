"""A launch command line read: ``torchrun`` (or ``python -m torch.distributed.run``), ``accelerate launch``,
``deepspeed``, plain ``python``, or a framework's own command (``llamafactory-cli train``, ``axolotl train``,
``trl sft|dpo|...``); its launcher options, the training script and the script's own flags.  A config file named
right after the script (``axolotl train config.yml``, ``python -m axolotl.cli.train config.yml``) is its ``config``;
LLaMA-Factory's ``key=value`` words after its YAML (OmegaConf overrides) are flags named ``key``.

Only what the launcher is and how many processes it starts matters here; :mod:`.read` turns the flags into setup
fields, each flag its own origin.  Environment assignments in front (``CUDA_VISIBLE_DEVICES=0,1 ...``) are kept.
"""

from __future__ import annotations

import enum
import re
import shlex
from dataclasses import dataclass

from oomlab.core.errors import InvalidValueError


class Launcher(enum.Enum):
    """The program that starts the training processes."""

    TORCHRUN = "torchrun"  # torchrun / python -m torch.distributed.run: --nproc_per_node processes, DDP in the script
    ACCELERATE = "accelerate launch"  # accelerate's launcher: its config file and flags decide the distributed type
    DEEPSPEED = "deepspeed"  # DeepSpeed's launcher: one process per visible GPU (--num_gpus)
    PYTHON = "python"  # one process (the HF Trainer then wraps nn.DataParallel over every visible GPU)
    # the frameworks' own commands, each starting a process per visible GPU
    LLAMAFACTORY = "llamafactory-cli"  # llamafactory-cli train: torchrun over NPROC_PER_NODE (every visible GPU)
    AXOLOTL = "axolotl"  # axolotl train: accelerate launch -m axolotl.cli.train
    TRL = "trl"  # trl sft|dpo|grpo|kto|reward|rloo: accelerate launch of trl/scripts/<name>.py
    TUNE = "tune run"  # torchtune: tune run [torchrun options] <recipe> --config C [key=value ...]


# the subcommands of the frameworks' commands that train (the script of the command)
FRAMEWORK_TRAIN = {Launcher.LLAMAFACTORY: ("train",), Launcher.AXOLOTL: ("train",),
                   Launcher.TRL: ("sft", "dpo", "grpo", "kto", "reward", "rloo")}
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
_OVERRIDE = re.compile(r"([A-Za-z_][\w.]*)=(.*)", re.DOTALL)  # an OmegaConf override: key=value


# launcher options that take no value (everything else of the form --opt takes one)
_SWITCHES = {
    Launcher.TORCHRUN: {"--standalone", "--no-python", "--no_python", "--module", "-m", "--run-path", "--run_path"},
    Launcher.ACCELERATE: {"--multi_gpu", "--use_deepspeed", "--use_fsdp", "--cpu", "--tpu", "-m", "--module",
                          "--no_python", "--debug", "-q", "--quiet", "--same_network", "--use_xpu"},
    Launcher.DEEPSPEED: {"--no_python", "--no_local_rank", "--module", "--force_multi", "--autotuning",
                         "--enable_each_rank_log", "--bind_cores_to_rank", "--no_ssh_check", "--elastic_training"},
    Launcher.PYTHON: {"-u", "-O", "-B"},
    Launcher.LLAMAFACTORY: set(), Launcher.AXOLOTL: set(), Launcher.TRL: set(),
    Launcher.TUNE: {"--standalone", "--no-python", "--no_python", "--module", "-m", "--run-path", "--run_path"},
}
_TORCH_RUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_VAR = re.compile(r"\$(\w+)|\$\{(\w+)\}")


@dataclass(frozen=True)
class LaunchCommand:
    """One command line, split into launcher, launcher options, script and script flags."""

    text: str
    launcher: Launcher
    env: tuple[tuple[str, str], ...]  # NAME=value assignments before the command
    options: tuple[tuple[str, str | None], ...]  # the launcher's options (None: a switch)
    script: str
    flags: tuple[tuple[str, str | None], ...]  # the script's flags (None: a flag without value)
    config: str | None = None  # a config file named right after the script (axolotl's, LLaMA-Factory's YAML)

    def option(self, *names: str) -> tuple[str, str | None] | None:
        """The last of the launcher's options named ``names`` (``--nproc_per_node``/``--nproc-per-node``)."""
        found = [(k, v) for k, v in self.options if k in names]
        return found[-1] if found else None

    def flag(self, *names: str) -> tuple[str, str | None] | None:
        """The last of the script's flags named ``names`` (a LLaMA-Factory override ``key=value`` is named ``key``)."""
        found = [(k, v) for k, v in self.flags if k in names]
        return found[-1] if found else None

    def to_dict(self) -> dict:
        return {"text": self.text, "launcher": self.launcher.value, "env": dict(self.env),
                "options": [list(o) for o in self.options], "script": self.script,
                "flags": [list(f) for f in self.flags], "config": self.config}


def split_flags(words: list[str], switches: set[str] = frozenset(),
                overrides: bool = False) -> tuple[tuple[str, str | None], ...]:
    """``--key value`` / ``--key=value`` / ``--flag`` (no value: the next word is another option, or none is left);
    a bare word after a value (``--configs a b``) joins the previous flag's value with a space; with ``overrides``,
    a bare ``key=value`` word (LLaMA-Factory's OmegaConf override after its YAML) is the flag ``key``."""
    out: list[list] = []
    i = 0
    while i < len(words):
        word = words[i]
        override = _OVERRIDE.fullmatch(word) if overrides else None
        if override:
            out.append([override.group(1), override.group(2)])
        elif overrides and word.startswith("~") and _OVERRIDE.fullmatch(word[1:] + "=") is not None:
            out.append([word, None])  # torchtune's ~key: the key removed from the YAML
        elif word.startswith("-") and len(word) > 1 and not _is_number(word):
            key, eq, value = word.partition("=")
            if eq:
                out.append([key, value])
            elif key in switches or i + 1 == len(words) or (words[i + 1].startswith("-")
                                                               and not _is_number(words[i + 1])):
                out.append([key, None])
            else:
                out.append([key, words[i + 1]])
                i += 1
        elif out and out[-1][1] is not None:
            out[-1][1] += " " + word
        else:
            raise InvalidValueError(f"cannot read {word!r} in the script's flags: expected --flag or --flag value")
        i += 1
    return tuple((k, v) for k, v in out)


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _launcher_options(words: list[str], launcher: Launcher) -> tuple[list[tuple[str, str | None]], int]:
    """The launcher's options up to the script (the first word that is not an option or an option's value)."""
    options: list[tuple[str, str | None]] = []
    i = 0
    while i < len(words) and words[i].startswith("-"):
        key, eq, value = words[i].partition("=")
        if eq:
            options.append((key, value))
        elif key in _SWITCHES[launcher]:
            options.append((key, None))
        elif i + 1 < len(words):
            options.append((key, words[i + 1]))
            i += 1
            if launcher is Launcher.PYTHON and key == "-m":  # python -m module: the module is the script
                return options, i + 1
        else:
            raise InvalidValueError(f"launcher option {key!r} has no value and no script follows")
        i += 1
    return options, i


def parse_command(text: str) -> LaunchCommand:
    """Read a launch command line; an unknown program is refused listing the launchers read."""
    try:
        words = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as err:
        raise InvalidValueError(f"cannot split the launch command {text!r}: {err}") from err
    env = []
    while words and "=" in words[0] and not words[0].startswith("-") and words[0].split("=")[0].isidentifier():
        name, _, value = words.pop(0).partition("=")
        env.append((name, value))
    if not words:
        raise InvalidValueError(f"empty launch command {text!r}; expected torchrun, accelerate launch, deepspeed or "
                                "python followed by the training script")
    program = words[0].rsplit("/", 1)[-1]
    rest = words[1:]
    if program == "torchrun":
        launcher = Launcher.TORCHRUN
    elif program == "accelerate" and rest[:1] == ["launch"]:
        launcher, rest = Launcher.ACCELERATE, rest[1:]
    elif program == "deepspeed":
        launcher = Launcher.DEEPSPEED
    elif program == "llamafactory-cli" or program == "lmf":
        launcher = Launcher.LLAMAFACTORY
    elif program == "axolotl":
        launcher = Launcher.AXOLOTL
    elif program == "trl":
        launcher = Launcher.TRL
    elif program == "tune":
        if rest[:1] != ["run"]:
            raise InvalidValueError(f"tune {' '.join(rest[:1])!r} does not train; oomlab reads tune run <recipe> "
                                    "--config <config>")
        launcher, rest = Launcher.TUNE, rest[1:]
    elif program.startswith("python"):
        if rest[:1] == ["-m"] and len(rest) > 1 and rest[1] in _TORCH_RUN_MODULES:
            launcher, rest = Launcher.TORCHRUN, rest[2:]
        elif rest[:1] == ["-m"] and len(rest) > 1 and rest[1] == "accelerate.commands.launch":
            launcher, rest = Launcher.ACCELERATE, rest[2:]
        else:
            launcher = Launcher.PYTHON
    else:
        raise InvalidValueError(f"unknown launcher {words[0]!r} in {text!r}; known: torchrun, python -m "
                                "torch.distributed.run, accelerate launch, deepspeed, python, llamafactory-cli train, "
                                "axolotl train, trl sft|dpo|grpo|kto|reward|rloo, tune run")
    options, i = _launcher_options(rest, launcher)
    if launcher is Launcher.PYTHON and options and options[-1][0] == "-m" and options[-1][1] is not None:
        script, i = options.pop()[1], i
    elif i < len(rest):
        script, i = rest[i], i + 1
    else:
        raise InvalidValueError(f"no training script in the launch command {text!r}")
    if launcher in FRAMEWORK_TRAIN and script not in FRAMEWORK_TRAIN[launcher]:
        raise InvalidValueError(f"{words[0]} {script!r} does not train; oomlab reads "
                                f"{', '.join(f'{words[0]} {s}' for s in FRAMEWORK_TRAIN[launcher])}")
    config = None
    if i < len(rest) and rest[i].lower().endswith(CONFIG_SUFFIXES) and not rest[i].startswith("-"):
        config, i = rest[i], i + 1
    return LaunchCommand(text=" ".join(text.split()), launcher=launcher, env=tuple(env), options=tuple(options),
                         script=script, flags=split_flags(rest[i:], overrides=launcher in (Launcher.LLAMAFACTORY,
                                                                                          Launcher.TUNE)),
                         config=config)


def expand_env(value: str | None, env: dict[str, str]) -> str | None:
    """A launcher value with ``$NAME`` / ``${NAME}`` filled from the command's own assignments
    (``SLURM_NNODES=2 torchrun --nnodes $SLURM_NNODES``); a name not assigned is refused naming it."""
    if value is None or "$" not in value:
        return value

    def fill(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in env:
            raise InvalidValueError(f"{value!r} names ${name}, which the launch command does not set; write its value "
                                    f"(or put {name}=... in front of the command)")
        return env[name]
    return _VAR.sub(fill, value)
