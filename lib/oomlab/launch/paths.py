"""How each launcher puts the model on the GPUs, read off the launchers' code, and so which launches can die in
``Module._apply → convert → t.to`` with most of a replica allocated -- as the seed did -- and which cannot.

Each row cites the line of the installed release that does the move (:func:`cite` finds it in the source files,
without importing the library).  :func:`load_path_of` says which row a :class:`~oomlab.launch.read.UserLaunch` (or a
remedy's setup) takes; :func:`paths_the_traceback_allows` keeps the rows a ``Module._apply`` traceback is evidence
for.
"""

from __future__ import annotations

import enum
import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from oomlab.core.choices import Method, Route, Strategy
from oomlab.core.setup import TrainingSetup

APPLY_FRAMES = ("_apply", "convert")  # the seed's innermost frames (torch/nn/modules/module.py)


class LoadPath(enum.Enum):
    """How the weights reach each GPU before the first step."""

    TRAINER_TO = "trainer-to"  # HF Trainer._move_model_to_device: model.to(args.device), a full replica per process
    ACCELERATE_TO = "accelerate-to"  # Accelerator.prepare_model: model.to(self.device), a full replica per process
    DEEPSPEED_TO = "deepspeed-to"  # DeepSpeedEngine: params cast to half on the host, then module.to(device)
    ZERO_INIT = "zero-init"  # ZeRO-3 with from_pretrained under deepspeed.zero.Init: partitioned as built
    FSDP_UNITS = "fsdp-units"  # FSDP1 moves and shards one wrapped unit at a time (no Module._apply)
    FSDP2_SHARDS = "fsdp2-shards"  # FSDP2 fully_shard: each parameter becomes a DTensor shard
    DEVICE_MAP = "device-map"  # from_pretrained(device_map=...): each tensor placed as loaded; the Trainer skips .to
    QUANTIZED = "quantized"  # bitsandbytes 4-bit: loaded with a device_map; the Trainer never calls .to()
    TORCHTUNE_BUILD = "torchtune-build"  # torchtune: built on its device in its dtype, the checkpoint copied in


@dataclass(frozen=True)
class PathRow:
    """One row of the launch-path table."""

    path: LoadPath
    launches: str  # which launches take it
    how: str  # what the code does
    package: str  # the top-level package whose source holds the line
    file: str  # path inside the package
    pattern: str  # the line's text, searched for
    full_replica: bool  # a full replica of the model is moved to each GPU with Module.to()
    apply_traceback: bool  # can fail inside Module._apply -> convert -> t.to with most of a replica allocated
    short: str = ""  # the launch in a few words
    read_at: str = ""  # a package oomlab does not install: the line as read at this release (file:line@tag)

    @property
    def citation(self) -> str:
        if self.read_at:
            return f"{self.package}/{self.read_at}"
        line = cite(self.package, self.file, self.pattern)
        return f"{self.package}/{self.file}" + (f":{line}" if line else " (line not found in the installed release)")


