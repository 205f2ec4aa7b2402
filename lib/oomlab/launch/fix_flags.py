"""How the user's own command spells each knob a fix changes, and how to set one on it: a transformers-style script's
``--per_device_train_batch_size 2``, LLaMA-Factory's ``cutoff_len=1024`` after its YAML (an OmegaConf override) or
``--cutoff_len 1024``, axolotl's ``--micro_batch_size 1`` / ``--sequence_len 1024`` after its YAML, TRL's
``--max_length 1024``."""

from __future__ import annotations

from dataclasses import dataclass

from oomlab.launch.command import LaunchCommand
from oomlab.launch.framework import Framework, framework_of

# a script's own sequence flags, the first found in its command named as it is
SCRIPT_SEQ_FLAGS = ("max_seq_length", "max_length", "model_max_length", "block_size", "cutoff_len", "sequence_len",
                    "seq_len", "max_seq_len", "seq_length", "context_length")
_NAMES = {
    None: {"seq": "max_seq_length", "batch": "per_device_train_batch_size",
           "accumulation": "gradient_accumulation_steps", "checkpointing": "gradient_checkpointing", "optim": "optim",
           "loss": "use_liger_kernel"},
    Framework.LLAMAFACTORY: {"seq": "cutoff_len", "batch": "per_device_train_batch_size",
                             "accumulation": "gradient_accumulation_steps",
                             "checkpointing": "disable_gradient_checkpointing", "optim": "optim",
                             "loss": "enable_liger_kernel"},
    # axolotl: the key takes effect only with axolotl.integrations.liger.LigerPlugin under plugins (a YAML change)
    Framework.AXOLOTL: {"seq": "sequence_len", "batch": "micro_batch_size",
                        "accumulation": "gradient_accumulation_steps", "checkpointing": "gradient_checkpointing",
                        "optim": "optimizer", "loss": "liger_fused_linear_cross_entropy"},
    Framework.TRL: {"seq": "max_length", "batch": "per_device_train_batch_size",
                    "accumulation": "gradient_accumulation_steps", "checkpointing": "gradient_checkpointing",
                    "optim": "optim", "loss": "use_liger_kernel"},
    # torchtune: key=value overrides after the config (oomlab.launch.torchtune_fix writes its fixes)
    Framework.TORCHTUNE: {"seq": "tokenizer.max_seq_len", "batch": "batch_size",
                          "accumulation": "gradient_accumulation_steps",
                          "checkpointing": "enable_activation_checkpointing", "optim": "optimizer._component_",
                          "loss": "loss._component_"},
}


@dataclass(frozen=True)
class FlagStyle:
    """The names of one command's knobs, and whether it takes ``key=value`` overrides (LLaMA-Factory after its
    YAML) rather than ``--key value``."""

    names: dict[str, str]
    overrides: bool = False
    plain: bool = False  # a transformers-style script: checkpointing is the bare --gradient_checkpointing

    def value(self, knob: str, value: str | None) -> str | None:
        """The value written for ``knob``: checkpointing switched on as this command says it (a transformers
        script's bare ``--gradient_checkpointing``, axolotl's ``true``, LLaMA-Factory's ``disable_... false``)."""
        if knob != "checkpointing":
            return value
        if self.names[knob].startswith("disable"):
            return "false"
        return None if self.plain else "true"

    def spell(self, knob: str, value: str | None) -> str:
        """``--name value`` / ``name=value`` of ``knob``."""
        name, value = self.names[knob], self.value(knob, value)
        if self.overrides:
            return f"{name}={value}"
        return f"--{name}" + ("" if value is None else f" {value}")

    def set(self, text: str, knob: str, value: str | None) -> str:
        """``text`` with ``knob`` set to ``value``: replaced where the command gives it, else added."""
        name, value = self.names[knob], self.value(knob, value)
        if self.overrides:
            words = text.split(" ")
            for i, word in enumerate(words):
                if word.startswith(f"{name}="):
                    words[i] = f"{name}={value}"
                    return " ".join(words)
            return f"{text} {name}={value}"
        return with_flag(text, f"--{name}", value)


_PLAIN = FlagStyle(_NAMES[None], plain=True)


def flag_style(cmd: LaunchCommand | None) -> FlagStyle:
    """The style of ``cmd`` (a plain script's own sequence flag kept where it gives one)."""
    if cmd is None:
        return _PLAIN
    framework = framework_of(cmd)
    if framework is not None:
        return FlagStyle(_NAMES[framework], overrides=framework is Framework.TORCHTUNE or (
            framework is Framework.LLAMAFACTORY and cmd.config is not None))
    given = {flag.lstrip("-").replace("-", "_") for flag, _ in cmd.flags}
    seq = next((name for name in SCRIPT_SEQ_FLAGS if name in given), None)
    return _PLAIN if seq is None else FlagStyle({**_NAMES[None], "seq": seq}, plain=True)


def with_flag(text: str, flag: str, value: str | None) -> str:
    """``text`` with ``flag`` set to ``value`` (None: a switch): its value replaced where it is given, else added."""
    words = text.split(" ")
    for i, word in enumerate(words):
        if word == flag or word.startswith(flag + "="):
            if value is None:
                return text
            if word == flag and i + 1 < len(words) and not words[i + 1].startswith("-"):
                words[i + 1] = value
            else:
                words[i] = f"{flag}={value}"
            return " ".join(words)
    return f"{text} {flag}" + ("" if value is None else f" {value}")
