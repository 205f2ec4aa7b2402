"""DeepSpeed ZeRO-1/2/3 trained for real on CPU: ``deepspeed.initialize`` → forward → ``backward`` → ``step`` of a tiny
model over gloo processes, every rank's bytes measured.

Each world size is one spawn of ``world`` processes (``DS_ACCELERATOR=cpu``, ``deepspeed.init_distributed("gloo")``
over a file rendezvous) that run every case of that size in turn, two steps each.  Per rank and case:

* structural bytes read off DeepSpeed's own objects after the second backward and step: the half parameters
  (ZeRO-1/2 ``bit16_groups_flat``; ZeRO-3 ``ds_tensor`` partitions and the persistent gathered parameters), the fp32
  master partitions, the optimizer state, the gradient partitions, the IPG buckets, the module's buffers;
* the CPU allocator, phase by phase: ``torch.profiler(profile_memory=True)`` from before the model is built, its
  allocation and free events replayed in time order (as :mod:`oomlab.instruments.measured` does), cut at marks around
  each forward, backward and step.  Two things gloo does that NCCL does not are taken out: it drops the last reference
  to a collective's tensors on its own threads (their frees would go unrecorded: :func:`_settle_collectives` waits for
  the caller to hold the last reference), and it stages copies inside its ops (``gloo:all_gather``'s output,
  ``c10d::_reduce_scatter_base_``'s input clone: blocks allocated inside ``c10d::``/``gloo:`` ops are left out).

fp16: the CPU accelerator refuses it where oneDNN has no fp16 (``ValueError: Type fp16 is not supported on your
device.``, ``runtime/engine.py:2003-2004``, ``accelerator/cpu_accelerator.py:228-233``); a case marked
``patch_fp16`` replaces only that capability check.  The optimizer is torch's ``AdamW(fused=True)`` handed to
DeepSpeed as its client optimizer (no JIT build; in place, like FusedAdam on a GPU); a case with ``trainer_optim``
(``"adamw_torch"``) has the HF Trainer's own ``create_optimizer`` build it from ``TrainingArguments(optim=...)`` (its
two parameter groups, decay and no decay), as ``deepspeed_optim_sched`` does for a JSON without an optimizer block
(``transformers/integrations/deepspeed.py:586-589``), with ``foreach=True``: the implementation torch picks for CUDA
tensors (``torch/optim/optimizer.py:161-186``), which on CPU it would not.
"""

from __future__ import annotations

import gc
import json
import os
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from oomlab.budget.deepspeed_config import (
    DeepSpeedSettings,
    OptimizerSource,
    data_types_block,
    precision_block,
    zero_optimization_block,
)
from oomlab.budget.result import Phase
from oomlab.budget.step import LEARNING_RATE, build_model, tiny_setup
from oomlab.core.quiet import quiet_libraries
from oomlab.core.setup import TrainingSetup

MARK = "oomlab.ds:"
PHASES = tuple(Phase)  # each step's marks, labelled with the phases' values (the records' keys)
STEPS = 2
SPAWN_ATTEMPTS = 2
COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "_reduce_scatter_base", "_all_gather_base", "all_to_all_single")


def case_setup(case: dict[str, Any]) -> TrainingSetup:
    """The tiny setup a case trains (``case["knobs"]``: :func:`oomlab.budget.step.tiny_setup` keywords)."""
    knobs = dict(case["knobs"])
    return tiny_setup(knobs.pop("model_config", None), **knobs)


def case_settings(case: dict[str, Any]) -> DeepSpeedSettings:
    settings = dict(case.get("settings", {}))
    if settings.get("optimizer_source") is not None:
        settings["optimizer_source"] = OptimizerSource(settings["optimizer_source"])
    return DeepSpeedSettings(**settings)


def trainer_optimizer(model: Any, optim: str, folder: str) -> Any:
    """The optimizer the HF Trainer builds for ``model`` with ``optim`` (``Trainer.create_optimizer``: its decay and
    no-decay groups, ``get_optimizer_cls_and_kwargs``), foreach as on CUDA."""
    from types import SimpleNamespace

    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=folder, optim=optim, learning_rate=LEARNING_RATE, report_to=[], use_cpu=True)
    trainer = SimpleNamespace(model=model, args=args, optimizer=None, optimizer_cls_and_kwargs=None,
                              get_optimizer_cls_and_kwargs=Trainer.get_optimizer_cls_and_kwargs)
    trainer.get_decay_parameter_names = lambda m: Trainer.get_decay_parameter_names(trainer, m)
    optimizer = Trainer.create_optimizer(trainer)
    for group in optimizer.param_groups:
        if group.get("foreach") is None and not group.get("fused"):
            group["foreach"] = True
    return optimizer


