"""What every ``python -m oomlab`` command shares: the parser class (errors exit 2), the argument types that name a
bad value and what is accepted, and the training-setup options.  Loads no torch."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oomlab.core.choices import (
    Attention,
    BaseDtype,
    Loss,
    MessageFormat,
    Method,
    Optimizer,
    Precision,
    Reference,
    Strategy,
    Trainer,
    message_format,
)
from oomlab.core.defaults import DEFAULTS
from oomlab.core.errors import OomlabError
from oomlab.core.gpus import known_gpus
from oomlab.core.models import ALL_LINEAR, PROJECTIONS, known_models
from oomlab.core.prices import HOST_RAM_AUTO
from oomlab.core.units import parse_memory_size
from oomlab.core.user_input import MAX_INT_DIGITS, shown
from oomlab.core.versions import KNOWN as KNOWN_PACKAGES
from oomlab.core.versions import Versions, versions_from
from oomlab.pipeline.params import PARAMETERS

EXIT_BAD_INPUT = 2


class Parser(argparse.ArgumentParser):
    """argparse, but errors name the program and exit 2 (argparse's own convention)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid number {shown(text)}; expected a number of MiB >= 0") from err
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"invalid value {shown(text)}; must be >= 0 MiB")
    return value


def positive_int(text: str) -> int:
    try:
        if len(text.strip().lstrip("+")) > MAX_INT_DIGITS:  # int() of 5,000 digits: Python's own limit, slowly
            raise ValueError(text)
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid integer {shown(text)}; expected an integer >= 1") from err
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid value {shown(text)}; must be an integer >= 1")
    return value


def path_argument(text: str) -> Path:
    """A file or folder argument; an empty one is refused (``Path("")`` would silently mean the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"empty path {text!r}; give a file or folder")
    return Path(text)


def versions_argument(text: str) -> Versions:
    """``--versions``: ``name==release`` pins, or the path of a ``pip freeze`` file (:mod:`oomlab.core.versions`)."""
    try:
        return versions_from(text if "==" in text else path_argument(text))
    except OomlabError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def batch_argument(text: str) -> int:
    """A micro-batch: an integer from 1 to the pipeline parameter's maximum (past it the traced step overflows)."""
    value = positive_int(text)
    if value > PARAMS["batch"].maximum:
        raise argparse.ArgumentTypeError(f"invalid value {shown(text)}; must be an integer from 1 to "
                                         f"{PARAMS['batch'].maximum:g}")
    return value


