"""Counted nouns and verbs in the prose oomlab writes: "1 process", "4 processes", "1 is", "2 are".

One rule in one place, so no sentence says "1 processes" or "1 are predicted".
"""

from __future__ import annotations

# Nouns whose plural is not noun + "s".
_IRREGULAR = {"process": "processes", "is": "are", "was": "were", "has": "have", "does": "do", "fits": "fit",
              "its": "their", "this": "these", "it": "they"}


def plural(noun: str) -> str:
    """The plural of ``noun`` (``"GPU"`` -> ``"GPUs"``, ``"process"`` -> ``"processes"``)."""
    if noun in _IRREGULAR:
        return _IRREGULAR[noun]
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    return noun + "s"


def count(n: int, noun: str, plural_form: str | None = None) -> str:
    """``n`` and ``noun``, the noun plural unless ``n`` is 1: ``count(1, "process")`` is ``"1 process"``."""
    return f"{n:,} {noun if n == 1 else (plural_form or plural(noun))}"


def agree(n: int, word: str) -> str:
    """``word`` (a verb or determiner given in the singular) agreeing with ``n``: ``agree(2, "is")`` is ``"are"``."""
    return word if n == 1 else plural(word)
