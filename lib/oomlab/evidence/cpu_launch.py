"""Run the emitted ``train.py`` on CPU the way ``accelerate launch`` would: gloo processes with accelerate's own
environment for the config, and accelerate's own code path for it -- FSDP1, FSDP2, DDP or DeepSpeed ZeRO (on
DeepSpeed's CPU accelerator, ``DS_ACCELERATOR=cpu``) through the script's ``accelerator.prepare(model, optimizer)`` --
made to run on CPU by a few named patches (the small-scale test that the launch files run).

accelerate takes its FSDP path, fp16 autocast, FSDP1's ``sync_module_states`` and a multi-process DeepSpeed state
only on an accelerator. Each rank
is started as ``python -c`` :func:`run_rank`, which wraps ``accelerate.Accelerator.__init__`` so that every
Accelerator the script builds gets :func:`apply_cpu_patches` right after construction, then runs the script as
``__main__``. Nothing here is needed on a GPU machine: the patches are a test harness, not part of the launch files.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oomlab.remedies.launch_files import TRAIN_SCRIPT


@dataclass(frozen=True)
class CpuPatch:
    """One change that lets accelerate's accelerator-only code run in a CPU gloo process."""

    name: str
    reason: str  # what CPU lacks, citing the accelerate / torch source it works around


FSDP_DISTRIBUTED_TYPE = CpuPatch(
    "fsdp-distributed-type",
    "accelerate/state.py:986-1016 (AcceleratorState.__init__) sets DistributedType.FSDP and state.fsdp_plugin only "
    "for accelerator types (MULTI_GPU, MULTI_XPU, ...); a gloo CPU run stays MULTI_CPU, drops the plugin "
    "Accelerator() built from FSDP_* (accelerate/accelerator.py:388-392) and prepare() wraps the model in DDP")
CPU_DEVICE_WITHOUT_INDEX = CpuPatch(
    "cpu-device-without-index",
    "accelerate/state.py:840-845 (set_device) gives a MULTI_CPU rank torch.device('cpu', local_rank % 1) = cpu:0; "
    "FSDP1 gets device_id=accelerator.device (accelerate/accelerator.py:1958) and torch/distributed/fsdp/"
    "_init_utils.py:1100-1104 raises 'Inconsistent compute device and `device_id`' against torch.cpu's 'cpu'")
FSDP1_SYNC_MODULE_STATES = CpuPatch(
    "fsdp1-sync-module-states",
    "accelerate/utils/dataclasses.py:1998-2016 builds sync_module_states' param_init_fn for an accelerator device "
    "only ('There are currently no available devices found'), and torch/distributed/fsdp/_init_utils.py:1170-1180 "
    "refuses CPU module states (NCCL cannot broadcast them; gloo can): the plugin is built with the two FSDP_* "
    "flags hidden, then given them back with param_init_fn = to_empty(cpu), and torch's check is skipped")
FSDP1_OFFLOAD_UNPINNED = CpuPatch(
    "fsdp1-offload-unpinned",
    "torch/distributed/fsdp/_flat_param.py:1260,1265 and _runtime_utils.py:396 pin FSDP1's offloaded shards and "
    "CPU gradients unconditionally, and page-locked memory needs an accelerator ('Cannot access accelerator device "
    "when none is available'): Tensor.pin_memory returns the tensor itself")
CPU_STREAM_SYNCHRONIZE = CpuPatch(
    "cpu-stream-synchronize",
    "torch/distributed/fsdp/_runtime_utils.py:1111 waits for FSDP1's offloaded gradient copies with "
    "current_stream().synchronize(), which torch/cpu/__init__.py:136-151's stand-in Stream lacks (CPU work is "
    "already synchronous): torch.cpu.Stream.synchronize does nothing")
FSDP2_OFFLOAD_UNPINNED = CpuPatch(
    "fsdp2-offload-unpinned",
    "accelerate/utils/dataclasses.py:2189 builds CPUOffloadPolicy() whose pin_memory=True (torch/distributed/fsdp/"
    "_fully_shard/_fsdp_api.py:199) pins the host shards (_fsdp_param.py:314-315, 1044-1045), which needs an "
    "accelerator: the plugin gets CPUOffloadPolicy(pin_memory=False)")
FP16_NATIVE_AMP = CpuPatch(
    "fp16-native-amp",
    "accelerate/accelerator.py:564-569 turns on fp16 autocast and the GradScaler only when device.type != 'cpu' "
    "(a CPU fp16 run silently trains in fp32): native_amp = True and the scaler accelerate picks at 578-584 for "
    "this distributed type, on 'cpu'")
