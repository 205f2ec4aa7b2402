"""python -m oomlab check refuses every bad launch input in seconds with exit 2, naming the file or flag, the value and
what is accepted -- never a traceback, a hang on a FIFO or an alias bomb, or an exit 0 on an absurd value (issue 20)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from oomlab.core.errors import InvalidValueError
from oomlab.launch.inputs import check_inputs, inputs_from_dir
from oomlab.launch.user import user_launch
from tests.cli_support import run_refused

TIMEOUT_S = 20.0  # a refusal takes milliseconds; a hang is caught long before pytest's own patience runs out
BASE = ["check", "--gpu", "a100-80gb", "--model", "llama-7b"]
# 9 levels of 9 aliases: 9**9 = 387,420,489 nodes once expanded, in 300 bytes
ALIAS_BOMB = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))


def _unblock(fifo: Path) -> None:
    """Let a reader stuck on ``fifo`` see end-of-file (it was opened by the code under test, not by oomlab's reader)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # no reader: nothing is stuck
        pass


def check_within(argv: list[str], capsys, fifos: tuple[Path, ...] = ()) -> tuple[int, str]:
    """Exit code and stderr of ``oomlab check ARGV``, failing the test if it runs past TIMEOUT_S (a hang) or if the
    budget is computed (a refusal comes before any work)."""
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["result"] = run_refused(argv, capsys, "oomlab.launch.check.estimate_setup")
        except BaseException as err:  # noqa: BLE001 -- handed to the test's thread below
            outcome["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(TIMEOUT_S)
    if thread.is_alive():
        for fifo in fifos:
            _unblock(fifo)
        pytest.fail(f"oomlab {' '.join(argv)} still running after {TIMEOUT_S:.0f} s")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["result"]  # type: ignore[return-value]


@pytest.mark.parametrize("where", ["--accelerate-config", "--config_file in launch.txt", "launch.txt",
                                   "a .json in the launch folder", "--deepspeed in the command"])
def test_fifo_is_refused_without_blocking(where: str, tmp_path: Path, capsys) -> None:
    """A FIFO where a launch file is expected is refused as a FIFO at once (reading it blocked forever)."""
    folder = tmp_path / "launch"
    folder.mkdir()
    if where == "--accelerate-config":
        fifo = tmp_path / "accelerate.yaml"
        argv = [*BASE, "--accelerate-config", str(fifo)]
    elif where == "--config_file in launch.txt":
        fifo = tmp_path / "accelerate.yaml"
        (folder / "launch.txt").write_text(f"accelerate launch --config_file {fifo} train.py\n")
        argv = [*BASE, "--launch-dir", str(folder)]
    elif where == "launch.txt":
        fifo = folder / "launch.txt"
        argv = [*BASE, "--launch-dir", str(folder)]
    elif where == "a .json in the launch folder":
        fifo = folder / "ds_config.json"
        argv = [*BASE, "--launch-dir", str(folder)]
    else:  # was passed over as "not here"
        fifo = tmp_path / "ds_config.json"
        argv = [*BASE, "--launch", f"deepspeed train.py --deepspeed {fifo}"]
    os.mkfifo(fifo)
    code, err = check_within(argv, capsys, (fifo,))
    assert code == 2
    assert f"{str(fifo)!r} is a FIFO (named pipe); give a regular file" in err


@pytest.mark.parametrize("name", ["launch.txt", "launch.sh"])
def test_non_utf8_launch_command_is_refused(name: str, tmp_path: Path, capsys) -> None:
    """A Latin-1 launch command file is refused naming the file, the byte and its offset (was a traceback)."""
    (tmp_path / name).write_bytes(b"torchrun --nproc_per_node 2 train.py  # caf\xe9\n")
    code, err = check_within([*BASE, "--launch-dir", str(tmp_path)], capsys)
    assert code == 2
    assert f"launch command file {str(tmp_path / name)!r} is not UTF-8 text (byte 0xe9 at offset 43)" in err


@pytest.mark.parametrize(("config", "message"), [
    ({"fp16": True}, 'fp16 must be a block of keys such as {"enabled": true}, got True'),
    ({"optimizer": "AdamW"}, 'optimizer must be a block of keys such as {"type": "AdamW"}, got \'AdamW\''),
    ({"zero_optimization": [2]}, 'zero_optimization must be a block of keys such as {"stage": 2}, got [2]'),
    ({"zero_optimization": {"stage": 2, "offload_optimizer": "cpu"}},
     'zero_optimization.offload_optimizer must be a block of keys such as {"device": "cpu"}, got \'cpu\''),
    ({"data_types": "fp32"}, 'data_types must be a block of keys such as {"grad_accum_dtype": "fp32"}, got \'fp32\''),
    ('{"zero_optimization": {"stage": 2, "reduce_bucket_size": Infinity}}', "Infinity is not a number JSON allows"),
    ({"zero_optimization": {"stage": 2, "reduce_bucket_size": -1e12}},
     "invalid zero_optimization.reduce_bucket_size -1000000000000.0; expected a number of elements: a whole number "
     "from 0 to 1,000,000,000,000,000"),
    ({"fp16": {"enabled": "maybe"}}, "fp16.enabled must be true, false or \"auto\", got 'maybe'"),
    ({"zero_optimization": {"stage": True}}, "invalid zero_optimization.stage True; oomlab budgets ZeRO stages"),
])
def test_deepspeed_json_values(config: dict | str, message: str, tmp_path: Path, capsys) -> None:
    """A DeepSpeed JSON whose block is not a mapping, or whose count is infinite or negative, is refused naming the
    file and the key (was a traceback, or exit 0)."""
    ds = tmp_path / "ds.json"
    if isinstance(config, dict):
        config = json.dumps({"zero_optimization": {"stage": 2}, **config})
    ds.write_text(config)
    code, err = check_within([*BASE, "--gpus", "2", "--deepspeed", str(ds)], capsys)
    assert code == 2
    assert f"{ds}" in err and message in err


@pytest.mark.parametrize(("batch", "message"), [
    ('"inf"', ":2 per_device_train_batch_size: expected an integer from 1 to 1,048,576, got 'inf'"),
    ("NaN", "NaN is not a number JSON allows"),
    ("1e308", ":2 per_device_train_batch_size: expected an integer from 1 to 1,048,576, got 1e+308"),
    ("1" * 5000, "an integer of 5,000 digits (at most 30 are accepted)"),
    ("[" * 100_000 + "]" * 100_000, "nests deeper than 64 levels"),
    (str(10**40), "an integer of 41 digits (at most 30 are accepted)"),  # was exit 0: a batch of 10**40 budgeted
    (str(2**20 + 1), "expected an integer from 1 to 1,048,576, got 1048577"),  # boundary: one past the cap
    ("2.5", "expected an integer from 1 to 1,048,576, got 2.5"),
    ("true", "expected an integer from 1 to 1,048,576, got True"),
])
def test_training_args_batch(batch: str, message: str, tmp_path: Path, capsys) -> None:
    """A TrainingArguments batch that is not a sane count is refused naming the file, the key and the range."""
    ta = tmp_path / "training_args.json"
    ta.write_text('{\n"per_device_train_batch_size": ' + batch + "\n}\n")
    code, err = check_within([*BASE, "--training-args", str(ta)], capsys)
    assert code == 2
    assert f"{ta}" in err and message in err


@pytest.mark.parametrize(("yaml_text", "message"), [
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: abc\n",
     ":3 deepspeed_config.zero_stage: expected an integer from 0 to 3, got 'abc'"),
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: null\n",
     ":3 deepspeed_config.zero_stage: expected an integer from 0 to 3, got None"),
    ("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: two\n",
     ":3 fsdp_config.fsdp_version: expected an integer from 1 to 2, got 'two'"),
    ("distributed_type: MULTI_GPU\nnum_processes: .inf\n", ":2 num_processes: expected an integer from 1 to 65,536, "
     "got inf"),
    (ALIAS_BOMB, ":2:8: an alias (*a) -- YAML aliases are not accepted in user files; write the value out"),
    ("num_processes: " + "9" * 40 + "\n", ":1:16: an integer of 40 digits (at most 30 are accepted)"),
])
def test_accelerate_yaml_values(yaml_text: str, message: str, tmp_path: Path, capsys) -> None:
    """An accelerate YAML value that is not one accelerate accepts, or an alias bomb, is refused naming the file and
    the line (was a traceback, or a hang)."""
    acc = tmp_path / "accelerate.yaml"
    acc.write_text(yaml_text)
    code, err = check_within([*BASE, "--accelerate-config", str(acc)], capsys)
    assert code == 2
    assert f"{acc}{message}" in err


