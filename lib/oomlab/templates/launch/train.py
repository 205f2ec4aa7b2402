"""Fine-tune a causal language model with accelerate (DDP, FSDP1, FSDP2 or DeepSpeed, from the launch config) and peft.

Written by oomlab (``python -m oomlab plan --write-configs``); see LAUNCH.md next to this file for the commands.

    accelerate launch --config_file accelerate_fsdp.yaml train.py --model ORG/MODEL --method lora \
        --checkpointing --seq 2048 --batch 1 --steps 1000 --data train.txt

``--data`` is a UTF-8 text file, tokenized and cut into ``--seq``-token blocks; without it, random token ids are used
(a memory and speed check).  ``--tiny-config config.json`` builds a randomly initialised model from a config instead
of downloading weights (what oomlab's tests run on CPU).

The model and the optimizer go through ``accelerator.prepare(model, optimizer)`` together, the optimizer built on the
unwrapped model's trainable parameters, as accelerate's FSDP2 path requires (accelerate/accelerator.py, ``prepare``:
"When using FSDP2, a model and optimizer must be passed together"). After the first step a ``{"prepared": ...}``
line says what accelerate built: the distributed type, the wrapped model's class, whether the forward runs under
accelerate's autocast, and the dtype the first decoder layer computes in.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, DummyOptim, set_seed

DEFAULT_MODEL = "huggyllama/llama-13b"  # oomlab writes the plan's model here


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=DEFAULT_MODEL, help="hub id or local folder with config and weights")
    p.add_argument("--tiny-config", default=None, help="a config.json: random weights, no download (tests)")
    p.add_argument("--method", choices=("full", "lora", "qlora"), default="lora")
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--lora-alpha", type=int, default=16)
    p.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj")
    p.add_argument("--optimizer", choices=("adamw", "adamw-fused", "adamw-hf", "adamw-8bit", "sgd"), default="adamw",
                   help="adamw: torch AdamW (foreach on GPUs); adamw-fused: AdamW(fused=True), the HF Trainer's "
                        "default; adamw-8bit: bitsandbytes AdamW8bit; sgd: SGD with momentum 0.9")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--seq", type=int, default=2048, help="tokens per sequence")
    p.add_argument("--batch", type=int, default=1, help="micro-batch per GPU")
    p.add_argument("--accumulation", type=int, default=1,
                   help="micro-batches per optimizer step (gradient accumulation: the global batch kept)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing of each decoder layer")
    p.add_argument("--loss", choices=("standard", "liger-flce", "cce"), default="standard",
                   help="liger-flce: Liger-Kernel's fused linear cross-entropy, as TrainingArguments(use_liger_kernel) "
                   "applies it (pip install liger-kernel); cce: Apple's Cut Cross-Entropy (pip install "
                   "cut-cross-entropy); both need a GPU (Triton)")
    p.add_argument("--data", default=None, help="a text file to train on (default: random token ids)")
    p.add_argument("--output-dir", default=None, help="save the adapters (LoRA) or the model here at the end")
    p.add_argument("--log-json", default=None, help="append one JSON line per step here (rank 0)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def half_dtype(accelerator: Accelerator) -> torch.dtype:
    """The compute dtype of the launch's mixed precision (fp32 without one)."""
    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(accelerator.mixed_precision, torch.float32)


