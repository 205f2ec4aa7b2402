"""The plan: the configured row, dropped bf16, searches, knob table, device_map placement, throughput, CLI."""

import json
import subprocess
import sys
from contextlib import nullcontext
from dataclasses import replace
from unittest import mock

import pytest

from oomlab.budget.estimator import estimate_setup
from oomlab.budget.states import lora_parameters, weight_bytes_total
from oomlab.cli import main
from oomlab.core.choices import Method, Optimizer, Precision, Route, Strategy
from oomlab.core.setup import make_setup
from oomlab.remedies import placement
from oomlab.remedies.display import heading, remedy_rows, render_plan, summarize
from oomlab.remedies.fit_map import fit_map
from oomlab.remedies.knobs import KNOB_VALUES
from oomlab.remedies.plan import Plan, make_plan
from oomlab.remedies.remedy import Remedy, remedy_name
from oomlab.remedies.throughput import (
    Assumptions,
    attention_flops_per_token,
    collective_bytes,
    flops_per_token,
    matmul_parameters,
    step_time,
)

BF16_MESSAGE = ("dropped: precision 'bf16-mixed' needs bfloat16, which the Tesla T4 (compute capability 7.5) lacks; "
                "use fp16-mixed or fp32 on this GPU")


@pytest.fixture(scope="module")
def plan() -> Plan:
    return make_plan(model="llama-13b", gpu="t4", gpus=4, host_ram="192GiB", seq=2048)


def test_configured_row_fails_for_notebook_01s_reason(plan) -> None:
    """The user's configuration does not fit: the fp16 replica alone exceeds a T4, as notebook 01 reproduced."""
    configured = plan.configured
    assert (configured.strategy, configured.method, configured.precision, configured.optimizer) == (
        Strategy.DDP, Method.FULL, Precision.FP16_MIXED, Optimizer.ADAMW)
    assert not configured.fits and configured.max_batch is None and configured.tokens_per_s is None
    assert configured.reason.startswith(
        "fails before training: model.to('cuda') of the fp16 replica reserves 24.37 GiB")
    assert configured.fails_at_load and Remedy.from_dict(configured.to_dict()).fails_at_load


def test_configured_row_is_named_as_the_others_and_shown_as_configured(plan) -> None:
    """The configured row's name is its configuration's (no prefix to strip); the ranked table's # column says
    "as configured" once (the name column used to repeat it: "as configured | as configured: DeepSpeed ZeRO-3 ·
    ...")."""
    configured = plan.configured
    assert configured.name == remedy_name(configured.route, configured.strategy, configured.method,
                                          configured.precision, configured.optimizer, configured.checkpointing,
                                          plan.lora_rank)
    first = remedy_rows(configured, plan.remedies, 1)[0]
    assert first[:2] == ("as configured", configured.name)


def test_heading_reads_the_typed_load_failure(plan) -> None:
    """The heading's "notebook 01 reproduced why" follows ``fails_at_load``, not the reason's wording."""
    assert heading(plan).endswith("does not fit (notebook 01 reproduced why).")
    worded = replace(plan, configured=replace(plan.configured, fails_at_load=False))  # same reason, no load failure
    assert "fails before training" in worded.configured.reason and heading(worded).endswith("does not fit.")


def test_bf16_dropped_with_make_setups_message(plan) -> None:
    """bf16 variants are dropped on a T4 with make_setup's own reason."""
    bf16 = [r for r in plan.dropped if r.precision is Precision.BF16_MIXED]
    assert bf16 and all(r.reason == BF16_MESSAGE for r in bf16)
    assert all(r.precision not in (Precision.BF16, Precision.BF16_MIXED) for r in plan.remedies)


def test_ranked_fitting_first_by_throughput(plan) -> None:
    """Fitting remedies come first; among the sound ones, tokens/s does not increase down the list."""
    fits = [r.fits for r in plan.remedies]
    assert fits == sorted(fits, reverse=True)
    sound = [float(f"{r.tokens_per_s:.3g}") for r in plan.remedies if r.recommendable]
    assert sound == sorted(sound, reverse=True)