def case_config(case: dict[str, Any]) -> dict[str, Any]:
    """The DeepSpeed JSON a case runs (``case["config"]`` when given: e.g. oomlab's launch JSON)."""
    if case.get("config"):
        return dict(case["config"])
    setup, settings = case_setup(case), case_settings(case)
    return {"train_micro_batch_size_per_gpu": setup.batch, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
            **precision_block(setup), **data_types_block(settings), "zero_force_ds_cpu_optimizer": False,
            "zero_optimization": zero_optimization_block(setup, settings), "steps_per_print": 10**9}


# ------------------------------------------------------------------------------------------------ measuring


def _storage(tensors: Any) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None and hasattr(t, "untyped_storage") and t.untyped_storage().nbytes():
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _state_tensors(optimizer: Any) -> list[Any]:
    return [v for st in optimizer.state.values() for v in st.values() if hasattr(v, "dim") and v.dim() > 0]


def probe(engine: Any) -> dict[str, int]:
    """Bytes of DeepSpeed's own tensors on this rank, each storage once."""
    opt, module = engine.optimizer, engine.module
    out = {"buffers": _storage(module.buffers()), "optimizer": _storage(_state_tensors(opt.optimizer))}
    if hasattr(opt, "fp16_groups"):  # ZeRO-3
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        params = list(module.parameters())
        own = {p.ds_tensor.untyped_storage().data_ptr() for p in params}
        gathered = [p.data for p in params if p.ds_status == ZeroParamStatus.AVAILABLE
                    and p.data.untyped_storage().data_ptr() not in own]
        out.update(partitions=_storage(p.ds_tensor for p in params), gathered=_storage(gathered),
                   persistent=_storage(p.data for p in params if p.ds_persist
                                       and p.data.untyped_storage().data_ptr() not in own),
                   master=_storage(opt.fp32_partitioned_groups_flat),
                   gradients=_storage([opt.grad_partitions_flat_buffer]),
                   fp32_gradients=_storage(t.grad for t in opt.fp32_partitioned_groups_flat),
                   bucket=sum(_storage([b.buffer]) for b in opt.ipg_buckets.values()
                              if getattr(b, "buffer", None) is not None and hasattr(b.buffer, "untyped_storage")))
        return out
    flat = getattr(opt, "bit16_groups_flat", None) or getattr(opt, "bf16_groups_flat", [])
    master = getattr(opt, "single_partition_of_fp32_groups", None) or getattr(opt, "fp32_groups_flat_partition", [])
    grads = [p.grad for g in getattr(opt, "bit16_groups", getattr(opt, "bf16_groups", [])) for p in g]
    grads += [t for v in (getattr(opt, "averaged_gradients", None) or {}).values() if v for t in v]
    grads += list(getattr(opt, "fp32_groups_gradients_flat", []))
    frozen = [p for p in module.parameters() if not p.requires_grad]
    out.update(partitions=_storage(flat) + _storage(frozen), master=_storage(master), gradients=_storage(grads),
               fp32_gradients=_storage(t.grad for t in master))
    return out


def _watch(opt: Any) -> dict[str, list[int]]:
    """ZeRO-1/2 frees its IPG buckets at the end of each backward: record their bytes at every flush; and ZeRO-1's
    half gradients when the epilogue starts reducing them (``reduce_gradients``, stage_1_and_2.py:958-981)."""
    seen: dict[str, list[int]] = {"bucket": [], "full_gradients": []}
    if hasattr(opt, "fp16_groups") or not hasattr(opt, "reduce_ipg_grads"):
        return seen
    flush, reduce = opt.reduce_ipg_grads, opt.reduce_gradients

    def reduce_ipg_grads(*args: Any, **kwargs: Any) -> Any:
        seen["bucket"].append(sum(_storage(b.buffer) for b in opt.ipg_buckets.values()))
        return flush(*args, **kwargs)

    def reduce_gradients(*args: Any, **kwargs: Any) -> Any:
        seen["full_gradients"].append(_storage(p.grad for g in opt.bit16_groups for p in g))
        return reduce(*args, **kwargs)

    opt.reduce_ipg_grads, opt.reduce_gradients = reduce_ipg_grads, reduce_gradients
    return seen