PATH_ROWS: tuple[PathRow, ...] = (
    PathRow(LoadPath.TRAINER_TO, "HF Trainer under python / torchrun / accelerate launch (single, DDP, or "
            "nn.DataParallel on cuda:0), no DeepSpeed, no FSDP, no device_map",
            "Trainer.__init__ → _move_model_to_device → model.to(args.device)", "transformers", "trainer.py",
            "model = model.to(device)", True, True,
            short="the HF Trainer's model.to(device) (single, DDP, DataParallel)"),
    PathRow(LoadPath.ACCELERATE_TO, "accelerate launch with a custom loop (MULTI_GPU or one process)",
            "Accelerator.prepare_model → model.to(self.device)", "accelerate", "accelerator.py",
            "model = model.to(self.device)", True, True,
            short="accelerate's prepare_model model.to(device)"),
    PathRow(LoadPath.DEEPSPEED_TO, "DeepSpeed ZeRO-1 / ZeRO-2 (deepspeed launcher, the Trainer's --deepspeed, "
            "accelerate DEEPSPEED), and ZeRO-3 loaded without zero.Init",
            "deepspeed.initialize → DeepSpeedEngine._configure_distributed_model: cast to half, then "
            "module.to(self.device) (frames of deepspeed/runtime/engine.py above Module._apply)", "deepspeed",
            "runtime/engine.py", "self.module.to(self.device)", True, True,
            short="DeepSpeed's engine module.to(device) (ZeRO-1/2, ZeRO-3 without zero.Init)"),
    PathRow(LoadPath.ZERO_INIT, "DeepSpeed ZeRO-3 with zero.Init (the HF Trainer, whose TrainingArguments come "
            "before from_pretrained; accelerate's zero3_init_flag)",
            "from_pretrained builds every parameter partitioned under deepspeed.zero.Init; the engine skips .to()",
            "transformers", "modeling_utils.py", "needs_zero3_init = is_deepspeed_zero3_enabled()", False, False,
            short='ZeRO-3 under zero.Init'),
    PathRow(LoadPath.FSDP_UNITS, "FSDP1 (accelerate distributed_type FSDP, fsdp_version 1)",
            "FullyShardedDataParallel moves one wrapped unit's states at a time and shards it (_move_states_to_device,"
            " not Module._apply)", "torch", "distributed/fsdp/_init_utils.py", "def _move_module_to_device(", False,
            False,
            short='FSDP1'),
    PathRow(LoadPath.FSDP2_SHARDS, "FSDP2 (accelerate fsdp_version 2, the Trainer's --fsdp)",
            "fsdp2_prepare_model: fully_shard per decoder layer; each parameter becomes a DTensor shard",
            "accelerate", "utils/fsdp_utils.py", "def fsdp2_prepare_model(", False, False,
            short='FSDP2'),
    PathRow(LoadPath.DEVICE_MAP, "one process, from_pretrained(device_map='auto')",
            "accelerate's dispatch places each tensor as it is loaded (set_module_tensor_to_device); the Trainer "
            "skips .to() for an hf_device_map", "transformers", "trainer.py",
            "The model is already on multiple devices. Skipping the move", False, False,
            short="device_map='auto'"),
    PathRow(LoadPath.QUANTIZED, "a bitsandbytes 4-bit base (QLoRA)",
            "weights quantized as loaded onto their device; the Trainer never calls .to() on them", "transformers",
            "trainer.py", "QuantizationMethod.BITS_AND_BYTES", False, False,
            short='a bitsandbytes 4-bit base'),
    PathRow(LoadPath.TORCHTUNE_BUILD, "a torchtune recipe (tune run)",
            "the model built on its device under training.set_default_dtype (NF4 quantized as built for QLoRA; "
            "*_distributed: on meta, then sharded), the checkpoint's state dict copied in by load_state_dict; no "
            "Module.to()", "torchtune", "training/checkpointing/_checkpointer.py", "merged_state_dict.update(",
            False, False, short="torchtune's recipe",
            read_at="training/checkpointing/_checkpointer.py:528 at v0.6.1 (not installed: read from its source)"),
)
ROWS = {row.path: row for row in PATH_ROWS}


@cache
def cite(package: str, file: str, pattern: str) -> int | None:
    """The 1-based line of ``pattern`` in ``package/file`` as installed (None: not found), read without import."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / file
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    return next((i for i, line in enumerate(lines, 1) if pattern in line), None)


def load_path_of(setup: TrainingSetup, *, hf_trainer: bool = True, zero3_init: bool = True,
                 route: Route = Route.PROCESS_PER_GPU) -> LoadPath:
    """The row a setup takes: by its strategy, method and route (``hf_trainer``: an HF Trainer script rather than a
    custom accelerate loop; ``zero3_init``: ZeRO-3 built under zero.Init); a torchtune setup takes torchtune's."""
    if setup.versions.framework == "torchtune" and route is Route.PROCESS_PER_GPU:
        return LoadPath.TORCHTUNE_BUILD
    return path_of(setup.strategy, setup.method, hf_trainer=hf_trainer, zero3_init=zero3_init, route=route)


def path_of(strategy: Strategy, method: Method, *, hf_trainer: bool = True, zero3_init: bool = True,
            route: Route = Route.PROCESS_PER_GPU) -> LoadPath:
    """:func:`load_path_of` from the strategy and the method alone (what a results JSON records)."""
    if route is Route.DEVICE_MAP:
        return LoadPath.DEVICE_MAP
    if method is Method.QLORA:
        return LoadPath.QUANTIZED
    s = strategy
    if s.deepspeed:
        return LoadPath.ZERO_INIT if s.zero_stage == 3 and zero3_init else LoadPath.DEEPSPEED_TO
    if s in (Strategy.FSDP, Strategy.FSDP_OFFLOAD):
        return LoadPath.FSDP_UNITS
    if s.fsdp:
        return LoadPath.FSDP2_SHARDS
    return LoadPath.TRAINER_TO if hf_trainer else LoadPath.ACCELERATE_TO


def paths_the_traceback_allows(frames: tuple[str, ...] = APPLY_FRAMES) -> tuple[PathRow, ...]:
    """The rows consistent with a failure whose innermost frames are ``Module._apply → convert`` (``t.to``)."""
    if not all(f in frames for f in APPLY_FRAMES):
        return PATH_ROWS
    return tuple(row for row in PATH_ROWS if row.apply_traceback)


def path_table() -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The launch-path table: headers and one row per load path."""
    headers = ("launch", "how the weights reach each GPU", "full replica .to() per GPU",
               "can fail in Module._apply → convert → t.to", "code")
    rows = [(r.launches, r.how, "yes" if r.full_replica else "no", "yes" if r.apply_traceback else "no",
             r.citation) for r in PATH_ROWS]
    return headers, rows
