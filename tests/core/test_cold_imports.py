"""The analytic path imports no torch and no transformers: each analytic command run in a fresh interpreter, then
``sys.modules`` read.  (Timings live in ``benchmarks/bench_cold_start.py``.)"""

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import contextlib, io, json, sys
from oomlab.cli import run_cli
with contextlib.redirect_stdout(io.StringIO()):
    try:
        code = run_cli(json.loads(sys.argv[1]))
    except SystemExit as exit:
        code = exit.code
print(json.dumps({"code": code, "torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules}))
"""
API = """
import json, sys
import oomlab
oomlab.estimate()
print(json.dumps({"code": 0, "torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules}))
"""


def imported_after(code: str, *args: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["budget"],  # the defaults: llama-13b, 4 x T4
    ["budget", "--model", "llama-2-70b", "--gpu", "a100-80gb", "--gpus", "8", "--strategy", "zero3"],
    ["plan", "--model", "llama-2-70b", "--any-gpu"],
    ["plan", "--model", "llama-13b", "--gpu", "t4", "--gpus", "4"],  # device_map placed over the module tree
    ["check", "--launch", "torchrun --nproc_per_node 4 train.py --fp16", "--model", "llama-13b", "--gpu", "t4"],
], ids=lambda argv: " ".join(argv))
def test_analytic_command_imports_no_torch(argv):
    """An analytic command (no trace, no reproduction) leaves torch and transformers unimported."""
    seen = imported_after(PROBE, json.dumps(argv))
    assert seen == {"code": 0, "torch": False, "transformers": False}


def test_estimate_imports_no_torch():
    """``oomlab.estimate()`` with the defaults leaves torch and transformers unimported."""
    assert imported_after(API) == {"code": 0, "torch": False, "transformers": False}