def _settle_collectives() -> None:
    """Make gloo's collectives leave the last reference to their tensors with the caller (see the module docstring):
    after each one completes (async ones in ``Work.wait()``), wait until the tensors' use counts are back."""
    import torch
    import torch.distributed as dist

    def settle(tensors: list[Any], base: list[int]) -> None:
        deadline = time.time() + 0.2
        while any(t._use_count() > b for t, b in zip(tensors, base, strict=True)) and time.time() < deadline:
            time.sleep(0.0001)

    class Work:
        def __init__(self, work: Any, tensors: list[Any], base: list[int]) -> None:
            self._work, self._tensors, self._base = work, tensors, base

        def wait(self, *args: Any, **kwargs: Any) -> Any:
            if self._work is None:
                return True
            result, self._work = self._work.wait(*args, **kwargs), None
            settle(self._tensors, self._base)
            self._tensors = self._base = []
            return result

        def is_completed(self) -> bool:
            return self._work is None or self._work.is_completed()

        def __getattr__(self, name: str) -> Any:
            return getattr(self._work, name)

    def wrap(fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            tensors = [t for v in (*args, *kwargs.values()) for t in (v if isinstance(v, (list, tuple)) else [v])
                       if torch.is_tensor(t)]
            base = [t._use_count() for t in tensors]
            work = fn(*args, **kwargs)
            if kwargs.get("async_op") and work is not None:
                return Work(work, tensors, base)
            settle(tensors, base)
            return work
        return wrapped

    for name in COLLECTIVES:
        if hasattr(dist, name):
            setattr(dist, name, wrap(getattr(dist, name)))


def replay(prof: Any) -> dict[str, dict[str, int]]:
    """Per mark-delimited phase: bytes live at its start and end and its peak, over blocks allocated in the session,
    leaving out blocks gloo allocates inside its own ops (a reused address without a recorded free counts as freed)."""
    from torch._C._profiler import _EventType

    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            parents, parent = [], event.parent
            while parent is not None and len(parents) < 8:
                parents.append(parent.name)
                parent = parent.parent
            gloo = any("c10d::" in n or "gloo:" in n for n in parents)
            events.append((event.start_time_ns, 1, int(event.extra_fields.alloc_size), int(event.extra_fields.ptr),
                           gloo))
        elif event.tag == _EventType.TorchOp and event.name.startswith(MARK):
            events.append((event.start_time_ns, 0, 0, 0, event.name[len(MARK):]))
    live: dict[int, int] = {}
    current, phase, out = 0, None, {}
    for _, kind, size, ptr, extra in sorted(events, key=lambda e: (e[0], e[1])):
        if kind == 0:
            if phase is not None:
                out[phase]["end"] = current
            phase = extra
            out[phase] = {"start": current, "peak": current, "end": current}
        elif size > 0:
            if ptr in live:
                current -= live.pop(ptr)
            if extra:
                continue
            live[ptr] = size
            current += size
            if phase is not None:
                out[phase]["peak"] = max(out[phase]["peak"], current)
        elif ptr in live:
            current -= live.pop(ptr)
    return out


def phase_mark(step: int, phase: Phase) -> str:
    """The profiler label that opens ``phase`` of step ``step`` (``s2_forward``): the key of its figures in a record."""
    return f"s{step}_{phase.value}"


def _mark(label: str) -> None:
    from torch.profiler import record_function

    with record_function(MARK + label):
        pass


def _run_case(case: dict[str, Any], rank: int) -> dict[str, Any]:
    import deepspeed
    import torch
    from torch.profiler import ProfilerActivity, profile

    setup = case_setup(case)
    config = case_config(case)
    accelerator = deepspeed.get_accelerator()
    original = accelerator.is_fp16_supported
    if case.get("patch_fp16"):
        accelerator.is_fp16_supported = lambda: True
    record: dict[str, Any] = {"label": case["label"], "rank": rank, "config": config}
    hf_config = engine = None
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            _mark("build")
            torch.manual_seed(0)
            if case.get("zero_init"):  # transformers builds the model under deepspeed.zero.Init
                from transformers.integrations import HfDeepSpeedConfig

                hf_config = HfDeepSpeedConfig(config)  # kept alive: is_deepspeed_zero3_enabled() reads a weakref
            base = setup.with_(strategy="single", gpus=1, precision="fp32")
            with quiet_libraries():
                model = build_model(base, "cpu")
            _mark("initialize")
            optimizer = None  # a JSON with an "optimizer" block: DeepSpeed builds its own (FusedAdam: a JIT build)
            if case.get("trainer_optim") and "optimizer" not in config:
                with tempfile.TemporaryDirectory(prefix="oomlab-trainer-") as folder:
                    optimizer = trainer_optimizer(model, case["trainer_optim"], folder)
            elif "optimizer" not in config:
                optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LEARNING_RATE,
                                              fused=True)
            engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
            watched = _watch(engine.optimizer)
            generator = torch.Generator().manual_seed(100 + rank)
            losses = []
            for step in range(1, STEPS + 1):
                ids = torch.randint(0, setup.model.vocab_size, (setup.batch, setup.seq), generator=generator)
                _mark(phase_mark(step, Phase.FORWARD))
                loss = engine(input_ids=ids, labels=ids).loss
                _mark(phase_mark(step, Phase.BACKWARD))
                engine.backward(loss)
                if step == STEPS:
                    record["after_backward"] = probe(engine)
                _mark(phase_mark(step, Phase.OPTIMIZER))
                engine.step()
                _mark(f"s{step}_done")
                losses.append(float(loss.detach().float()))
                del loss
            record["after_step"] = probe(engine)
            for name, values in watched.items():
                if values:
                    record["after_backward"][name] = max(values)
            _mark("end")
        record.update(phases=replay(prof), losses=losses, status="ok",
                      zero_init=any(hasattr(p, "ds_id") for p in model.parameters()) and bool(case.get("zero_init")))
    except Exception as err:  # noqa: BLE001 -- recorded with the traceback, the next case still runs
        record.update(status="failed", error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc()[-3000:])
    finally:
        accelerator.is_fp16_supported = original
        if engine is not None and hasattr(engine, "destroy"):
            engine.destroy()
        del engine, hf_config
        _restore_linear()
        gc.collect()
    return record


