"""oomlab.explanation.aggregate: the tolerance rule (span meets the request range; exact at the nominal size) and the
arithmetic's wording."""

import pytest

from oomlab.core.units import MiB
from oomlab.explanation.aggregate import Aggregate, AggregateKind, count_text, layer_of
from oomlab.explanation.printed import printed_size
from oomlab.explanation.request import request_range

REQUEST = request_range(printed_size("136.00", "MiB"))  # (134 MiB, 136 MiB]


def _agg(nbytes: int, span: tuple[int, int]) -> Aggregate:
    return Aggregate(kind=AggregateKind.WHOLE_COPY, what="x", arithmetic="x", nbytes=nbytes, span=span, where="x",
                     phases=frozenset())


@pytest.mark.parametrize(
    ("nbytes", "span", "matches", "exact"),
    [
        (135 * MiB, (135 * MiB, 135 * MiB), True, True),  # inside: its segment is 136 MiB
        (136 * MiB, (136 * MiB, 136 * MiB), True, True),  # the top of the range: a segment of its own size
        (134 * MiB, (134 * MiB, 134 * MiB), False, False),  # the bottom is open: 134 MiB has a 134 MiB segment
        (133 * MiB, (133 * MiB, 135 * MiB), True, False),  # nominal outside, span reaching in: within, not exact
        (140 * MiB, (137 * MiB, 141 * MiB), False, False),  # span entirely above
    ],
)
def test_matches_and_exact(nbytes: int, span: tuple[int, int], matches: bool, exact: bool) -> None:
    """Matches when the span meets the request range; exact when the nominal size lies in it."""
    a = _agg(nbytes, span)
    assert (a.matches(REQUEST), a.exact(REQUEST)) == (matches, exact)


@pytest.mark.parametrize(
    ("n", "text"),
    [(7_000_559_616, "7.00B"), (6_738_415_616, "6.74B"), (13_015_864_320, "13.0B"), (70_553_706_496, "70.6B"),
     (202_383_360, "202M"), (10_554_240, "10.6M"), (4096, "4.10K"), (999, "999")],
)
def test_count_text(n: int, text: str) -> None:
    """Three significant figures with B, M or K."""
    assert count_text(n) == text


def test_layer_of() -> None:
    assert (layer_of("model.layers.23.mlp.up_proj.weight"), layer_of("transformer.h.4.attn.weight"),
            layer_of("lm_head.weight")) == (23, 4, None)
