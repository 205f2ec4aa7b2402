"""A setup without its GPU: the key under which the hardware search (:mod:`oomlab.remedies.hardware`) remembers what
no GPU type changes -- a candidate's FLOPs and bytes moved (:mod:`.throughput`), whether the plan could recommend it
(:attr:`~oomlab.remedies.plan.Candidate.may_recommend`) -- so each is worked out once per search, not once per GPU type.

Twins are setups equal in every field but the GPU.  What is remembered under this key must read nothing of the GPU;
the tests recompute it on every GPU type and compare (``tests/remedies/test_twins.py``).
"""

from __future__ import annotations

from dataclasses import fields
from operator import attrgetter

from oomlab.core.setup import TrainingSetup

__all__ = ["twin_key"]

_ALL_BUT_GPU = attrgetter(*(f.name for f in fields(TrainingSetup) if f.name != "gpu"))


def twin_key(setup: TrainingSetup) -> tuple:
    """Every field of ``setup`` but its GPU (the micro-batch included): equal for twins, and only for twins."""
    return _ALL_BUT_GPU(setup)