@pytest.mark.parametrize(("command", "message"), [
    ("torchrun --nproc_per_node=inf train.py", "--nproc_per_node inf: expected an integer from 1 to 65,536, got 'inf'"),
    ("torchrun --nnodes=1:nan train.py", "--nnodes 1:nan: expected an integer from 1 to 65,536, got 'nan'"),
    ("torchrun --nnodes=4:2 train.py", "--nnodes 4:2: expected N or MIN:MAX nodes with MIN <= MAX, got '4:2'"),
    ("deepspeed --num_gpus 1e308 train.py", "--num_gpus 1e308: expected an integer from 1 to 65,536, got '1e308'"),
    ("python train.py --max_seq_length 99999999999", "--max_seq_length 99999999999: expected an integer from 1 to "
     "16,777,216"),
])
def test_launcher_counts(command: str, message: str, capsys) -> None:
    """A launcher's or script's count that is infinite, NaN or absurd is refused naming the flag (was a traceback)."""
    code, err = check_within([*BASE, "--launch", command], capsys)
    assert code == 2
    assert message in err


@pytest.mark.parametrize(("env", "entry"), [
    ("CUDA_VISIBLE_DEVICES=,", "''"),  # was "0 GPUs" without saying where the 0 came from
    ("CUDA_VISIBLE_DEVICES=", "''"),
    ("CUDA_VISIBLE_DEVICES=0,,1", "''"),
    ("CUDA_VISIBLE_DEVICES=-1", "'-1'"),
    ("CUDA_VISIBLE_DEVICES=all", "'all'"),
])
def test_cuda_visible_devices(env: str, entry: str, capsys) -> None:
    """CUDA_VISIBLE_DEVICES in the command that lists no GPU is refused saying where it came from and what is
    accepted."""
    code, err = check_within([*BASE, "--launch", f"{env} python train.py"], capsys)
    assert code == 2
    value = env.partition("=")[2]
    assert (f"CUDA_VISIBLE_DEVICES={value!r} in the launch command: the entry {entry} is not a GPU; expected "
            "comma-separated device indices or GPU UUIDs, e.g. CUDA_VISIBLE_DEVICES=0,1") in err


