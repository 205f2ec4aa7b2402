"""DeepSpeed's own memory estimators beside oomlab's DeepSpeed budget, every difference listed and sized: the
committed ``docs/deepspeed-estimators.md``.

DeepSpeed 0.19.8 ships ``estimate_zero2_model_states_mem_needs`` (``runtime/zero/stage_1_and_2.py:4017-4034``: no
offload ``gpu = 2P + 18P/N`` -- "2 = params_16bit, 18 = 2_grads_16bit + 4_grads_32bit + 4_params_32bit +
8_optimizer_states_32bit" --, ``cpu = 4P`` per GPU × 1.5; offload ``gpu = 2P``, ``cpu = P·max(4N, 16)·1.5`` per
node) and ``estimate_zero3_model_states_mem_needs`` (``runtime/zero/stage3.py:4016-4052``: ``4·L + 18P/N``,
offloaded optimizer ``4·L + 2P/N``, offloaded parameters too ``4·L``, with ``L`` the largest module's own parameters,
``model_to_params`` :4055-4065; host ``16P`` / ``18P`` per node × 1.5, or ``4·L`` per GPU × 1.5 under ``zero_init``).
Their ``*_all_cold`` wrappers print these numbers.  They count model states only, with a 1.5 host margin; oomlab
budgets the step.  ``python -m oomlab.evidence deepspeed-estimators`` rewrites the doc; a test checks it is current.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomlab.budget import deepspeed_layout as layout
from oomlab.budget.deepspeed import FP32, buffer_bytes, host_offload_bytes, zero_states
from oomlab.budget.deepspeed_config import settings_for
from oomlab.budget.estimator import estimate_setup
from oomlab.budget.result import MemCategory, Phase
from oomlab.core.files import write_text_atomic
from oomlab.core.paths import REPO_ROOT
from oomlab.core.setup import TrainingSetup, make_setup
from oomlab.core.units import format_size

ESTIMATORS_DOC = REPO_ROOT / "docs" / "deepspeed-estimators.md"
BUFFER_FACTOR = 1.5  # the estimators' additional_buffer_factor default

# (model, gpu, gpus, strategy, checkpointing): the llama-13b on 4 GPUs, then a wider machine
ROWS: tuple[tuple[str, str, int, str, bool], ...] = tuple(
    ("llama-13b", "t4", 4, strategy, checkpointing)
    for strategy in ("zero1", "zero2", "zero3", "zero2-offload", "zero3-offload") for checkpointing in (False, True)
) + (("llama-2-70b", "a100-80gb", 8, "zero3", True), ("llama-2-70b", "a100-80gb", 8, "zero3-offload", True))


def row_setup(row: tuple[str, str, int, str, bool]) -> TrainingSetup:
    model, gpu, gpus, strategy, checkpointing = row
    return make_setup(model=model, gpu=gpu, gpus=gpus, strategy=strategy, method="full", precision="fp16-mixed",
                      optimizer="adamw", batch=1, seq=2048, checkpointing=checkpointing)


@dataclass(frozen=True)
class EstimatorFigures:
    """DeepSpeed's estimator for a setup: bytes per GPU and per node of host memory (``None``: no estimator)."""

    gpu_bytes: int | None
    host_bytes: int | None
    function: str


def deepspeed_estimate(setup: TrainingSetup) -> EstimatorFigures:
    """What DeepSpeed's cold estimator says for the setup (ZeRO-1 has none; ZeRO-2's stands in, its own docs say
    stage 1 needs the same states)."""
    total, gpus, nodes = setup.model.num_parameters, setup.gpus, setup.nodes
    offload = setup.strategy.offloads_optimizer
    if setup.strategy.zero_stage == 3:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
            total, layout.largest_module(setup), num_gpus_per_node=gpus, num_nodes=nodes, cpu_offload=offload,
            cpu_offload_params=setup.strategy.offloads, zero_init=True, additional_buffer_factor=BUFFER_FACTOR)
        return EstimatorFigures(int(gpu), int(cpu), "estimate_zero3_model_states_mem_needs (zero_init=True)")
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    cpu, gpu = estimate_zero2_model_states_mem_needs(total, num_gpus_per_node=gpus, num_nodes=nodes,
                                                     cpu_offload=offload, additional_buffer_factor=BUFFER_FACTOR)
    name = "estimate_zero2_model_states_mem_needs" + (" (no ZeRO-1 estimator)" if setup.strategy.zero_stage == 1
                                                      else "")
    return EstimatorFigures(int(gpu), int(cpu), name)


