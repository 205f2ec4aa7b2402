"""oomlab.explanation.aggregate_candidates through explain: requests that are aggregates of the model (whole copies,
partitions, optimizer states, buckets, logits), as seen on real cases, ranked by phase and what the caller told."""

import json
from pathlib import Path

import pytest

from oomlab.explanation.aggregate import AggregateKind
from oomlab.explanation.explain import explain

LLAMA_2_7B = Path(__file__).parents[2] / "lib" / "oomlab" / "specs" / "models" / "llama-2-7b.json"
LLAMA_2_7B_PARAMS = 6_738_415_616  # 32 × 202,383,360 + 2 × 32,000 × 4,096 + 4,096
MODEL_7B_PARAMS = 7_000_559_616  # the same with a 64,000-token vocabulary: 2 × 32,000 × 4,096 more

NEW_FORMAT = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried}. GPU 0 has a total capacity of "
              "{total} of which {free} is free. Including non-PyTorch memory, this process has {in_use} memory in use. "
              "Of the allocated memory {allocated} is allocated by PyTorch, and {unallocated} is reserved by PyTorch "
              "but unallocated.\n")


def frames(*lines: tuple[str, int, str, str]) -> str:
    """A Python traceback of ``(file, line, function, code)`` frames, outermost first."""
    out = ["Traceback (most recent call last):"]
    for file, line, function, code in lines:
        out += [f'  File "{file}", line {line}, in {function}', f"    {code}"]
    return "\n".join(out) + "\n"


SP = "/usr/local/lib/python3.11/site-packages"
LOAD = frames(("/workspace/resume.py", 41, "<module>", 'state = torch.load(path, map_location="cuda")'),
              (f"{SP}/torch/serialization.py", 1471, "load", "return _load("),
              (f"{SP}/torch/serialization.py", 1964, "_load", "result = unpickler.load()"))
ZERO_STEP = frames(("/workspace/train.py", 118, "<module>", "model_engine.step()"),
                   (f"{SP}/deepspeed/runtime/engine.py", 2213, "step", "self._take_model_step(lr_kwargs)"),
                   (f"{SP}/deepspeed/runtime/engine.py", 2119, "_take_model_step", "self.optimizer.step()"),
                   (f"{SP}/deepspeed/runtime/zero/stage_1_and_2.py", 1842, "step", "self._optimizer_step(i)"))
# 26.08 GiB on an H100 (79.19 GiB): 54.07 GiB reserved, 0.77 GiB outside PyTorch
H100_26 = NEW_FORMAT.format(tried="26.08 GiB", total="79.19 GiB", free="24.35 GiB", in_use="54.83 GiB",
                            allocated="52.16 GiB", unallocated="1.91 GiB")
# 3.14 GiB on an A100-80GB (79.35 GiB)
A100_3 = NEW_FORMAT.format(tried="3.14 GiB", total="79.35 GiB", free="2.05 GiB", in_use="77.29 GiB",
                           allocated="73.40 GiB", unallocated="2.46 GiB")


@pytest.fixture(scope="module")
def model_7b(tmp_path_factory) -> str:
    """A 7.0B LLaMA: llama-2-7b's layers with a 64,000-token vocabulary (7,000,559,616 parameters)."""
    config = json.loads(LLAMA_2_7B.read_text())
    config["vocab_size"] = 64_000
    path = tmp_path_factory.mktemp("model-7b") / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


# ------------------------------------------------------------------- 26.08 GiB: a whole fp32 copy


def test_7b_fp32_copy_at_load(model_7b: str) -> None:
    """26.08 GiB while loading a 7.0B model: 7.0B parameters × 4 bytes, a whole fp32 copy, ranked first."""
    from oomlab.explanation.aggregate import parameter_inventory

    assert parameter_inventory(model_7b).total == MODEL_7B_PARAMS
    e = explain(LOAD + H100_26, model=model_7b, gpu="h100-80gb")
    top = e.aggregates[0]
    assert (top.aggregate.kind, top.exact, top.in_phase) == (AggregateKind.WHOLE_COPY, True, True)
    assert top.aggregate.nbytes == 4 * MODEL_7B_PARAMS
    assert top.aggregate.arithmetic == "7.00B parameters × 4 bytes = 26.08 GiB"
    assert top.aggregate.what == "a whole fp32 copy of the model"
    assert "7.00B parameters × 4 bytes = 26.08 GiB: a whole fp32 copy of the model" in e.verdict
    assert "something else (activations, a temporary buffer)" not in e.verdict


def test_7b_fp32_copy_in_a_step(model_7b: str) -> None:
    """26.08 GiB in an optimizer step, nothing else told: a whole fp32 copy (one GPU's flat ZeRO partition)."""
    e = explain(ZERO_STEP + H100_26, model=model_7b, gpu="h100-80gb")
    top = e.aggregates[0]
    assert top.aggregate.arithmetic == "7.00B parameters × 4 bytes = 26.08 GiB" and top.in_phase
    assert top.aggregate.what.startswith("a whole fp32 copy of the model: ")
    assert top.aggregate.solved == "the job has one GPU"