def test_relative_config_file_is_read_from_the_launch_folder(tmp_path: Path, monkeypatch, capsys) -> None:
    """``--config_file acc.yaml`` in launch.txt is the launch folder's acc.yaml, wherever check runs (it was looked
    up in the current folder)."""
    folder = tmp_path / "launch"
    folder.mkdir()
    (folder / "acc.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 2\n")
    (folder / "launch.txt").write_text("accelerate launch --config_file acc.yaml train.py\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    inputs = check_inputs(launch_dir=str(folder), model="llama-7b", gpu="a100-80gb")
    launch = user_launch({"launch_dir": str(folder), "gpu": "a100-80gb", "gpus": 2, "model": "llama-7b"})
    assert inputs.command_dir == str(folder)
    assert launch.setup.gpus == 2 and launch.files == (str(folder / "acc.yaml"),)
    assert str(launch.fields["gpus"].origin) == f"{folder / 'acc.yaml'}:2 num_processes"


@pytest.mark.parametrize("folder", ["", "   "])
def test_empty_launch_dir_is_refused(folder: str, tmp_path: Path, monkeypatch) -> None:
    """An empty launch_dir is refused, not read as the current folder (which held a launch.txt here)."""
    (tmp_path / "launch.txt").write_text("torchrun --nproc_per_node 2 train.py\n")
    monkeypatch.chdir(tmp_path)
    message = f"launch_dir {folder!r} is empty; give the folder of launch files"
    with pytest.raises(InvalidValueError, match=message):
        inputs_from_dir(folder, gpu="t4")
    with pytest.raises(InvalidValueError, match=message):
        check_inputs(launch_dir=folder, model="llama-7b")
    with pytest.raises(InvalidValueError, match=message):
        user_launch({"launch_dir": folder, "gpu": "t4", "gpus": 1, "model": "llama-7b"})