def test_recommended_fits_and_launches(plan) -> None:
    """The recommendation fits, harms nothing, and has launch files."""
    rec = plan.recommended
    assert rec is not None and rec.fits and rec.recommendable and "train.py" in rec.config_files
    assert rec.headroom_bytes > 0 and rec.host_ram_bytes <= plan.host_ram_bytes


def test_full_fine_tuning_fits_only_offloaded_with_8bit_states(plan) -> None:
    """Sound full fine-tuning fits 4 x T4 with 192 GiB of host RAM only as FSDP CPU offload with 8-bit AdamW: rank 0
    loads the weights once (fsdp_cpu_ram_efficient_loading), fp32 weights and gradients and 8-bit states live on the
    host; fp32 AdamW states do not fit."""
    full = [r for r in plan.fitting if r.method is Method.FULL and r.recommendable]
    assert full and all(r.strategy.offloads and r.optimizer is Optimizer.ADAMW_8BIT for r in full)


@pytest.mark.parametrize("index", [0, 1, 2, 5])
def test_max_batch_is_the_boundary(plan, index: int) -> None:
    """The micro-batch search stops exactly where the analytic model stops fitting."""
    r = [x for x in plan.remedies if x.fits and x.route is Route.PROCESS_PER_GPU][index]
    at = estimate_setup(replace(r.setup, batch=r.max_batch))
    above = estimate_setup(replace(r.setup, batch=r.max_batch + 1))
    assert at.fits and not above.fits


def test_max_seq_capped_at_context(plan) -> None:
    """Sequence searches stop at max_position_embeddings (2048 for llama-13b)."""
    assert max(r.max_seq or 0 for r in plan.remedies) == 2048
    assert "max_position_embeddings = 2048" in plan.seq_note


def test_knob_table_singles_then_minimal_pairs(plan) -> None:
    """Every single knob appears; the pairs shown fit and neither of their changes fits alone."""
    singles = [k for k in plan.knobs if len(k.changes) == 1]
    assert {k.changes[0][0] for k in singles} == set(KNOB_VALUES)
    fitting_single = {k.changes[0] for k in singles if k.fits}
    pairs = [k for k in plan.knobs if len(k.changes) == 2]
    assert pairs and all(k.fits for k in pairs)
    assert all(not (set(k.changes) & fitting_single) for k in pairs)
    assert any(k.changes == (("method", "qlora"), ("checkpointing", "true")) for k in pairs)
    bf16 = next(k for k in singles if k.changes == (("precision", "bf16-mixed"),))
    assert bf16.reason == BF16_MESSAGE and bf16.per_gpu_peak_bytes is None


def test_device_map_places_every_layer_once(plan) -> None:
    """accelerate's placement covers decoder layers 0..39 exactly once, in order, over the 4 GPUs."""
    dm = plan.device_map
    layers = [i for g in dm.gpus for i in g.layers]
    assert layers == list(range(40)) and len(dm.gpus) == 4 and not dm.spilled
    assert dm.per_gpu_peak_bytes <= 15835398144


@pytest.mark.heavy  # accelerate on a meta model, twice
def test_memoised_sizes_change_nothing() -> None:
    """Memoising accelerate's module sizes (in the evidence path, accelerate itself on the meta model) gives the
    same map as accelerate alone."""
    spec = make_setup(model="llama-13b", gpu="t4", gpus=4).model
    budget = {i: 12 * 2**30 for i in range(4)}
    fast = placement.accelerate_device_map(spec, budget)
    with mock.patch.object(placement, "_memoised_sizes", nullcontext):
        slow = placement.accelerate_device_map(spec, budget)
    assert fast == slow and len(set(fast.values())) > 1


