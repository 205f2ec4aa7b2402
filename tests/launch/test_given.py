"""check --seq N / --batch N / --trainer KIND (oomlab.launch.given): given on the command line, they decide whatever
the launch says, with that origin; bad values exit 2 naming them."""

import json
from pathlib import Path

import pytest

from oomlab.cli import main
from oomlab.core.choices import Trainer
from oomlab.launch.inputs import check_inputs
from oomlab.launch.resolve import read_launch
from tests.cli_support import run_refused

AXOLOTL = Path(__file__).parents[1] / "fixtures" / "axolotl"


def test_given_values_win_over_the_yaml() -> None:
    """--seq and --batch replace the YAML's sequence_len and micro_batch_size; the YAML's are listed as overridden."""
    launch = read_launch(check_inputs(launch_dir=AXOLOTL, model="llama-3.1-8b", gpu="t4", seq=1024, batch=1))
    f = launch.fields
    assert (f["seq"].value, str(f["seq"].origin)) == (1024, "flag --seq 1024 (given on the command line)")
    assert (f["batch"].value, str(f["batch"].origin)) == (1, "flag --batch 1 (given on the command line)")
    assert (launch.setup.seq, launch.setup.batch) == (1024, 1)
    keys = {u.origin.key: u.why for u in launch.unmodelled if "given on the command line" in u.why}
    assert keys == {"sequence_len": "overridden by flag --seq 1024 (given on the command line)",
                    "micro_batch_size": "overridden by flag --batch 1 (given on the command line)"}


def test_cli_json_carries_the_given_origins(capsys) -> None:
    """python -m oomlab check --seq 1024 --batch 1 --trainer dpo --json: the fields and their origins."""
    assert main(["check", "--launch-dir", str(AXOLOTL), "--model", "llama-3.1-8b", "--gpu", "t4", "--seq", "1024",
                 "--batch", "1", "--trainer", "dpo", "--json"]) == 0
    fields = json.loads(capsys.readouterr().out)["setup"]["fields"]
    assert fields["seq"]["value"] == 1024 and fields["seq"]["origin"]["kind"] == "flag"
    assert fields["trainer"]["value"] == Trainer.DPO.value
    assert fields["trainer"]["origin"]["text"] == "flag --trainer dpo (given on the command line)"


@pytest.mark.parametrize("argv, message", [
    (["--seq", "0"], "--seq: invalid value '0'; must be an integer >= 1"),
    (["--batch", "x"], "--batch: invalid"),
    (["--trainer", "sft2"], "--trainer: invalid choice: 'sft2'"),
])
def test_bad_values_exit_2(argv: list[str], message: str, capsys) -> None:
    """A bad --seq, --batch or --trainer exits 2 naming the option and the value, before any budget."""
    code, err = run_refused(["check", "--launch-dir", str(AXOLOTL), "--model", "llama-3.1-8b", "--gpu", "t4", *argv],
                            capsys, "oomlab.launch.check.estimate_setup")
    assert code == 2 and message in err
