"""The explorer's callbacks, driven by setting widget values in Python (no browser, no kernel)."""

import inspect
import json
from dataclasses import replace

import pytest

from oomlab.budget.estimator import estimate_setup
from oomlab.budget.result import MemCategory
from oomlab.core.choices import Strategy
from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.gpus import known_gpus
from oomlab.core.models import load_model
from oomlab.core.paths import MODEL_SPECS_DIR as MODELS_DIR
from oomlab.core.prices import resolve_host_ram
from oomlab.core.setup import make_setup
from oomlab.core.units import GiB, format_size
from oomlab.explorer import (
    AMBER,
    GREEN,
    MAX_BATCH_SEARCH,
    Choices,
    build_explorer,
    explore,
    explorer_intro,
    largest_micro_batch,
    render_hardware_html,
    render_verdict,
    render_verdict_html,
    search_for,
)
from oomlab.pipeline.params import PARAMETERS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def explorer():
    """One explorer for the module (its figure is reused, as in a notebook); each test resets it."""
    return build_explorer()


@pytest.fixture
def seed(explorer):
    """The explorer back at the seed's setup: llama-13b, 4 x T4, full fine-tuning, fp16-mixed, AdamW."""
    explorer.set_choices(Choices())
    return explorer


def test_seed_does_not_fit_and_names_the_largest_component(seed) -> None:
    """The seed's setup: does not fit, short by the headroom, naming the largest component."""
    r = seed.exploration.result
    assert not r.fits
    breaking = r.breaking_component
    assert render_verdict(seed.exploration)[0] == (
        f"Does not fit on 4 x Tesla T4 (14.75 GiB each): needs {format_size(r.per_gpu_peak_bytes)} per GPU in the "
        f"{r.peak_phase.value} phase, short by {format_size(-r.headroom_bytes)}; the largest component is "
        f"{breaking.value} ({format_size(r.components[breaking])})."
    )
    assert "Does not fit on 4 x Tesla T4" in seed.verdict.value


def test_bar_data_is_the_budget_at_the_peak(seed) -> None:
    """The bar's segments are the budget's components (no zeros) and add up to the per-GPU peak."""
    r = seed.exploration.result
    assert sum(seed.bar_data.values()) == r.per_gpu_peak_bytes
    assert all(v > 0 for v in seed.bar_data.values())
    assert list(seed.bar_data) == [c for c in MemCategory if c in seed.bar_data]  # enum order
    assert MemCategory.OUTSIDE_PYTORCH in seed.bar_data
    assert bytes(seed.bar.value).startswith(PNG_MAGIC)


def test_changing_gpu_and_method_changes_verdict_and_bar(seed) -> None:
    """full -> lora on 4 x A100-80GB: the verdict turns to fits and the bar is redrawn."""
    verdict, png, data = seed.verdict.value, seed.bar.value, seed.bar_data
    seed.controls["gpu"].value = "a100-80gb"
    seed.controls["method"].value = "lora"
    assert seed.exploration.result.fits
    assert render_verdict(seed.exploration)[0].startswith("Fits on 4 x NVIDIA A100-SXM4-80GB (79.35 GiB each): ")
    assert seed.verdict.value != verdict
    assert seed.bar.value != png and bytes(seed.bar.value).startswith(PNG_MAGIC)
    assert seed.bar_data != data
    assert seed.bar_data[MemCategory.WEIGHTS] < data[MemCategory.WEIGHTS] // 2 + GiB  # half weights, not fp32


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"precision": "bf16-mixed"},  # the T4 (compute capability 7.5) has no bfloat16
         "precision 'bf16-mixed' needs bfloat16, which the Tesla T4 (compute capability 7.5) lacks; "
         "use fp16-mixed or fp32 on this GPU"),
        ({"method": "qlora", "precision": "fp32"},
         "method 'qlora' computes in half precision over a 4-bit base; precision 'fp32' is not a QLoRA setup: "
         "use fp16-mixed (or bf16-mixed where the GPU has bf16)"),
    ],
)
def test_invalid_combination_shows_the_error_as_verdict(seed, changes, message) -> None:
    """An invalid combination does not raise: its message is the verdict and the bar is empty."""
    for name, value in changes.items():
        seed.controls[name].value = value
    assert seed.exploration.error == message
    assert render_verdict(seed.exploration) == [f"Not a valid setup: {message}"]
    assert "Not a valid setup: " in seed.verdict.value
    assert seed.bar_data == {}
    assert seed.exploration.largest_batch is None and not seed.exploration.fits


