"""Each recommended remedy, run for real at small scale on CPU with the same mechanism, beside the analytic figure.

A tiny LLaMA-family model (:func:`oomlab.budget.step.tiny_setup`) trains for real:

* FSDP2 ``fully_shard`` over 4 gloo processes (spawned here, no torchrun): each rank's parameter, gradient and
  optimizer-state bytes, measured on its local shards, beside DDP's full replica in the same processes and the
  budget's ``weights_on_gpu`` / ``gradients_on_gpu`` / ``optimizer_on_gpu``; the two fp32 runs' losses step by step;
* peft LoRA: the trainable parameter count against :func:`oomlab.budget.states.lora_parameters`;
* activation checkpointing: the measured drop of the step's peak (CPU allocator,
  :func:`oomlab.instruments.measured.measure_steps`)
  against the budget's;
* accelerate ``infer_auto_device_map`` with ``max_memory`` on a real tiny model: bytes per device within the limits,
  and the real tensors' bytes against accelerate's sizes;
* bitsandbytes 4-bit NF4 (QLoRA) on CPU: the quantized weights' bytes against the budget's 4.127 bits, and a LoRA
  training step over them;
* bitsandbytes 8-bit AdamW: a step if it runs on this machine, its state bytes against the budget's;
* the FLOP formula of :mod:`oomlab.remedies.throughput` against ``torch.utils.flop_counter.FlopCounterMode`` on a
  training step.

The multi-process run (:mod:`oomlab.instruments.gloo`) takes 15-25 s; :func:`verification` caches the rows
(:mod:`oomlab.evidence.checks_cache`) keyed by the library versions, and says when they were measured.  What a check
records, and its display rows, are :mod:`oomlab.remedies.verification`'s; the gloo world size is
:data:`oomlab.instruments.gloo.WORLD_SIZE`.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from oomlab.budget import states
from oomlab.budget.estimator import estimate_setup
from oomlab.budget.step import apply_lora, build_model, make_optimizer, tiny_setup, trainable_tensors
from oomlab.core.choices import Method
from oomlab.core.modeling import tensor_nbytes
from oomlab.core.quiet import quiet_libraries
from oomlab.core.setup import TrainingSetup
from oomlab.evidence.checks_cache import cached_verification
from oomlab.instruments.gloo import WORLD_SIZE, fsdp_setup, run_fsdp_gloo
from oomlab.instruments.measured import measure_steps
from oomlab.remedies.throughput import flops_per_token
from oomlab.remedies.verification import Check, CheckUnit, Verification

__all__ = ["CHECKS", "FAST", "check_adamw_8bit", "check_checkpointing", "check_device_map", "check_flops", "check_fsdp",
           "check_lora", "check_qlora", "count_step_flops", "verification"]


# ------------------------------------------------------------------------------------------ FSDP2 over gloo


def check_fsdp(world_size: int = WORLD_SIZE, steps: int = 3) -> list[Check]:
    """Per-rank model-state bytes of FSDP2 and DDP, measured, beside the budget's; and the losses' agreement."""
    start = time.perf_counter()
    ranks = run_fsdp_gloo(world_size, steps)
    seconds = time.perf_counter() - start
    setup = fsdp_setup(world_size)
    ddp = setup.with_(strategy="ddp")
    analytic = {
        "fsdp": {"weights": states.weights_on_gpu(setup), "gradients": states.gradients_on_gpu(setup),
                 "optimizer": states.optimizer_on_gpu(setup)},
        "ddp": {"weights": states.weights_on_gpu(ddp), "gradients": states.gradients_on_gpu(ddp),
                "optimizer": states.optimizer_on_gpu(ddp)},
    }
    checks = []
    for kind, label in (("ddp", "DDP (full replica)"), ("fsdp", "FSDP2 fully_shard")):
        for part in ("weights", "gradients", "optimizer"):
            per_rank = [ranks[r][kind][part] for r in range(world_size)]
            checks.append(Check(
                label, f"{part} per rank (largest of {world_size})", max(per_rank), analytic[kind][part],
                CheckUnit.BYTES, note=f"ranks: {', '.join(map(str, per_rank))}", seconds=seconds))
    fsdp_w = max(ranks[r]["fsdp"]["weights"] for r in range(world_size))
    ddp_w = max(ranks[r]["ddp"]["weights"] for r in range(world_size))
    checks.append(Check("FSDP2 fully_shard", "weights per rank / DDP's", fsdp_w / ddp_w, 1 / world_size,
                        CheckUnit.RATIO, seconds=seconds))
    diffs = [abs(a - b) for a, b in zip(ranks[0]["ddp"]["losses"], ranks[0]["fsdp"]["losses"], strict=True)]
    checks.append(Check("FSDP2 fully_shard", f"|loss FSDP2 − loss DDP|, largest of {steps} fp32 steps", max(diffs),
                        0.0, CheckUnit.LOSS, seconds=seconds,
                        note="losses: " + ", ".join(f"{v:.6f}" for v in ranks[0]["fsdp"]["losses"])))
    return checks


# ------------------------------------------------------------------------------------- single-process checks


def check_lora(rank: int = 8) -> list[Check]:
    """peft's trainable parameter count equals ``r · (in + out)`` per targeted projection."""
    start = time.perf_counter()
    setup = tiny_setup(method="lora", lora_rank=rank, precision="fp32")
    with quiet_libraries():
        model = build_model(setup, "cpu")
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return [Check("peft LoRA", f"trainable parameters (r={rank}, {', '.join(setup.lora_targets)})", trainable,
                  states.lora_parameters(setup), CheckUnit.PARAMETERS, seconds=time.perf_counter() - start)]