def load_model(args: argparse.Namespace, accelerator: Accelerator) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    half = half_dtype(accelerator)
    # LoRA trains adapters over a frozen base kept in half precision; full fine-tuning keeps fp32 master weights
    dtype = torch.float32 if args.method == "full" else half
    kwargs = {"dtype": dtype}
    if args.method == "qlora":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=half, bnb_4bit_quant_storage=half,  # a uniform storage dtype lets FSDP shard it
        )
        if accelerator.distributed_type != DistributedType.FSDP:
            kwargs["device_map"] = {"": accelerator.device}  # each DDP process quantizes onto its own GPU
    if args.tiny_config:
        with open(args.tiny_config) as f:
            config = AutoConfig.for_model(**json.load(f))
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        if args.method == "qlora":  # quantization happens while loading: save the random weights, load them back
            import tempfile

            from safetensors.torch import save_file

            with tempfile.TemporaryDirectory() as folder:  # every rank writes its own copy (no main-process guard)
                save_file({k: v.contiguous() for k, v in model.state_dict().items()}, f"{folder}/model.safetensors",
                          metadata={"format": "pt"})
                with open(f"{folder}/config.json", "w") as f:
                    json.dump(config.to_dict(), f)
                model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(args.model, **kwargs)
    model.config.use_cache = False
    if args.loss == "liger-flce":  # transformers' own integration, the base model patched before peft wraps it
        from transformers.integrations.liger import apply_liger_kernel

        apply_liger_kernel(model, {"fused_linear_cross_entropy": True, "cross_entropy": False, "rope": False,
                                   "rms_norm": False, "swiglu": False, "geglu": False, "layer_norm": False})
    elif args.loss == "cce":
        from cut_cross_entropy.transformers import cce_patch

        model = cce_patch(model)
    if args.method in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

        if args.method == "qlora":
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=args.checkpointing)
        config = LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=0.0, task_type="CAUSAL_LM",
                            target_modules=[t for t in args.lora_targets.split(",") if t])
        model = get_peft_model(model, config)  # adapters in fp32 over the half base (peft's autocast_adapter_dtype)
    return model


