"""The user-facing choices: enums whose values are what users type, and the message-format names."""

import pytest

from oomlab.core.choices import MessageFormat, Strategy, choice, message_format
from oomlab.core.errors import UnknownNameError


@pytest.mark.parametrize(
    ("name", "canonical"),
    [("old", MessageFormat.OLD), ("new", MessageFormat.NEW), ("torch>=2.1", MessageFormat.NEW),
     ("torch<=2.0", MessageFormat.OLD), (MessageFormat.NEW, MessageFormat.NEW)],
)
def test_message_format_aliases(name: str, canonical: MessageFormat) -> None:
    """Short names (usable as papermill parameter defaults, which cannot contain '=') map to the formats."""
    assert message_format(name) is canonical


def test_unknown_message_format_lists_the_names() -> None:
    """An unknown format names itself and every accepted name."""
    with pytest.raises(UnknownNameError, match=r"unknown message format 'torch-2'; known: new, old, torch<=2.0, "
                                               r"torch>=2.1"):
        message_format("torch-2")


def test_choice_accepts_values_in_any_case_and_lists_members() -> None:
    """A choice is looked up by its value (stripped, lower-cased); an unknown one lists every value."""
    assert choice(Strategy, " FSDP ", "strategy") is Strategy.FSDP
    known = "ddp, fsdp, fsdp-offload, fsdp2, fsdp2-offload, single, zero1, zero2"
    with pytest.raises(UnknownNameError, match=rf"unknown strategy 'zero9'; known: {known}"):
        choice(Strategy, "zero9", "strategy")
