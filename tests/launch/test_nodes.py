"""The world size from every multi-node spelling: deepspeed --num_nodes/--num_node and --hostfile, torchrun --nnodes
(ranges too), SLURM's variables; each with its origin."""

from pathlib import Path

import pytest

from oomlab.core.errors import InvalidValueError
from oomlab.launch.read import LaunchInputs
from oomlab.launch.resolve import read_launch


def _read(command: str, tmp_path: Path | None = None, **kw):
    if command.startswith("deepspeed") and tmp_path is not None:  # the DeepSpeed launcher needs its JSON
        (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3}, "bf16": {"enabled": true}}')
        kw["deepspeed"] = str(tmp_path / "ds.json")
    return read_launch(LaunchInputs(command=command, model="llama-2-7b", gpu="a100-80gb",
                                    command_dir=None if tmp_path is None else str(tmp_path), **kw))


def _world(command: str, tmp_path: Path | None = None, **kw) -> tuple[int, str, int, str]:
    f = _read(command, tmp_path, **kw).fields
    return f["nodes"].value, str(f["nodes"].origin), f["gpus"].value, str(f["gpus"].origin)


@pytest.mark.parametrize(("command", "nodes", "origin"), [
    ("deepspeed --num_gpus 8 --num_nodes 2 train.py", 2, "flag --num_nodes 2"),
    ("deepspeed --num_gpus 8 --num_node 2 train.py", 2, "flag --num_node 2"),  # argparse's prefix of --num_nodes
    ("deepspeed --num_gpus 8 --num_node=3 train.py", 3, "flag --num_node 3"),
    ("torchrun --nnodes 2 --nproc_per_node 8 train.py", 2, "flag --nnodes 2"),
    ("torchrun --nnodes 4:4 --nproc_per_node 8 train.py", 4, "flag --nnodes 4:4"),
])
def test_nodes_from_the_launcher_flags(tmp_path: Path, command: str, nodes: int, origin: str) -> None:
    """Each launcher's own spelling of the node count is read, with its flag."""
    assert _world(command, tmp_path)[:2] == (nodes, origin)


def test_torchrun_elastic_range_takes_the_fewest_nodes() -> None:
    """--nnodes 2:4 budgets 2 nodes: the job may run on 2, where each GPU holds the largest shard."""
    nodes, origin, _, _ = _world("torchrun --nnodes 2:4 --nproc_per_node 8 train.py")
    assert nodes == 2
    assert origin == "flag --nnodes 2:4 (elastic: its fewest nodes, where each GPU holds most)"


def test_hostfile_gives_nodes_and_slots(tmp_path: Path) -> None:
    """A hostfile's hosts are the nodes and their slots the GPUs per node, each with its line."""
    (tmp_path / "hostfile").write_text("# two workers\nworker-1 slots=4\n\nworker-2 slots=4\n")
    nodes, n_origin, gpus, g_origin = _world("deepspeed --hostfile hostfile train.py", tmp_path)
    assert (nodes, gpus) == (2, 4)
    assert n_origin == f"{tmp_path / 'hostfile'}:2 2 hosts"
    assert g_origin == f"{tmp_path / 'hostfile'}:2 worker-1 slots=4"


def test_hostfile_with_num_nodes_and_num_gpus(tmp_path: Path) -> None:
    """--num_nodes keeps the first hosts of the hostfile; --num_gpus replaces its slots."""
    (tmp_path / "hosts").write_text("a slots=8\nb slots=8\nc slots=2\n")
    assert _world("deepspeed -H hosts --num_nodes 2 --num_gpus 4 train.py", tmp_path) == (
        2, "flag --num_nodes 2", 4, "flag --num_gpus 4")


@pytest.mark.parametrize(("text", "message"), [
    ("a slots=4\nb slots=2\n", r"hosts with different slots \(a slots=4 \(line 1\), b slots=2 \(line 2\)\)"),
    ("a slots=4\na slots=4\n", r"hostfile:2: host 'a' is listed twice"),
    ("a 4\n", r"hostfile:1: expected 'HOST slots=N' \(as DeepSpeed's runner reads a hostfile\), got 'a 4'"),
    ("# nothing\n", r"hostfile: no 'HOST slots=N' line"),
])
def test_bad_hostfiles_are_refused(tmp_path: Path, text: str, message: str) -> None:
    """A hostfile DeepSpeed refuses (or one of uneven nodes, which oomlab does not budget) names its line."""
    (tmp_path / "hostfile").write_text(text)
    with pytest.raises(InvalidValueError, match=message):
        _read("deepspeed --hostfile hostfile train.py", tmp_path)


def test_hostfile_is_read_bounded(tmp_path: Path) -> None:
    """A FIFO named as the hostfile is refused, not waited on."""
    import os
    os.mkfifo(tmp_path / "hostfile")
    with pytest.raises(InvalidValueError, match="hostfile"):
        _read("deepspeed --hostfile hostfile train.py", tmp_path)


def test_slurm_variables_in_front_of_torchrun() -> None:
    """SLURM_NNODES fills --nnodes $SLURM_NNODES; SLURM_GPUS_ON_NODE is the node's GPUs for --nproc_per_node gpu."""
    nodes, n_origin, gpus, g_origin = _world(
        "SLURM_NNODES=2 SLURM_GPUS_ON_NODE=4 torchrun --nnodes $SLURM_NNODES --nproc_per_node gpu train.py")
    assert (nodes, gpus) == (2, 4)
    assert n_origin == "flag --nnodes $SLURM_NNODES" and g_origin == "flag SLURM_GPUS_ON_NODE=4"


def test_slurm_tasks_per_node_under_python() -> None:
    """srun python train.py: SLURM_NTASKS_PER_NODE processes on each of SLURM_NNODES nodes, a DDP world of 8."""
    launch = _read("SLURM_NNODES=2 SLURM_NTASKS_PER_NODE=4 python train.py")
    f = launch.fields
    assert (f["nodes"].value, str(f["nodes"].origin)) == (2, "flag SLURM_NNODES=2")
    assert (f["gpus"].value, str(f["gpus"].origin)) == (4, "flag SLURM_NTASKS_PER_NODE=4")
    assert launch.setup.gpus * launch.setup.nodes == 8


def test_unset_variable_in_a_launcher_value_is_named() -> None:
    """--nnodes $SLURM_NNODES with no SLURM_NNODES= in the command says which variable to give."""
    with pytest.raises(InvalidValueError, match=r"names \$SLURM_NNODES, which the launch command does not set"):
        _read("torchrun --nnodes $SLURM_NNODES --nproc_per_node 8 train.py")