def test_recovers_after_an_invalid_combination(seed) -> None:
    """Making the choice valid again brings the budget back."""
    seed.controls["precision"].value = "bf16-mixed"
    seed.controls["gpu"].value = "a100-80gb"
    assert seed.exploration.error is None and seed.bar_data


def test_lora_rank_is_enabled_only_for_lora_methods(seed) -> None:
    """The LoRA rank control is greyed out under full fine-tuning."""
    assert seed.controls["lora_rank"].disabled
    seed.controls["method"].value = "qlora"
    assert not seed.controls["lora_rank"].disabled


def test_lora_rank_changes_the_budget(seed) -> None:
    """A higher LoRA rank means more adapter gradients and optimizer state."""
    seed.controls["method"].value = "lora"
    before = seed.bar_data[MemCategory.OPTIMIZER_STATE]
    seed.controls["lora_rank"].value = 64
    assert seed.bar_data[MemCategory.OPTIMIZER_STATE] == 8 * before


def test_host_ram_control(seed) -> None:
    """The host-RAM line compares what the node needs with the host-RAM control."""
    seed.controls["method"].value = "lora"
    need = seed.exploration.result.host_ram_bytes
    seed.controls["host_ram_bytes"].value = 4 * need / GiB
    assert seed.exploration.host_ram_fits
    assert render_verdict(seed.exploration)[1] == (
        f"Host RAM: needs {format_size(need)} of {format_size(4 * need)} per node - fits.")
    seed.controls["host_ram_bytes"].value = 1.0
    assert not seed.exploration.host_ram_fits
    assert render_verdict(seed.exploration)[1] == (
        f"Host RAM: needs {format_size(need)} of 1024.00 MiB per node - does not fit, "
        f"short by {format_size(need - GiB)}.")


def test_largest_micro_batch_line(seed) -> None:
    """The verdict names the largest micro-batch, or says that not even 1 fits."""
    assert render_verdict(seed.exploration)[2] == (
        "Largest micro-batch that fits: none - even micro-batch 1 at sequence length 2048 is too big.")
    seed.controls["gpu"].value = "h200"
    seed.controls["method"].value = "qlora"
    best = seed.exploration.largest_batch
    assert best is not None and best > 1
    assert render_verdict(seed.exploration)[2] == f"Largest micro-batch that fits: {best} at sequence length 2048."


def test_choices_round_trip(explorer) -> None:
    """The controls hold exactly what build_explorer was given."""
    wanted = Choices(model="llama-2-7b", gpu="a10g", gpus=2, strategy="fsdp", method="lora", precision="bf16-mixed",
                     optimizer="adamw-8bit", batch=3, seq=1024, checkpointing=True, lora_rank=16,
                     host_ram_bytes=64 * GiB)
    kwargs = dict(vars(wanted))
    kwargs["host_ram"] = kwargs.pop("host_ram_bytes")
    built = build_explorer(**kwargs)
    assert built.choices == wanted
    assert built.exploration.result.setup == wanted.setup()


def test_every_gpu_is_offered(explorer) -> None:
    """The GPU dropdown lists every shipped GPU, labelled with its capacity."""
    options = explorer.controls["gpu"].options
    assert [value for _, value in options] == known_gpus()
    assert ("Tesla T4 (14.75 GiB)", "t4") in options


def test_model_from_a_config_path(tmp_path) -> None:
    """A config.json path is validated and offered beside the shipped models."""
    config = {"hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2, "num_attention_heads": 4,
              "vocab_size": 320, "model_type": "llama"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    built = build_explorer(model=str(path), gpu="t4", gpus=1)
    assert built.controls["model"].value == str(path)
    assert built.exploration.result.fits


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"gpu": "h9000"}, UnknownNameError,
         "unknown GPU 'h9000'; known: " + ", ".join(known_gpus())),
        ({"strategy": "zero4"}, UnknownNameError,
         "unknown strategy 'zero4'; known: " + ", ".join(sorted(s.value for s in Strategy))),
        ({"batch": 0}, InvalidValueError, "invalid batch 0; must be an integer >= 1"),
        ({"host_ram": "lots"}, InvalidValueError, None),  # parse_size's own message
    ],
)
def test_bad_initial_values_raise(kwargs, error, message) -> None:
    """Unknown names and impossible numbers are refused up front, naming the value."""
    with pytest.raises(error) as info:
        build_explorer(**kwargs)
    if message is not None:
        assert str(info.value) == message