# --------------------------------------------------- 3.14 GiB in the AdamW step under ZeRO-2 × 8


def test_zero2_step_is_the_fp32_gradient_partition() -> None:
    """llama-2-7b, ZeRO-2 on 8 GPUs, 3.14 GiB in the step: 6.74B × 4 / 8.  DeepSpeed's step makes the partition's fp32
    gradient every step (single_grad_partition), then the first step an Adam moment of the same size; the fp32 master
    partition is the same size too, but deepspeed.initialize made it: ranked below, ruled out by the phase."""
    e = explain(ZERO_STEP + A100_3, model="llama-2-7b", gpu="a100-80gb", gpus=8, strategy="zero2")
    kinds = [c.aggregate.kind for c in e.aggregates]
    assert kinds[:2] == [AggregateKind.GRADIENT_PARTITION, AggregateKind.MOMENT]
    top = e.aggregates[0]
    assert top.aggregate.nbytes == LLAMA_2_7B_PARAMS * 4 // 8 and top.exact
    assert top.aggregate.arithmetic == "6.74B parameters × 4 bytes / 8 GPUs = 3.14 GiB"
    assert top.aggregate.what == "ZeRO's fp32 gradient partition over 8 GPUs"
    master = next(c for c in e.aggregates if c.aggregate.kind is AggregateKind.MASTER_PARTITION)
    assert master.in_phase is False and master.rank > 2
    assert "Of the same size but ruled out by the phase: ZeRO's fp32 master partition over 8 GPUs" in e.verdict
    assert all(c.aggregate.solved is None for c in e.aggregates)  # the world size was given


def test_zero2_moment_when_the_frame_shows_it() -> None:
    """The innermost frame creating exp_avg (FusedAdam's first step) puts the Adam moment first."""
    fused = frames((f"{SP}/deepspeed/ops/adam/fused_adam.py", 155, "step",
                    "state['exp_avg'] = torch.zeros_like(p.data)"))
    e = explain(ZERO_STEP + fused.split("\n", 1)[1] + A100_3, model="llama-2-7b", gpus=8, strategy="zero2")
    assert e.aggregates[0].aggregate.kind is AggregateKind.MOMENT
    assert any("fused_adam.py:155 in step" in ev for ev in e.aggregates[0].evidence)


def test_zero2_world_size_solved_when_not_given() -> None:
    """Without --gpus the partition is still found, at the power of two that makes it, named as an assumption."""
    e = explain(ZERO_STEP + A100_3, model="llama-2-7b")
    grads = [c for c in e.aggregates if c.aggregate.what == "ZeRO's fp32 gradient partition over 8 GPUs"]
    assert grads and grads[0].aggregate.solved == "the job has 8 GPUs"
    assert "if the job has 8 GPUs" in e.verdict


# --------------------------------------------------------------------------------------- logits

LOGITS_TRACE = frames(
    ("/workspace/train.py", 77, "<module>", "loss = model(**batch).loss"),
    (f"{SP}/transformers/models/llama/modeling_llama.py", 480, "forward",
     "loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)"),
    (f"{SP}/transformers/loss/loss_utils.py", 61, "ForCausalLMLoss", "logits = logits.float()"))
H100_LOGITS = NEW_FORMAT.format(tried="7.83 GiB", total="79.19 GiB", free="5.12 GiB", in_use="74.06 GiB",
                                allocated="71.83 GiB", unallocated="1.48 GiB")


def test_logits_fp32_upcast_with_batch_and_seq() -> None:
    """llama-3.1-8b at 4 × 4096: the loss's fp32 upcast is 4 × 4096 × 128,256 × 4 bytes = 7.83 GiB, first."""
    e = explain(LOGITS_TRACE + H100_LOGITS, model="llama-3.1-8b", batch=4, seq=4096)
    top = e.aggregates[0]
    assert top.aggregate.kind is AggregateKind.LOGITS_FP32 and top.exact
    assert top.aggregate.nbytes == 4 * 4096 * 128_256 * 4
    assert top.aggregate.arithmetic == "4 × 4096 tokens × 128,256 vocab × 4 bytes = 7.83 GiB"
    assert any("loss_utils.py:61 in ForCausalLMLoss" in ev for ev in top.evidence)


def test_logits_batch_times_seq_solved() -> None:
    """Without batch and seq: the request is 16,384 tokens of fp32 logits (4 × 4096, …) or 32,768 of half ones."""
    e = explain(LOGITS_TRACE + H100_LOGITS, model="llama-3.1-8b")
    solved = {c.aggregate.kind: c.aggregate.solved for c in e.aggregates}
    assert solved[AggregateKind.LOGITS_FP32] == "b × s = 16,384 tokens (2 × 8192, 4 × 4096 or 8 × 2048)"
    assert solved[AggregateKind.LOGITS] == "b × s = 32,768 tokens (4 × 8192, 8 × 4096 or 16 × 2048)"
    assert e.aggregates[0].aggregate.kind is AggregateKind.LOGITS_FP32  # the frame shows logits.float()


