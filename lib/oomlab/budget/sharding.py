"""One rule: the per-GPU share of each model-state category, by strategy.

A strategy either keeps a category whole on every GPU (a replica), divides it over the data-parallel ranks
(ZeRO / FSDP sharding: Rajbhandari et al. 2020, sec. 5 -- stage 1 the optimizer state, stage 2 + gradients,
stage 3 + parameters), or keeps it on the host (offload).  Every per-GPU model-state figure reads :data:`SHARES`:
:func:`per_gpu` divides the totals for the PyTorch strategies (:mod:`.states`); DeepSpeed's budget takes each
category's cell through :func:`oomlab.budget.deepspeed.zero_shares` and counts the bytes with DeepSpeed's own
alignment and padding (:mod:`.deepspeed_layout`).

A cell says what one GPU holds in the optimizer step, with the gradients complete.  Moments before it can differ,
and those are phase rules, kept in the phase modules: ZeRO-1 holds its gradient partition at the step, but without
``overlap_comm`` it reduces only in backward's epilogue, so every half gradient is alive at the end of autograd's
backward (``stage_1_and_2.py:2290-2295``; :func:`oomlab.budget.deepspeed.zero_states`); FSDP holds one layer's gathered
parameters and unsharded gradients inside that layer (:mod:`.fsdp`).
"""

from __future__ import annotations

import enum

from oomlab.budget.result import MemCategory
from oomlab.core.choices import Strategy
from oomlab.core.setup import TrainingSetup
from oomlab.core.units import ceil_div


class Share(enum.Enum):
    """How much of a category one GPU holds."""

    WHOLE = "whole"  # every GPU holds all of it
    SHARDED = "sharded"  # each of the world_size ranks holds 1/world_size (rounded up)
    HOST = "host"  # offloaded: nothing on the GPU


_W, _G, _M, _O = (MemCategory.WEIGHTS, MemCategory.GRADIENTS, MemCategory.MASTER_WEIGHTS,
                  MemCategory.OPTIMIZER_STATE)
_REPLICA = {_W: Share.WHOLE, _G: Share.WHOLE, _M: Share.WHOLE, _O: Share.WHOLE}

SHARES: dict[Strategy, dict[MemCategory, Share]] = {
    Strategy.SINGLE: _REPLICA,
    Strategy.DDP: _REPLICA,
    # ZeRO-1's gradients: the partition DeepSpeedZeroOptimizer keeps for the step (averaged_gradients), not a replica
    Strategy.ZERO1: {_W: Share.WHOLE, _G: Share.SHARDED, _M: Share.SHARDED, _O: Share.SHARDED},
    Strategy.ZERO2: {_W: Share.WHOLE, _G: Share.SHARDED, _M: Share.SHARDED, _O: Share.SHARDED},
    Strategy.FSDP: {_W: Share.SHARDED, _G: Share.SHARDED, _M: Share.SHARDED, _O: Share.SHARDED},
    Strategy.FSDP_OFFLOAD: {_W: Share.HOST, _G: Share.HOST, _M: Share.HOST, _O: Share.HOST},
    Strategy.FSDP2: {_W: Share.SHARDED, _G: Share.SHARDED, _M: Share.SHARDED, _O: Share.SHARDED},
    Strategy.FSDP2_OFFLOAD: {_W: Share.HOST, _G: Share.HOST, _M: Share.HOST, _O: Share.HOST},
    Strategy.ZERO3: {_W: Share.SHARDED, _G: Share.SHARDED, _M: Share.SHARDED, _O: Share.SHARDED},
    # offload_optimizer: the fp32 master, fp32 gradient partition and optimizer state on the host; the half replica
    # (ZeRO-2) or, with offload_param, the half partitions too (ZeRO-3) -- see oomlab.budget.deepspeed
    Strategy.ZERO2_OFFLOAD: {_W: Share.WHOLE, _G: Share.HOST, _M: Share.HOST, _O: Share.HOST},
    Strategy.ZERO3_OFFLOAD: {_W: Share.HOST, _G: Share.HOST, _M: Share.HOST, _O: Share.HOST},
}


def share(setup: TrainingSetup, category: MemCategory) -> Share:
    """The setup's strategy's cell for ``category``."""
    return SHARES[setup.strategy][category]


def per_gpu(setup: TrainingSetup, category: MemCategory, total_bytes: int) -> int:
    """Bytes of ``category`` on one GPU, out of ``total_bytes`` for the whole (unsharded) model."""
    how = SHARES[setup.strategy][category]
    if how is Share.WHOLE:
        return total_bytes
    if how is Share.SHARDED:
        return ceil_div(total_bytes, setup.world_size)
    return 0
