"""The unread keys ranked by how much they could change memory: batch, length, method, precision, world size first;
logging, saving, evaluation and output paths last."""

import pytest

from oomlab.launch.keys import MemoryEffect, memory_effect, ranked
from oomlab.launch.origin import Unmodelled, file_origin, flag_origin
from oomlab.launch.read import LaunchInputs
from oomlab.launch.resolve import read_launch


@pytest.mark.parametrize(("name", "effect"), [
    ("--per_device_eval_batch_size", MemoryEffect.BATCH),  # an eval batch can OOM too: not "eval", harmless
    ("--gradient_accumulation_steps", MemoryEffect.BATCH),
    ("--cutoff_len", MemoryEffect.SEQUENCE),  # LLaMA-Factory's sequence length
    ("--finetuning_type", MemoryEffect.METHOD),
    ("--bf16_full_eval", MemoryEffect.PRECISION),
    ("-H", MemoryEffect.WORLD),  # deepspeed's hostfile
    ("zero_optimization.offload_param.pin_memory", MemoryEffect.SHARDING),
    ("bnb_4bit_compute_dtype", MemoryEffect.PRECISION),
    ("--use_reentrant", MemoryEffect.CHECKPOINTING),
    ("--template", MemoryEffect.OTHER),
    ("optimizer.params.lr", MemoryEffect.HARMLESS),  # an optimizer block's learning rate changes no memory
    ("--logging_steps", MemoryEffect.HARMLESS),
    ("--output_dir", MemoryEffect.HARMLESS),
    ("--resume_from_checkpoint", MemoryEffect.HARMLESS),  # not activation checkpointing
])
def test_memory_effect_of_a_name(name: str, effect: MemoryEffect) -> None:
    """Each name falls in the effect it could have on memory."""
    assert memory_effect(name) is effect


def test_ranked_keeps_read_order_within_an_effect() -> None:
    """Memory-changing keys first, harmless ones last, ties in the order read."""
    items = [Unmodelled(flag_origin("--logging_steps"), "10"), Unmodelled(flag_origin("--cutoff_len"), "4096"),
             Unmodelled(file_origin("a.yaml", "debug", 3), False, "does not change GPU memory"),
             Unmodelled(flag_origin("--template"), "llama3"), Unmodelled(flag_origin("--finetuning_type"), "lora"),
             Unmodelled(flag_origin("--save_steps"), "500")]
    assert [str(u.origin) for u in ranked(items)] == [
        "flag --cutoff_len", "flag --finetuning_type", "flag --template", "flag --logging_steps", "a.yaml:3 debug",
        "flag --save_steps"]


def test_check_lists_decisive_flags_before_harmless_ones() -> None:
    """A LLaMA-Factory-style launch: its decisive unread flags come before the logging and saving ones."""
    command = ("python train.py --output_dir out --logging_steps 10 --save_steps 500 --report_to none "
               "--eval_steps 100 --overwrite_output_dir --plot_loss --template llama3 --finetuning_type lora "
               "--lora_target q_proj,v_proj --cutoff_len 4096")
    launch = read_launch(LaunchInputs(command=command, model="llama-2-7b", gpu="a100-80gb"))
    assert [u.origin.where for u in launch.unmodelled[:3]] == ["--finetuning_type", "--lora_target", "--template"]
    assert launch.to_dict()["unmodelled"][0]["origin"]["where"] == "--finetuning_type"
    assert str(launch.fields["seq"].origin) == "flag --cutoff_len 4096"  # a custom script's cutoff_len is read
