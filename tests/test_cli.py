"""python -m oomlab: output, JSON fields, and exit code 2 for bad input before any work."""

import json
import subprocess
import sys

import pytest

from oomlab.cli import main


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
    """The human output shows the message and the figure-by-figure comparison."""
    assert main(["reproduce", "--device", "simulated"]) == 0
    out = capsys.readouterr().out
    assert "Tried to allocate 136.00 MiB" in out
    assert out.count(" match") == 5 and "DIFFERENT" not in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["reproduce", "--model", "llama-14b"], "unknown model 'llama-14b'; known: llama-13b"),
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