class StoreGiven(argparse.Action):
    """Store the value and note that the option was given: ``plan --any-gpu`` refuses ``--gpu`` and ``--gpus``; an
    unset ``--strategy`` on one GPU means single; an unset ``--host-ram`` is assumed (auto)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


PARAMS = PARAMETERS  # one set of defaults: the pipeline's parameters (the seed's case)


class Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in its help line (argparse shows the choices in braces); an option without one
    (None) says in its help what happens instead."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def model_help() -> str:
    return f"a shipped model ({', '.join(known_models())}) or the path to a config.json"


def gpu_help() -> str:
    return f"GPU type: {', '.join(known_gpus())}"


def message_format_argument(text: str) -> str:
    """``auto``, ``old`` or ``new`` (``torch<=2.0`` / ``torch>=2.1`` are accepted for old / new)."""
    if text.strip() == "auto":
        return "auto"
    try:
        return "old" if message_format(text) is MessageFormat.OLD else "new"
    except OomlabError as err:
        raise argparse.ArgumentTypeError(f"invalid message format {text!r}; choose auto, old or new") from err


def add_setup_arguments(parser: argparse.ArgumentParser) -> None:
    """The training-setup options of ``budget``."""
    parser.add_argument("--model", default=DEFAULTS.model, help=model_help())
    parser.add_argument("--gpu", default=DEFAULTS.gpu, help=gpu_help())
    parser.add_argument("--gpus", type=positive_int, default=DEFAULTS.gpus, help="GPUs per node")
    parser.add_argument("--nodes", type=positive_int, default=DEFAULTS.nodes, help="nodes")
    parser.add_argument("--strategy", choices=[s.value for s in Strategy], default=None,
                        help="the launch: single = one process; ddp = accelerate/torchrun DDP; fsdp = accelerate's "
                        "default FSDP (fsdp_version 1); fsdp2 = accelerate fsdp_version 2; *-offload = with "
                        "fsdp_offload_params; zero1/zero2 = DeepSpeed (default: "
                        f"{DEFAULTS.strategy.value}; ddp over one GPU in all is single)")
    parser.add_argument("--method", choices=[m.value for m in Method], default=DEFAULTS.method.value,
                        help="what is trained")
    parser.add_argument("--precision", choices=[p.value for p in Precision], default=DEFAULTS.precision.value,
                        help="weights and compute dtypes (the budget's notes say what they mean for the launch)")
    parser.add_argument("--optimizer", choices=[o.value for o in Optimizer], default=DEFAULTS.optimizer.value,
                        help="adamw = torch.optim.AdamW as constructed by hand (foreach); adamw-fused = "
                        "AdamW(fused=True), the HF Trainer's default (optim='adamw_torch_fused')")
    parser.add_argument("--batch", type=batch_argument, default=DEFAULTS.batch, help="micro-batch per GPU")
    parser.add_argument("--seq", type=positive_int, default=DEFAULTS.seq, help="sequence length in tokens")
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing of each layer")
    add_attention_and_lora_arguments(parser)
    parser.add_argument("--versions", type=versions_argument, default=None,
                        help="the releases the run uses, as name==release pins (torch==2.0.1,transformers==4.31.0) "
                        f"or a pip freeze file; packages read: {', '.join(KNOWN_PACKAGES)}; default: the installed "
                        "releases (the budget's notes say which)")
    add_trainer_arguments(parser)
    add_step_arguments(parser)


def add_attention_and_lora_arguments(parser: argparse.ArgumentParser, lora_rank: bool = True) -> None:
    """``--attention``, ``--lora-rank`` (unless the command has its own), ``--lora-alpha``, ``--lora-targets``:
    ``budget``'s and ``plan``'s."""
    parser.add_argument("--attention", choices=[a.value for a in Attention], default=DEFAULTS.attention.value,
                        help="transformers' attention implementation")
    if lora_rank:
        parser.add_argument("--lora-rank", type=positive_int, default=DEFAULTS.lora_rank, help="LoRA rank")
    parser.add_argument("--lora-alpha", type=positive_int, default=DEFAULTS.lora_alpha, help="LoRA alpha")
    parser.add_argument("--lora-targets", default=",".join(DEFAULTS.lora_targets),
                        help=f"comma-separated names of the model's nn.Linear modules (LLaMA's: "
                        f"{','.join(PROJECTIONS)}; other families their own), or {ALL_LINEAR}")


def add_step_arguments(parser: argparse.ArgumentParser) -> None:
    """What the step runs beside the setup -- ``--loss``, ``--offload-activations``, ``--optimizer-in-backward``,
    ``--base-dtype``: ``budget``'s and ``plan``'s."""
    add_loss_argument(parser, DEFAULTS.loss.value)
    parser.add_argument("--offload-activations", action="store_true",
                        help="TRL's activation_offloading: saved activations in pinned host memory, the top layer's "
                        "kept on the GPU")
    parser.add_argument("--optimizer-in-backward", action="store_true",
                        help="torchtune's optimizer_in_bwd: each parameter stepped by its own optimizer as its "
                        "gradient completes, the gradient then freed (no optimizer step after backward; strategy "
                        "single only)")
    parser.add_argument("--base-dtype", choices=[d.value for d in BaseDtype], default=DEFAULTS.base_dtype.value,
                        help="LoRA's frozen base as from_pretrained stored it: half = torch_dtype=bfloat16/float16 "
                        "(or transformers 5's dtype='auto' over a half checkpoint); float32 = loaded without "
                        "torch_dtype in transformers 4.x (or TRL's ModelConfig dtype default), twice the bytes, and "
                        "autocast's half copies of its weights kept for backward")


def add_loss_argument(parser: argparse.ArgumentParser, default: str | None) -> None:
    """``--loss``: how the causal-LM loss is computed (oomlab.budget.loss_kernels)."""
    parser.add_argument("--loss", choices=[m.value for m in Loss], default=default,
                        help="the causal-LM loss: standard = transformers' loss over the (tokens x vocab) logits; "
                        "liger-flce = Liger's fused linear cross-entropy (use_liger_kernel=True); cce = Cut "
                        "Cross-Entropy (axolotl cut_cross_entropy); chunked* = a framework's chunked head and loss "
                        "(torchtune, litgpt, axolotl chunked_cross_entropy: oomlab.core.choices.Loss)"
                        + ("" if default else "; none: as the launch says"))


def add_trainer_arguments(parser: argparse.ArgumentParser) -> None:
    """The training loop's options: ``--trainer`` and ``--reference`` (oomlab.budget.trainers)."""
    parser.add_argument("--trainer", choices=[t.value for t in Trainer], default=DEFAULTS.trainer.value,
                        help="the training loop: sft = transformers' Trainer / TRL SFTTrainer; dpo, orpo, kto, grpo, "
                        "reward = TRL's trainers (dpo: a reference model and chosen + rejected per example; grpo: "
                        "generation's KV cache for --batch completions of --seq tokens); ppo = policy, reference, "
                        "reward and value models")
    parser.add_argument("--reference", choices=[r.value for r in Reference], default=DEFAULTS.reference.value,
                        help="the trainer's reference model: default = as its config defaults it (dpo, kto, ppo: "
                        "resident; grpo: beta=0, none); resident = held all step (grpo beta > 0); none = "
                        "precompute_ref_log_probs (one extra pass over the data before training)")


