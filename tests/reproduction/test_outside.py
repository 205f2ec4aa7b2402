"""The seed's outside-PyTorch figure ships as data (so the analytic path imports no torch): re-derived here."""

from oomlab.core.seed import SEED_OUTSIDE_BYTES
from oomlab.core.units import format_size
from oomlab.reproduction.outside import seed_outside_bytes
from oomlab.reproduction.walk import derive_seed_outside_bytes


def test_shipped_seed_outside_equals_the_walks_derivation():
    """The shipped figure is what the unlimited walk of the seed's model derives from the seed's message."""
    assert derive_seed_outside_bytes() == SEED_OUTSIDE_BYTES == seed_outside_bytes()
    assert format_size(SEED_OUTSIDE_BYTES) == "561.00 MiB"
