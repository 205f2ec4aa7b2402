"""The pipeline's user setup (launch_dir or assumed parameters) and notebook 01's sentences computed from the case."""

from pathlib import Path

from oomlab.core.choices import Strategy
from oomlab.launch.check import other_launches
from oomlab.launch.origin import OriginKind
from oomlab.launch.prose import case_intro, launch_path_reading, replica_dtype, traceback_proves
from oomlab.launch.user import user_launch
from oomlab.pipeline.params import PARAMETERS, parse_params
from oomlab.reproduction.replay import reproduce

DEFAULTS = {name: p.default for name, p in PARAMETERS.items()}
TWIN = Path(__file__).parents[1] / "fixtures" / "open-assistant"


def test_without_files_every_field_is_an_assumption() -> None:
    """The registry's defaults are stated as assumptions; a -p value as given."""
    launch = user_launch(parse_params([]), DEFAULTS)
    assert launch.setup.strategy is Strategy.DDP
    assert all(s.origin.kind is OriginKind.ASSUMED for s in launch.fields.values())
    given = user_launch(parse_params(["method=lora", "lora_rank=16"]), DEFAULTS)
    assert str(given.fields["method"].origin) == "flag -p method=lora" and given.setup.lora_rank == 16


def test_ddp_on_one_gpu_is_single() -> None:
    """strategy ddp (the default) on one GPU is one process."""
    launch = user_launch(parse_params(["gpus=1"]), DEFAULTS)
    assert launch.setup.strategy is Strategy.SINGLE


def test_launch_dir_decides() -> None:
    """With launch_dir the twin's files decide (ZeRO-2 from zero_config.json), not the parameters."""
    launch = user_launch(parse_params([f"launch_dir={TWIN / 'seed'}"]), DEFAULTS)
    assert launch.setup.strategy is Strategy.ZERO2 and launch.setup.batch == 4
    assert replica_dtype(launch) == "float16"


def test_case_sentences_come_from_the_case() -> None:
    """Another model's intro names that model, not the seed's; the seed's names the user's traceback."""
    other = user_launch(parse_params(["model=llama-2-7b", "gpu=a10g", "gpus=1"]), DEFAULTS)
    text = case_intro(other, "float16")
    assert "llama-2-7b" in text and "llama-13b" not in text and "user's report" not in text
    seed = user_launch(parse_params([]), DEFAULTS)
    assert "The user's report shows this run dying" in case_intro(seed, "float16")


def test_traceback_reading_and_other_launches() -> None:
    """The seed's traceback proves a full-replica .to(); the assumed DDP is one of those; ZeRO-3 gets past load."""
    seed = user_launch(parse_params([]), DEFAULTS)
    result = reproduce(device="simulated")
    reading = launch_path_reading(seed, result)
    assert "the user's launcher moved a full replica" in reading and "is one of them" in reading
    rows = {row[0]: row for row in other_launches(seed)}
    assert rows["ddp (as launched)"][2] == "load" and rows["zero3"][2] != "load"


def test_a_read_traceback_and_a_hypothetical_one() -> None:
    """Notebook 01 read a traceback, so a launch that cannot raise it is not the one that ran; check (hypothetical)
    read none, so the same launch only cannot fail there."""
    launch = user_launch(parse_params(["strategy=zero3"]), DEFAULTS)
    read = launch_path_reading(launch, reproduce(device="simulated"))
    assert "means the user's launcher moved a full replica" in read and "It was not ZeRO-3 under zero.Init" in read
    assert read.endswith("is not one of them: under it this traceback could not happen, so the launch that ran "
                         "differed.")
    said = traceback_proves(launch, "A traceback like it", "its launcher", hypothetical=True)
    assert said.startswith("A traceback like it would prove that its launcher moved a full replica")
    assert said.endswith("(zero3: ZeRO-3 under zero.Init) is not one of them: it cannot fail there.")
    assert "that ran" not in said


def test_assumed_fields_hold_the_setups_members() -> None:
    """Without files, each choice field holds the setup's member (not the parameter's text), as a read launch does."""
    from oomlab.core.choices import Attention, Method, Optimizer, Precision

    launch = user_launch(parse_params(["gpus=1", "precision=fp32"]), DEFAULTS)
    s, f = launch.setup, launch.fields
    assert f["strategy"].value is s.strategy is Strategy.SINGLE and f["precision"].value is Precision.FP32
    for name, kind in (("method", Method), ("optimizer", Optimizer), ("attention", Attention)):
        assert isinstance(f[name].value, kind) and f[name].value is getattr(s, name)
    assert str(f["precision"].origin) == "flag -p precision=fp32"


def test_off_the_seed_nothing_is_proved_and_the_load_dtype_follows_the_precision() -> None:
    """A bf16 LoRA run on L4s (no traceback of the user's): its load dtype is bfloat16, said as an assumption that
    follows the precision, not the seed's float16; the launch section claims no proof."""
    from oomlab.launch.paths import path_table
    from oomlab.launch.prose import launch_section

    launch = user_launch(parse_params(["model=qwen2.5-7b", "gpu=l4", "gpus=2", "strategy=fsdp2", "method=lora",
                                       "precision=bf16-mixed"]), DEFAULTS)
    field = launch.fields["load_dtype"]
    assert field.value == "bfloat16" and "seed" not in str(field.origin) and "bf16-mixed" in str(field.origin)
    result = reproduce(model="qwen2.5-7b", dtype=replica_dtype(launch), gpu="l4", device="simulated")
    text = launch_section(launch, result, replica_dtype(launch), path_table(), other_launches(launch))
    assert "traceback proves" not in text and "the user's" not in text and "seed" not in text
    assert "would prove" in text or not result.raised
    seed = user_launch(parse_params([]), DEFAULTS)
    assert seed.fields["load_dtype"].value == "float16"
    assert "### The launch the traceback proves" in launch_section(
        seed, reproduce(device="simulated"), "float16", path_table(), other_launches(seed))
