"""axolotl's ``chunked_cross_entropy`` (oomlab.launch.axolotl): its example YAML (tests/fixtures/axolotl, v0.18.0)
with the key as axolotl's support matrix spells it, read into ``setup.loss`` with its origin."""

from pathlib import Path

import pytest

from oomlab.core.choices import Loss
from oomlab.core.errors import OomlabError
from oomlab.launch.read import LaunchInputs
from oomlab.launch.resolve import read_launch

FIXTURE = Path(__file__).parents[1] / "fixtures" / "axolotl"
YAML = FIXTURE / "qlora.yml"
CCE_PLUGIN = "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"


def _read(tmp_path: Path, extra: str, command: str = "axolotl train {yaml}"):
    yaml = tmp_path / "qlora.yml"
    yaml.write_text(YAML.read_text() + extra)
    lines = yaml.read_text().count("\n")
    launch = read_launch(LaunchInputs(command=command.format(yaml=yaml), model="llama-3.1-8b", gpu="a100-80gb",
                                      gpus=1))
    return launch, yaml, lines


def test_chunked_cross_entropy_sets_the_compiled_chunked_loss(tmp_path: Path) -> None:
    """``chunked_cross_entropy: true`` (docs/support-matrix.qmd:114) is the loss compiled per chunk over the whole
    logits, from the YAML's line."""
    launch, yaml, lines = _read(tmp_path, "chunked_cross_entropy: true\n")
    assert launch.setup.loss is Loss.CHUNKED_LOSS_COMPILED
    assert str(launch.fields["loss"].origin) == f"{yaml}:{lines} chunked_cross_entropy"


def test_the_example_alone_keeps_transformers_loss(tmp_path: Path) -> None:
    """The example without the key (or with it false) budgets transformers' loss."""
    assert _read(tmp_path, "")[0].setup.loss is Loss.STANDARD
    assert _read(tmp_path, "chunked_cross_entropy: false\n")[0].setup.loss is Loss.STANDARD


def test_the_chunk_count_is_noted_not_budgeted(tmp_path: Path) -> None:
    """``chunked_cross_entropy_num_chunks`` is listed with why it does not move the budget."""
    launch, _, _ = _read(tmp_path, "chunked_cross_entropy: true\nchunked_cross_entropy_num_chunks: 16\n")
    assert launch.setup.loss is Loss.CHUNKED_LOSS_COMPILED
    noted = [u for u in launch.unmodelled if "chunked_cross_entropy_num_chunks" in str(u)]
    assert len(noted) == 1 and "at any count" in noted[0].why


def test_with_cut_cross_entropy_both_are_named(tmp_path: Path) -> None:
    """axolotl refuses chunked_cross_entropy beside Cut Cross-Entropy (integrations/cut_cross_entropy/args.py:46-54);
    the read names both lines."""
    text = f"plugins:\n  - {CCE_PLUGIN}\ncut_cross_entropy: true\nchunked_cross_entropy: true\n"
    with pytest.raises(OomlabError, match="chunked_cross_entropy") as err:
        _read(tmp_path, text)
    assert "cut_cross_entropy" in str(err.value)
