"""python -m oomlab check: --json fields, --markdown, and exit code 2 naming the bad value before any work."""

import json
from pathlib import Path

import pytest

from oomlab.cli import main
from tests.cli_support import run_refused

TWIN = Path(__file__).parents[1] / "fixtures" / "open-assistant"


def test_check_json_fields(capsys) -> None:
    """--json carries fails_at, phase, per_gpu_peak_bytes, the setup with origins and the smallest fix."""
    assert main(["check", "--launch-dir", str(TWIN / "seed"), "--model", "llama-13b", "--gpu", "t4", "--gpus", "4",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fails_at"] == "load" and data["phase"].startswith("load: deepspeed.initialize")
    assert data["per_gpu_peak_bytes"] > data["capacity_bytes"]
    assert data["setup"]["fields"]["strategy"]["value"] == "zero2"
    assert data["setup"]["fields"]["strategy"]["origin"]["line"] == 32
    assert data["smallest_fix"]["changes"] and data["setup"]["unmodelled"]


def test_check_explicit_files_and_markdown(capsys) -> None:
    """The same twin given file by file, answered as a GitHub reply."""
    seed = TWIN / "seed"
    assert main(["check", "--launch", (seed / "launch.txt").read_text(), "--deepspeed", str(seed / "zero_config.json"),
                 "--training-args", str(seed / "training_args.json"), "--model", "llama-13b", "--gpu", "t4",
                 "--gpus", "4", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("**Verdict.**") and "fails while loading" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["check", "--gpu", "h9000"], "unknown GPU 'h9000'; known: a100-40gb"),
    (["check", "--gpu", "t4", "--model", "llama-99b"], "unknown model 'llama-99b'"),
    (["check", "--gpu", "t4", "--deepspeed", "/nonexistent/ds.json"], "--deepspeed '/nonexistent/ds.json': no such"),
    (["check", "--gpu", "t4", "--gpus", "0"], "invalid value '0'; must be an integer >= 1"),
    (["check", "--gpu", "t4", "--model", "llama-13b", "--launch", "srun x.py"], "unknown launcher 'srun'"),
    (["check", "--gpu", "t4", "--launch-dir", "/nonexistent"], "launch_dir '/nonexistent' is not a folder"),
])
def test_check_bad_input(argv: list[str], message: str, capsys) -> None:
    """Bad input exits 2 naming the value, before any budget is computed."""
    code, err = run_refused(argv, capsys, "oomlab.launch.check.estimate_setup")
    assert code == 2
    assert message in err


def test_check_malformed_file_exits_2(tmp_path: Path, capsys) -> None:
    """A malformed DeepSpeed JSON exits 2 naming the file and the line."""
    bad = tmp_path / "ds.json"
    bad.write_text('{\n  "zero_optimization": {"stage": 2,,}\n}\n')
    assert main(["check", "--gpu", "t4", "--model", "llama-13b", "--deepspeed", str(bad)]) == 2
    assert f"{bad}:2:" in capsys.readouterr().err
