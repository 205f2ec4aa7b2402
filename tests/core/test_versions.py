"""core.versions: the user's releases (pins, pip freeze files, mappings; the installed ones by default) and the version
facts, each answered on both sides of the release that changed it."""

from __future__ import annotations

import pytest

from oomlab.cli import main
from oomlab.core.errors import InvalidValueError, UnknownNameError
from oomlab.core.setup import make_setup
from oomlab.core.versions import (
    FACTS,
    Fact,
    Origin,
    applies,
    installed_versions,
    parse_release,
    parse_versions,
    read_freeze_file,
    versions_from,
)


@pytest.mark.parametrize(("text", "release"), [
    ("4.31.0", (4, 31, 0)),
    ("2.0.1+cu118", (2, 0, 1)),  # a local tag is dropped
    ("0.43.2.dev0", (0, 43, 2)),  # so is a pre-release tag
    ("v0.10.0", (0, 10, 0)),
    ("5", (5,)),
])
def test_release_is_its_leading_numbers(text: str, release: tuple[int, ...]) -> None:
    """A release is compared by its numeric components."""
    assert parse_release(text, "torch") == release


def test_pins_given_and_installed() -> None:
    """Pins are given; every other package keeps its installed release, and says so."""
    v = parse_versions("torch==2.0.1, transformers==4.31.0")
    assert v.release("transformers") == (4, 31, 0) and v.origin("transformers") is Origin.GIVEN
    assert v.release("peft") == installed_versions().release("peft") and v.origin("peft") is Origin.INSTALLED
    assert "transformers 4.31.0 (given)" in v.describe() and "peft " in v.describe()


@pytest.mark.parametrize(("text", "message"), [
    ("torch=2.0.1", "invalid version pin 'torch=2.0.1'; expected name==release, e.g. transformers==4.31.0 (pins "
                    "separated by commas)"),
    ("torch==abc", "invalid version 'abc' for torch; expected a release such as 4.31.0 (numbers separated by dots, "
                   "an optional +local or pre-release tag)"),
    (" , ", "no version pins in ' , '; expected e.g. torch==2.0.1,transformers==4.31.0"),
])
def test_bad_pins_name_the_value(text: str, message: str) -> None:
    """A malformed pin is refused with the bad value and the accepted form."""
    with pytest.raises(InvalidValueError) as info:
        parse_versions(text)
    assert str(info.value) == message


def test_unknown_package_lists_the_known_ones() -> None:
    """A package whose release oomlab does not read is refused, listing the ones it reads."""
    with pytest.raises(UnknownNameError) as info:
        parse_versions("tensorflow==2.15.0")
    assert str(info.value).startswith("unknown package 'tensorflow'; known: accelerate, bitsandbytes, deepspeed, "
                                      "litgpt, peft, torch, torchao, torchtune, transformers, trl")


def test_pip_freeze_file(tmp_path) -> None:
    """A pip freeze file: its pins of the packages oomlab reads; comments, editables, URLs and others skipped."""
    path = tmp_path / "requirements.txt"
    path.write_text("# frozen\n-e git+https://example.org/x.git#egg=x\nnumpy==1.26.4\nTorch==2.1.2+cu121\n"
                    "transformers==4.36.2\npeft @ file:///tmp/peft\nbitsandbytes==0.41.3.post2\n")
    v = read_freeze_file(path)
    assert [(name, release) for name, release in v.given] == [
        ("bitsandbytes", (0, 41, 3)), ("torch", (2, 1, 2)), ("transformers", (4, 36, 2))]
    assert versions_from(str(path)) == v


def test_pip_freeze_file_without_known_pins(tmp_path) -> None:
    """A freeze file naming none of the packages oomlab reads is refused (not silently the installed stack)."""
    path = tmp_path / "freeze.txt"
    path.write_text("numpy==1.26.4\n")
    with pytest.raises(InvalidValueError, match="names none of the packages oomlab reads"):
        read_freeze_file(path)


def test_mapping_and_default() -> None:
    """estimate(versions={...}) pins through a mapping; nothing given is the installed releases."""
    assert versions_from({"transformers": "4.48.1"}).release("transformers") == (4, 48, 1)
    assert versions_from(None) is installed_versions()
    assert make_setup("llama-2-7b", gpus=1).versions == installed_versions()
    with pytest.raises(InvalidValueError, match="invalid version 4.48 for transformers in versions"):
        versions_from({"transformers": 4.48})


# the release each fact changed in, and the one just before it
BOUNDARIES = [
    (Fact.PEFT_KBIT_UPCAST, "peft", "0.3.0", "0.4.0"),
    (Fact.BNB_DROPS_SAVED_INPUT, "bitsandbytes", "0.43.1", "0.43.2"),  # commit 9e75374 (#1270)
    (Fact.LOSS_UPCASTS_LOGITS, "transformers", "4.45.2", "4.46.0"),
    (Fact.LOSS_SHIFTS_LABELS, "transformers", "4.48.3", "4.49.0"),
    (Fact.MOE_EXPERTS_3D, "transformers", "4.57.1", "5.0.0"),
    (Fact.TRAINER_FUSED_ADAMW, "transformers", "4.53.3", "4.54.0"),
    (Fact.LOAD_DTYPE_AUTO, "transformers", "4.57.1", "5.0.0"),
    (Fact.LOAD_STREAMS, "transformers", "4.57.1", "5.0.0"),
    (Fact.TRAINER_ADAMW_TORCH, "transformers", "4.31.0", "4.32.0"),  # PR #25109
    (Fact.SDPA_DEFAULT, "transformers", "4.35.2", "4.36.0"),  # PR #26572
    (Fact.TORCHAO_CHUNKED_NF4, "torchao", "0.1", "0.2.0"),  # PR #196, commit 6081796bc
    (Fact.TORCHTUNE_FROZEN_NF4, "torchtune", "0.2.1", "0.3.0"),
]


