"""Stage 6: the user's launch, read: accelerate / DeepSpeed / TrainingArguments / peft / quantization / model files
and the launch command turned into a :class:`~oomlab.core.setup.TrainingSetup` whose every field says where it came
from (:mod:`.read`), which launch path that is (:mod:`.paths`), and where it fails first (:mod:`.check`)."""

from oomlab.core.exports import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "check": ("CheckResult", "check_launch"),  # not check(): a module of that name (oomlab.check is the function)
    "command": ("LaunchCommand", "parse_command"),
    "display": ("render_check",),
    "inputs": ("check_inputs", "inputs_from_dir"),
    "read": ("LaunchInputs", "UserLaunch"),
    "resolve": ("read_launch",),
    "user": ("user_launch",),
})
