"""How fast a remedy would train: FLOPs per token, step time by cause, tokens per second, assumptions stated.

Throughput (every assumption is in :class:`Assumptions` and printed by :func:`describe_assumptions`):

* FLOPs per token (:func:`flops_per_token`): forward ``2 N`` for the ``N`` parameters that multiply activations
  (Kaplan et al. 2020, sec. 2.1, ``C_forward ≈ 2N + 2 n_layer n_ctx d_attn``), backward twice the forward for
  full fine-tuning (gradients with respect to activations and to weights), and only the activation gradients
  (``2 N``) plus the adapters' own for LoRA's frozen base; activation checkpointing recomputes the decoder
  layers' forward once more (Narayanan et al. 2021, sec. 5.1: ``72 → 96 B s l h^2`` per iteration, i.e. 3 → 4
  forward passes).  Attention scores and values are counted as ``4 s d_attn`` per token per layer forward
  (QK^T and AV, the full square as ``FlopCounterMode`` counts SDPA; a causal kernel skips about half).
* Step time: FLOPs / (the GPU's dense fp16 (or fp32) peak × MFU, assumed by GPU generation: :func:`mfu_for`) +
  host-link time for offloaded bytes + the collectives' bytes over the GPU-to-GPU link of the GPU's spec (NVLink
  on SXM parts, PCIe otherwise) + the host optimizer step.  NB: no overlap of communication and
  compute is assumed, so step times are upper bounds.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomlab.budget import activations as act
from oomlab.budget import deepspeed_layout
from oomlab.budget.deepspeed import model_dtype_bytes, zero_states
from oomlab.budget.result import MemCategory
from oomlab.budget.sharding import Share, share
from oomlab.budget.states import (
    grad_bytes_per_param,
    lora_parameters,
    quantized_parameters,
    trainable_parameters,
    weight_bytes_total,
)
from oomlab.core.choices import Method, Precision, Route, Strategy
from oomlab.core.gpus import GPUSpec
from oomlab.core.memo import BoundedMemo
from oomlab.core.setup import TrainingSetup
from oomlab.core.units import ceil_div
from oomlab.remedies.twins import twin_key


@dataclass(frozen=True)
class Assumptions:
    """What the throughput estimate assumes (printed with every plan)."""

    mfu: float | None = None  # model FLOPs utilisation of the tensor-core peak; None: by GPU generation (mfu_for)
    host_optimizer_params_per_s: float = 1e9  # CPU AdamW updates per second per node (NB: order of magnitude)
    throughput_batch_cap: int = 8  # throughput is estimated at min(largest micro-batch that fits, this)
    overlap: bool = False  # communication overlapped with compute (False: step times are upper bounds)
    speed_uncertainty: float = 0.10  # NB: speeds closer than this are not told apart (the MFU is assumed)

DEFAULT_ASSUMPTIONS = Assumptions()

# (first compute capability of the generation, MFU, basis); NB: assumptions for a fine-tuning step through the HF
# stack, below the published large-scale pre-training figures they cite
MFU_BY_GENERATION = (
    ((7, 0), 0.35, "oomlab's assumption for Volta/Turing GPUs (V100, T4): not measured"),
    ((8, 0), 0.45, "Ampere/Ada (A100, A10G, L4, RTX 30/40): below Megatron-LM's 52% of the A100's peak at scale "
                   "(Narayanan et al. 2021, sec. 5.1); not measured here"),
    ((9, 0), 0.40, "Hopper (H100, H200): within Llama 3's 38-43% BF16 MFU on H100 (Dubey et al. 2024, Table 4); "
                   "not measured here"),
)


def mfu_for(gpu: GPUSpec, assumptions: Assumptions = DEFAULT_ASSUMPTIONS) -> tuple[float, str]:
    """The MFU assumed on ``gpu`` and its basis: the assumptions' own, else its generation's."""
    if assumptions.mfu is not None:
        return assumptions.mfu, "given"
    found = MFU_BY_GENERATION[0]
    for row in MFU_BY_GENERATION:
        if gpu.compute_capability >= row[0]:
            found = row
    return found[1], found[2]


def interconnect_text(gpu: GPUSpec) -> str:
    """How the GPUs of a node talk to each other, from the GPU's spec."""
    return (f"{gpu.interconnect}, {gpu.gpu_to_gpu_bytes_per_s / 1e9:.3f} GB/s per direction theoretical"
            + ("" if gpu.nvlink else " (no NVLink)"))