def test_logits_not_in_the_optimizer_step() -> None:
    """Solved logits in an optimizer step are dropped: nothing but arithmetic would support them."""
    e = explain(ZERO_STEP + H100_LOGITS, model="llama-3.1-8b")
    assert not [c for c in e.aggregates if c.aggregate.kind in (AggregateKind.LOGITS, AggregateKind.LOGITS_FP32)]


# -------------------------------------------------------------------------------------- buckets

DDP_TRACE = frames(
    ("/workspace/train_ddp.py", 64, "<module>", "out = ddp_model(input_ids, labels=labels)"),
    (f"{SP}/torch/nn/parallel/distributed.py", 1633, "forward",
     "inputs, kwargs = self._pre_forward(*inputs, **kwargs)"),
    (f"{SP}/torch/nn/parallel/distributed.py", 1519, "_pre_forward",
     "if torch.is_grad_enabled() and self.reducer._rebuild_buckets():"))
L4_42 = NEW_FORMAT.format(tried="42.00 MiB", total="23.54 GiB", free="30.81 MiB", in_use="23.50 GiB",
                          allocated="22.61 GiB", unallocated="355.12 MiB")


def test_ddp_gradient_bucket() -> None:
    """qwen2.5-0.5b under DDP, 42.00 MiB in the forward that rebuilds the buckets: a 25 MiB-capped fp32 bucket of
    o_proj, q/k/v (weights, biases), both norms, then down_proj and the layer below's up_proj -- 40.26 MiB."""
    h, i, kv = 896, 4864, 128
    bucket = 4 * (2 * h * h + h + 2 * (kv * h + kv) + 2 * h + 2 * i * h)
    assert bucket == 42_216_960
    e = explain(DDP_TRACE + L4_42, model="qwen2.5-0.5b", gpus=4, strategy="ddp")
    top = e.aggregates[0]
    assert (top.aggregate.kind, top.aggregate.nbytes, top.exact) == (AggregateKind.DDP_BUCKET, bucket, True)
    assert top.aggregate.arithmetic == "10.6M gradients × 4 bytes = 40.26 MiB (closed past the 25 MiB cap)"
    assert "a DDP gradient bucket in fp32 (23 such buckets" in e.verdict
    assert not e.candidates  # no single parameter of the model is that size


def test_deepspeed_reduce_bucket() -> None:
    """953.67 MiB in backward under ZeRO-2: DeepSpeed's default reduce bucket, 5e8 half elements."""
    backward = frames(("/workspace/train.py", 110, "<module>", "model_engine.backward(loss)"),
                      (f"{SP}/torch/_tensor.py", 626, "backward", "torch.autograd.backward("))
    text = backward + NEW_FORMAT.format(tried="954.00 MiB", total="79.35 GiB", free="512.00 MiB", in_use="78.83 GiB",
                                        allocated="76.20 GiB", unallocated="2.01 GiB")
    e = explain(text, model="llama-2-7b", gpus=8, strategy="zero2")
    top = e.aggregates[0]
    assert top.aggregate.kind is AggregateKind.REDUCE_BUCKET and top.aggregate.nbytes == 500_000_000 * 2
    assert top.aggregate.arithmetic == "500,000,000 elements × 2 bytes = 953.67 MiB"


# ------------------------------------------------------------------------------ what the caller told


def test_strategy_told_ranks_its_own_allocations_first() -> None:
    """A strategy that cannot allocate an aggregate puts it below (FSDP's shard under ZeRO-2), with the reason."""
    e = explain(ZERO_STEP + A100_3, model="llama-2-7b", gpus=8, strategy="zero2")
    shard = next(c for c in e.aggregates if c.aggregate.kind is AggregateKind.FLAT_SHARD)
    assert shard.rank > 3
    assert any(ev.startswith("not allocated under the strategy given (zero2; only under fsdp, fsdp2)")
               for ev in shard.evidence)


def test_json_lists_aggregates_and_context() -> None:
    """--json carries each aggregate's arithmetic, span and evidence, and the context told."""
    data = explain(ZERO_STEP + A100_3, model="llama-2-7b", gpus=8, strategy="zero2").to_dict()
    first = data["aggregates"][0]
    assert first["kind"] == "gradient-partition" and first["bytes"] == 3_369_207_808 and first["exact"] is True
    assert first["span"][0] <= first["bytes"] <= first["span"][1]
    assert data["context"] == {"world_size": 8, "strategy": "zero2", "method": None, "optimizer": None,
                               "batch": None, "seq": None}
    json.dumps(data)
