"""The analytic budget of any setup under its trainer: the supervised step (:func:`oomlab.budget.analytic.sft_estimate`)
or, for the preference and RL trainers, that step over the sequences their forward carries plus their frozen models
(:func:`oomlab.budget.trainers.trainer_estimate`).  Every caller that budgets a user's setup -- ``check``, ``plan``'s
remedies, the explorer, the pipeline -- calls this one, so a DPO run is never budgeted as SFT."""

from __future__ import annotations

from oomlab.budget.deepspeed_config import DeepSpeedSettings
from oomlab.budget.result import BudgetResult
from oomlab.budget.trainers import trainer_estimate
from oomlab.core.setup import TrainingSetup


def estimate_setup(setup: TrainingSetup, outside_bytes: int | None = None,
                   deepspeed: DeepSpeedSettings | None = None) -> BudgetResult:
    """The analytic budget of one validated setup (``deepspeed``: DeepSpeed's knobs, for its strategies), under its
    trainer."""
    return trainer_estimate(setup, outside_bytes, deepspeed)
