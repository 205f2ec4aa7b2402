"""oomlab.explanation.next_step: the plan/budget command each verdict ends with, prefilled from the findings."""

import json
import shlex
from pathlib import Path

import pytest

from oomlab.budget.result import Phase
from oomlab.cli import build_parser
from oomlab.core.errors import InvalidValueError
from oomlab.core.seed import seed_report_text
from oomlab.explanation.explain import explain
from oomlab.explanation.next_step import PLACEHOLDER_GPUS, Subcommand, next_step, next_step_command
from oomlab.explanation.phase import PhaseCode

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "real_oom_messages.json").read_text())
T4_OLD = FIXTURES[0]["text"]  # colabtools: a T4, torch <= 2.0, no traceback
BACKWARD = ('  File "train.py", line 40, in <module>\n    loss.backward()\n'
            '  File "/x/torch/_tensor.py", line 487, in backward\n    torch.autograd.backward(\n')
GPUS = "--gpus <number of GPUs>"


def _fixture(part: str) -> str:
    return next(c["text"] for c in FIXTURES if part in c["source"])


@pytest.mark.parametrize(
    ("text", "options", "command"),
    [
        # the seed: moving llama-13b to a T4 (matched from 14.75 GiB), float16 replayed -> the plan
        (seed_report_text(), {"model": "llama-13b"},
         f"python -m oomlab plan --model llama-13b --gpu t4 {GPUS} --precision fp16-mixed"),
        # no model given, no traceback: the plan, with the model left to fill in
        (T4_OLD, {}, f"python -m oomlab plan --model <model name or config.json> --gpu t4 {GPUS}"),
        # the backward pass: the budget, the method unknown, the dtype given -> its mixed precision
        (BACKWARD + T4_OLD, {"model": "llama-2-7b", "dtype": "bfloat16"},
         f"python -m oomlab budget --model llama-2-7b --gpu t4 {GPUS} --method <full|lora|qlora> "
         "--precision bf16-mixed"),
        # --gpu given wins over the match (and float32 is pure fp32)
        (T4_OLD, {"model": "mistral-7b", "gpu": "a10g", "dtype": "float32"},
         f"python -m oomlab plan --model mistral-7b --gpu a10g {GPUS} --precision fp32"),
        # a retyped "79 GiB" holds both 80 GB GPUs' capacities: both offered
        ("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79 GiB total capacity; 70.00 GiB already "
         "allocated; 1.00 GiB free; 75.00 GiB reserved in total by PyTorch)", {"model": "llama-13b"},
         f"python -m oomlab plan --model llama-13b --gpu <a100-80gb or h100-80gb> {GPUS}"),
        # host RAM ran out: the plan, with the host's RAM to fill in
        (_fixture("mxfold2/issues/20"), {"model": "llama-13b"},
         f"python -m oomlab plan --model llama-13b --gpu <GPU name> {GPUS} --host-ram <host RAM, e.g. 64GiB>"),
        # an MPS message: no NVIDIA GPU to prefill
        (_fixture("ComfyUI/issues/7372"), {}, f"python -m oomlab plan --model <model name or config.json> "
                                              f"--gpu <GPU name> {GPUS}"),
    ],
)
def test_next_step_command(text: str, options: dict, command: str) -> None:
    """The phase picks plan or budget; the model, GPU and precision are filled in where explain knows them."""
    assert next_step_command(explain(text, **options)) == command


@pytest.mark.parametrize(
    ("text", "options", "unknown"),
    [
        (seed_report_text(), {"model": "llama-13b"}, ["--gpus"]),
        (T4_OLD, {}, ["--model", "--gpus"]),
        (BACKWARD + T4_OLD, {"model": "llama-13b"}, ["--gpus", "--method"]),
        (_fixture("mxfold2/issues/20"), {}, ["--model", "--gpu", "--gpus", "--host-ram"]),
        (_fixture("ComfyUI/issues/7372"), {"model": "llama-13b"}, ["--gpu", "--gpus"]),
    ],
)
def test_unknown_options_are_named(text: str, options: dict, unknown: list) -> None:
    """Each placeholder left in the command is named with why; the GPU count is never known from a message."""
    step = next_step(explain(text, **options))
    assert [u.split(":")[0] for u in step.unknown] == unknown and not step.runnable
    assert PLACEHOLDER_GPUS in step.command


