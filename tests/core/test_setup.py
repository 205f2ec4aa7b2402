"""Tests for oomlab.core.setup: the LoRA rank is bounded by the model's hidden size, before any work."""

from __future__ import annotations

import subprocess
import sys

import pytest

from oomlab.core.errors import InvalidValueError
from oomlab.core.models import load_model
from oomlab.core.setup import make_setup

HIDDEN_13B = 5120  # llama-13b's hidden_size


def test_llama_13b_hidden_size() -> None:
    assert load_model("llama-13b").hidden_size == HIDDEN_13B


@pytest.mark.parametrize("method", ["lora", "qlora", "full"])  # full too: the plan builds LoRA remedies from it
def test_rank_above_the_hidden_size_is_refused(method: str) -> None:
    """Rank 5121 on a 5120-wide model is refused, naming the rank, the hidden size and the accepted range."""
    with pytest.raises(InvalidValueError) as err:
        make_setup("llama-13b", "t4", method=method, lora_rank=HIDDEN_13B + 1, gpus=1)
    assert str(err.value) == (
        f"invalid LoRA rank {HIDDEN_13B + 1}; llama-13b has hidden size {HIDDEN_13B}: use a rank from 1 to "
        f"{HIDDEN_13B} (a larger rank adds more parameters than the full weight matrix it adapts)")


@pytest.mark.parametrize("rank", [1, 8, HIDDEN_13B])  # the hidden size itself is the largest accepted
def test_rank_up_to_the_hidden_size_is_accepted(rank: int) -> None:
    assert make_setup("llama-13b", "t4", method="lora", lora_rank=rank, gpus=1).lora_rank == rank


def test_rank_zero_is_refused() -> None:
    with pytest.raises(InvalidValueError, match="invalid LoRA rank 0; must be >= 1"):
        make_setup("llama-13b", "t4", method="lora", lora_rank=0, gpus=1)


@pytest.mark.parametrize("command", [["budget", "--method", "lora"], ["plan"]])
def test_cli_refuses_a_huge_rank_with_exit_2(command: list[str]) -> None:
    """The CLI exits 2 with the message, quickly (before any search), for budget and plan alike."""
    proc = subprocess.run([sys.executable, "-m", "oomlab", *command, "--model", "llama-13b", "--gpu", "t4",
                           "--lora-rank", "100000"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "invalid LoRA rank 100000; llama-13b has hidden size 5120" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_run_refuses_a_huge_rank_before_any_notebook(tmp_path) -> None:
    """`run -p lora_rank=...` is refused by the parameter check, before notebook 01 starts."""
    from oomlab.pipeline.params import validate_params

    with pytest.raises(InvalidValueError, match="parameter 'lora_rank' 5121 exceeds llama-13b's hidden size 5120"):
        validate_params({"lora_rank": "5121"})
    assert validate_params({"lora_rank": "5120"})["lora_rank"] == 5120