def setup_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The ``estimate``/``make_setup`` keyword arguments from parsed setup options (no ``--strategy``: None, the
    default launch of :func:`oomlab.core.defaults.launch_strategy`)."""
    return {"model": args.model, "gpu": args.gpu, "gpus": args.gpus, "nodes": args.nodes,
            "strategy": args.strategy, "method": args.method, "precision": args.precision,
            "optimizer": args.optimizer, "batch": args.batch, "seq": args.seq,
            "checkpointing": args.checkpointing, "attention": args.attention, "lora_rank": args.lora_rank,
            "lora_alpha": args.lora_alpha, "lora_targets": args.lora_targets, "trainer": args.trainer,
            "reference": args.reference, "loss": args.loss,
            "offload_activations": args.offload_activations, "base_dtype": args.base_dtype,
            "optimizer_in_backward": args.optimizer_in_backward, "versions": args.versions}


def host_ram_argument(text: str) -> int | str:
    if text.strip().lower() == HOST_RAM_AUTO:
        return HOST_RAM_AUTO
    try:
        return parse_memory_size(text)
    except OomlabError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


VALUE_OPTIONS = ("--host-ram", "--non-pytorch-mib")  # options whose value may start with "-" (refused with a reason)


def join_dash_values(argv: Sequence[str]) -> list[str]:
    """``--host-ram -5GiB`` as ``--host-ram=-5GiB``: argparse would take ``-5GiB`` for an option and say only
    "expected one argument"; joined, the option's own check names the value."""
    out: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        if items[i] in VALUE_OPTIONS and i + 1 < len(items) and items[i + 1].startswith("-") \
                and not items[i + 1].startswith("--"):
            out.append(f"{items[i]}={items[i + 1]}")
            i += 2
            continue
        out.append(items[i])
        i += 1
    return out


