"""Four cases through the library functions the notebooks call (not papermill): each report is its own case's,
its verdict agrees with its remedies table, its recommended row launches, and its host RAM is stated."""

import re

import pytest

from oomlab.budget import display as br
from oomlab.core.gpus import load_gpu
from oomlab.evidence import agreement, checks
from oomlab.explanation.explain import explain
from oomlab.launch.check import other_launches
from oomlab.launch.prose import replica_dtype
from oomlab.launch.user import user_launch
from oomlab.pipeline.params import PARAMETERS
from oomlab.remedies import display as rd
from oomlab.remedies import launch_writer
from oomlab.remedies.plan import Outcome, plan_for
from oomlab.report import story
from oomlab.report.results import (
    budget_results,
    plan_results,
    read_results,
    reproduce_results,
    setup_case,
    write_results,
)
from oomlab.reproduction import summary
from oomlab.reproduction.honesty import honest_reproduction
from oomlab.reproduction.outside import case_outside
from oomlab.reproduction.replay import reproduce

pytestmark = pytest.mark.heavy  # runs the pipeline per case: `pytest -m "not heavy"` leaves it out

CASES = {  # name: (model, gpu, gpus, method, precision)
    "seed": ("llama-13b", "t4", 4, "full", "fp16-mixed"),
    "a10g-lora": ("llama-2-7b", "a10g", 1, "lora", "bf16-mixed"),
    "l4x2": ("llama-3.1-8b", "l4", 2, "full", "bf16-mixed"),
    "a100x8": ("llama-2-70b", "a100-80gb", 8, "full", "bf16-mixed"),
}
# what only the seed's case may say: its model, GPU, message figures, the user who reported it
SEED_TEXT = ("llama-13b", "T4", "14.75 GiB", "61 GB", "the user's", "seed", "user's message", "4 × Tesla")


def _run(name: str, tmp_path) -> tuple[dict, object, str]:
    """Notebooks 01-04 as library calls: the results JSONs (written and read back) and the report's text."""
    model, gpu, gpus, method, precision = CASES[name]
    # 01: reproduce, decode
    result = reproduce(model=model, dtype="float16", gpu=gpu, device="simulated")
    fp32 = reproduce(model=model, dtype="float32", gpu=gpu, device="simulated")
    big = summary.smallest_fitting_gpu(model, "float16", result.outside_pytorch_bytes)
    fits_case = reproduce(model=model, dtype="float16", gpu=big, device="simulated") if big else None
    target = summary.decoding_target(result)
    decoded = explain(target[1], model=model, gpu=gpu, dtype="float16") if target else None
    honesty = honest_reproduction() if summary.is_seed_result(result) else None
    # the user's setup, as notebooks 01-03 read it (no launch files: every field the parameters')
    defaults = {name: p.default for name, p in PARAMETERS.items()}
    launch = user_launch({**defaults, "model": model, "gpu": gpu, "gpus": gpus, "method": method,
                          "precision": precision}, defaults)
    setup = launch.setup
    rep = reproduce_results({"model": model, "dtype": "float16", "gpu": gpu, "gpus": gpus, "device": "simulated"},
                            result, fp32, big, fits_case, decoded, target[0] if target else None, gpus, honesty,
                            {**launch.to_dict(), "replica_dtype": replica_dtype(launch),
                             "other_launches": other_launches(launch)})
    # 02: the budget
    gpu_spec = setup.gpu
    outside = case_outside(setup.model.name, gpu_spec, setup.world_size).total_bytes
    variants = br.budget_variants(br.configured_variants(setup))
    committed = agreement.load_committed()
    bud = budget_results(setup_case(setup), gpu_spec, setup.world_size, outside, variants,
                         committed, agreement.worst_row(committed), {}, [])
    # 03: the plan, its launch files
    plan = plan_for(setup)
    config_dir = tmp_path / "configs"
    written = launch_writer.write_configs(config_dir, plan)
    rec = plan.recommended
    model_id = launch_writer.hub_id(plan.configured.setup.model.source) or "PATH/TO/MODEL"
    command = launch_writer.plan_launch_command(plan, rec, model_id)
    verified = {"single_process": checks.verification(checks.FAST, run=False),
                "fsdp_gloo": checks.verification(("fsdp",), run=False)}
    res = plan_results({"model": model, "gpu": gpu, "gpus": gpus, "seq": 2048, "host_ram": "auto", "trace": False},
                       plan, command, config_dir, written, plan.device_map, [], verified)
    # 04: the report, from the JSONs as written
    r = {}
    for key, data in (("reproduce", rep), ("budget", bud), ("plan", res)):
        r[key] = read_results(write_results(tmp_path / f"{key}.json", data))
    parts = [story.title(r), story.answer(r), story.deciding_configuration(r), story.reproduction(r),
             story.honesty(r, launch), story.decoded(r), story.evidence_of_budget(r), story.recommended_fix(r),
             *story.assumptions(r), rd.summarize(plan), br.summarize(variants, setup.world_size),
             summary.summarize(result, gpus), rd.heading(plan), rd.verdict(plan)]
    parts += [" | ".join(map(str, row)) for row in story.remedy_rows(r) + story.knob_table_rows(r)]
    return r, plan, "\n".join(parts)


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    name = request.param
    r, plan, text = _run(name, tmp_path_factory.mktemp(name))
    return name, r, plan, text


