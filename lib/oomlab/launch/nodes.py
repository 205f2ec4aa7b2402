"""The world size from every multi-node spelling a launch uses, each with its origin: the ``deepspeed`` launcher's
``--hostfile`` (``slots=`` lines), SLURM's variables among the command's environment assignments, and ``$VAR``
launcher values those assignments fill (``torchrun --nnodes $SLURM_NNODES``).  The launchers' own ``--nnodes`` /
``--num_nodes`` flags are read by :func:`oomlab.launch.read.launcher_refs` (``$VAR`` values filled by
:func:`oomlab.launch.command.expand_env`)."""

from __future__ import annotations

import re
from pathlib import Path

from oomlab.core.errors import InvalidValueError
from oomlab.core.user_input import read_user_text, shown
from oomlab.launch.claims import Claims
from oomlab.launch.command import Launcher
from oomlab.launch.origin import Origin, file_origin, flag_origin
from oomlab.launch.read import MAX_PROCESSES, int_value

__all__ = ["HOSTFILE_MAX_BYTES", "Hostfile", "hostfile_path", "read_hostfile", "slurm_claims"]

HOSTFILE_MAX_BYTES = 1 << 20  # a hostfile of 65,536 hosts is well under this
# deepspeed/launcher/runner.py _parse_hostfile: r'^(\S+)\s+slots=(\d+)' on each stripped line
_HOST_LINE = re.compile(r"^(\S+)\s+slots=(\d+)")


class Hostfile:
    """A DeepSpeed (MPI-style) hostfile: its hosts in order, each with its slots (GPUs) and line."""

    def __init__(self, path: str, hosts: list[tuple[str, int, int]]) -> None:
        self.path = path
        self.hosts = hosts  # (host, slots, 1-based line)

    def nodes(self, num_nodes: int | None) -> int:
        """``--num_nodes N`` keeps the first N hosts (runner.py ``apply_num_nodes_and_gpus``); fewer are all."""
        return len(self.hosts) if num_nodes is None else min(num_nodes, len(self.hosts))

    def slots(self, nodes: int) -> tuple[int, Origin]:
        """The GPUs per node of the first ``nodes`` hosts; different counts are refused (oomlab budgets one shape)."""
        used = self.hosts[:nodes]
        counts = {slots for _, slots, _ in used}
        if len(counts) > 1:
            listed = ", ".join(f"{host} slots={slots} (line {line})" for host, slots, line in used)
            raise InvalidValueError(f"{self.path}: hosts with different slots ({listed}); oomlab budgets the same "
                                    "GPUs on every node: give deepspeed --num_gpus N")
        host, slots, line = used[0]
        return slots, file_origin(self.path, f"{host} slots={slots}", line)

    def origin(self) -> Origin:
        return file_origin(self.path, f"{len(self.hosts)} hosts", self.hosts[0][2])


def read_hostfile(path: str, named_by: Origin) -> Hostfile:
    """A hostfile read bounded (:mod:`oomlab.core.user_input`) and parsed as ``runner.py _parse_hostfile`` parses it:
    ``#`` comments and blank lines skipped, ``host slots=N`` lines, a repeated host or any other line refused."""
    text = read_user_text(path, f"the hostfile {named_by} names", HOSTFILE_MAX_BYTES)
    hosts: list[tuple[str, int, int]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _HOST_LINE.search(line)
        if match is None:
            raise InvalidValueError(f"{path}:{number}: expected 'HOST slots=N' (as DeepSpeed's runner reads a "
                                    f"hostfile), got {shown(line)}")
        if any(host == match.group(1) for host, _, _ in hosts):
            raise InvalidValueError(f"{path}:{number}: host {match.group(1)!r} is listed twice; DeepSpeed refuses "
                                    "a hostfile with multiple entries for one host")
        where = file_origin(path, f"{match.group(1)} slots", number)
        hosts.append((match.group(1), int_value(match.group(2), where, MAX_PROCESSES), number))
        if len(hosts) > MAX_PROCESSES:
            raise InvalidValueError(f"{path}: more than {MAX_PROCESSES:,} hosts")
    if not hosts:
        raise InvalidValueError(f"{path}: no 'HOST slots=N' line; DeepSpeed refuses an empty hostfile")
    return Hostfile(path, hosts)


def slurm_claims(claims: Claims, env: dict[str, str], launcher: Launcher | None) -> int | None:
    """SLURM's variables among the command's assignments: ``SLURM_NNODES`` (or ``SLURM_JOB_NUM_NODES``) is the nodes;
    under plain ``python`` (srun starts each process) ``SLURM_NTASKS_PER_NODE`` is the processes per node.  Returns
    ``SLURM_GPUS_ON_NODE`` (the GPUs each node shows, as ``CUDA_VISIBLE_DEVICES`` would), or None."""
    for name in ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"):
        if name in env:
            origin = flag_origin(f"{name}={env[name]}")
            claims.say("nodes", int_value(env[name], origin, MAX_PROCESSES), origin)
    if "SLURM_NTASKS_PER_NODE" in env and launcher is Launcher.PYTHON:
        value = env["SLURM_NTASKS_PER_NODE"].split("(")[0]  # SLURM writes "4(x2)" for repeated counts
        origin = flag_origin(f"SLURM_NTASKS_PER_NODE={env['SLURM_NTASKS_PER_NODE']}")
        claims.say("gpus", int_value(value, origin, MAX_PROCESSES), origin)
    if "SLURM_GPUS_ON_NODE" in env:
        origin = flag_origin(f"SLURM_GPUS_ON_NODE={env['SLURM_GPUS_ON_NODE']}")
        return int_value(env["SLURM_GPUS_ON_NODE"], origin, MAX_PROCESSES)
    return None


def hostfile_path(value: str, command_dir: str | None) -> str:
    """A hostfile path as the command reads it: relative to the folder holding the command."""
    path = Path(value).expanduser()
    return str(path if path.is_absolute() or not command_dir else Path(command_dir) / path)