@pytest.mark.parametrize(
    "changes",
    [
        {"model": "llama-7b", "gpu": "h200", "method": "lora"},
        {"model": "llama-13b", "gpu": "a10g", "method": "qlora", "checkpointing": True},
        {"model": "llama-2-70b", "gpu": "h100-80gb", "gpus": 8, "strategy": "fsdp", "method": "lora",
         "precision": "bf16-mixed", "checkpointing": True},
    ],
)
def test_largest_micro_batch_is_the_boundary(changes) -> None:
    """The largest micro-batch fits and one more does not."""
    setup = make_setup(**changes)
    best = largest_micro_batch(setup)
    assert best is not None and best < MAX_BATCH_SEARCH
    assert estimate_setup(replace(setup, batch=best)).fits
    assert not estimate_setup(replace(setup, batch=best + 1)).fits


def test_largest_micro_batch_none_and_limit() -> None:
    """None when micro-batch 1 does not fit; the search limit when even that fits."""
    assert largest_micro_batch(make_setup(gpus=1, model="llama-65b", gpu="t4")) is None
    tiny = make_setup(gpus=1, model="llama-7b", gpu="h200", method="qlora", seq=16, checkpointing=True)
    assert largest_micro_batch(tiny, limit=8) == 8


def test_explore_does_not_raise_on_invalid_choices() -> None:
    """explore() returns the error message rather than raising."""
    result = explore(Choices(gpu="v100-16gb", precision="bf16"))
    assert result.result is None and result.error.startswith("precision 'bf16' needs bfloat16")


def test_displays_as_a_widget(explorer) -> None:
    """The explorer displays as its widget box."""
    bundle = explorer._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == explorer.ui.model_id


def test_gpus_fit_but_host_ram_does_not_is_never_green(seed) -> None:
    """A setup the GPUs hold but the host RAM does not: amber "fits the GPUs but not the host RAM", not green."""
    seed.controls["gpu"].value = "h200"
    seed.controls["method"].value = "qlora"
    assert seed.exploration.result.fits
    seed.controls["host_ram_bytes"].value = 1.0
    ex = seed.exploration
    assert not ex.fits and ex.colour == AMBER
    first = render_verdict(ex)[0]
    assert first.startswith("Fits the GPUs but not the host RAM")
    assert GREEN not in render_verdict_html(ex).split("<br>")[0]


def test_new_controls_reach_the_budget(seed) -> None:
    """nodes, attention, LoRA targets and the memory outside PyTorch change the estimate."""
    seed.controls["gpu"].value = "a100-80gb"
    seed.controls["strategy"].value = "fsdp"
    one = seed.exploration.result.components[MemCategory.OPTIMIZER_STATE]
    seed.controls["nodes"].value = 2
    assert seed.exploration.result.setup.world_size == 8
    assert seed.exploration.result.components[MemCategory.OPTIMIZER_STATE] == pytest.approx(one / 2, rel=0.01)
    seed.controls["method"].value = "lora"
    base = seed.exploration.result.components.get(MemCategory.ACTIVATIONS, 0)
    seed.controls["attention"].value = "eager"
    assert seed.exploration.result.setup.attention.value == "eager"
    assert seed.exploration.result.peak_phase is not None and seed.exploration.result.components.get(
        MemCategory.ACTIVATIONS, 0) != base
    seed.controls["lora_targets"].value = ("q_proj", "v_proj")
    assert seed.exploration.result.setup.lora_targets == ("q_proj", "v_proj")
    seed.controls["outside_mib"].value = 3000.0
    assert seed.exploration.result.components[MemCategory.OUTSIDE_PYTORCH] == 3000 * 2**20
    seed.controls["outside_mib"].value = -1.0  # back to the shipped figure
    assert seed.exploration.result.components[MemCategory.OUTSIDE_PYTORCH] != 3000 * 2**20