def test_flops_full_is_6n_plus_attention() -> None:
    """Full fine-tuning: 2N forward + 4N backward (+3 x attention); checkpointing adds the layers' forward."""
    setup = make_setup(gpus=1, model="llama-13b", gpu="t4", seq=2048)
    n, attn = matmul_parameters(setup), attention_flops_per_token(setup)
    assert flops_per_token(setup).total == 6 * n + 3 * attn
    layers_n = n - 32000 * 5120
    assert flops_per_token(setup.with_(checkpointing=True)).recompute == 2 * layers_n + attn
    assert n == 40 * (4 * 5120 * 5120 + 3 * 5120 * 13824) + 32000 * 5120


def test_collectives_ddp_all_reduce() -> None:
    """DDP moves 2(n-1)/n of the gradients per GPU; FSDP gathers weights twice and reduce-scatters gradients."""
    ddp = make_setup(model="llama-13b", gpu="t4", gpus=4, strategy="ddp", method="lora")
    grads = 4 * lora_parameters(ddp)
    assert collective_bytes(ddp) == round(1.5 * grads)
    fsdp = ddp.with_(strategy="fsdp")
    assert collective_bytes(fsdp) == round(0.75 * (2 * weight_bytes_total(fsdp) + grads))


def test_device_map_runs_at_one_gpus_speed() -> None:
    """device_map's tokens per step are one GPU's, not four."""
    setup = make_setup(model="llama-13b", gpu="t4", gpus=4, method="qlora", checkpointing=True)
    dm = step_time(setup, Assumptions(), Route.DEVICE_MAP)
    ddp = step_time(setup.with_(strategy="ddp"), Assumptions())
    assert dm.tokens == setup.seq and ddp.tokens == 4 * setup.seq
    assert dm.compute_s == pytest.approx(ddp.compute_s)


def test_seq_beyond_context_refused() -> None:
    """A target length past the model's context is refused with the limit named."""
    with pytest.raises(ValueError, match="max_position_embeddings 2048"):
        make_plan(seq=4096)


def test_fit_map_agrees_with_search(plan) -> None:
    """The fit map's column at the target length fits exactly up to max_batch."""
    r = plan.recommended
    fm = fit_map(r, plan.host_ram_bytes, batches=range(1, r.max_batch + 2), seqs=(2048,))
    assert [row[0] for row in fm.fits] == [True] * r.max_batch + [False]


def test_summary_has_no_placeholders(plan) -> None:
    """The plain-words answer names the recommendation and the failing configuration."""
    text = summarize(plan)
    assert plan.recommended.name in text and "does not fit" in text and "None" not in text