def describe_assumptions(gpu: GPUSpec, assumptions: Assumptions) -> list[str]:
    """Every assumption behind the figures, as sentences."""
    return [
        f"GPU: {gpu.display_name}, dense fp16 tensor-core peak {gpu.peak_fp16_flops / 1e12:g} TFLOP/s, "
        f"fp32 peak {gpu.peak_fp32_flops / 1e12:g} TFLOP/s (source: {gpu.sources.get('peak_fp16_flops', 'spec')})",
        "MFU {:.0%} of that peak ({})".format(*mfu_for(gpu, assumptions)),
        "FLOPs per token: forward 2N + 4·s·d_attn per layer, backward 4N (full) or 2N + 4N_adapters (LoRA/QLoRA; "
        "frozen weights need no weight gradients), + the layers' forward again with checkpointing "
        "(Kaplan et al. 2020 sec. 2.1; Narayanan et al. 2021 sec. 5.1); N = parameters that multiply activations "
        "(the decoder layers' projections and the LM head; the embedding is a lookup)",
        f"GPU-to-GPU collectives over {interconnect_text(gpu)}; host offload over {gpu.host_link} at its "
        f"theoretical {gpu.host_link_bytes_per_s / 1e9:.3f} GB/s per direction (NB: NCCL and copies reach less)",
        "ring collectives: all-reduce moves 2(n-1)/n of the buffer per GPU, all-gather and reduce-scatter (n-1)/n; "
        "FSDP gathers the weights in forward and again in backward and reduce-scatters the gradients; DeepSpeed "
        "ZeRO-1/2 all-reduce the half gradients and all-gather the updated half partitions, ZeRO-3 gathers each "
        "module's half weights in forward and in backward (less what its reuse window keeps) and reduce-scatters",
        f"offloaded optimizer step on the host at {assumptions.host_optimizer_params_per_s:.0e} parameters/s per "
        "node (NB: order of magnitude of a vectorised CPU Adam)",
        "communication is " + ("overlapped with compute" if assumptions.overlap
                               else "not overlapped with compute: step times are upper bounds"),
        f"tokens/s at the largest micro-batch that fits at the target length, capped at "
        f"{assumptions.throughput_batch_cap}",
        "device_map='auto' runs one GPU at a time (a naive pipeline): n GPUs give one GPU's throughput",
        f"QLoRA: the same MFU, plus each 4-bit weight dequantized per forward, backward and recomputed forward "
        f"({DEQUANTIZE_BYTES_PER_PARAM_PASS:g} B per parameter per pass at the GPU's memory bandwidth; NB: a lower "
        "bound, bitsandbytes' kernels run slower than their memory traffic on small matrices)",
    ]


# -------------------------------------------------------------------------------------------------- FLOPs


@dataclass(frozen=True)
class Flops:
    """FLOPs per token of one training step, by pass."""

    forward: int
    backward: int
    recompute: int

    @property
    def total(self) -> int:
        return self.forward + self.backward + self.recompute


def matmul_parameters(setup: TrainingSetup) -> int:
    """N: parameters that multiply activations -- every layer's projections and the LM head (Kaplan's N, + head)."""
    spec = setup.model
    return spec.num_hidden_layers * spec.layer_matmul_params + spec.embedding_params


def attention_flops_per_token(setup: TrainingSetup) -> int:
    """Forward QK^T and AV: ``2 · 2 · s · d_attn`` per token per layer (the full square, as FlopCounterMode)."""
    spec = setup.model
    return spec.num_hidden_layers * 4 * setup.seq * spec.q_dim


def flops_per_token(setup: TrainingSetup) -> Flops:
    """FLOPs per token: forward 2N (+attention), backward 4N full / 2N + 4N_lora LoRA, + recompute.

    NB: LoRA's first layer computes no input gradient for its frozen q/k/v projections (the embedding output
    needs none), and the LM head computes no weight gradient; both are counted exactly.
    """
    spec = setup.model
    n = matmul_parameters(setup)
    attn = attention_flops_per_token(setup)
    lora = lora_parameters(setup) if setup.method is not Method.FULL else 0
    forward = 2 * n + 2 * lora + attn
    if setup.method is Method.FULL:
        backward = 4 * n + 2 * attn
    else:
        first_qkv = spec.hidden_size * (spec.q_dim + 2 * spec.kv_dim)  # layer 0's q, k, v: no dX
        backward = 2 * (n - first_qkv) + 4 * lora + 2 * attn
    recompute = 0
    if setup.checkpointing:
        recompute = 2 * (n - spec.embedding_params) + 2 * lora + attn
    return Flops(forward, backward, recompute)


# ------------------------------------------------------------------------------------------- throughput


