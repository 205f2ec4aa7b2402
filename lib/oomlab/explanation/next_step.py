"""The command to run next, for the failure's phase, prefilled from what the message and the options told.

* Moving or loading the model (``Module.to``, ``load_state_dict``), no traceback, or host RAM (a CPU message):
  ``python -m oomlab plan`` -- every remedy for training the model on these GPUs, budgeted and ranked.
* Forward, backward or the optimizer step: ``python -m oomlab budget`` -- the per-GPU memory of one training step,
  component by component, to see which one outgrew the GPU.

What explain knows is filled in (the model given, the GPU given or the one shipped GPU whose capacity prints as the
message's total, the precision from the dtype given or replayed, the GPU and node counts when the caller passed them,
and for ``budget`` the strategy, method, optimizer, batch and sequence length told); what it cannot know stays a
``<placeholder>`` (the number of GPUs, by default: a message names one GPU, not how many the job has).
:func:`next_step_command` is the one place that writes the command, for the verdict, the JSON and any later command
that wants to point there too.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from oomlab.core.choices import Choice, Method, Precision
from oomlab.explanation.backend import Backend
from oomlab.explanation.findings import Findings

PLACEHOLDER_MODEL = "<model name or config.json>"
PLACEHOLDER_GPU = "<GPU name>"
PLACEHOLDER_GPUS = "<number of GPUs>"
PLACEHOLDER_HOST_RAM = "<host RAM, e.g. 64GiB>"
PLACEHOLDER_METHOD = "<" + "|".join(m.value for m in Method) + ">"

# NB: a weight dtype names the compute dtype, not whether master weights are fp32: the mixed precision, as the
# pipeline's parameters pair them (dtype float16 with precision fp16-mixed).
PRECISION_OF_DTYPE = {"float32": Precision.FP32, "float16": Precision.FP16_MIXED, "bfloat16": Precision.BF16_MIXED}


class Subcommand(Choice):
    """The oomlab subcommand a verdict points to (its value is the command-line name)."""

    PLAN = "plan"  # every remedy, budgeted and ranked: the failure came before training (or on the host)
    BUDGET = "budget"  # one training step's memory by component: the failure came inside the step


@dataclass(frozen=True)
class NextStep:
    """The oomlab command that takes the failure further, and what is left for the user to fill in."""

    subcommand: Subcommand
    command: str  # the whole command line, placeholders included
    answers: str  # what running it tells
    unknown: tuple[str, ...]  # the options left as placeholders, each with why

    @property
    def runnable(self) -> bool:
        """Whether the command runs as written (no placeholder left)."""
        return not self.unknown


def _gpu_option(e: Findings) -> tuple[str, str | None]:
    """The --gpu value, and why it is a placeholder (None when it is not)."""
    if e.gpu is not None:
        return e.gpu, None
    backend = e.message.backend
    if backend is Backend.CPU:
        return PLACEHOLDER_GPU, "--gpu: a CPU message names no GPU"
    if backend not in (None, Backend.CUDA):
        return PLACEHOLDER_GPU, (f"--gpu: oomlab ships NVIDIA GPU specs only, and this is {backend.article} "
                                 f"{backend.value} message; name the NVIDIA GPU to plan for")
    if len(e.gpu_matches) == 1:
        return e.gpu_matches[0], None
    if e.gpu_matches:
        return "<" + " or ".join(e.gpu_matches) + ">", "--gpu: several shipped GPUs report this total capacity"
    return PLACEHOLDER_GPU, "--gpu: no shipped GPU reports this total capacity (or the message has none)"


def _precision(e: Findings) -> Precision | None:
    dtype = e.dtype or (e.walk.dtype if e.walk is not None and e.walk.matched else None)
    return PRECISION_OF_DTYPE.get(dtype) if dtype else None


def next_step(e: Findings) -> NextStep:
    """The ``plan`` or ``budget`` command for the failure's phase and model, prefilled from the findings."""
    host = e.message.backend is Backend.CPU
    in_step = e.phase is not None and e.phase.code.in_step
    subcommand = Subcommand.BUDGET if in_step and not host else Subcommand.PLAN
    unknown: list[str] = []
    model = shlex.quote(e.model) if e.model is not None else PLACEHOLDER_MODEL
    if e.model is None:
        unknown.append("--model: the message does not name the model (give --model to explain)")
    gpu, why_gpu = _gpu_option(e)
    if why_gpu:
        unknown.append(why_gpu)
    if e.gpus is None:
        unknown.append("--gpus: the message names one GPU, not how many the job has")
    gpus = str(e.gpus) if e.gpus is not None else PLACEHOLDER_GPUS
    parts = ["python -m oomlab", subcommand.value, "--model", model, "--gpu", gpu, "--gpus", gpus]
    ctx = e.context
    if e.gpus is not None and ctx.world_size is not None and ctx.world_size > e.gpus:
        parts += ["--nodes", str(ctx.world_size // e.gpus)]
    if subcommand is Subcommand.BUDGET:
        if ctx.strategy is not None:
            parts += ["--strategy", ctx.strategy.value]
        if ctx.method is not None:
            parts += ["--method", ctx.method.value]
        else:
            parts += ["--method", PLACEHOLDER_METHOD]
            unknown.append("--method: full fine-tuning, LoRA or QLoRA is not in the message")
        for flag, value in (("--optimizer", ctx.optimizer and ctx.optimizer.value), ("--batch", ctx.batch),
                            ("--seq", ctx.seq)):
            if value is not None:
                parts += [flag, str(value)]
    if host:
        parts += ["--host-ram", PLACEHOLDER_HOST_RAM]
        unknown.append("--host-ram: the CPU message does not say how much RAM the host has")
    precision = _precision(e)
    if precision is not None:
        parts += ["--precision", precision.value]
    answers = ("the per-GPU memory of one training step, component by component: which part outgrew the GPU"
               if subcommand is Subcommand.BUDGET else
               "every remedy for training this model on these GPUs, budgeted and ranked, with launch files")
    return NextStep(subcommand, " ".join(parts), answers, tuple(unknown))


def next_step_command(e: Findings) -> str:
    """The next command as one line: ``python -m oomlab plan --model llama-13b --gpu t4 --gpus <number of GPUs> …``."""
    return next_step(e).command