def test_gpu_count_given_fills_the_placeholder() -> None:
    """explain(gpus=4) -- the pipeline knows the count -- leaves no --gpus placeholder: the seed's plan runs as is."""
    step = next_step(explain(seed_report_text(), model="llama-13b", gpus=4))
    assert step.command == "python -m oomlab plan --model llama-13b --gpu t4 --gpus 4 --precision fp16-mixed"
    assert step.runnable


@pytest.mark.parametrize("gpus", [0, -1, 2.5, True, "4"])
def test_bad_gpu_count_is_refused(gpus: object) -> None:
    """A GPU count that is not a whole number >= 1 is refused, naming the value and what is accepted."""
    with pytest.raises(InvalidValueError) as info:
        explain(T4_OLD, gpus=gpus)
    assert str(info.value) == f"invalid gpus {gpus!r}; expected a whole number of GPUs >= 1, or None when unknown"


def test_config_path_is_quoted(tmp_path: Path) -> None:
    """A model given as a config.json path with a space is quoted for the shell."""
    path = tmp_path / "my model" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100}))
    command = next_step_command(explain(T4_OLD, model=str(path)))
    assert shlex.split(command)[4:6] == ["--model", str(path)]


@pytest.mark.parametrize("subcommand", list(Subcommand))
def test_prefilled_options_are_the_clis(subcommand: Subcommand) -> None:
    """With the placeholders filled, the command parses with oomlab's own CLI, as the subcommand it names."""
    text = (BACKWARD if subcommand is Subcommand.BUDGET else "") + T4_OLD
    step = next_step(explain(text, model="llama-13b", dtype="float16"))
    filled = step.command.replace(PLACEHOLDER_GPUS, "4").replace("<full|lora|qlora>", "lora")
    args = build_parser().parse_args(shlex.split(filled)[3:])
    assert step.subcommand is subcommand
    assert (args.command, args.model, args.gpu, args.gpus, args.precision) == (
        subcommand.value, "llama-13b", "t4", 4, "fp16-mixed")


def test_training_phases_are_the_budgets() -> None:
    """The traceback's training-step phases are budget's Phase, one to one; moving and loading are not in it."""
    assert {code.name: code.value for code in PhaseCode if code.in_step} == {p.name: p.value for p in Phase}
    assert not PhaseCode.MOVE.in_step and not PhaseCode.LOAD.in_step


@pytest.mark.parametrize(("trace", "subcommand"), [
    (BACKWARD, Subcommand.BUDGET),  # inside a training step: its memory by component
    ('  File "train.py", line 41, in <module>\n    optimizer.step()\n'
     '  File "/x/torch/optim/adamw.py", line 184, in step\n    adamw(\n', Subcommand.BUDGET),
    ('  File "/x/accelerate/utils/modeling.py", line 300, in set_module_tensor_to_device\n'
     '    new_value = value.to(device)\n', Subcommand.PLAN),  # loading: before any step
    ("", Subcommand.PLAN),  # no traceback
])
def test_subcommand_follows_the_phase(trace: str, subcommand: Subcommand) -> None:
    """A failure inside the step points to the budget, one before it (or without a traceback) to the plan."""
    assert next_step(explain(trace + T4_OLD, model="llama-13b")).subcommand is subcommand


def test_budget_carries_the_run_told() -> None:
    """The run told to explain (strategy, method, optimizer, batch, seq, nodes) is filled into the budget command, and
    the command parses with oomlab's own CLI."""
    step = next_step(explain(BACKWARD + T4_OLD, model="llama-2-7b", gpus=4, nodes=2, strategy="zero2", method="full",
                             optimizer="adamw", batch=2, seq=1024))
    assert step.command == ("python -m oomlab budget --model llama-2-7b --gpu t4 --gpus 4 --nodes 2 --strategy zero2 "
                            "--method full --optimizer adamw --batch 2 --seq 1024")
    assert step.runnable
    args = build_parser().parse_args(shlex.split(step.command)[3:])
    assert (args.nodes, args.strategy, args.method, args.batch, args.seq) == (2, "zero2", "full", 2, 1024)