DEEPSPEED_GLOO_BACKEND = CpuPatch(
    "deepspeed-gloo-backend",
    "accelerate/state.py:755-817 (PartialState._prepare_backend) picks a backend only for an accelerator or the cpu "
    "flag, and the cpu flag skips DeepSpeed (state.py:200, 974); without either it returns None and state.py:286-290 "
    "sets num_processes = 1 although deepspeed.init_distributed (state.py:204-217) joined every rank: the backend is "
    "gloo and the type MULTI_CPU, as the cpu flag would give, and DeepSpeed's branch still runs (DS_ACCELERATOR=cpu)")
CPU_PATCHES = {p.name: p for p in (  # in the order apply_cpu_patches applies them
    DEEPSPEED_GLOO_BACKEND, FSDP_DISTRIBUTED_TYPE, CPU_DEVICE_WITHOUT_INDEX, FSDP1_SYNC_MODULE_STATES,
    FSDP1_OFFLOAD_UNPINNED, CPU_STREAM_SYNCHRONIZE, FSDP2_OFFLOAD_UNPINNED, FP16_NATIVE_AMP)}

# FSDP1 flags whose plugin field needs an accelerator device when true (FSDP_CPU_RAM_EFFICIENT_LOADING forces
# sync_module_states, accelerate/utils/dataclasses.py:1983-1988)
SYNC_FLAGS = ("FSDP_SYNC_MODULE_STATES", "FSDP_CPU_RAM_EFFICIENT_LOADING")
PATCH_LOG_ENV = "OOMLAB_CPU_PATCH_LOG"  # where run_rank writes the names of the patches applied (JSON list)


def _env_true(name: str) -> bool:
    return _env_true_in(os.environ, name)


def _env_true_in(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "false").lower() in ("1", "true", "yes")


def _fsdp1_syncs() -> bool:
    """Does the launch environment ask FSDP1 for sync_module_states (directly or through cpu_ram_efficient_loading)?"""
    return (_env_true("ACCELERATE_USE_FSDP") and os.environ.get("FSDP_VERSION", "1") == "1"
            and any(_env_true(name) for name in SYNC_FLAGS))


@contextlib.contextmanager
def _hidden_env(names: tuple[str, ...]) -> Iterator[None]:
    """Unset ``names`` inside the block; restore them after."""
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _fsdp_plugin_from_env() -> Any:
    """The FSDP plugin ``Accelerator()`` builds from the FSDP_* environment, buildable on CPU (see
    :data:`FSDP1_SYNC_MODULE_STATES`)."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    with _hidden_env(SYNC_FLAGS if _fsdp1_syncs() else ()):
        return FullyShardedDataParallelPlugin()


def apply_cpu_patches(accelerator: Any) -> tuple[str, ...]:
    """Make ``accelerator`` (built in a CPU gloo process) take the code path accelerate takes on GPUs for the launch
    environment; return the names of the :data:`CPU_PATCHES` applied, in order (none on an accelerator)."""
    import torch
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    state = accelerator.state
    if state.device.type != "cpu":
        return ()
    applied = []
    if _env_true("ACCELERATE_USE_FSDP") and state.distributed_type == DistributedType.MULTI_CPU:
        plugin = _fsdp_plugin_from_env()
        if accelerator.mixed_precision != "no":
            plugin.set_mixed_precision(accelerator.mixed_precision)  # as state.py does in its accelerator branch
        state.fsdp_plugin = plugin
        state.distributed_type = DistributedType.FSDP
        # every later AcceleratorState() copies PartialState's dict over its own (state.py, __init__), so the type
        # is set there too, as state.py does at the end of AcceleratorState.__init__
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
        applied.append(FSDP_DISTRIBUTED_TYPE.name)
        if plugin.fsdp_version == 1 and state.device.index is not None:
            state.device = torch.device("cpu")
            PartialState._shared_state["device"] = state.device
            applied.append(CPU_DEVICE_WITHOUT_INDEX.name)
        if _fsdp1_syncs():
            from torch.distributed.fsdp import _init_utils

            plugin.sync_module_states = True
            plugin.cpu_ram_efficient_loading = _env_true("FSDP_CPU_RAM_EFFICIENT_LOADING")
            plugin.param_init_fn = _to_empty_cpu
            _init_utils._check_module_states_for_sync_module_states = _no_check
            applied.append(FSDP1_SYNC_MODULE_STATES.name)
        if plugin.fsdp_version == 1 and plugin.cpu_offload.offload_params:
            torch.Tensor.pin_memory = _unpinned
            applied.append(FSDP1_OFFLOAD_UNPINNED.name)
            if not hasattr(torch.cpu.Stream, "synchronize"):
                torch.cpu.Stream.synchronize = _no_wait
                applied.append(CPU_STREAM_SYNCHRONIZE.name)
        if plugin.fsdp_version == 2 and getattr(plugin.cpu_offload, "pin_memory", False):
            from torch.distributed.fsdp import CPUOffloadPolicy

            plugin.cpu_offload = CPUOffloadPolicy(pin_memory=False)
            applied.append(FSDP2_OFFLOAD_UNPINNED.name)
    if accelerator.mixed_precision == "fp16" and not accelerator.native_amp:
        accelerator.native_amp = True
        accelerator.scaler = _cpu_grad_scaler(accelerator)
        applied.append(FP16_NATIVE_AMP.name)
    return tuple(applied)


def _to_empty_cpu(module: Any) -> Any:
    """FSDP1's param_init_fn for meta modules, as accelerate builds it for an accelerator, on the CPU."""
    return module.to_empty(device="cpu", recurse=False)


