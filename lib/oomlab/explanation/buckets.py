"""Gradient buckets: DDP's (torch/nn/parallel/distributed.py with the C++ Reducer) and DeepSpeed's reduce buckets.

DDP (``bucket_cap_mb`` 25 MiB by default, ``_DEFAULT_FIRST_BUCKET_BYTES`` 1 MiB): unless ``find_unused_parameters``
or a static graph is asked for, ``_ddp_init_helper`` first puts every parameter in one bucket (``bucket_size_limits =
[sys.maxsize]``), so constructing DDP allocates one flat gradient buffer of the whole model in the parameters' dtype.
After the first backward the Reducer rebuilds its buckets in the order the gradients became ready, a first bucket of
1 MiB then 25 MiB each: a bucket closes once its gradients reach the cap, so it holds whole parameters and ends at
or above it.  The rebuilt buckets are allocated in the next forward (``_pre_forward`` → ``_rebuild_buckets``).

DeepSpeed ZeRO (``deepspeed/runtime/zero/stage_1_and_2.py`` ``setup_buckets``; stage 3's ipg buffer): one flat
buffer of ``reduce_bucket_size`` elements (two with ``overlap_comm``) in the half dtype, or fp32 when gradients
accumulate in fp32, allocated at the first backward: DeepSpeed's default 5e8 elements, or hidden_size² where the
Trainer's integration fills in ``"auto"``.
"""

from __future__ import annotations

from collections.abc import Iterator

from oomlab.core.choices import Strategy
from oomlab.core.units import MiB, format_size
from oomlab.explanation.aggregate import ZERO, Aggregate, AggregateKind, ParameterInventory, count_text
from oomlab.explanation.phase import PhaseCode

DDP_BUCKET_CAP_BYTES = 25 * MiB  # torch/nn/parallel/distributed.py _DEFAULT_BUCKET_CAP_MB
DDP_FIRST_BUCKET_BYTES = 1 * MiB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DEEPSPEED_REDUCE_BUCKET_SIZE = 500_000_000  # deepspeed/runtime/zero/config.py reduce_bucket_size = pp_int(5e8)
DDP = frozenset({Strategy.DDP})


def ddp_bucket_sizes(numels: tuple[int, ...], itemsize: int) -> list[tuple[int, tuple[int, ...]]]:
    """DDP's rebuilt buckets as ``(bytes, parameter indices)``: the parameters in ``numels``' order, the first bucket
    closed at 1 MiB, every later one at 25 MiB (``compute_bucket_assignment_by_size``: a bucket closes once its size
    reaches the cap).  NB: the rebuilt order is the order gradients became ready in the first backward; the reverse of
    registration order stands in for it."""
    buckets: list[tuple[int, tuple[int, ...]]] = []
    size, members = 0, []
    for index, numel in enumerate(numels):
        members.append(index)
        size += numel * itemsize
        if size >= (DDP_FIRST_BUCKET_BYTES if not buckets else DDP_BUCKET_CAP_BYTES):
            buckets.append((size, tuple(members)))
            size, members = 0, []
    if members:
        buckets.append((size, tuple(members)))
    return buckets


def _role(name: str) -> str:
    """A parameter's name with its layer index as N: ``model.layers.N.mlp.up_proj.weight``."""
    parts = name.split(".")
    return ".".join("N" if p.isdigit() else p for p in parts)


def _closed(position: int, nbytes: int) -> str:
    if position == 0:
        return "the first bucket, closed past 1 MiB"
    return "closed past the 25 MiB cap" if nbytes >= DDP_BUCKET_CAP_BYTES else "the last bucket, under the cap"


def ddp_buckets(inv: ParameterInventory) -> Iterator[Aggregate]:
    """DDP's first bucket (every parameter) and each distinct size of its rebuilt 25 MiB buckets, in fp32 and half."""
    order = tuple(reversed(range(inv.count)))
    for itemsize, dtype in ((4, "fp32"), (2, "half")):
        whole = inv.total * itemsize
        yield Aggregate(
            kind=AggregateKind.DDP_BUCKET, what=f"DDP's first gradient bucket, every parameter in {dtype}",
            arithmetic=f"{count_text(inv.total)} parameters × {itemsize} bytes = {format_size(whole)}", nbytes=whole,
            span=(whole, whole), where="DistributedDataParallel(model): _ddp_init_helper puts every parameter in one "
            "bucket until the first backward, and the Reducer allocates its flat gradient buffer "
            "(torch/nn/parallel/distributed.py)", phases=frozenset(), strategies=DDP)
        sizes: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
        for position, (nbytes, members) in enumerate(ddp_bucket_sizes(tuple(inv.numels[i] for i in order), itemsize)):
            sizes.setdefault(nbytes, []).append((position, tuple(order[m] for m in members)))
        for nbytes, groups in sizes.items():
            first, params = groups[0]
            names = [_role(inv.names[i]) for i in params]
            held = (" + ".join(names) if len(names) <= 3 else
                    f"{len(names)} parameters, {names[0]} … {names[-1]}")
            count = f"{len(groups)} such buckets" if len(groups) > 1 else "one bucket"
            yield Aggregate(
                kind=AggregateKind.DDP_BUCKET,
                what=f"a DDP gradient bucket in {dtype} ({count}; {held})",
                arithmetic=(f"{count_text(sum(inv.numels[i] for i in params))} gradients × {itemsize} bytes = "
                            f"{format_size(nbytes)} ({_closed(first, nbytes)})"),
                nbytes=nbytes, span=(nbytes, nbytes),
                where="DDP's rebuilt buckets (bucket_cap_mb 25), allocated in the forward after the first backward "
                "(_pre_forward → Reducer._rebuild_buckets; torch/nn/parallel/distributed.py)",
                phases=frozenset({PhaseCode.FORWARD}), strategies=DDP)


def reduce_buckets(inv: ParameterInventory) -> Iterator[Aggregate]:
    """DeepSpeed's reduce bucket at its default size and at the Trainer's ``"auto"`` (hidden_size²), half and fp32."""
    h2 = inv.hidden_size * inv.hidden_size
    for elements, why in ((DEEPSPEED_REDUCE_BUCKET_SIZE, "reduce_bucket_size 5e8, DeepSpeed's default"),
                          (h2, f"reduce_bucket_size {inv.hidden_size}² = hidden_size², the Trainer's \"auto\"")):
        for itemsize, dtype in ((2, "half"), (4, "fp32")):
            nbytes = elements * itemsize
            yield Aggregate(
                kind=AggregateKind.REDUCE_BUCKET, what=f"DeepSpeed's reduce bucket in {dtype} ({why})",
                arithmetic=f"{elements:,} elements × {itemsize} bytes = {format_size(nbytes)}", nbytes=nbytes,
                span=(nbytes, nbytes), where="ZeRO's setup_buckets: torch.empty(reduce_bucket_size) at the first "
                "backward, two with overlap_comm (deepspeed/runtime/zero/stage_1_and_2.py; stage3.py's ipg buffer)",
                phases=frozenset({PhaseCode.BACKWARD}), strategies=ZERO)