def _restore_linear() -> None:
    """ZeRO-3's ``Init`` replaces ``torch.nn.functional.linear`` process-wide and never puts it back
    (partition_parameters.py:412-419, 603-604): restore it before the next case."""
    import torch
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses as Hooks

    if hasattr(Hooks, "linear_bk"):
        torch.nn.functional.linear = Hooks.linear_bk


def _worker(rank: int, world: int, folder: str, cases: list[dict[str, Any]]) -> None:
    os.environ.update(DS_ACCELERATOR="cpu", RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_SIZE=str(world), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")  # init_distributed reads them; file rendezvous
    import torch

    torch.set_num_threads(1)
    _settle_collectives()
    import deepspeed

    with quiet_libraries():
        deepspeed.init_distributed("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world)
    records = [_run_case(case, rank) for case in cases]
    Path(folder, f"rank{rank}.json").write_text(json.dumps(records))
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


def run_world(world: int, cases: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Run ``cases`` on ``world`` gloo processes; per case, every rank's record."""
    import torch.multiprocessing as mp

    previous = os.environ.get("DS_ACCELERATOR")
    os.environ["DS_ACCELERATOR"] = "cpu"  # the children import deepspeed with it
    try:
        for attempt in range(SPAWN_ATTEMPTS):
            with tempfile.TemporaryDirectory(prefix="oomlab-ds-") as folder:
                try:
                    mp.start_processes(_worker, args=(world, folder, cases), nprocs=world, start_method="spawn")
                except mp.ProcessExitedException:
                    # NB: a gloo rank was seen to abort once in a few runs on a loaded two-core machine; run again
                    if attempt + 1 == SPAWN_ATTEMPTS:
                        raise
                    continue
                ranks = [json.loads(Path(folder, f"rank{r}.json").read_text()) for r in range(world)]
                return [[ranks[r][i] for r in range(world)] for i in range(len(cases))]
    finally:
        if previous is None:
            os.environ.pop("DS_ACCELERATOR", None)
        else:
            os.environ["DS_ACCELERATOR"] = previous
    raise AssertionError("unreachable")  # pragma: no cover