@dataclass(frozen=True)
class StepTime:
    """Seconds of one optimizer step on one GPU, by cause."""

    compute_s: float
    collectives_s: float  # all-reduce / all-gather / reduce-scatter between GPUs
    host_link_s: float  # offloaded weights and gradients over the host link
    host_optimizer_s: float  # the optimizer step on the host (offload)
    tokens: int  # tokens of the whole step (all GPUs that work in parallel)
    dequantize_s: float = 0.0  # QLoRA: each 4-bit weight dequantized per matmul pass (memory traffic)

    @property
    def seconds(self) -> float:
        return self.compute_s + self.collectives_s + self.host_link_s + self.host_optimizer_s + self.dequantize_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def _deepspeed_collective_bytes(setup: TrainingSetup, frac: float) -> int:
    """DeepSpeed: ZeRO-1/2 all-reduce the half gradients bucket by bucket (``average_tensor`` with the default
    ``use_multi_rank_bucket_allreduce``, stage_1_and_2.py:1590-1726) and all-gather the updated half partitions
    (``all_gather_dp_groups``); ZeRO-3 all-gathers every module's half parameters in forward and again in backward,
    except those its reuse window keeps gathered (partitioned_param_coordinator.py:634-665), and reduce-scatters the
    gradients (stage3.py:1673-1678)."""
    lp = model_dtype_bytes(setup)
    trained = lp * trainable_parameters(setup)
    if setup.strategy.zero_stage in (1, 2):
        return round(2 * frac * trained + frac * trained)
    z = zero_states(setup)
    gathered = lp * sum(deepspeed_layout.all_numels(setup))
    return round(frac * (2 * gathered - z.gathered_forward + trained))


def collective_bytes(setup: TrainingSetup) -> int:
    """Bytes each GPU sends per step in the strategy's collectives (ring algorithms)."""
    n = setup.world_size
    if n == 1 or setup.strategy is Strategy.SINGLE:
        return 0
    frac = (n - 1) / n
    if setup.strategy.deepspeed:
        return _deepspeed_collective_bytes(setup, frac)
    grads = grad_bytes_per_param(setup) * trainable_parameters(setup)
    if setup.strategy is Strategy.DDP:
        return round(2 * frac * grads)  # all-reduce
    return round(frac * (2 * weight_bytes_total(setup) + grads))  # FSDP: gather fwd + bwd, reduce-scatter


def host_link_bytes(setup: TrainingSetup) -> int:
    """Bytes each GPU moves over the host link per step.

    FSDP offload copies its shards in (forward and backward) and its gradients out.  DeepSpeed ``zero2-offload``
    copies its gradient partition out in fp32 (converted on the GPU, stage_1_and_2.py:1900) and the updated half
    partition back; ``zero3-offload`` its half gradient partition out, and with ``offload_param`` each half parameter
    partition in for every gather (forward and backward).
    """
    n = setup.world_size
    weights_host = share(setup, MemCategory.WEIGHTS) is Share.HOST
    if setup.strategy.deepspeed:
        if share(setup, MemCategory.OPTIMIZER_STATE) is not Share.HOST:
            return 0
        lp, trained = model_dtype_bytes(setup), trainable_parameters(setup)
        if setup.strategy.zero_stage == 2:
            return ceil_div((4 + lp) * trained, n)
        params = ceil_div(lp * sum(deepspeed_layout.all_numels(setup)), n) if weights_host else 0
        updated = 0 if weights_host else ceil_div(lp * trained, n)
        return ceil_div(lp * trained, n) + 2 * params + updated
    if not weights_host:
        return 0
    shard = ceil_div(weight_bytes_total(setup), n)
    grads = ceil_div(grad_bytes_per_param(setup) * trainable_parameters(setup), n)
    return 2 * shard + grads  # the shard to the GPU for forward and again for backward, the grads out


# bitsandbytes' Linear4bit dequantizes its NF4 weight to the compute dtype in the forward (MatMul4Bit.forward /
# dequantize_4bit) and again in the backward for the input gradient (MatMul4Bit.backward), and once more when
# checkpointing recomputes the forward: per pass it reads the 4-bit weight (0.5 B/param, the absmax besides) and writes
# then reads the half copy (2 + 2 B/param) -- memory traffic at the GPU's bandwidth, a lower bound: the kernels'
# own inefficiency on small matrices is not modelled
DEQUANTIZE_BYTES_PER_PARAM_PASS = 4.5


def dequantize_bytes(setup: TrainingSetup) -> float:
    """Bytes per micro-batch step the 4-bit weights' dequantization moves through GPU memory (0 unless QLoRA)."""
    if setup.method is not Method.QLORA:
        return 0.0
    passes = 3 if setup.checkpointing else 2
    return passes * quantized_parameters(setup) * DEQUANTIZE_BYTES_PER_PARAM_PASS


def dequantize_seconds(setup: TrainingSetup) -> float:
    """Seconds per micro-batch step the 4-bit weights' dequantization costs (0 unless QLoRA)."""
    return _traffic(setup).dequantize_bytes / setup.gpu.memory_bandwidth_bytes_per_s