def batches(args: argparse.Namespace, vocab_size: int, rank: int):
    """Endless micro-batches of ``(batch, seq)`` token ids: from --data, else random."""
    if args.data:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model)
        with open(args.data, encoding="utf-8") as f:
            ids = torch.tensor(tokenizer(f.read())["input_ids"], dtype=torch.long)
        blocks = ids[: len(ids) // args.seq * args.seq].view(-1, args.seq)
        if len(blocks) < args.batch:
            raise SystemExit(f"--data {args.data} has {len(ids)} tokens: fewer than one micro-batch")
        while True:
            order = torch.randperm(len(blocks), generator=torch.Generator().manual_seed(args.seed + rank))
            for i in range(0, len(order) - args.batch + 1, args.batch):
                yield blocks[order[i:i + args.batch]]
    generator = torch.Generator().manual_seed(args.seed + rank)
    while True:
        yield torch.randint(0, vocab_size, (args.batch, args.seq), generator=generator)


def make_optimizer(args: argparse.Namespace, params: list[torch.nn.Parameter],
                   accelerator: Accelerator | None = None) -> torch.optim.Optimizer:
    """The optimizer oomlab budgeted (``--optimizer``), over the trainable parameters.

    A DeepSpeed JSON with an ``"optimizer"`` block (oomlab writes one for ``adamw``: DeepSpeed's FusedAdam, or
    DeepSpeedCPUAdam under offload) builds its own; accelerate then takes a ``DummyOptim`` placeholder
    (accelerate/accelerator.py ``_prepare_deepspeed``: "You cannot specify an optimizer in the config file and in the
    code at the same time").
    """
    plugin = getattr(accelerator.state, "deepspeed_plugin", None) if accelerator is not None else None
    if plugin is not None and "optimizer" in plugin.deepspeed_config:
        return DummyOptim(params, lr=args.lr)
    if args.optimizer == "adamw-8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, lr=args.lr)
    if args.optimizer == "adamw-fused":  # the HF Trainer's default optim="adamw_torch_fused" (torch >= 2.8)
        return torch.optim.AdamW(params, lr=args.lr, fused=True)
    if args.optimizer == "sgd":
        return torch.optim.SGD(params, lr=args.lr, momentum=0.9)
    if args.optimizer == "adamw-hf":  # transformers' own AdamW (gone in 5.x): torch's, one parameter at a time
        return torch.optim.AdamW(params, lr=args.lr, foreach=False)
    return torch.optim.AdamW(params, lr=args.lr)  # foreach on CUDA (torch's default when neither flag is given)


def is_fsdp1(accelerator: Accelerator) -> bool:
    return accelerator.distributed_type == DistributedType.FSDP and accelerator.state.fsdp_plugin.fsdp_version == 1


def wrap_adapters_separately(model: torch.nn.Module, accelerator: Accelerator) -> None:
    """FSDP1 + LoRA/QLoRA: wrap each trainable LoRA module in its own FSDP unit, as the HF Trainer does.

    The Trainer calls ``update_fsdp_plugin_peft`` before preparing an FSDP1 peft model
    (transformers/trainer.py:1760-1762 in transformers 5.24; transformers/distributed/fsdp.py:267-286): it sets
    peft's ``fsdp_auto_wrap_policy`` (peft/utils/other.py:1271-1308: the decoder layers, plus every leaf module whose
    weight requires grad) and, for bitsandbytes 4-bit with a float storage dtype, the FSDP mixed precision to that
    storage dtype. Without it a decoder-layer unit flattens the frozen half base together with peft's fp32 adapters
    ("Must flatten tensors with uniform dtype", torch/distributed/fsdp/_flat_param.py:814) -- or, with half
    adapters, accelerate upcasts the whole unit, frozen base included, to fp32 because one member requires grad
    (accelerate/accelerator.py:2029-2038). FSDP2 shards each parameter on its own and needs neither (the Trainer
    skips it there too).
    """
    from peft.utils.other import fsdp_auto_wrap_policy

    plugin = accelerator.state.fsdp_plugin
    plugin.auto_wrap_policy = fsdp_auto_wrap_policy(model)
    quantization = getattr(getattr(model, "hf_quantizer", None), "quantization_config", None)
    storage = getattr(quantization, "bnb_4bit_quant_storage", None)
    if isinstance(storage, torch.dtype) and storage.is_floating_point:
        plugin.set_mixed_precision(storage, override=True)


def describe_prepared(accelerator: Accelerator, model: torch.nn.Module,
                      optimizer: torch.optim.Optimizer) -> dict[str, object]:
    """What ``accelerator.prepare`` built: distributed type, wrapper class, autocast wrap, FSDP1 flat params."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1

    inner = accelerator.unwrap_model(model, keep_fp32_wrapper=True)
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    base_optimizer = getattr(optimizer, "optimizer", optimizer)  # inside accelerate's AcceleratedOptimizer
    out: dict[str, object] = {
        "distributed_type": accelerator.distributed_type.value,
        "fsdp_version": plugin.fsdp_version if accelerator.distributed_type == DistributedType.FSDP else None,
        "mixed_precision": accelerator.mixed_precision,
        "model_class": type(model).__name__,
        "fsdp2_module": isinstance(model, FSDPModule),
        # prepare_model keeps the original forward here when it wraps it in torch.autocast (DDP, FSDP1, one GPU)
        "accelerate_autocast": hasattr(inner, "_original_forward") or hasattr(model, "_original_forward"),
        "optimizer": type(base_optimizer).__name__,
        "optimizer_fused": bool(getattr(base_optimizer, "defaults", {}).get("fused")),
        # the optimizer steps the parameters the model trains with (FSDP2: re-pointed at the shards by prepare)
        "optimizer_holds_model_params": {id(p) for g in optimizer.param_groups for p in g["params"]}
        <= {id(p) for p in model.parameters()},
        "scaler": None if accelerator.scaler is None else type(accelerator.scaler).__name__,
    }
    if accelerator.distributed_type == DistributedType.DEEPSPEED:  # the engine's own account of what it runs
        out["zero_stage"] = model.zero_optimization_stage()
        out["zero_offload_optimizer"] = bool(model.zero_cpu_offload())
        out["deepspeed_optimizer"] = type(getattr(base_optimizer, "optimizer", base_optimizer)).__name__
        out["micro_batch"] = model.train_micro_batch_size_per_gpu()
        out["zero3_init"] = any(hasattr(p, "ds_id") for p in model.module.parameters())
    if isinstance(model, FSDP1):
        units = [m for m in FSDP1.fsdp_modules(model) if m._has_params]
        out["fsdp1_flat_params"] = sorted({(str(m._flat_param.dtype).removeprefix("torch."),
                                            bool(m._flat_param.requires_grad)) for m in units})
    return out


def probe_first_layer(model: torch.nn.Module, seen: dict[str, object]) -> None:
    """Record, once, whether the first decoder layer's forward runs under autocast and its weights' dtype."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    classes = set(getattr(base, "_no_split_modules", None) or ())
    layer = next((m for m in base.modules() if type(m).__name__ in classes), None)
    if layer is None:
        return

    def hook(module: torch.nn.Module, args: tuple) -> None:
        if not seen:
            weight = next(module.parameters())
            device = weight.device.type
            seen.update(autocast=torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None,
                        weight_dtype=weight.dtype)

    layer.register_forward_pre_hook(hook)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    accelerator = Accelerator(gradient_accumulation_steps=args.accumulation)
    set_seed(args.seed)
    model = load_model(args, accelerator)
    vocab_size = model.config.vocab_size
    if accelerator.is_main_process:
        # under DeepSpeed's zero.Init a parameter is an empty placeholder; ds_numel is its size
        trainable = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters() if p.requires_grad)
        total = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
        print(f"{args.method}: {trainable:,} trainable of {total:,} parameters; {accelerator.num_processes} "
              f"processes, {accelerator.distributed_type}, mixed precision {accelerator.mixed_precision}", flush=True)
    if args.checkpointing:  # transformers' own, per decoder layer (before FSDP wraps the layers)
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    seen: dict[str, object] = {}
    probe_first_layer(model, seen)
    optimizer = make_optimizer(args, [p for p in model.parameters() if p.requires_grad], accelerator)
    if is_fsdp1(accelerator) and args.method != "full":
        wrap_adapters_separately(model, accelerator)
    # One call, the optimizer built first on the unwrapped model: FSDP2 requires both together and re-points the
    # optimizer at the sharded DTensors (accelerate/accelerator.py:1508-1521, 1715-1766); DeepSpeed takes both too.
    # FSDP1 with use_orig_params (as written in accelerate_fsdp*.yaml) keeps these parameter objects and swaps their
    # .data for shard views (torch/distributed/fsdp/_flat_param.py:2128, _use_sharded_views), so the optimizer built
    # before wrapping steps the shards -- where the Trainer instead builds it after prepare(model) for FSDP1
    # (transformers/trainer.py:1717-1722, 1763-1766).
    model, optimizer = accelerator.prepare(model, optimizer)
    model.train()
    prepared = describe_prepared(accelerator, model, optimizer)
    if not prepared["optimizer_holds_model_params"] and accelerator.distributed_type != DistributedType.DEEPSPEED:
        raise SystemExit("the optimizer does not step the prepared model's parameters: with FSDP1 set "
                         "fsdp_use_orig_params: true in the accelerate config (as oomlab writes it)")
    data = batches(args, vocab_size, accelerator.process_index)
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        for _ in range(args.accumulation):  # accelerate steps the optimizer on the last micro-batch only
            with accelerator.accumulate(model):
                input_ids = next(data).to(accelerator.device)
                loss = model(input_ids=input_ids, labels=input_ids).loss
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - start
        value = accelerator.reduce(loss.detach().float(), reduction="mean").item()
        if not math.isfinite(value):
            raise SystemExit(f"step {step}: loss is {value}")
        if step == 1:  # after the first forward: the probe has seen the first decoder layer run
            prepared["forward"] = {k: str(v).removeprefix("torch.") if v is not None else None
                                   for k, v in seen.items()}
            prepared["loss_dtype"] = str(loss.dtype).removeprefix("torch.")
            if accelerator.is_main_process:
                emit({"prepared": prepared}, args.log_json)
        if accelerator.is_main_process:
            tokens = args.batch * args.accumulation * args.seq * accelerator.num_processes
            record = {"step": step, "loss": value, "seconds": seconds, "tokens_per_s": tokens / seconds}
            if torch.cuda.is_available():
                record["max_memory_allocated"] = torch.cuda.max_memory_allocated()
                record["max_memory_reserved"] = torch.cuda.max_memory_reserved()
            emit(record, args.log_json)
    accelerator.wait_for_everyone()
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
        accelerator.unwrap_model(model).save_pretrained(
            args.output_dir, is_main_process=accelerator.is_main_process, save_function=accelerator.save,
            state_dict=accelerator.get_state_dict(model))
    accelerator.end_training()


def emit(record: dict[str, object], log_json: str | None) -> None:
    """Print one JSON line; append it to ``--log-json`` too."""
    line = json.dumps(record)
    print(line, flush=True)
    if log_json:
        with open(log_json, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
