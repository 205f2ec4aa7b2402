"""``python -m oomlab check``: read the user's launch; where it fails first and the smallest fix."""

from __future__ import annotations

import argparse
import json

from oomlab.cli.common import (
    PARAMS,
    Formatter,
    add_loss_argument,
    gpu_help,
    host_ram_argument,
    model_help,
    path_argument,
    positive_int,
    versions_argument,
)
from oomlab.core.choices import Trainer


def add_parser(sub: argparse._SubParsersAction) -> None:
    chk = sub.add_parser("check", help="read the user's launch files and command: where the run fails first "
                         "(load or step, which phase), the per-GPU budget and the smallest fix",
                         formatter_class=Formatter)
    chk.add_argument("--launch", default=None, metavar="COMMAND",
                     help="the launch command line, quoted: torchrun / accelerate launch / deepspeed / python / "
                          "llamafactory-cli / axolotl / trl / tune run ...")
    chk.add_argument("--launch-dir", type=path_argument, default=None, metavar="DIR",
                     help="a folder of launch files (launch.txt, accelerate*.yaml, DeepSpeed JSON, training_args.json,"
                     " adapter_config.json, quantization_config.json, config.json)")
    chk.add_argument("--accelerate-config", default=None, metavar="F", help="accelerate config YAML")
    chk.add_argument("--deepspeed", default=None, metavar="F", help="DeepSpeed JSON")
    chk.add_argument("--training-args", default=None, metavar="F", help="HF TrainingArguments as JSON")
    chk.add_argument("--adapter-config", default=None, metavar="F", help="peft adapter_config.json")
    chk.add_argument("--quantization-config", default=None, metavar="F", help="a quantization_config JSON")
    chk.add_argument("--model", default=None, help=model_help() + " (none: from the launch)")
    chk.add_argument("--gpu", required=True, help=gpu_help())
    chk.add_argument("--gpus", type=positive_int, default=None, help="GPUs per node (none: as the launch says)")
    chk.add_argument("--host-ram", type=host_ram_argument, default=PARAMS["host_ram"].default,
                     help="host RAM per node, with its unit (an assumption unless given)")
    chk.add_argument("--seq", type=positive_int, default=None, metavar="N",
                     help="the sequence length in tokens, whatever the launch says (origin: given on the command line)")
    chk.add_argument("--batch", type=positive_int, default=None, metavar="N",
                     help="the micro-batch per GPU, whatever the launch says (origin: given on the command line)")
    chk.add_argument("--trainer", choices=[t.value for t in Trainer], default=None,
                     help="the training loop (sft, dpo, grpo, ...), whatever the launch says; none: as the launch "
                     "says (stage:, rl:, trl dpo), else sft")
    add_loss_argument(chk, None)
    chk.add_argument("--versions", type=versions_argument, default=None,
                     help="the releases the run uses, as name==release pins (trl==0.21.0) or a pip freeze file: "
                     "TRL's defaults follow its release; default: the installed ones, else the release each reader "
                     "cites")
    chk.add_argument("--message", type=path_argument, default=None, metavar="FILE",
                     help="the user's OOM message (and traceback): set against the budget of the launch as read")
    chk.add_argument("--json", action="store_true", help="print the answer as JSON")
    chk.add_argument("--markdown", action="store_true", help="print a reply to paste under the user's GitHub issue")


def command(args: argparse.Namespace) -> int:
    from oomlab.launch.check import check
    from oomlab.launch.display import render_check, render_markdown

    result = check(launch=args.launch, launch_dir=args.launch_dir, accelerate_config=args.accelerate_config,
                   deepspeed=args.deepspeed, training_args=args.training_args, adapter_config=args.adapter_config,
                   quantization_config=args.quantization_config, model=args.model, gpu=args.gpu, gpus=args.gpus,
                   host_ram=args.host_ram, message=args.message, seq=args.seq, batch=args.batch,
                   trainer=args.trainer, versions=args.versions, loss=args.loss)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    elif args.markdown:
        print(render_markdown(result))
    else:
        print(render_check(result))
    return 0
