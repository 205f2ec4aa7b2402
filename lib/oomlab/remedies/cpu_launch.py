"""Run the emitted ``train.py`` on CPU the way ``accelerate launch`` would: gloo processes with accelerate's own
environment for the config (the small-scale test that the launch files run)."""

from __future__ import annotations

import os
from pathlib import Path

from oomlab.remedies.launch_files import TRAIN_SCRIPT


def launch_env(config_file: str | os.PathLike[str], num_processes: int) -> dict[str, str]:
    """The environment ``accelerate launch --config_file CONFIG`` gives each process (accelerate's own code)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(
        ["--config_file", str(config_file), "--num_processes", str(num_processes), TRAIN_SCRIPT])
    args, _, _ = _validate_launch_command(args)
    return {k: v for k, v in prepare_multi_gpu_env(args).items() if k.startswith(("ACCELERATE_", "FSDP_"))}


def _free_port() -> int:
    """A free TCP port on loopback for the launched processes' rendezvous."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CPU_ATTEMPTS = 3


def run_on_cpu(config_dir: str | os.PathLike[str], config: str, script_args: list[str], num_processes: int = 2,
               timeout: float = 240.0, attempts: int = CPU_ATTEMPTS) -> list[tuple[int, str]]:
    """Run ``train.py`` under ``config`` on CPU: ``num_processes`` gloo processes started as accelerate would.

    The environment is accelerate's for that config (:func:`launch_env`) plus the torchrun-style rank variables and
    ``ACCELERATE_USE_CPU``; on CPU the script applies the config's FSDP sharding itself (see ``shard_on_cpu``).
    Returns ``(exit code, output)`` per process.

    NB: on a loaded two-core CI machine a gloo rank that had finished its steps was seen to die of SIGABRT
    ("terminate called without an active exception") while the interpreter exited -- gloo's worker threads torn
    down at exit (pytorch/pytorch#190489). The run is deterministic, so when any rank is killed by a signal it is run
    again, up to ``attempts`` times, from an empty ``--log-json`` file; an ordinary failure (exit code > 0) is never
    retried.
    """
    if attempts < 1:
        raise ValueError(f"attempts={attempts!r} is not accepted: give 1 or more")
    log = Path(script_args[script_args.index("--log-json") + 1]) if "--log-json" in script_args else None
    results: list[tuple[int, str]] = []
    for _ in range(attempts):
        if log is not None:
            log.unlink(missing_ok=True)
        results = _run_once(Path(config_dir), config, script_args, num_processes, timeout)
        if not any(code < 0 for code, _ in results):
            break
    return results


def _run_once(folder: Path, config: str, script_args: list[str], num_processes: int,
              timeout: float) -> list[tuple[int, str]]:
    import subprocess
    import sys

    env = launch_env(folder / config, num_processes)
    port = _free_port()
    procs = []
    for rank in range(num_processes):
        proc_env = {**os.environ, **env, "RANK": str(rank), "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": str(num_processes), "LOCAL_WORLD_SIZE": str(num_processes),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "ACCELERATE_USE_CPU": "true",
                    "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore::FutureWarning"}
        procs.append(subprocess.Popen([sys.executable, str(folder / TRAIN_SCRIPT), *script_args], env=proc_env,
                                      cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        results.append((proc.returncode, out))
    return results