def test_every_fact_has_a_boundary_row() -> None:
    assert {row[0] for row in BOUNDARIES} == set(FACTS)


@pytest.mark.parametrize(("fact", "package", "before", "since"), BOUNDARIES, ids=[b[0].value for b in BOUNDARIES])
def test_fact_changes_at_its_release(fact: Fact, package: str, before: str, since: str) -> None:
    """The release before the change runs the old behaviour, the release itself the new one."""
    assert not applies(fact, versions_from({package: before}))
    assert applies(fact, versions_from({package: since}))
    assert fact.source  # every fact cites the file that changed


def test_a_framework_release_pins_its_torchao() -> None:
    """torchtune 0.1.x pins torchao 0.1 (unchunked NF4), 0.2.x 0.3.1; the user's own pin wins, and without torchtune
    torchao is what is installed (here: none, so the newest behaviour)."""
    old = versions_from({"torchtune": "0.1.1"})
    assert old.release("torchao") == (0, 1) and old.origin("torchao") is Origin.PINNED
    assert not applies(Fact.TORCHAO_CHUNKED_NF4, old)
    assert "torchao 0.1 (pinned by the framework)" in old.describe()
    assert versions_from({"torchtune": "0.2.0"}).release("torchao") == (0, 3, 1)
    assert versions_from({"torchtune": "0.4.0"}).origin("torchao") is not Origin.PINNED
    own = versions_from({"torchtune": "0.1.0", "torchao": "0.2.0"})
    assert own.origin("torchao") is Origin.GIVEN and applies(Fact.TORCHAO_CHUNKED_NF4, own)


def test_frameworks_run_no_peft_preparation() -> None:
    """torchtune and litgpt have their own model code: no peft upcast, the newest transformers behaviour otherwise."""
    litgpt = versions_from({"litgpt": "0.4.0", "bitsandbytes": "0.42.0"})
    assert litgpt.framework == "litgpt"
    assert not applies(Fact.PEFT_KBIT_UPCAST, litgpt) and applies(Fact.LOSS_SHIFTS_LABELS, litgpt)
    assert not applies(Fact.BNB_DROPS_SAVED_INPUT, litgpt)  # litgpt runs bitsandbytes' own MatMul4Bit
    assert installed_versions().framework == "transformers"


@pytest.mark.parametrize(("value", "shown"), [("torch==abc", "'abc'"), ("nosuchfile.txt", "'nosuchfile.txt'")])
def test_cli_bad_versions_exit_2_naming_the_value(capsys, value: str, shown: str) -> None:
    """--versions with a bad pin or a missing freeze file exits 2, the message naming the bad value."""
    with pytest.raises(SystemExit) as info:
        main(["budget", "--versions", value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --versions:" in err and shown in err


def test_versions_travel_through_the_setup_record() -> None:
    """The runner's setup record keeps the user's pins (the notebooks budget the same releases)."""
    from oomlab.launch.record import setup_of, setup_record

    s = make_setup("llama-2-7b", versions="transformers==4.31.0,bitsandbytes==0.41.1", gpus=1)
    assert setup_of(setup_record(s)).versions == s.versions


def test_pipeline_parameter_is_canonical_pins(tmp_path) -> None:
    """The pipeline's ``versions``: pins or a freeze file, validated into canonical pins; a bad one is refused."""
    from oomlab.pipeline.params import PARAMETERS

    canonical = PARAMETERS["versions"].canonical
    assert canonical("transformers==4.31.0+local, torch==2.0.1") == "torch==2.0.1,transformers==4.31.0"
    (tmp_path / "freeze.txt").write_text("peft==0.7.1\n")
    assert canonical(str(tmp_path / "freeze.txt")) == "peft==0.7.1"
    with pytest.raises(InvalidValueError, match="invalid version 'x' for peft"):
        canonical("peft==x")


@pytest.mark.parametrize(("pins", "optim"), [
    ("transformers==4.54.0,torch==2.8.0", "adamw_torch_fused"),
    ("transformers==4.54.0,torch==2.7.1", "adamw_torch"),  # the release waits for torch 2.8
    ("transformers==4.53.3,torch==2.8.0", "adamw_torch"),
])
def test_trainer_default_optimizer(pins: str, optim: str) -> None:
    from oomlab.core.versions import trainer_default_optimizer

    assert trainer_default_optimizer(parse_versions(pins)) == optim


def test_a_freeze_file_does_not_name_the_framework(tmp_path) -> None:
    """litgpt installed beside transformers says nothing of which code trains: a freeze file's litgpt is skipped (a
    Trainer launch keeps peft's preparation); --versions litgpt==X names it."""
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("litgpt==0.4.0\ntransformers==4.46.0\npeft==0.13.2\n")
    versions = versions_from(str(freeze))
    assert versions.framework == "transformers" and versions.release("litgpt") is None
    assert applies(Fact.PEFT_KBIT_UPCAST, versions)
    assert versions_from("litgpt==0.4.0").framework == "litgpt"


def test_with_given_changes_and_drops_pins() -> None:
    """An upgrade as the ladder writes it: a package given at a new release, another no longer given."""
    v = versions_from({"torchtune": "0.1.0", "torchao": "0.1"})
    up = v.with_given(torchtune=(0, 2, 0), torchao=None)
    assert up.given == (("torchtune", (0, 2, 0)),) and up.installed == v.installed
    assert up.release("torchao") == (0, 3, 1) and up.origin("torchao") is Origin.PINNED
