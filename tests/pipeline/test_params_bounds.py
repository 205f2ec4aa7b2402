"""Absurd pipeline parameters (issue 20): refused by parse_params before any notebook runs, with a short message
naming the value and what is accepted -- never a traceback, a 35 MB message, or a failure 30 seconds later."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlab.core.errors import OomlabError
from oomlab.core.gpus import load_gpu
from oomlab.core.units import MiB
from oomlab.pipeline.params import MAX_BATCH, parse_params

# 316 bytes of nested aliases: PyYAML expanded them into a mapping whose echo made a 35.8 MB message
ALIAS_BOMB = (
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    "model: [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
)
T4_TOTAL_MIB = load_gpu("t4").total_memory_bytes / MiB


def refusal(pairs: list[str] = (), params_file: Path | None = None) -> str:
    with pytest.raises(OomlabError) as info:
        parse_params(pairs, params_file)
    message = str(info.value)
    assert len(message) < 1200, len(message)
    return message


def test_params_file_not_utf8(tmp_path: Path) -> None:
    """A params file in another encoding is refused naming the byte (a UnicodeDecodeError traceback before)."""
    path = tmp_path / "params.yaml"
    path.write_bytes(b"gpu: t4\nmodel: llama\xe9\n")
    assert refusal(params_file=path) == (f"params file {str(path)!r} is not UTF-8 text (byte 0xe9 at offset 20); "
                                         "save it as UTF-8")


def test_params_file_alias_bomb(tmp_path: Path) -> None:
    """YAML aliases are refused at the first one, in a short message (a 35.8 MB message before)."""
    path = tmp_path / "params.yaml"
    path.write_text(ALIAS_BOMB)
    message = refusal(params_file=path)
    assert message.startswith(f"params file {str(path)!r} is not valid YAML: ")
    assert "an alias (*a) -- YAML aliases are not accepted in user files; write the value out" in message


def test_params_file_folder(tmp_path: Path) -> None:
    """A folder given as the params file is refused as such."""
    assert refusal(params_file=tmp_path) == f"params file {str(tmp_path)!r} is a folder; give a regular file"


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        # notebook 01 failed 31 s into the run before
        (["non_pytorch_mib=16000"], f"parameter 'non_pytorch_mib' 16000 MiB is not below the total memory of gpu "
         f"'t4', {T4_TOTAL_MIB:.2f} MiB (14.75 GiB): give less than {T4_TOTAL_MIB:.2f}, or none for the "
         "measured/default figure"),
        ([f"non_pytorch_mib={T4_TOTAL_MIB}"], "is not below the total memory of gpu 't4'"),  # the total itself
        # read as the current folder before
        (["launch_dir="], "parameter 'launch_dir': launch_dir '' is empty; give a folder of launch files, or none "
         "for no launch files"),
        (["launch_dir=  "], "launch_dir '' is empty"),  # -p strips the value
        ([f"batch={MAX_BATCH + 1}"], f"parameter 'batch' must be at most {MAX_BATCH}, got {MAX_BATCH + 1}"),
        (["batch=4096", "seq=8192", "model=llama-3.1-8b"], "parameters 'batch' 4096 x 'seq' 8192 make 33,554,432 "
         "tokens per GPU; at most 16,777,216 are accepted: lower batch or seq"),
        (["gpus=" + "9" * 5000], "parameter 'gpus' expects an integer, got '99999999"),  # int() of 5,000 digits
        (["seq=" + "9" * 40], "parameter 'seq' must be a number of at most 30 digits, got 9999"),
        (["gpu=" + "x" * 100_000], "parameter 'gpu': GPU 'xxxx"),
        (["x" * 100_000 + "=1"], "unknown parameter 'xxxx"),
        (["model=" + "y" * 100_000 + "=1"], "(100,004 characters)"),
    ],
    ids=["non-pytorch-16000", "non-pytorch-total", "launch-dir-empty", "launch-dir-blank", "batch", "tokens",
         "digits-5000", "digits-40", "long-gpu", "long-key", "long-model"],
)
def test_bad_pairs_refused_early_and_short(pairs: list[str], message: str) -> None:
    """Each refusal names the value (clipped) and what is accepted, before any notebook runs."""
    assert message in refusal(pairs)


def test_non_pytorch_below_the_chosen_gpu() -> None:
    """The same figure is accepted on a GPU that has room for it: the check is against the chosen GPU."""
    assert parse_params(["non_pytorch_mib=16000", "gpu=a100-80gb"])["non_pytorch_mib"] == 16000.0
