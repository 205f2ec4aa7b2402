"""The framework a launch command runs, read by its reader: :func:`read_framework` (None for a plain script, read
as a transformers-style script by :func:`oomlab.launch.read.training_claims`)."""

from __future__ import annotations

from oomlab.launch.axolotl import read_axolotl
from oomlab.launch.claims import Claims
from oomlab.launch.command import LaunchCommand
from oomlab.launch.framework import Framework, FrameworkRead, framework_of
from oomlab.launch.llamafactory import read_llamafactory
from oomlab.launch.read import LaunchInputs
from oomlab.launch.torchtune import read_torchtune
from oomlab.launch.trl_config import read_trl


def read_framework(claims: Claims, cmd: LaunchCommand, inputs: LaunchInputs) -> FrameworkRead | None:
    """Claims of the framework ``cmd`` runs (LLaMA-Factory, axolotl, TRL, torchtune), with its defaults at the release
    its reader cites (TRL's: the user's ``versions``, else the installed, else the release read); None when ``cmd`` runs
    none of them."""
    framework = framework_of(cmd)
    command_dir, gpu = inputs.command_dir, inputs.gpu
    if framework is Framework.LLAMAFACTORY:
        return read_llamafactory(claims, cmd, command_dir)
    if framework is Framework.AXOLOTL:
        return read_axolotl(claims, cmd, command_dir, gpu)
    if framework is Framework.TRL:
        return read_trl(claims, cmd, command_dir, gpu, inputs.versions)
    if framework is Framework.TORCHTUNE:
        return read_torchtune(claims, cmd, command_dir, gpu, inputs.versions)
    return None
