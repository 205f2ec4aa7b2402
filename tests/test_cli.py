"""python -m oomlab: output, JSON fields, and exit code 2 for bad input before any work."""

import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from oomlab.cli import main
from oomlab.core.gpus import known_gpus
from tests.cli_support import HANG_S, run_refused


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oomlab", *args], capture_output=True, text=True, timeout=300)


def test_reproduce_json_fields() -> None:
    """--json prints every field the issue lists, with the seed's figures."""
    proc = run_cli("reproduce", "--json", "--device", "simulated")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    for key in ("raised", "exception", "message", "tried_bytes", "allocated_bytes", "reserved_bytes", "free_bytes",
                "total_bytes", "failing_tensor", "moved_bytes", "model_bytes", "frames"):
        assert key in data, key
    assert data["raised"] is True and data["exception"] == "torch.OutOfMemoryError"
    assert data["tried_bytes"] == 136 * 2**20
    assert data["failing_tensor"]["name"] == "model.layers.23.mlp.gate_proj.weight"
    assert data["frames"][-3:] == ["convert", "__torch_function__", "_copy_to_device"]


def test_reproduce_text_output(capsys) -> None:
    """The human output shows the message, the reproduction's facts and the figure-by-figure comparison, in the
    words of reproduction.summary (the report's rows)."""
    from oomlab.reproduction.summary import SEED_HEADERS

    assert main(["reproduce", "--device", "simulated"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "Tried to allocate 136.00 MiB" in lines[1]
    cells = [re.split(r"\s{2,}", line.strip()) for line in lines]
    facts = {row[0]: row[-1] for row in cells if len(row) == 2}
    assert facts["failing tensor"] == "model.layers.23.mlp.gate_proj.weight"
    assert facts["whole model fits one GPU"] == "no"
    header = cells.index(list(SEED_HEADERS))
    rows = cells[header + 1:]
    assert [row[0] for row in rows] == ["Tried to allocate", "total capacity", "already allocated", "free",
                                        "reserved in total by PyTorch"]
    assert all(row[-1] == "yes" for row in rows), rows


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["reproduce", "--model", "llama-14b"], "unknown model 'llama-14b'; known: falcon-7b, gemma-2-27b"),
        (["reproduce", "--dtype", "float8"], "unknown dtype 'float8'"),
        (["reproduce", "--gpu", "h9000"], "unknown GPU 'h9000'; known: a100-40gb"),
        (["reproduce", "--non-pytorch-mib", "-5"], "invalid value '-5'; must be >= 0 MiB"),
        (["reproduce", "--non-pytorch-mib", "lots"], "invalid number 'lots'"),
        (["reproduce", "--device", "tpu"], "invalid choice: 'tpu'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_bad_input_exits_2(args: list[str], message: str, capsys) -> None:
    """Bad input: exit code 2 and a message naming the value and the accepted ones."""
    with pytest.raises(SystemExit) as info:
        code = main(args)
        raise SystemExit(code)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_run_rejects_unknown_parameter_before_any_notebook(tmp_path, capsys) -> None:
    """`run -p modle=x` exits 2 naming the accepted parameters, and writes nothing."""
    code = main(["run", "-p", "modle=llama-7b", "--out", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err
    assert "unknown parameter 'modle'" in err and "model" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", "--host-ram", "192"], "invalid host RAM '192': give it with a unit"),
        (["plan", "--host-ram", "-5GiB"], "invalid host RAM '-5GiB': must be a positive size"),
        (["plan", "--host-ram", "512MiB"], "must be at least"),
        (["plan", "--gpus", "100000"], "invalid gpus 100000; must be at most 72"),
        (["budget", "--seq", "1000000000"], "invalid seq 1000000000; llama-13b has max_position_embeddings 2048"),
        (["reproduce", "--message-format", "torch3"], "invalid message format 'torch3'; choose auto, old or new"),
    ],
)
def test_more_bad_input_exits_2_before_any_work(args: list[str], message: str, capsys) -> None:
    """The rough edges a new user hit: each refused with exit 2, naming the value."""
    with pytest.raises(SystemExit) as info:
        raise SystemExit(main(args))
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("pair", ["host_ram=192", "seq=1000000000", "gpus=100000"])
def test_run_refuses_what_budget_and_plan_refuse(tmp_path, pair: str, capsys) -> None:
    """The same rules for `run`, before any notebook: nothing is written."""
    assert main(["run", "-p", pair, "--out", str(tmp_path / "out")]) == 2
    assert pair.split("=")[0] in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_yaml_integer_host_ram_is_judged_like_the_flag(tmp_path, capsys) -> None:
    """`host_ram: 192` in a params file is refused as `-p host_ram=192` is, not taken as a type error."""
    (tmp_path / "p.yaml").write_text("host_ram: 192\n")
    assert main(["run", "--params", str(tmp_path / "p.yaml"), "--out", str(tmp_path / "out")]) == 2
    assert "give it with a unit" in capsys.readouterr().err


def test_broken_pipe_ends_quietly() -> None:
    """`python -m oomlab plan | head -1`: no BrokenPipeError traceback."""
    proc = subprocess.run(f"{sys.executable} -m oomlab plan | head -1", shell=True, capture_output=True, text=True,
                          timeout=300)
    assert proc.stdout.startswith("llama-13b on 4 x t4")
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


@pytest.mark.parametrize("command", ["reproduce", "explain", "budget", "plan"])
def test_help_shows_every_default_and_the_known_names(command: str, capsys) -> None:
    """Every option with a value says its default; --model and --gpu list the known names; no RST backticks."""
    from oomlab.cli import build_parser
    from oomlab.core.gpus import known_gpus

    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[command]  # noqa: SLF001 - argparse keeps them there
    with pytest.raises(SystemExit):
        sub.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "``" not in text
    for action in sub._actions:  # noqa: SLF001
        if action.option_strings and action.default not in (None, "==SUPPRESS==") and action.dest != "help":
            assert "default" in (action.help or "") or f"(default: {action.default})" in text, action.dest
    if any(a.dest == "gpu" for a in sub._actions):  # noqa: SLF001
        assert ", ".join(known_gpus()) in text


# (subcommand, option) named like a registry parameter whose default is None on purpose: the value comes from elsewhere
NOT_THE_REGISTRYS = {
    ("explain", "model"): "the tensors are named only when given",
    ("explain", "gpu"): "inferred from the message's total capacity",
    ("explain", "dtype"): "every dtype that fits",
    ("check", "model"): "from the launch files",
    ("check", "gpu"): "required",
    ("check", "gpus"): "from the launch files",
    ("check", "loss"): "from the launch files",
    ("check", "seq"): "from the launch files unless given (then it decides, 'given on the command line')",
    ("check", "batch"): "from the launch files unless given (then it decides, 'given on the command line')",
    ("check", "trainer"): "from the launch (stage:, rl:, trl dpo) unless given",
    ("plan", "method"): "plan --any-gpu's methods: every method unless given",
    ("plan", "strategy"): "None: core.defaults.launch_strategy (the default launch, single on one GPU)",
    ("explain", "gpus"): "not known unless given: partitions are solved over powers of two",
    ("explain", "batch"): "not known unless given: the logits' b x s is solved",
    ("explain", "seq"): "not known unless given: the logits' b x s is solved",
    ("explain", "strategy"): "not known unless given: it ranks the aggregates",
    ("explain", "method"): "not known unless given: it ranks the aggregates",
    ("explain", "optimizer"): "not known unless given: it ranks the aggregates",
    ("budget", "strategy"): "None: core.defaults.launch_strategy (the default launch, single on one GPU)",
}


def test_every_option_named_like_a_parameter_defaults_to_it() -> None:
    """One set of defaults: every option of every subcommand sharing a registry name has its default, value and type
    (``4`` is not ``"4"``, ``False`` is not ``0``), save the few listed above, whose value comes from elsewhere."""
    from oomlab.cli import build_parser
    from oomlab.pipeline.params import PARAMETERS

    subs = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001
    shared, wrong = set(), []
    for command, sub in subs.items():
        for action in sub._actions:  # noqa: SLF001
            if action.dest not in PARAMETERS or (command, action.dest) in NOT_THE_REGISTRYS:
                continue
            shared.add(action.dest)
            default = PARAMETERS[action.dest].default
            if not (action.default == default and type(action.default) is type(default)):
                wrong.append((command, action.dest, action.default, default))
    assert wrong == []
    assert {"model", "gpu", "gpus", "dtype", "method", "lora_targets", "message_format", "host_ram",
            "non_pytorch_mib", "device", "checkpointing", "attention", "lora_rank", "seq", "batch"} <= shared


@pytest.mark.parametrize(("argv", "strategy"), [
    ([], "ddp"),  # the default launch on the default 4 GPUs
    (["--gpus", "1"], "single"),  # the one rule: ddp over one GPU is one process
    (["--gpus", "1", "--nodes", "2"], "ddp"),  # two processes in all
    (["--gpus", "1", "--strategy", "ddp"], "single"),  # given or not, one rule
    (["--gpus", "2", "--strategy", "fsdp"], "fsdp"),
])
def test_budget_strategy_default(argv: list[str], strategy: str) -> None:
    """``budget`` budgets the launch :func:`oomlab.core.defaults.launch_strategy` says: without --strategy the
    default (ddp), and ddp over one GPU in all is single; another strategy is kept as given."""
    from oomlab.cli import build_parser, setup_kwargs
    from oomlab.core.setup import make_setup

    args = build_parser().parse_args(["budget", *argv])
    assert make_setup(**setup_kwargs(args)).strategy.value == strategy


def test_budget_cli_passes_checkpointing(capsys) -> None:
    """`budget --checkpointing` reaches the estimate (the line says so and the activations shrink)."""
    assert main(["budget", "--gpus", "1", "--method", "lora", "--json"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert main(["budget", "--gpus", "1", "--method", "lora", "--checkpointing", "--json"]) == 0
    on = json.loads(capsys.readouterr().out)
    assert off["checkpointing"] is False and on["checkpointing"] is True
    assert on["allocated_peak_bytes"] < off["allocated_peak_bytes"]
    assert main(["budget", "--gpus", "1", "--method", "lora", "--checkpointing"]) == 0
    assert "checkpointing on" in capsys.readouterr().out


def test_plan_any_gpu_json(capsys) -> None:
    """`plan --any-gpu --json`: one row per GPU type and count, the three winners named, integer bytes."""
    assert main(["plan", "--any-gpu", "--model", "qwen2.5-0.5b", "--method", "lora", "--max-gpus", "2",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {(o["gpu"], o["gpus"]) for o in data["options"]} == {(g, n) for g in known_gpus() for n in (1, 2)}
    assert data["methods"] == ["lora"] and data["cheapest"] and data["fastest"] and data["fewest_gpus"]
    assert all(isinstance(o["per_gpu_peak_bytes"], int) for o in data["options"] if o["fits"])


@pytest.mark.parametrize(("argv", "message"), [
    (["plan", "--any-gpu", "--max-gpus", "0"], "argument --max-gpus: invalid value '0'; must be an integer >= 1"),
    (["plan", "--any-gpu", "--max-gpus", "100"], "invalid max_gpus 100; must be an integer from 1 to 72"),
    (["plan", "--any-gpu", "--gpu", "t4"], "--any-gpu searches every GPU type and count; drop --gpu (got --gpu t4)"),
    (["plan", "--any-gpu", "--gpus", "2"], "drop --gpus (got --gpus 2)"),
    (["plan", "--any-gpu", "--prices", "/nonexistent.json"], "price table '/nonexistent.json': file not found"),
    (["plan", "--prices", "p.json"], "--prices applies to plan --any-gpu only (got --prices p.json)"),
    (["plan", "--method", "lora", "--method", "qlora"], "--method names the user's one method without --any-gpu"),
    (["plan", "--any-gpu", "--base-dtype", "float32"], "--base-dtype applies to plan without --any-gpu"),
    (["plan", "--any-gpu", "--lora-targets", "q_proj"], "--lora-targets applies to plan without --any-gpu"),
])
def test_plan_any_gpu_bad_input(argv: list[str], message: str, capsys) -> None:
    """Bad --any-gpu input exits 2 naming the value, before any search."""
    code, err = run_refused(argv, capsys, "oomlab.remedies.hardware.search_hardware")
    assert code == 2
    assert message in err


# ------------------------------------------------------------------------------------ absurd input (issue 20)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_explain_file_device_refused_at_once(capsys) -> None:
    """`explain --file /dev/zero` is refused before any read (a MemoryError after reading without bound before)."""
    start = time.perf_counter()
    assert main(["explain", "--file", "/dev/zero"]) == 2
    assert "--file '/dev/zero' is a character device; give a regular file" in capsys.readouterr().err
    assert time.perf_counter() - start < HANG_S  # a hang guard, not a speed target (benchmarks/ time things)


def test_explain_stdin_bounded(monkeypatch, capsys) -> None:
    """Standard input is read up to a bound, then refused (`cat /dev/zero | oomlab explain` read forever before)."""
    monkeypatch.setattr("oomlab.explanation.message.MAX_INPUT_BYTES", 1000)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\0" * 5000)))
    assert main(["explain"]) == 2
    assert "standard input has more than 1,000 bytes; at most 1,000 are read" in capsys.readouterr().err


def test_explain_stdin_not_utf8(monkeypatch, capsys) -> None:
    """Standard input in another encoding (PowerShell's UTF-16 log) is refused naming the byte."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("CUDA out of memory".encode("utf-16"))))
    assert main(["explain", "-"]) == 2
    assert "standard input is not UTF-8 text (byte 0xff at offset 0); save it as UTF-8" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["budget", "--gpu", "../models/llama-13b"], "GPU '../models/llama-13b' is not a GPU name: a GPU is named by "
         "one of oomlab's specs, never by a path; known: a100-40gb"),
        (["plan", "--host-ram", "9" * 400 + "GiB"], "a number of at most 30 digits (before and after the point)"),
        (["plan", "--host-ram", "2000TiB"], "must be at most 1048576.00 GiB (1 PiB)"),
        (["explain", "CUDA out of memory. Tried to allocate banana MiB (GPU x; total capacity;"],
         "error: an out-of-memory message with no readable figure: where sizes should stand it has tried "
         "'banana MiB'"),
        # a RuntimeError traceback from the traced step before
        (["budget", "--batch", "100000", "--source", "traced"], "argument --batch: invalid value '100000'; must be an "
         "integer from 1 to 65536"),
        (["budget", "--batch", "9" * 5000], "argument --batch: invalid integer '999"),  # echoed clipped
    ],
    ids=["gpu-path", "host-ram-digits", "host-ram-huge", "explain-garbled", "batch-huge", "batch-digits"],
)
def test_absurd_values_exit_2(argv: list[str], message: str, capsys) -> None:
    """Each absurd value exits 2 naming it and what is accepted (a traceback, or exit 0, before)."""
    with pytest.raises(SystemExit) as info:
        raise SystemExit(main(argv))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err) < 2000


def test_plan_prices_folder_exits_2(tmp_path, capsys) -> None:
    """`plan --any-gpu --prices FOLDER` is refused naming the folder (an IsADirectoryError traceback before)."""
    code, err = run_refused(["plan", "--any-gpu", "--prices", str(tmp_path)], capsys,
                            "oomlab.remedies.hardware.search_hardware")
    assert code == 2 and f"price table {str(tmp_path)!r} is a folder; give a regular file" in err


@pytest.mark.parametrize(
    ("env", "argv", "expected"),
    [
        ({"PYTHONIOENCODING": "ascii"}, ["explain", "CUDA out of memory. Tried to allocate 50.00 MiB (GPU 0; 14.75 GiB "
          "total capacity; 14.16 GiB already allocated; 40.81 MiB free; 14.16 GiB reserved in total by PyTorch)"],
         "[52,423,558 - 52,434,042 bytes]"),  # an en dash in UTF-8
        ({"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}, ["plan", "--model", "qwen2.5-0.5b", "--top", "2"],
         "DDP * full fine-tuning * fp16-mixed * adamw"),  # middle dots
    ],
    ids=["pythonioencoding-ascii", "lc-all-c"],
)
def test_ascii_terminal_gets_ascii(env: dict[str, str], argv: list[str], expected: str) -> None:
    """Under an ASCII terminal encoding oomlab prints x, ->, - ... for its symbols (a UnicodeEncodeError before)."""
    proc = subprocess.run([sys.executable, "-m", "oomlab", *argv], capture_output=True, timeout=300,
                          env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr.decode("ascii", "replace")[-2000:]
    out = proc.stdout.decode("ascii")  # pure ASCII
    assert expected in out and "Traceback" not in proc.stderr.decode("ascii", "replace")


def test_ascii_terminal_error_with_user_text() -> None:
    """A user's own non-ASCII text in an error message prints as '?' on an ASCII terminal, still exit 2."""
    proc = subprocess.run([sys.executable, "-m", "oomlab", "budget", "--gpu", "é/x"], capture_output=True,
                          timeout=300, env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 2
    assert "error: GPU '?/x' is not a GPU name" in proc.stderr.decode("ascii")


def test_write_configs_onto_a_file_exits_2_before_the_plan(tmp_path, capsys) -> None:
    """`plan --write-configs FILE` is refused naming the file, before any planning; the file is unchanged."""
    target = tmp_path / "train.py"
    target.write_text("mine")
    code, err = run_refused(["plan", "--write-configs", str(target)], capsys, "oomlab.remedies.plan.make_plan")
    assert code == 2 and f"launch folder {str(target)!r} is an existing file, not a folder" in err
    assert target.read_text() == "mine"


@pytest.mark.parametrize(
    ("argv", "never_called"),
    [
        (["check", "--launch-dir", "", "--gpu", "t4"], "oomlab.launch.check.check"),
        (["check", "--launch-dir", " ", "--gpu", "t4"], "oomlab.launch.check.check"),
        (["plan", "--model", "llama-13b", "--gpu", "t4", "--write-configs", ""], "oomlab.remedies.plan.make_plan"),
        (["explain", "--file", ""], "oomlab.explanation.explain.explain"),
        (["run", "--params", ""], "oomlab.pipeline.runner.run_pipeline"),
    ],
)
def test_empty_path_refused(argv: list[str], never_called: str, capsys) -> None:
    """An empty path is refused with exit 2 naming the option, never read as the current folder."""
    code, err = run_refused(argv, capsys, never_called)
    assert code == 2
    option = argv[argv.index("") - 1] if "" in argv else "--launch-dir"
    assert f"argument {option}: empty path" in err, err


def test_estimate_cli_pipeline_and_explorer_share_the_default_run(capsys) -> None:
    """One set of defaults: ``oomlab.estimate()`` with no arguments, ``python -m oomlab budget`` with no options, the
    pipeline's configured setup with no parameters and the explorer's first choices are one run, with one answer."""
    import oomlab
    from oomlab.core.setup import make_setup
    from oomlab.exploration import Choices
    from oomlab.launch.user import user_launch
    from oomlab.pipeline.params import parse_params

    api = oomlab.estimate()
    assert main(["budget", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    pipeline = user_launch(parse_params()).setup
    assert api.setup == pipeline == Choices().setup() == make_setup(gpus=4)
    assert (api.setup.gpus, api.setup.strategy.value) == (4, "ddp")
    assert cli["per_gpu_peak_bytes"] == api.per_gpu_peak_bytes


def test_plan_and_check_as_functions_answer_as_the_cli(capsys) -> None:
    """``oomlab.plan()`` and ``oomlab.check(...)`` are the commands' functions: the same defaults, the same answer."""
    import oomlab

    plan = oomlab.plan()
    assert main(["plan", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert (plan.model, plan.gpu, plan.gpus) == (cli["model"], cli["gpu"], cli["gpus"]) == ("llama-13b", "t4", 4)
    assert [r.name for r in plan.shown[:3]] == [r["name"] for r in cli["remedies"][:3]]
    launch = "torchrun --nproc_per_node 4 train.py --fp16"
    result = oomlab.check(gpu="t4", launch=launch, model="llama-13b")
    assert main(["check", "--gpu", "t4", "--launch", launch, "--model", "llama-13b", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(result.to_dict(), default=str))


def test_plan_takes_the_users_run(capsys) -> None:
    """``plan --strategy --method`` and ``plan --launch-dir`` make the user's run the first row ("configured"); more
    than one --method without --any-gpu is refused naming the choices (exit 2)."""
    assert main(["plan", "--model", "qwen2.5-7b", "--gpu", "l4", "--gpus", "2", "--strategy", "fsdp2", "--method",
                 "lora", "--precision", "bf16-mixed", "--json"]) == 0
    configured = json.loads(capsys.readouterr().out)["configured"]
    assert (configured["strategy"], configured["method"]) == ("fsdp2", "lora")
    twin = Path(__file__).parent / "fixtures" / "open-assistant" / "seed"
    assert main(["plan", "--launch-dir", str(twin), "--model", "llama-13b", "--gpu", "t4", "--json"]) == 0
    configured = json.loads(capsys.readouterr().out)["configured"]
    assert (configured["strategy"], configured["checkpointing"]) == ("zero2", True)
    assert main(["plan", "--method", "lora", "--method", "full"]) == 2
    assert "full, lora, qlora" in capsys.readouterr().err


def test_plan_takes_the_run_flags_budget_takes(capsys) -> None:
    """plan describes the run with budget's flags (attention, LoRA targets and alpha, loss, offloading, base dtype,
    optimizer in backward): its configured row is budget's setup; with --launch-dir the launch says them instead."""
    argv = ["--model", "llama-2-7b", "--gpu", "a10g", "--gpus", "1", "--method", "lora", "--precision", "bf16-mixed",
            "--seq", "1024", "--checkpointing", "--lora-targets", "q_proj,v_proj", "--lora-alpha", "32",
            "--loss", "liger-flce", "--base-dtype", "float32", "--attention", "eager"]
    assert main(["plan", *argv, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert main(["budget", *argv, "--json"]) == 0
    budget = json.loads(capsys.readouterr().out)
    assert plan["configured"]["per_gpu_peak_bytes"] == budget["per_gpu_peak_bytes"]
    code, err = run_refused(["plan", "--launch-dir", "/nonexistent", "--loss", "cce"], capsys,
                            "oomlab.remedies.plan.make_plan")
    assert code == 2 and "--loss with --launch-dir" in err
