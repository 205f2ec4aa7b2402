"""Fine-tune a causal language model with accelerate (FSDP or DeepSpeed, from the launch config) and peft.

Written by oomlab (``python -m oomlab plan --write-configs``); see LAUNCH.md next to this file for the commands.

    accelerate launch --config_file accelerate_fsdp.yaml train.py --model huggyllama/llama-13b --method lora \
        --checkpointing --seq 2048 --batch 1 --steps 1000 --data train.txt

``--data`` is a UTF-8 text file, tokenized and cut into ``--seq``-token blocks; without it, random token ids are used
(a memory and speed check).  ``--tiny-config config.json`` builds a randomly initialised model from a config instead
of downloading weights (what oomlab's tests run on CPU).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="huggyllama/llama-13b", help="hub id or local folder with config and weights")
    p.add_argument("--tiny-config", default=None, help="a config.json: random weights, no download (tests)")
    p.add_argument("--method", choices=("full", "lora", "qlora"), default="lora")
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--lora-alpha", type=int, default=16)
    p.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj")
    p.add_argument("--optimizer", choices=("adamw", "adamw-8bit"), default="adamw")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--seq", type=int, default=2048, help="tokens per sequence")
    p.add_argument("--batch", type=int, default=1, help="micro-batch per GPU")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing of each decoder layer")
    p.add_argument("--data", default=None, help="a text file to train on (default: random token ids)")
    p.add_argument("--output-dir", default=None, help="save the adapters (LoRA) or the model here at the end")
    p.add_argument("--log-json", default=None, help="append one JSON line per step here (rank 0)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def load_model(args: argparse.Namespace, accelerator: Accelerator) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    half = torch.float16 if accelerator.mixed_precision == "fp16" else (
        torch.bfloat16 if accelerator.mixed_precision == "bf16" else torch.float32)
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
    if args.method in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

        if args.method == "qlora":
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=args.checkpointing)
        config = LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=0.0, task_type="CAUSAL_LM",
                            target_modules=[t for t in args.lora_targets.split(",") if t])
        model = get_peft_model(model, config)
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


def shard_on_cpu(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2 on CPU, from the FSDP_* variables ``accelerate launch`` sets from the config.

    accelerate applies FSDP only on accelerators; on a CPU test run it would fall back to DDP. This applies the
    same sharding -- ``fully_shard`` on each wrapped decoder layer, then the root -- so the CPU run trains as the
    GPU run does.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    classes = set(os.environ.get("FSDP_TRANSFORMER_CLS_TO_WRAP", "LlamaDecoderLayer").split(","))
    kwargs = {"reshard_after_forward": os.environ.get("FSDP_RESHARD_AFTER_FORWARD", "true").lower() == "true"}
    if os.environ.get("FSDP_OFFLOAD_PARAMS", "false").lower() == "true":
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
    if os.environ.get("ACCELERATE_MIXED_PRECISION", "no") == "fp16":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32)
    for module in model.modules():
        if type(module).__name__ in classes:
            fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    return model


def make_optimizer(args: argparse.Namespace, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if args.optimizer == "adamw-8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, lr=args.lr)
    return torch.optim.AdamW(params, lr=args.lr)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    accelerator = Accelerator()
    set_seed(args.seed)
    model = load_model(args, accelerator)
    vocab_size = model.config.vocab_size
    if accelerator.is_main_process:
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in model.parameters())
        print(f"{args.method}: {trainable:,} trainable of {total:,} parameters; {accelerator.num_processes} "
              f"processes, {accelerator.distributed_type}, mixed precision {accelerator.mixed_precision}", flush=True)
    if args.checkpointing:  # transformers' own, per decoder layer (before FSDP wraps the layers)
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    cpu_fsdp = (os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
                and accelerator.distributed_type == DistributedType.MULTI_CPU)
    model = shard_on_cpu(model) if cpu_fsdp else accelerator.prepare(model)
    optimizer = accelerator.prepare(make_optimizer(args, [p for p in model.parameters() if p.requires_grad]))
    model.train()
    data = batches(args, vocab_size, accelerator.process_index)
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        input_ids = next(data).to(accelerator.device)
        loss = model(input_ids=input_ids, labels=input_ids).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - start
        value = accelerator.reduce(loss.detach().float(), reduction="mean").item()
        if not math.isfinite(value):
            raise SystemExit(f"step {step}: loss is {value}")
        if accelerator.is_main_process:
            tokens = args.batch * args.seq * accelerator.num_processes
            record = {"step": step, "loss": value, "seconds": seconds, "tokens_per_s": tokens / seconds}
            if torch.cuda.is_available():
                record["max_memory_allocated"] = torch.cuda.max_memory_allocated()
                record["max_memory_reserved"] = torch.cuda.max_memory_reserved()
            if cpu_fsdp:
                record["fsdp_on_cpu"] = True
            print(json.dumps(record), flush=True)
            if args.log_json:
                with open(args.log_json, "a") as f:
                    f.write(json.dumps(record) + "\n")
    accelerator.wait_for_everyone()
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
        accelerator.unwrap_model(model).save_pretrained(
            args.output_dir, is_main_process=accelerator.is_main_process, save_function=accelerator.save,
            state_dict=accelerator.get_state_dict(model))
    accelerator.end_training()


if __name__ == "__main__":
    main()