def _unpinned(tensor: Any, device: Any = None) -> Any:
    """``Tensor.pin_memory`` on a machine without an accelerator: the tensor itself (nothing to pin it for)."""
    return tensor


def _no_wait(stream: Any) -> None:
    """``Stream.synchronize`` for torch.cpu's stand-in stream: CPU work has already finished."""


def _no_check(module_states: list[Any]) -> None:
    """torch's CPU-states check for sync_module_states, skipped: gloo broadcasts CPU tensors."""


def _cpu_grad_scaler(accelerator: Any) -> Any:
    """The GradScaler accelerate builds for this distributed type (accelerator.py:578-584), on the CPU."""
    from accelerate.utils import DistributedType

    if accelerator.is_fsdp2 or accelerator.distributed_type != DistributedType.FSDP:
        from torch.amp.grad_scaler import GradScaler

        return GradScaler("cpu")  # get_fsdp2_grad_scaler(device=...); get_grad_scaler's non-FSDP fallback
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    return ShardedGradScaler(device="cpu")  # get_grad_scaler(DistributedType.FSDP)


def _deepspeed_on_cpu() -> bool:
    """A DeepSpeed launch (ACCELERATE_USE_DEEPSPEED) on a machine without an accelerator?"""
    import torch

    return _env_true("ACCELERATE_USE_DEEPSPEED") and not torch.cuda.is_available()


def patch_deepspeed_backend() -> tuple[str, ...]:
    """:data:`DEEPSPEED_GLOO_BACKEND`, before the first ``PartialState`` is built (none on an accelerator)."""
    if not _deepspeed_on_cpu():
        return ()
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    def _prepare_backend(self: Any, cpu: bool = False, sagemaker_dp: bool = False,
                         backend: str | None = None) -> tuple[str, Any]:
        return "gloo", DistributedType.MULTI_CPU

    PartialState._prepare_backend = _prepare_backend
    return (DEEPSPEED_GLOO_BACKEND.name,)


def install_cpu_patches(record: Callable[[tuple[str, ...]], None]) -> None:
    """Wrap ``accelerate.Accelerator.__init__``: construct (with FSDP1's sync flags hidden from the plugin it builds,
    which it drops on CPU anyway; DeepSpeed's backend patched first), then :func:`apply_cpu_patches`, and pass the
    names applied to ``record``."""
    from accelerate import Accelerator

    original = Accelerator.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        before = patch_deepspeed_backend()
        with _hidden_env(SYNC_FLAGS if _fsdp1_syncs() else ()):
            original(self, *args, **kwargs)
        record(before + apply_cpu_patches(self))

    Accelerator.__init__ = __init__


def run_rank() -> None:
    """One CPU rank (``python -c "...run_rank()" SCRIPT ARGS...``): install the patches, run SCRIPT as ``__main__``."""
    import runpy

    script, *args = sys.argv[1:]
    log = os.environ.get(PATCH_LOG_ENV)

    def record(names: tuple[str, ...]) -> None:
        if log:
            Path(log).write_text(json.dumps(list(names)))

    install_cpu_patches(record)
    sys.argv = [script, *args]
    sys.path[0] = str(Path(script).resolve().parent)  # as `python SCRIPT` would have it
    runpy.run_path(script, run_name="__main__")


RANK_COMMAND = "from oomlab.evidence.cpu_launch import run_rank; run_rank()"