def test_model_field_takes_a_path_or_says_why_not(seed, tmp_path) -> None:
    """The model field is free text: a config.json path works, a missing one is the verdict, not a crash."""
    config = json.loads((MODELS_DIR / "llama-2-7b.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    seed.controls["model"].value = str(path)
    assert seed.exploration.result is not None
    seed.controls["model"].value = str(tmp_path / "missing.json")
    assert seed.exploration.result is None and "missing.json" in seed.exploration.error


def test_sequence_length_is_bounded_like_everywhere_else(seed) -> None:
    """seq beyond the model's max_position_embeddings is refused in the verdict, as make_setup refuses it."""
    seed.controls["seq"].value = 1_000_000
    assert seed.exploration.result is None and "max_position_embeddings" in seed.exploration.error


def test_default_strategy_matches_the_gpu_count() -> None:
    """The default choices run one replica per GPU on the default 4 GPUs (ddp), not "single" on 4 GPUs."""
    assert Choices().gpus > 1 and Choices().strategy == "ddp"


def registry_form(name: str, value: object) -> object:
    """A choice as the registry holds it: LoRA targets as ``"a,b"``, the host RAM as the bytes it resolves to."""
    return ",".join(value) if isinstance(value, tuple) else value


def test_every_explorer_default_is_the_registrys() -> None:
    """Every Choices field and build_explorer argument named like a registry parameter defaults to the registry's
    value, in its type (the host RAM: the bytes the registry's ``auto`` resolves to; the strategy: its ``ddp``, which on
    one GPU would be single)."""
    host = resolve_host_ram(PARAMETERS["host_ram"].default, PARAMETERS["gpu"].default,
                            PARAMETERS["gpus"].default).host_ram_bytes
    assert Choices().host_ram_bytes == host
    assert PARAMETERS["gpus"].default > 1  # else the registry's ddp would be single here
    signature = inspect.signature(build_explorer).parameters
    checked = set()
    for name, param in PARAMETERS.items():
        for where, default in (("Choices", getattr(Choices, name, None)),
                               ("build_explorer", signature[name].default if name in signature else None)):
            if default is None and not param.nullable:
                continue  # not an explorer choice (dtype, device, trace, ...)
            checked.add(name)
            value = registry_form(name, default)
            assert value == param.default and type(value) is type(param.default), (where, name, default)
    assert {"model", "gpu", "gpus", "strategy", "method", "precision", "optimizer", "batch", "seq", "checkpointing",
            "attention", "lora_rank", "lora_targets", "host_ram"} <= checked


def test_lora_targets_of_another_family_are_that_familys(tmp_path) -> None:
    """Falcon names its attention query_key_value: build_explorer takes it (as make_setup does), the control offers
    Falcon's names, and switching the model offers the new model's, the selection carried over where it can."""
    explorer = build_explorer(model="falcon-7b", gpu="a100-80gb", gpus=1, strategy="single", method="lora",
                              lora_targets="query_key_value")
    control = explorer.controls["lora_targets"]
    assert control.options == (*load_model("falcon-7b").lora_target_names, "all-linear")
    assert control.value == ("query_key_value",)
    assert explorer.exploration.error is None
    assert explorer.exploration.result.setup.lora_targets == ("query_key_value",)
    explorer.controls["model"].value = "llama-2-7b"  # falcon's names mean nothing here: LLaMA's attention
    assert control.options == (*load_model("llama-2-7b").lora_target_names, "all-linear")
    assert control.value == ("q_proj", "k_proj", "v_proj", "o_proj") and explorer.exploration.error is None
    explorer.controls["model"].value = "pythia-1.4b"  # the same attention, in GPT-NeoX's names
    assert control.value == ("query_key_value", "dense") and explorer.exploration.error is None
    explorer.controls["model"].value = str(tmp_path / "missing.json")  # not a model: the options stay
    assert control.options[0] == "query_key_value" and "missing.json" in explorer.exploration.error
    explorer.set_choices(Choices(method="lora", gpus=1, strategy="single"))  # the seed's names on llama-13b again
    assert control.value == ("q_proj", "k_proj", "v_proj", "o_proj") and explorer.exploration.error is None


def test_the_default_lora_targets_mean_the_familys_attention() -> None:
    """LLaMA's default names on Phi-3 select Phi-3's attention projections, the same setup make_setup builds."""
    explorer = build_explorer(model="phi-3-mini-4k", gpu="a100-80gb", gpus=1, strategy="single", method="lora")
    assert explorer.controls["lora_targets"].value == ("qkv_proj", "o_proj")
    assert explorer.exploration.result.setup == make_setup(gpus=1, model="phi-3-mini-4k", gpu="a100-80gb",
                                                           method="lora")


def test_an_unknown_lora_target_is_refused_with_the_models_names() -> None:
    """A name the model does not have is refused naming the model's own (not LLaMA's)."""
    with pytest.raises(UnknownNameError) as info:
        build_explorer(model="falcon-7b", method="lora", lora_targets="q_proj,v_proj")
    assert str(info.value) == ("unknown LoRA target module 'q_proj'; known: all-linear, dense, dense_4h_to_h, "
                               "dense_h_to_4h, query_key_value (the nn.Linear modules of falcon-7b's falcon layers)")


def test_intro_speaks_of_the_chosen_case() -> None:
    """The intro names the case's model, GPU and method, not the seed's."""
    text = explorer_intro(Choices(model="mistral-7b", gpu="a100-80gb", gpus=2, method="lora"))
    assert "mistral-7b" in text and "A100" in text and "LoRA r8" in text
    assert "llama-13b" not in text and "T4" not in text


def test_hardware_button_shows_the_ranking_for_the_chosen_model_and_method(explorer) -> None:
    """The button runs the search for the chosen model and method and shows the winners and every row."""
    explorer.set_choices(Choices(model="qwen2.5-0.5b", gpus=1, strategy="single", method="lora", seq=512))
    assert explorer.hardware.value == ""
    explorer.search_button.click()
    search = explorer.search
    assert search is not None and search.model == "qwen2.5-0.5b" and [m.value for m in search.methods] == ["lora"]
    html_text = explorer.hardware.value
    assert "<b>cheapest per token</b>" in html_text and search.fastest.label in html_text
    assert html_text.count("<tr>") == len(search.options) + 1  # the header and one row per GPU type and count
    assert {o.gpu for o in search.options} == set(known_gpus())


def test_hardware_table_clears_when_the_model_or_method_changes(explorer) -> None:
    """A changed method makes the shown search stale: cleared; a changed GPU does not (the search covers it)."""
    explorer.set_choices(Choices(model="qwen2.5-0.5b", gpus=1, strategy="single", method="lora", seq=512))
    explorer.search_button.click()
    shown = explorer.hardware.value
    explorer.controls["gpu"].value = "a10g"
    assert explorer.hardware.value == shown
    explorer.controls["method"].value = "qlora"
    assert explorer.hardware.value == "" and explorer.search is None


def test_hardware_search_of_invalid_choices_says_why() -> None:
    """A sequence past the model's context is refused by the search, and the view says why."""
    with pytest.raises(InvalidValueError, match="invalid seq 10000000") as info:
        search_for(Choices(model="qwen2.5-0.5b", method="lora", seq=10**7))
    assert render_hardware_html(info.value).endswith(f"cannot search: {info.value}</div>")


def test_the_run_description_controls_reach_the_budget(seed) -> None:
    """Trainer, loss, activation offloading, the LoRA base dtype and the versions: the same setup (and so the same
    answer) as make_setup with those values -- the pipeline's parameters, check's and plan's flags."""
    seed.set_choices(Choices(model="llama-2-7b", gpu="a100-80gb", gpus=1, strategy="single", method="qlora",
                             precision="bf16-mixed", batch=2, seq=512, checkpointing=True,
                             lora_targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                           "down_proj")))
    seed.controls["versions"].value = "torchtune==0.1.0"
    r = seed.exploration.result
    assert r.setup.versions.framework == "torchtune" and r.load is not None
    assert r.per_gpu_peak_bytes == estimate_setup(seed.choices.setup()).per_gpu_peak_bytes
    assert any(line.startswith("Loading: torchtune's QLoRA init") for line in render_verdict(seed.exploration))
    assert "while loading the model" in render_verdict(seed.exploration)[0]
    seed.controls["versions"].value = "tensorflow==2.15.0"
    assert seed.exploration.result is None and "unknown package 'tensorflow'" in seed.exploration.error
    seed.controls["versions"].value = ""
    seed.controls["method"].value = "lora"
    for name, value in (("loss", "liger-flce"), ("offload_activations", True), ("base_dtype", "float32"),
                        ("trainer", "dpo")):
        before = seed.exploration.result.per_gpu_peak_bytes
        seed.controls[name].value = value
        setup = seed.exploration.result.setup
        assert getattr(setup, name) == value or getattr(setup, name).value == value, name
        assert seed.exploration.result.per_gpu_peak_bytes != before, name


def test_bad_versions_are_refused_before_any_widget() -> None:
    with pytest.raises(UnknownNameError, match="tensorflow"):
        build_explorer(versions="tensorflow==2.15.0")
    with pytest.raises(InvalidValueError, match="name==release"):
        build_explorer(versions="requirements.txt")


def test_the_versions_field_takes_pins_not_a_file(seed, tmp_path) -> None:
    """A path typed into the versions field is refused in the verdict (no file is read from the explorer)."""
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("transformers==4.40.0\n")
    seed.controls["versions"].value = str(freeze)
    assert seed.exploration.result is None and "expected name==release pins" in seed.exploration.error