@dataclass(frozen=True)
class Traffic:
    """What a step computes and moves, per GPU, whatever the GPU: the terms :func:`step_time` divides by the GPU's
    rates."""

    flops_per_token: int  # :func:`flops_per_token`, all passes
    collective_bytes: int  # :func:`collective_bytes`
    host_link_bytes: int  # :func:`host_link_bytes`
    host_optimizer_params: int | None  # parameters the host steps (per job); None when the optimizer is on the GPU
    dequantize_bytes: float  # :func:`dequantize_bytes`


def traffic(setup: TrainingSetup) -> Traffic:
    """The GPU-independent terms of ``setup``'s step time (none of these functions reads the GPU)."""
    on_host = share(setup, MemCategory.OPTIMIZER_STATE) is Share.HOST
    return Traffic(flops_per_token(setup).total, collective_bytes(setup), host_link_bytes(setup),
                   trainable_parameters(setup) if on_host else None, dequantize_bytes(setup))


# step_time is asked about the same setup on every GPU type the hardware search tries (twins: :mod:`.twins`)
_TRAFFIC: BoundedMemo[tuple, Traffic] = BoundedMemo()


def _traffic(setup: TrainingSetup) -> Traffic:
    key = twin_key(setup)
    found = _TRAFFIC.get(key)
    if found is None:
        found = _TRAFFIC[key] = traffic(setup)
    return found


def step_time(setup: TrainingSetup, assumptions: Assumptions, route: Route = Route.PROCESS_PER_GPU,
              batch: int | None = None) -> StepTime:
    """The step time of ``setup`` (per GPU; one GPU at a time on the device-map route) at its micro-batch, or at
    ``batch`` (the same figure as ``setup`` with that micro-batch: nothing else here depends on it)."""
    gpu = setup.gpu
    peak = gpu.peak_fp32_flops if setup.precision is Precision.FP32 else (
        gpu.peak_bf16_flops if setup.precision.uses_bf16 and gpu.peak_bf16_flops else gpu.peak_fp16_flops)
    tokens = (setup.batch if batch is None else batch) * setup.seq
    terms = _traffic(setup)
    compute = tokens * terms.flops_per_token / (peak * mfu_for(gpu, assumptions)[0])
    dequantize = terms.dequantize_bytes / gpu.memory_bandwidth_bytes_per_s
    link, peer = gpu.host_link_bytes_per_s, gpu.gpu_to_gpu_bytes_per_s
    if route is Route.DEVICE_MAP:
        # activations (and their gradients) cross each GPU boundary once each way
        crossing = 2 * (setup.gpus - 1) * tokens * setup.model.hidden_size * act.stream_bytes(setup)
        return StepTime(compute, crossing / peer, 0.0, 0.0, tokens, dequantize)
    # NB: NVLink within a node; between nodes the collectives cross the network, not modelled (the same link)
    collectives = terms.collective_bytes / peer
    host = terms.host_link_bytes / link
    host_opt = 0.0
    if terms.host_optimizer_params is not None:
        host_opt = terms.host_optimizer_params / setup.nodes / assumptions.host_optimizer_params_per_s
    parallel = 1 if setup.strategy is Strategy.SINGLE else setup.world_size
    if assumptions.overlap:
        compute, collectives, host = max(compute, collectives, host), 0.0, 0.0
    return StepTime(compute, collectives, host, host_opt, parallel * tokens, dequantize)


_CAUSES = (("compute_s", "more compute (recomputed forwards, smaller matmuls)"),
           ("collectives_s", "more communication between GPUs"),
           ("host_link_s", "states over the host link (PCIe) every step"),
           ("host_optimizer_s", "the optimizer step on the CPU"),
           ("dequantize_s", "4-bit weights dequantized in every pass"))


def speed_change(before: TrainingSetup, after: TrainingSetup,
                 assumptions: Assumptions = DEFAULT_ASSUMPTIONS) -> tuple[float, tuple[str, ...]]:
    """``after``'s modelled tokens/s over ``before``'s (one change of the ladder), and the mechanisms that grew per
    token (each term of :class:`StepTime` per token of the step)."""
    old, new = step_time(before, assumptions), step_time(after, assumptions)
    grew = tuple(words for name, words in _CAUSES
                 if getattr(new, name) / new.tokens > getattr(old, name) / old.tokens * 1.01)
    return new.tokens_per_s / old.tokens_per_s, grew


def speed_words(before: TrainingSetup, after: TrainingSetup) -> str:
    """``speed_change`` in words: "modelled speed 0.74x (states over the host link (PCIe) every step)"."""
    ratio, grew = speed_change(before, after)
    return f"modelled speed {ratio:.2f}x" + (f" ({'; '.join(grew)})" if grew and ratio < 1 else "")