def check_checkpointing() -> list[Check]:
    """The drop of the step's peak when each decoder layer is checkpointed: measured (CPU allocator) vs analytic."""

    start = time.perf_counter()
    setup = tiny_setup(precision="fp32", batch=4, seq=256, model_config={"num_hidden_layers": 4})
    with quiet_libraries():  # two steps: the second is the steady state the budget models
        plain, ckpt = measure_steps(setup, steps=2), measure_steps(setup.with_(checkpointing=True), steps=2)
    a_plain = estimate_setup(setup, 0).allocated_peak_bytes
    a_ckpt = estimate_setup(setup.with_(checkpointing=True), 0).allocated_peak_bytes
    seconds = time.perf_counter() - start
    return [
        Check("activation checkpointing", "peak without checkpointing", plain.peak_bytes, a_plain, CheckUnit.BYTES,
              seconds=seconds),
        Check("activation checkpointing", "peak with checkpointing", ckpt.peak_bytes, a_ckpt, CheckUnit.BYTES,
              seconds=seconds),
        Check("activation checkpointing", "saving (peak without − with)", plain.peak_bytes - ckpt.peak_bytes,
              a_plain - a_ckpt, CheckUnit.BYTES, seconds=seconds),
    ]


def check_device_map(gpus: int = 4) -> list[Check]:
    """accelerate's placement of a real tiny model under ``max_memory``: within limits, sizes = the real tensors'."""
    import torch
    from accelerate.utils import compute_module_sizes, get_balanced_memory, infer_auto_device_map

    start = time.perf_counter()
    setup = tiny_setup(precision="fp32", model_config={"num_hidden_layers": 8})
    torch.manual_seed(0)
    with quiet_libraries():
        model = build_model(setup, "cpu")
    sizes = compute_module_sizes(model)
    limit = sizes[""] // gpus + sizes[""] // (4 * gpus)  # a quarter of the model each, plus 25 %
    with quiet_libraries():  # accelerate's modeling logger warns of devices this machine lacks
        max_memory = get_balanced_memory(model, max_memory=dict.fromkeys(range(gpus), limit),
                                         no_split_module_classes=["LlamaDecoderLayer"])
        device_map = infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=["LlamaDecoderLayer"])
    placed = dict.fromkeys(range(gpus), 0)
    for name, device in device_map.items():
        module = model.get_submodule(name) if name else model
        placed[device] = placed.get(device, 0) + sum(tensor_nbytes(p) for p in module.parameters())
    real_total = sum(tensor_nbytes(p) for p in model.parameters())
    within = all(placed[d] <= max(limit, int(max_memory.get(d, limit))) for d in range(gpus))
    seconds = time.perf_counter() - start
    layers = {d: sum(1 for n, v in device_map.items() if v == d and ".layers." in f".{n}") for d in range(gpus)}
    return [
        Check("accelerate device_map", "bytes placed on the most loaded device", max(placed.values()),
              max(int(v) for k, v in max_memory.items() if k in placed), CheckUnit.BYTES,
              note=f"layers per device {layers}; within max_memory: {within}; analytic = accelerate's balanced "
                   "max_memory of that device", seconds=seconds),
        Check("accelerate device_map", "all placed bytes vs the real tensors", sum(placed.values()), real_total,
              CheckUnit.BYTES, seconds=seconds),
    ]


