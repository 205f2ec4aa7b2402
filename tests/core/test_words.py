"""Tests for oomlab.core.words: counted nouns and agreeing verbs."""

import pytest

from oomlab.core.words import agree, count, plural


@pytest.mark.parametrize(
    ("n", "noun", "expected"),
    [
        (1, "process", "1 process"),  # the bug the report had: "1 processes"
        (4, "process", "4 processes"),
        (0, "GPU", "0 GPUs"),  # zero takes the plural
        (1, "GPU", "1 GPU"),
        (2, "machine", "2 machines"),
        (1_000, "setup", "1,000 setups"),
        (3, "batch", "3 batches"),
    ],
)
def test_count(n: int, noun: str, expected: str) -> None:
    """The noun is singular for exactly 1, plural otherwise."""
    assert count(n, noun) == expected


def test_count_with_an_explicit_plural() -> None:
    """An irregular plural can be given."""
    assert count(2, "child", "children") == "2 children" and count(1, "child", "children") == "1 child"


@pytest.mark.parametrize(("n", "word", "expected"), [(1, "is", "is"), (2, "is", "are"), (0, "is", "are"),
                                                     (1, "fits", "fits"), (3, "fits", "fit")])
def test_agree(n: int, word: str, expected: str) -> None:
    """Verbs agree with the count."""
    assert agree(n, word) == expected


def test_plural_of_gpu() -> None:
    assert plural("GPU") == "GPUs"
