"""Time the analytic commands cold: each in a fresh interpreter, the median of several runs, beside ``--help`` and
beside accelerate's ``estimate-memory`` in the same run; print the medians, the ratio to each target and whether torch
and transformers were imported.

    .venv/bin/python benchmarks/bench_cold_start.py [--repeat 7] [--before REV] [--write docs/FILE.md]

Targets (issue 21, medians on a quiet machine): ``plan --model llama-13b --gpu t4 --gpus 4`` at most 1 s, ``plan
--model llama-2-70b --any-gpu`` at most 1.5 s.  ``--before REV`` times the ``lib/`` of an earlier commit the same way
(``git archive`` into a temporary folder, run with the same interpreter), the two trees taking turns run by run so a
change in the machine's load falls on both alike.  Nothing is written unless ``--write`` names
a file.

accelerate's ``estimate-memory`` asks the Hub for the model's metadata first (``verify_on_hub``), which an offline
machine cannot; its row therefore runs accelerate's own ``estimate_command`` on llama-13b's ``config.json`` in a
local folder with that one lookup stubbed (everything else -- transformers' config, ``init_empty_weights``, the meta
model, the size table -- as the command does it): a lower bound of the real command, which also waits for the Hub.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROBE = ("import sys, runpy; sys.argv = ['oomlab', *sys.argv[1:]]\n"
         "try:\n    runpy.run_module('oomlab', run_name='__main__')\nexcept SystemExit:\n    pass\n"
         "print('torch' in sys.modules, 'transformers' in sys.modules, file=sys.stderr)")
ACCELERATE = """
import sys, types
from accelerate.commands import estimate
estimate.verify_on_hub = lambda repo, token=None: types.SimpleNamespace(config={}, library_name="transformers")
parser = estimate.estimate_command_parser()
estimate.estimate_command(parser.parse_args([sys.argv[1], "--library_name", "transformers", "--dtypes", "float16"]))
print('torch' in sys.modules, 'transformers' in sys.modules, file=sys.stderr)
"""
# (label, oomlab arguments, target seconds or None)
CASES = (
    ("--help", ["--help"], None),
    ("budget (defaults: llama-13b, 4 x T4)", ["budget"], None),
    ("plan --model llama-13b --gpu t4 --gpus 4", ["plan", "--model", "llama-13b", "--gpu", "t4", "--gpus", "4"], 1.0),
    ("plan --model llama-2-70b --any-gpu", ["plan", "--model", "llama-2-70b", "--any-gpu"], 1.5),
    ("check --launch 'torchrun --nproc_per_node 4 train.py --fp16' --model llama-13b --gpu t4",
     ["check", "--launch", "torchrun --nproc_per_node 4 train.py --fp16", "--model", "llama-13b", "--gpu", "t4"], None),
    ("check --launch 'tune run full_finetune_single_device --config llama3_1/8B_full_single_device ...' --gpu "
     "rtx-4090 (a built-in config read, a fix written)",
     ["check", "--launch", "tune run full_finetune_single_device --config llama3_1/8B_full_single_device batch_size=4 "
      "tokenizer.max_seq_len=4096 optimizer=torch.optim.AdamW optimizer_in_bwd=False", "--gpu", "rtx-4090"], 1.0),
)


def cold_run(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Wall time of ``command`` in a fresh process, and what it imported (torch, transformers)."""
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}): {proc.stderr[-1000:]}")
    last = proc.stderr.strip().splitlines()[-1].split()
    return seconds, ", ".join(n for n, flag in zip(("torch", "transformers"), last, strict=True) if flag == "True") \
        or "neither"


def time_trees(libs: list[Path], repeat: int, tmp: Path) -> list[list[tuple[str, list[float], str, float | None]]]:
    """Each case's cold times for each ``lib/`` (rows per tree), the trees taking turns run by run so that a change
    in the machine's load falls on all of them alike."""
    folder = tmp / "llama-13b"
    folder.mkdir(exist_ok=True)
    shutil.copy(REPO / "lib/oomlab/specs/models/llama-13b.json", folder / "config.json")
    cases = [(label, ["-c", PROBE, *argv], target) for label, argv, target in CASES]
    cases.append(("accelerate estimate-memory llama-13b (Hub lookup stubbed)", ["-c", ACCELERATE, str(folder)], None))
    envs = [{**os.environ, "PYTHONPATH": str(lib), "HF_HUB_OFFLINE": "1"} for lib in libs]
    rows: list[list[tuple[str, list[float], str, float | None]]] = [[] for _ in libs]
    for label, argv, target in cases:
        times: list[list[float]] = [[] for _ in libs]
        imported = ["?"] * len(libs)
        for _ in range(repeat):
            for k, env in enumerate(envs):
                seconds, imported[k] = cold_run([sys.executable, *argv], env)
                times[k].append(seconds)
        for k in range(len(libs)):
            rows[k].append((label, times[k], imported[k], target))
    return rows


def table(title: str, rows: list[tuple[str, list[float], str, float | None]]) -> str:
    lines = [title, "", "| command | median s | min s | max s | target s | ratio | imports |",
             "|---|---|---|---|---|---|---|"]
    for label, times, imported, target in rows:
        med = statistics.median(times)
        ratio = f"{med / target:.2f}" if target else ""
        lines.append(f"| {label} | {med:.3f} | {min(times):.3f} | {max(times):.3f} | {target or ''} | {ratio} | "
                     f"{imported} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--before", metavar="REV", help="also time the lib/ of this earlier commit")
    parser.add_argument("--write", metavar="FILE", type=Path, help="also write the tables (markdown) to FILE")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        libs, titles = [REPO / "lib"], [f"this tree, {args.repeat} cold runs each"]
        if args.before:
            archive = subprocess.run(["git", "-C", str(REPO), "archive", args.before, "lib"], check=True,
                                     capture_output=True).stdout
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                tar.extractall(Path(tmp) / "before", filter="data")
            libs.insert(0, Path(tmp) / "before" / "lib")
            titles.insert(0, f"lib/ at {args.before}, {args.repeat} cold runs each (taking turns with this tree)")
        out = [table(title, rows) for title, rows in zip(titles, time_trees(libs, args.repeat, Path(tmp)), strict=True)]
    text = "\n\n".join(out) + f"\n\n(python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average " \
        f"{json.dumps([round(x, 2) for x in load_before])} at the start, " \
        f"{json.dumps([round(x, 2) for x in os.getloadavg()])} at the end)\n"
    print(text)
    if args.write:
        args.write.write_text(text)


if __name__ == "__main__":
    main()