def test_report_names_its_own_case(case) -> None:
    """The report names the case's model, GPU and method; outside the seed's case nothing of the seed's."""
    name, r, plan, text = case
    model, gpu, gpus, method, _ = CASES[name]
    assert model in text and load_gpu(gpu).display_name in text and f"{gpus} × " in text
    assert plan.configured.method.value == method and f"{method} fine-tuning" in text
    assert f"Training as configured ({r['budget']['configured']['strategy']}, {method} fine-tuning" in text
    if name != "seed":
        leaked = [s for s in SEED_TEXT if s in text]
        assert not leaked, leaked


def test_seed_case_still_reads_as_before(case) -> None:
    """The seed's report keeps its story: the user's message, as configured no, the T4."""
    name, _, _, text = case
    if name != "seed":
        pytest.skip("the seed's case only")
    assert "**As configured, no.**" in text and "Tesla T4" in text and "the user's configuration" in text


def test_verdict_agrees_with_the_table(case) -> None:
    """A recommended row exists iff some sound launchable row fits the GPUs and the host RAM; "nothing fits" is never
    said when a row fits the GPUs; the recommendation is the table's row and launchable."""
    _, r, plan, text = case
    rows = r["plan"]["remedies"]
    sound = [x for x in rows if x["fits"] and x["recommendable"] and x["config_files"]]
    rec = r["plan"]["recommended"]
    assert (rec is not None) == bool(sound)
    if any(x["gpu_fits"] for x in rows):
        assert "No configuration oomlab knows fits" not in text
    if rec is not None:
        assert rec["name"] in [x["name"] for x in rows] and rec["fits"] and rec["config_files"]
        assert r["plan"]["launch_command"] and all(
            f in r["plan"]["config_files"] or any(p.endswith("/" + f) for p in r["plan"]["config_files"].values())
            for f in rec["config_files"])
        rank = [x["name"] for x in rows].index(rec["name"]) + 1
        assert rank == r["plan"]["recommended_rank"]
        if rank != 1:
            assert "not rank 1" in r["plan"]["recommendation_note"] and "not the table's first row" in text
    assert r["plan"]["outcome"] in {o.value for o in Outcome}


def test_host_ram_assumption_is_stated(case) -> None:
    """The host RAM is stated as an assumption with its source (the listed instance with these GPUs)."""
    _, r, _, text = case
    assert r["plan"]["host_ram_assumed"] and r["plan"]["host_ram_source"]
    assert "an assumption" in text and "set `host_ram`" in text
    assert re.search(r"specs/prices\.json|price table", text)


def test_no_multi_gpu_rows_on_one_gpu(case) -> None:
    """One GPU gets no DDP, ZeRO or full-shard rows, in the plan or the budget's variants."""
    name, r, _, text = case
    if CASES[name][2] != 1:
        pytest.skip("one-GPU cases only")
    strategies = {x["strategy"] for x in r["plan"]["remedies"]} | {v["strategy"] for v in r["budget"]["variants"]}
    assert strategies.isdisjoint({"ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp2"})
    assert "over 1 GPUs" not in text


def test_as_configured_is_the_users_setup(case) -> None:
    """The budget's first variant, the plan's configured row and the knob table's baseline are the setup the parameters
    give (its method and strategy), and the report's "as configured" bar names it."""
    name, r, plan, _ = case
    _, gpu, gpus, method, precision = CASES[name]
    strategy = "single" if gpus == 1 else "ddp"
    configured = plan.configured.setup
    assert (configured.method.value, configured.strategy.value, configured.precision.value) == (
        method, strategy, precision)
    assert (r["budget"]["configured"]["method"], r["budget"]["configured"]["strategy"]) == (method, strategy)
    assert r["budget"]["variants"][0]["label"].startswith("as configured")
    bar = story.remedy_bars(r)[0].label
    assert bar.startswith("as configured") and (("LoRA" in bar) == (method == "lora")), bar


def test_assumed_setup_stated_once(case) -> None:
    """Without launch files the report states the assumed fields of the setup as assumptions, each once."""
    _, r, _, _ = case
    items = story.assumptions(r)
    assumed = [a.replace("&#x27;", "'") for a in items if a.replace("&#x27;", "'").startswith("The user's setup")]
    assert assumed and len(assumed) == len(set(assumed))
    text = " ".join(assumed)
    for field in ("batch", "seq", "optimizer"):  # the pipeline's defaults, in one sentence, each once
        assert text.count(f"{field} = ") == 1, field
    assert assumed[0].count(" = ") == sum("no launch files" in a for a in r["reproduce"]["launch"]["assumptions"])
    strategy = r["reproduce"]["launch"]["fields"]["strategy"]["value"]
    assert ("zero3_init" in text) == strategy.startswith("zero3"), text
