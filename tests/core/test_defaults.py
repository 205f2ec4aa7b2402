"""One set of defaults and one rule for the launch a world size implies (core.defaults)."""

from __future__ import annotations

import pytest

from oomlab.core.choices import Strategy
from oomlab.core.defaults import DEFAULTS, launch_strategy
from oomlab.core.errors import UnknownNameError


@pytest.mark.parametrize(("given", "world", "expected"), [
    (None, 4, Strategy.DDP), (None, 1, Strategy.SINGLE), ("ddp", 1, Strategy.SINGLE), ("ddp", 2, Strategy.DDP),
    (Strategy.FSDP, 1, Strategy.FSDP), ("zero3", 8, Strategy.ZERO3), ("single", 1, Strategy.SINGLE),
])
def test_launch_strategy(given, world: int, expected: Strategy) -> None:
    assert launch_strategy(given, world) is expected


def test_launch_strategy_names_the_choices() -> None:
    with pytest.raises(UnknownNameError, match="ddp"):
        launch_strategy("dpp", 2)


def test_defaults_are_the_seeds_case() -> None:
    assert (DEFAULTS.model, DEFAULTS.gpu, DEFAULTS.gpus, DEFAULTS.dtype) == ("llama-13b", "t4", 4, "float16")