def differences(setup: TrainingSetup) -> list[tuple[str, int]]:
    """Every term where oomlab's per-GPU peak and DeepSpeed's estimate differ, with its bytes (oomlab − DeepSpeed);
    the terms add up to the difference exactly."""
    result = estimate_setup(setup, 0)
    z, ds = zero_states(setup), settings_for(setup)
    p, n, offload = setup.model.num_parameters, setup.world_size, setup.strategy.offloads_optimizer
    out: list[tuple[str, int]] = []
    if setup.strategy.zero_stage == 3:
        halves = z.weights - z.persistent_gathered - buffer_bytes(setup)
        if not setup.strategy.offloads:
            counted = 2 * p // n if offload else 0
            out.append(("half parameter partitions (2/N, stage3.py:972): the estimator's 18/N lists no 16-bit "
                        "parameters" if not offload else "half parameter partitions (2/N): as the estimator, up to "
                        "per-parameter ceil(n/N)", halves - counted))
        if not offload:
            out.append(("fp32 gradients (4/N in the estimator) are never held: step() converts one sub-group at a "
                        "time (stage3.py:2683-2700, counted with the step's temporaries below)", -FP32 * p // n))
            out.append(("half gradient partitions, fp32 master, Adam (2 + 4 + 8 per N): as the estimator, up to "
                        "per-parameter ceil(n/N)", z.gradients + z.master + z.optimizer - 14 * p // n))
        out.append(("the estimator's 4 × largest layer (the largest module's parameters in fp32, stage3.py:4027) "
                    "is not a tensor DeepSpeed holds", -FP32 * layout.largest_module(setup)))
        out.append(("persistent small parameters kept gathered (stage3_param_persistence_threshold "
                    f"{ds.stage3_param_persistence_threshold:,}, parameter_offload.py:317-335) and the fp32 rotary "
                    "buffers", z.persistent_gathered + buffer_bytes(setup)))
        out.append(("permanent IPG bucket (reduce_bucket_size × 2 B, stage3.py:779-784)", z.bucket))
    else:
        out.append(("the half flat replica padded to 2N elements (stage_1_and_2.py:441-447), the fp32 rotary buffers",
                    z.weights - 2 * p))
        if offload:
            out.append(("temp_grad_buffer_for_gpu_offload: the largest parameter in half (:659-661)", z.offload_temps))
        else:
            out.append(("fp32 master and Adam (4 + 8 per N) as the estimator, up to ceil(P/2N)·2 partitions",
                        z.master + z.optimizer - 12 * p // n))
            out.append(("half gradient partition (2/N) as the estimator, plus the whole parameters straddling its "
                        "edges (get_partition_info, :2579-2611)", z.gradients - 2 * p // n))
            out.append(("the estimator's fp32 gradients (4/N) exist only inside step(), counted with the step's "
                        "temporaries below", -FP32 * p // n))
    counted = sum(v for _, v in out)
    phase = result.peak_phase
    peak = result.phases[phase]
    rest = result.allocated_peak_bytes - (deepspeed_estimate(setup).gpu_bytes or 0) - counted
    acts, logits = peak.get(MemCategory.ACTIVATIONS, 0), peak.get(MemCategory.LOGITS_LOSS, 0)
    workspace = peak.get(MemCategory.WORKSPACE, 0)
    out.append((f"activations at oomlab's peak ({phase.value}; the estimators count none)", acts))
    out.append((f"logits and loss at oomlab's peak ({phase.value})", logits))
    buckets = (f"IPG bucket {format_size(z.bucket)} (reduce_bucket_size {ds.reduce_bucket_size:,} × 2 B"
               f"{' × 2, overlap_comm' if ds.overlap_comm and setup.strategy.zero_stage != 3 else ''}), its flush "
               f"copy {format_size(z.flush)}, step temporaries {format_size(z.step_temps)} (the half flat gradient "
               "and its fp32 copy)")
    out.append((f"transient workspace at oomlab's peak ({phase.value}); DeepSpeed's buffers behind it, each where "
                f"live: {buckets}", workspace))
    extra = ""
    if z.full_gradients and phase is Phase.BACKWARD:
        extra = ": ZeRO-1's full half gradients before the epilogue reduces them (:2290-2295, 958-981)"
    out.append((f"model states held or not at that moment beyond the rows above{extra}",
                rest - acts - logits - workspace))
    return out


def host_rows(setup: TrainingSetup) -> list[tuple[str, int]]:
    """oomlab's host bytes per node by term, beside DeepSpeed's host estimate without its 1.5 margin."""
    result, figures = estimate_setup(setup, 0), deepspeed_estimate(setup)
    offload = setup.gpus * host_offload_bytes(setup)
    return [("DeepSpeed's host estimate / 1.5 (its additional_buffer_factor)", round((figures.host_bytes or 0)
                                                                                     / BUFFER_FACTOR)),
            ("oomlab: offloaded states, all ranks of the node (host_offload_bytes)", offload),
            ("oomlab: loading (one half replica per process for ZeRO-1/2, none under zero.Init)",
             result.host_ram_bytes - offload)]


def render_markdown() -> str:
    lines = [
        "# DeepSpeed's memory estimators beside oomlab's DeepSpeed budget", "",
        "Generated by `python -m oomlab.evidence deepspeed-estimators` (`oomlab.evidence.deepspeed_estimators`). "
        "DeepSpeed 0.19.8's `estimate_zero2_model_states_mem_needs` / `estimate_zero3_model_states_mem_needs` "
        "(what the `*_all_cold` functions print; `additional_buffer_factor` 1.5, `zero_init=True`) against "
        "`oomlab.estimate` (analytic allocated peak per GPU of a steady-state step, as `deepspeed.initialize` runs "
        "it; DeepSpeed's knobs as the HF integration resolves `\"auto\"`). Full fine-tuning, fp16-mixed, DeepSpeed's "
        "AdamW (FusedAdam, DeepSpeedCPUAdam when offloaded), micro-batch 1 × 2048 tokens. Host: per node.", "",
        "| setup | DeepSpeed GPU | oomlab GPU peak (phase) | oomlab model states at the step | DeepSpeed host "
        "| oomlab host | estimator |", "|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in ROWS:
        setup = row_setup(row)
        result, figures, z = estimate_setup(setup, 0), deepspeed_estimate(setup), zero_states(setup)
        states = z.weights + z.master + z.optimizer + z.gradients
        lines.append(f"| {_label(row)} | {format_size(figures.gpu_bytes)} | "
                     f"{format_size(result.allocated_peak_bytes)} ({result.peak_phase.value}) | "
                     f"{format_size(states)} | {format_size(figures.host_bytes)} | "
                     f"{format_size(result.host_ram_bytes)} | {figures.function} |")
    lines += ["", "## Every difference, sized (oomlab − DeepSpeed, per GPU)", ""]
    for row in ROWS:
        setup = row_setup(row)
        diff = differences(setup)
        figures = deepspeed_estimate(setup)
        lines += [f"### {_label(row)}", "", f"DeepSpeed {format_size(figures.gpu_bytes)}, oomlab "
                  f"{format_size(estimate_setup(setup, 0).allocated_peak_bytes)}.", "",
                  "| term | bytes |", "|---|---:|"]
        lines += [f"| {text} | {_signed(value)} |" for text, value in diff]
        lines.append("")
    lines += ["## Host memory, sized (per node)", "",
              "| setup | " + " | ".join(t for t, _ in host_rows(row_setup(ROWS[0]))) + " |",
              "|---|" + "---:|" * len(host_rows(row_setup(ROWS[0])))]
    for row in ROWS:
        lines.append(f"| {_label(row)} | " + " | ".join(format_size(v) for _, v in host_rows(row_setup(row))) + " |")
    lines += ["", HOST_NOTES]
    return "\n".join(lines) + "\n"


HOST_NOTES = """What the host figures mean:

- No offload: the estimators' host figure is a loading heuristic (`4P` fp32 per GPU × 1.5, or `4·L` per GPU under
  `zero_init`), not runtime state. oomlab counts one half replica per process while `from_pretrained` loads it for
  ZeRO-1/2, and none for ZeRO-3 under `zero.Init` (each module partitioned onto the GPU as it is built; the checkpoint
  read memory-mapped).
- zero2-offload: per rank the fp32 master, the fp32 gradient partition and the fp32 Adam moments (16/N), a half
  staging copy of the partition (2/N) and the largest parameter in half (`stage_1_and_2.py:565-575`, `:653-657`,
  `:934-941`): 18/N per GPU, against the estimator's `P·max(4N, 16)·1.5` per node.
- zero3-offload: per rank the half gradient partitions, fp32 partitions, one fp32 gradient buffer per sub-group and
  the fp32 moments (2 + 4 + 4 + 8 = 18/N, `stage3.py:786-795`, `:1336-1342`), plus the half parameter partitions
  (2/N, `:975-1000`) with `offload_param`: 20/N per GPU, against `18P·1.5` per node.
- Pinned: on CUDA every offloaded buffer is page-locked host memory; the estimators' 1.5 margin has no counterpart in
  DeepSpeed's code."""


def _label(row: tuple[str, str, int, str, bool]) -> str:
    model, gpu, gpus, strategy, checkpointing = row
    return f"{model}, {gpus} × {gpu}, {strategy}" + (", checkpointing" if checkpointing else "")


def _signed(value: int) -> str:
    return ("+" if value >= 0 else "−") + format_size(abs(value))




def regenerate() -> int:  # pragma: no cover - writes the committed document
    """Rewrite ``deepspeed-estimators.md``."""
    markdown = render_markdown()
    write_text_atomic(ESTIMATORS_DOC, markdown)
    print(markdown)
    return 0