def _quantized_tiny(setup: TrainingSetup) -> Any:
    """The tiny model with random weights, loaded back through transformers with bitsandbytes NF4 (on CPU)."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    torch.manual_seed(0)
    model = build_model(replace(setup, method=Method.FULL), "cpu")
    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                bnb_4bit_compute_dtype=torch.float16)
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as folder:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, f"{folder}/model.safetensors",
                  metadata={"format": "pt"})
        Path(folder, "config.json").write_text(json.dumps(model.config.to_dict()))
        return AutoModelForCausalLM.from_pretrained(folder, quantization_config=config, dtype=torch.float16)


def check_qlora() -> list[Check]:
    """bitsandbytes NF4 with double quantization on CPU: weight bytes vs the budget; a LoRA step over them."""
    import torch

    start = time.perf_counter()
    setup = tiny_setup(method="qlora", precision="fp16-mixed",
                       model_config={"hidden_size": 256, "intermediate_size": 688})
    try:
        with quiet_libraries():
            model = _quantized_tiny(setup)
            measured = 0
            for module in model.modules():
                weight = getattr(module, "weight", None)
                state = getattr(weight, "quant_state", None)
                if state is None:
                    continue
                measured += tensor_nbytes(weight) + tensor_nbytes(state.absmax)
                if state.state2 is not None:
                    measured += tensor_nbytes(state.state2.absmax) + tensor_nbytes(state.state2.code) // 1

            lora = apply_lora(model, setup, adapters_fp32=True)
            ids = torch.randint(0, setup.model.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0))
            optimizer = torch.optim.AdamW(trainable_tensors(lora), lr=1e-4)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = lora(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            ok = bool(torch.isfinite(loss).item())
    except Exception as err:  # noqa: BLE001 - report what bitsandbytes says on this machine
        return [Check("bitsandbytes QLoRA (NF4)", "4-bit weights", None, None, CheckUnit.BYTES,
                      note=f"did not run on this CPU: {type(err).__name__}: {err}",
                      seconds=time.perf_counter() - start)]
    analytic = round(states.quantized_parameters(setup) * states.NF4_DQ_BITS / 8)
    return [Check("bitsandbytes QLoRA (NF4)", "quantized projection weights (+ absmax, double-quantized)", measured,
                  analytic, CheckUnit.BYTES,
                  note=f"CPU fallback path; one LoRA step over the 4-bit base: loss {loss.item():.4f}, finite {ok}; "
                       f"analytic: {states.NF4_DQ_BITS} bits per quantized parameter (QLoRA paper)",
                  seconds=time.perf_counter() - start)]


def check_adamw_8bit() -> list[Check]:
    """bitsandbytes AdamW8bit: one step on CPU if it runs; its state bytes vs the budget's."""
    import torch

    start = time.perf_counter()
    setup = tiny_setup(precision="fp32", optimizer="adamw-8bit")
    try:
        with quiet_libraries():
            torch.manual_seed(0)
            model = build_model(setup, "cpu")
            optimizer = make_optimizer(setup, trainable_tensors(model))
            ids = torch.randint(0, setup.model.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0))
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
        state = sum(tensor_nbytes(v) for s in optimizer.state.values() for v in s.values()
                    if torch.is_tensor(v) and v.dim() > 0)
    except Exception as err:  # noqa: BLE001
        return [Check("bitsandbytes AdamW8bit", "optimizer state", None, states.optimizer_state_bytes_total(setup),
                      CheckUnit.BYTES, note=f"did not run on this CPU: {type(err).__name__}: {err}",
                      seconds=time.perf_counter() - start)]
    return [Check("bitsandbytes AdamW8bit", "optimizer state after one step", state,
                  states.optimizer_state_bytes_total(setup), CheckUnit.BYTES, note="ran on CPU",
                  seconds=time.perf_counter() - start)]


def count_step_flops(setup: TrainingSetup) -> int:
    """FLOPs of one forward + backward of ``setup``'s tiny model, counted by ``FlopCounterMode``."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    with quiet_libraries():
        model = build_model(setup, "cpu")
    ids = torch.randint(0, setup.model.vocab_size, (setup.batch, setup.seq), generator=torch.Generator().manual_seed(0))
    counter = FlopCounterMode(display=False)
    with counter:
        model(input_ids=ids, labels=ids).loss.backward()
    return int(counter.get_total_flops())


def check_flops() -> list[Check]:
    """The plan's FLOPs per token × tokens against FlopCounterMode, full / LoRA, with and without checkpointing."""

    checks = []
    for method in ("full", "lora"):
        for ckpt in (False, True):
            start = time.perf_counter()
            setup = tiny_setup(method=method, precision="fp32", attention="eager", checkpointing=ckpt)
            counted = count_step_flops(setup)
            analytic = flops_per_token(setup).total * setup.batch * setup.seq
            checks.append(Check("FLOP formula", f"{method}{', checkpointing' if ckpt else ''}: FLOPs of one step",
                                counted, analytic, CheckUnit.FLOPS,
                                note="FlopCounterMode (eager attention: bmm counted)",
                                seconds=time.perf_counter() - start))
    return checks


# ---------------------------------------------------------------------------------------------------- all


CHECKS: dict[str, Callable[[], list[Check]]] = {
    "fsdp": check_fsdp, "lora": check_lora, "checkpointing": check_checkpointing, "device_map": check_device_map,
    "qlora": check_qlora, "adamw_8bit": check_adamw_8bit, "flops": check_flops,
}
FAST = ("lora", "checkpointing", "device_map", "qlora", "adamw_8bit", "flops")  # single process, seconds


def verification(names: tuple[str, ...] = tuple(CHECKS), *, use_cache: bool = True, run: bool = True) -> Verification:
    """Run the named checks (or read them from the cache); ``run=False`` only reads the cache.

    The cache key is the names, the library versions and :data:`~oomlab.evidence.checks_cache.VERIFY_VERSION`; the
    result records when it was measured, so a notebook can say so.
    """
    return cached_verification(names, CHECKS, use_cache=use_cache, run=run)