def test_cli_plan_json_fields() -> None:
    """`python -m oomlab plan --json` lists remedies with every field of the issue."""
    proc = subprocess.run([sys.executable, "-m", "oomlab", "plan", "--model", "llama-13b", "--gpu", "t4", "--gpus",
                           "4", "--host-ram", "192GiB", "--seq", "2048", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    fields = ("name", "route", "strategy", "method", "precision", "optimizer", "checkpointing", "offload", "fits",
              "reason", "per_gpu_peak_bytes", "headroom_bytes", "host_ram_bytes", "max_batch", "max_seq",
              "tokens_per_s", "config_files")
    for r in data["remedies"] + [data["configured"]]:
        assert all(f in r for f in fields)
    assert data["host_ram_bytes"] == 192 * 2**30


@pytest.mark.parametrize(("args", "message"), [
    (["plan", "--host-ram", "lots"], "invalid size 'lots'"),
    (["plan", "--gpu", "h9000"], "unknown GPU 'h9000'; known: a100-40gb"),
    (["plan", "--gpus", "0"], "invalid value '0'; must be an integer >= 1"),
])
def test_cli_plan_bad_input_exits_2(args, message, capsys) -> None:
    """Bad input exits 2 naming the value."""
    with pytest.raises(SystemExit) as info:
        raise SystemExit(main(args))
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.fixture(scope="module")
def one_gpu() -> Plan:
    return make_plan(model="llama-2-7b", gpu="a10g", gpus=1, host_ram="64GiB")


def test_one_gpu_plan_has_no_multi_gpu_strategy(one_gpu) -> None:
    """On one GPU: no DDP, ZeRO-1/2/3, FSDP full shard or device_map rows (each is the single-GPU run there), in the
    plan or the knob table; the offload strategies stay, and the plan says what it left out."""
    strategies = {r.strategy for r in one_gpu.remedies}
    assert strategies.isdisjoint({Strategy.DDP, Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3, Strategy.FSDP,
                                  Strategy.FSDP2})
    assert Strategy.SINGLE in strategies and Strategy.FSDP2_OFFLOAD in strategies
    assert all(r.route is Route.PROCESS_PER_GPU for r in one_gpu.remedies)
    assert not any("over 1 GPUs" in r.name or "over 1 GPUs" in r.reason for r in one_gpu.remedies)
    knobs = {v for k in one_gpu.knobs for name, v in k.changes if name == "strategy"}
    assert knobs.isdisjoint({"ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp2", "device-map"})
    assert any(n.startswith("one GPU:") for n in one_gpu.notes)


def test_no_rows_differ_only_in_a_label(one_gpu, plan) -> None:
    """No two rows have the same figures and differ only in fp16/bf16 of one kind or adamw/adamw-fused: they are
    folded into the one a user would launch (bf16 where the GPU has it, adamw-fused), the others named."""
    from oomlab.remedies.plan import _figures

    for p in (one_gpu, plan):
        keys = [_figures(r) for r in p.remedies]
        assert len(keys) == len(set(keys))
    folded = [r for r in one_gpu.remedies if r.same_as]
    assert folded and all(r.precision is not Precision.FP16_MIXED or not r.precision.uses_bf16 for r in folded)
    assert any(r.optimizer is Optimizer.ADAMW_FUSED and any("· adamw ·" in n or n.endswith("· adamw")
                                                           for n in r.same_as) for r in folded)
    assert all(r.precision in (Precision.BF16_MIXED, Precision.BF16, Precision.FP32) for r in folded)


def test_recommended_is_the_best_launchable_row_and_says_why() -> None:
    """The recommendation is the first sound launchable row unless a row about as fast (within the estimate's own
    uncertainty) has clearly more headroom; when it is not rank 1 the note names the rank and the reason."""
    from oomlab.remedies.plan import HEADROOM_GAIN, recommend

    p = make_plan(model="llama-13b", gpu="t4", gpus=4, host_ram="192GiB")
    rec, note = recommend(p.remedies, p.speed_uncertainty)
    launchable = [r for r in p.remedies if r.recommendable and r.config_files]
    best = launchable[0]
    assert rec in launchable and rec.tokens_per_s >= best.tokens_per_s * (1 - p.speed_uncertainty)
    if rec is not best:
        assert rec.headroom_bytes - best.headroom_bytes >= HEADROOM_GAIN * p.configured.setup.gpu.total_memory_bytes
        assert note.startswith(f"rank {p.remedies.index(rec) + 1}, not rank 1:") and "headroom" in note
    if rec is not p.remedies[0]:
        assert "not rank 1" in note
    # the recommendation shown is the ladder's fix, row 1 of what is shown, and says why
    assert p.recommended is p.fix is p.shown[0] and p.recommendation_note.startswith("rank 1: the least disruptive")


def test_host_ram_only_is_its_own_verdict() -> None:
    """Fitting the GPUs but not the host RAM reads as that, never as "nothing fits"."""
    from oomlab.remedies.display import verdict
    from oomlab.remedies.plan import Outcome

    p = make_plan(model="llama-2-70b", gpu="a100-80gb", gpus=8, host_ram="16GiB")
    p = replace(p, remedies=tuple(r for r in p.remedies if not r.fits))  # without ZeRO-3's (no replica on the host)
    assert p.outcome is Outcome.HOST_RAM and p.recommended is None and p.host_ram_short
    text = verdict(p) + summarize(p)
    assert "fits the GPUs but not the assumed host RAM — set `host_ram`" in text
    assert "No configuration oomlab knows fits" not in text


def test_host_ram_defaults_to_the_gpus_machine() -> None:
    """host_ram auto: the listed instance with these GPUs (8 x A100-80GB: 1800 GiB), stated as an assumption with its
    source; the seed's 4 x T4 is its g4dn.12xlarge's 192 GiB."""
    from oomlab.core.units import GiB

    big = make_plan(model="llama-2-70b", gpu="a100-80gb", gpus=8)
    assert big.host_ram_assumed and big.host_ram_bytes == 1800 * GiB and "gpu_8x_a100_80gb" in big.host_ram_source
    assert any("an assumption" in a and "set host_ram" in a for a in big.assumptions)
    seed = make_plan(model="llama-13b", gpu="t4", gpus=4, seq=512)
    assert seed.host_ram_bytes == 192 * GiB and "g4dn.12xlarge" in seed.host_ram_source


@pytest.mark.parametrize(("gpu", "mfu", "link"), [
    ("t4", 0.35, "PCIe only"),  # Turing: the seed's assumption, unchanged
    ("a100-80gb", 0.45, "NVLink 3 (SXM4)"),  # an SXM A100 is not PCIe
    ("h100-80gb", 0.40, "NVLink 4 (SXM5)"),
    ("l4", 0.45, "PCIe only"),
])
def test_gpu_facts_are_the_gpus_own(gpu: str, mfu: float, link: str) -> None:
    """MFU by GPU generation with its basis, and the GPU-to-GPU link from the GPU's spec, in the assumptions and in
    the collectives' time; nothing of the T4's said of another GPU."""
    from oomlab.core.gpus import load_gpu
    from oomlab.remedies.throughput import DEFAULT_ASSUMPTIONS, describe_assumptions, mfu_for

    spec = load_gpu(gpu)
    assert mfu_for(spec)[0] == mfu
    text = " ".join(describe_assumptions(spec, DEFAULT_ASSUMPTIONS))
    assert f"MFU {mfu:.0%}" in text and link in text
    if gpu != "t4":
        assert "T4" not in text
    setup = make_setup(model="llama-2-7b", gpu=gpu, gpus=2, strategy="ddp", method="lora")
    t = step_time(setup, DEFAULT_ASSUMPTIONS)
    assert t.collectives_s == pytest.approx(collective_bytes(setup) / spec.gpu_to_gpu_bytes_per_s)


@pytest.mark.parametrize("strategy", ["zero2-offload", "zero3", "ddp", "single"])
def test_caveats_read_as_sentences_about_the_remedy(strategy) -> None:
    """The plan's text joins caveats as "It trains ...; it keeps ...": each starts with a verb in the third person."""
    from oomlab.remedies.remedy import caveats

    gpus = 1 if strategy == "single" else 4
    for method, optimizer, precision in (("lora", "adamw-8bit", "fp16-mixed"), ("qlora", "sgd", "fp16"),
                                         ("full", "adamw", "bf16-mixed")):
        if strategy.startswith("zero") and (precision == "fp16" or optimizer == "adamw-8bit") \
                or method == "qlora" and strategy == "zero3":
            continue  # refused by make_setup (tests/budget/test_deepspeed.py)
        setup = make_setup(model="llama-7b", gpu="a100-80gb", gpus=gpus, strategy=strategy, method=method,
                           optimizer=optimizer, precision=precision, checkpointing=True)
        for caveat in caveats(setup):
            first = caveat.text.split()[0]
            assert first.islower() and first.endswith("s"), caveat.text


def test_a_run_that_fits_with_the_margin_is_left_as_it_is() -> None:
    """Mistral-7B LoRA with checkpointing on one A10G fits with its margin: nothing is recommended instead (not
    QLoRA because it is faster), and the plan says to launch it as written (issue 22)."""
    from oomlab.remedies.plan import Outcome

    p = make_plan(model="mistral-7b", gpu="a10g", gpus=1, method="lora", precision="bf16-mixed", checkpointing=True)
    assert p.outcome is Outcome.FITS and p.decision.verdict.fits
    assert p.recommended is None and p.fix is None and "nothing to change" in p.recommendation_note
    assert "recommended: as configured (nothing to change)" in render_plan(p)