def launch_env(config_file: str | os.PathLike[str], num_processes: int,
               mixed_precision: str | None = None) -> dict[str, str]:
    """The environment ``accelerate launch --config_file CONFIG [--mixed_precision MP]`` gives each process
    (accelerate's own code)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    flags = ["--mixed_precision", mixed_precision] if mixed_precision else []
    args = launch_command_parser().parse_args(
        ["--config_file", str(config_file), "--num_processes", str(num_processes), "--main_process_port", "0",
         *flags, TRAIN_SCRIPT])
    args, defaults, mp_from_config_flag = _validate_launch_command(args)
    if args.use_deepspeed:  # as accelerate/commands/launch.py launch_command, then deepspeed_launcher's environment
        fields = list(defaults.deepspeed_config) if defaults else []
        args.deepspeed_fields_from_accelerate_config = ",".join(fields + (["mixed_precision"] if mp_from_config_flag
                                                                         else []))
        _, env = prepare_deepspeed_cmd_env(args)
    else:
        env = prepare_multi_gpu_env(args)
    return {k: v for k, v in env.items() if k.startswith(("ACCELERATE_", "FSDP_"))}


def _free_port() -> int:
    """A free TCP port on loopback for the launched processes' rendezvous."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class RankRun:
    """One launched process: how it ended, what it printed, which CPU patches its Accelerator got."""

    exit_code: int  # negative: killed by that signal
    output: str  # stdout and stderr together
    patches: tuple[str, ...] | None  # names from CPU_PATCHES, in order; None: the script built no Accelerator


CPU_ATTEMPTS = 3


def run_on_cpu(config_dir: str | os.PathLike[str], config: str, script_args: list[str], num_processes: int = 2,
               timeout: float = 240.0, attempts: int = CPU_ATTEMPTS, mixed_precision: str | None = None
               ) -> list[RankRun]:
    """Run ``train.py`` under ``config`` on CPU: ``num_processes`` gloo processes started as accelerate would.

    The environment is accelerate's for that config (:func:`launch_env`) plus the torchrun-style rank variables and
    ``ACCELERATE_USE_CPU``; each rank runs through :func:`run_rank`, so the script's own ``Accelerator`` and
    ``prepare`` take accelerate's path for the config, with the :data:`CPU_PATCHES` each :class:`RankRun` names.

    NB: on a loaded two-core CI machine a gloo rank that had finished its steps was seen to die of SIGABRT
    ("terminate called without an active exception") while the interpreter exited -- gloo's worker threads torn
    down at exit (pytorch/pytorch#190489). The run is deterministic, so when any rank is killed by a signal it is run
    again, up to ``attempts`` times, from an empty ``--log-json`` file; an ordinary failure (exit code > 0) is never
    retried.
    """
    if attempts < 1:
        raise ValueError(f"attempts={attempts!r} is not accepted: give 1 or more")
    log = Path(script_args[script_args.index("--log-json") + 1]) if "--log-json" in script_args else None
    results: list[RankRun] = []
    for _ in range(attempts):
        if log is not None:
            log.unlink(missing_ok=True)
        results = _run_once(Path(config_dir), config, script_args, num_processes, timeout, mixed_precision)
        if not any(r.exit_code < 0 for r in results):
            break
    return results


def _run_once(folder: Path, config: str, script_args: list[str], num_processes: int,
              timeout: float, mixed_precision: str | None = None) -> list[RankRun]:
    import subprocess

    env = launch_env(folder / config, num_processes, mixed_precision)
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="oomlab-cpu-ranks-") as scratch:
        patch_logs = [Path(scratch) / f"patches.rank{rank}.json" for rank in range(num_processes)]
        procs = []
        for rank in range(num_processes):
            proc_env = {**os.environ, **env, "RANK": str(rank), "LOCAL_RANK": str(rank),
                        "WORLD_SIZE": str(num_processes), "LOCAL_WORLD_SIZE": str(num_processes),
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "HF_HUB_OFFLINE": "1",
                        "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore::FutureWarning",
                        PATCH_LOG_ENV: str(patch_logs[rank])}
            # DeepSpeed on its CPU accelerator (the cpu flag would make accelerate skip DeepSpeed); else accelerate's
            # CPU path
            proc_env.update({"DS_ACCELERATOR": "cpu"} if _env_true_in(env, "ACCELERATE_USE_DEEPSPEED")
                            else {"ACCELERATE_USE_CPU": "true"})
            procs.append(subprocess.Popen(
                [sys.executable, "-c", RANK_COMMAND, str(folder / TRAIN_SCRIPT), *script_args], env=proc_env,
                cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        results = []
        for proc, patch_log in zip(procs, patch_logs, strict=True):
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            patches = tuple(json.loads(patch_log.read_text())) if patch_log.exists() else None
            results.append(RankRun(proc.returncode, out, patches))
    return results
