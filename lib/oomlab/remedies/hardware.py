"""Which GPUs would it fit: every GPU type oomlab knows × 1, 2, 4, 8 GPUs (and whole nodes), the best remedy that
fits each, priced from a dated list-price table, ranked the cheapest per token, the fastest, the fewest GPUs, and the
pareto front of cost against speed.

Each row is the fastest sound remedy of the plan's grid (:attr:`oomlab.remedies.plan.Plan.fastest`) on that
hardware -- "what would train this model, and how fast", not the fix of the user's own run (the ladder's,
:attr:`~oomlab.remedies.plan.Plan.fix`, which keeps what the user chose): the plan's
grid (:func:`~oomlab.remedies.plan.plan_grid`) restricted to the configurations it could recommend (no harmful
caveat, launch files written), ranked by the plan's own key (:func:`~oomlab.remedies.plan.rank_key`) and chosen by
its own rule (:func:`~oomlab.remedies.plan.recommend`: the fastest, or one about as fast with much more headroom).
The search is exact and quick because throughput never falls as the micro-batch grows: each candidate's tokens/s at
the throughput cap (no memory budget needed) bounds what it can reach, so candidates are budgeted best bound first and
the search stops once no bound can come within the speed uncertainty of the fastest found.  The winner is then
budgeted in full (:func:`evaluate_remedy`: the largest micro-batch up to 4096, the longest sequence).

Cost per million training tokens = the row's $/hour (list price: the cheapest listed instance with exactly that many
GPUs, times the nodes; else that many GPU-hours at the cheapest listed $/GPU-hour, said so) / (tokens/s × 3600) × 1e6.
NB: list prices, not quotes; tokens/s is the plan's estimate with its stated assumptions (MFU, links, no overlap).

Limitations: rows are independent (no mixed GPU types); host RAM is each row's assumed machine
(:func:`oomlab.core.prices.assumed_host_ram`) unless the user gives it; GPU-to-GPU traffic is costed over each GPU's
host link as the plan does (NVLink is not credited), so multi-GPU tokens/s are lower bounds.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from oomlab.core.choices import Method, Optimizer, Precision, Route, choice
from oomlab.core.errors import InvalidValueError
from oomlab.core.gpus import GPUSpec, known_gpus, load_gpu
from oomlab.core.memo import BoundedMemo
from oomlab.core.models import ModelSpec, load_model
from oomlab.core.prices import (
    HOST_RAM_AUTO,
    PriceTable,
    RowPrice,
    assumed_host_ram,
    load_prices,
    resolve_host_ram,
    row_price,
)
from oomlab.core.search import largest_true
from oomlab.core.setup import MAX_GPUS_PER_NODE, MAX_NODES, TrainingSetup, make_setup
from oomlab.remedies.peak_floor import Floor, PeakFloors
from oomlab.remedies.placement import DeviceMapPlacement
from oomlab.remedies.plan import HEADROOM_GAIN, Candidate, fold_label_twins, plan_grid, rank_key, recommend
from oomlab.remedies.remedy import Evaluation, Evaluator, Remedy, caveats, evaluate_remedy, reason, remedy_name
from oomlab.remedies.throughput import DEFAULT_ASSUMPTIONS, Assumptions, describe_assumptions, step_time
from oomlab.remedies.twins import twin_key

__all__ = ["DEFAULT_COUNTS", "HardwareOption", "HardwareSearch", "gpu_counts", "search_hardware"]

DEFAULT_COUNTS = (1, 2, 4, 8)  # GPUs per node searched by default (--max-gpus 8)


@dataclass(frozen=True)
class HardwareOption:
    """One GPU type × count (× nodes): the best remedy that fits, or why none does, and what it costs."""

    gpu: str
    display_name: str
    gpus: int  # per node
    nodes: int
    host_ram_bytes: int  # per node, as budgeted
    host_ram_source: str  # where the host RAM figure comes from
    remedy: Remedy | None  # the plan's recommendation on this hardware; None when nothing it could recommend fits
    reason: str  # why it fits, or why nothing does (the closest candidate)
    candidates: int  # configurations the plan could recommend here
    budgeted: int  # of which the search reached before the speed bound stopped it (each budgeted, or shown not to
    # fit by its floor, :mod:`oomlab.remedies.peak_floor`)
    price: RowPrice | None  # None: the price table lists no instance with this GPU
    gpu_capacity_bytes: int

    @property
    def world_size(self) -> int:
        return self.gpus * self.nodes

    @property
    def label(self) -> str:
        """``8 × a100-80gb`` (``2 nodes × 8 × h100-80gb``)."""
        nodes = f"{self.nodes} nodes × " if self.nodes > 1 else ""
        return f"{nodes}{self.gpus} × {self.gpu}"

    @property
    def fits(self) -> bool:
        return self.remedy is not None

    @property
    def tokens_per_s(self) -> float | None:
        return None if self.remedy is None else self.remedy.tokens_per_s

    @property
    def usd_per_million_tokens(self) -> float | None:
        """Dollars per million training tokens at the list price; None when nothing fits or no price is listed."""
        if self.remedy is None or self.price is None or not self.remedy.tokens_per_s:
            return None
        return self.price.usd_per_hour / (self.remedy.tokens_per_s * 3600.0) * 1e6

    def to_dict(self) -> dict[str, Any]:
        r = self.remedy
        return {"gpu": self.gpu, "display_name": self.display_name, "gpus": self.gpus, "nodes": self.nodes,
                "label": self.label, "world_size": self.world_size, "gpu_capacity_bytes": self.gpu_capacity_bytes,
                "host_ram_bytes": self.host_ram_bytes, "host_ram_source": self.host_ram_source, "fits": self.fits,
                "reason": self.reason, "candidates": self.candidates, "budgeted": self.budgeted,
                "remedy": None if r is None else r.to_dict(),
                "per_gpu_peak_bytes": None if r is None else r.per_gpu_peak_bytes,
                "headroom_bytes": None if r is None else r.headroom_bytes,
                "max_batch": None if r is None else r.max_batch, "tokens_per_s": self.tokens_per_s,
                "usd_per_hour": None if self.price is None else self.price.usd_per_hour,
                "price_basis": None if self.price is None else self.price.basis,
                "price_source": None if self.price is None else self.price.instance.source,
                "price_date": None if self.price is None else self.price.instance.date,
                "usd_per_million_tokens": self.usd_per_million_tokens,
                "price": None if self.price is None else self.price.to_dict()}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> HardwareOption:
        """The inverse of :meth:`to_dict` (the remedy without its setup and step time: for display from results
        JSON)."""
        remedy, price = raw["remedy"], raw["price"]
        return cls(gpu=raw["gpu"], display_name=raw["display_name"], gpus=int(raw["gpus"]), nodes=int(raw["nodes"]),
                   host_ram_bytes=int(raw["host_ram_bytes"]), host_ram_source=raw["host_ram_source"],
                   remedy=None if remedy is None else Remedy.from_dict(remedy), reason=raw["reason"],
                   candidates=int(raw["candidates"]), budgeted=int(raw["budgeted"]),
                   price=None if price is None else RowPrice.from_dict(price),
                   gpu_capacity_bytes=int(raw["gpu_capacity_bytes"]))


@dataclass(frozen=True)
class HardwareSearch:
    """Every searched row for one model and its methods, and the rankings over the rows that fit."""

    model: str
    methods: tuple[Method, ...]
    seq: int
    lora_rank: int
    options: tuple[HardwareOption, ...]  # GPU types as given (default: name order), then nodes, then GPUs per node
    prices_source: str
    assumptions: tuple[str, ...]
    # wall time of the search; None when rebuilt from JSON: a timing is not a result (two identical runs write
    # identical results), so :meth:`to_dict` leaves it out
    seconds: float | None = field(default=None, compare=False)

    @property
    def fitting(self) -> tuple[HardwareOption, ...]:
        return tuple(o for o in self.options if o.fits)

    @property
    def priced(self) -> tuple[HardwareOption, ...]:
        return tuple(o for o in self.fitting if o.usd_per_million_tokens is not None)

    @property
    def cheapest(self) -> HardwareOption | None:
        """The lowest list-price cost per million training tokens that fits."""
        return min(self.priced, key=lambda o: (o.usd_per_million_tokens, o.world_size, o.label), default=None)

    @property
    def fastest(self) -> HardwareOption | None:
        """The most estimated tokens per second that fits."""
        return max(self.fitting, key=lambda o: (o.tokens_per_s, -o.world_size, o.label), default=None)

    @property
    def fewest_gpus(self) -> HardwareOption | None:
        """The fewest GPUs that fit; among those, the cheapest per token (unpriced last), then the fastest."""
        inf = float("inf")
        return min(self.fitting, key=lambda o: (o.world_size, o.usd_per_million_tokens or inf, -(o.tokens_per_s or 0),
                                                o.label), default=None)

    @property
    def pareto(self) -> tuple[HardwareOption, ...]:
        """The priced rows no other row beats on both cost per token and tokens/s, cheapest first."""
        rows = self.priced
        front = [o for o in rows if not any(_dominates(p, o) for p in rows)]
        return tuple(sorted(front, key=lambda o: (o.usd_per_million_tokens, o.label)))

    def to_dict(self) -> dict[str, Any]:
        def label(o: HardwareOption | None) -> str | None:
            return None if o is None else o.label

        return {"model": self.model, "methods": [m.value for m in self.methods], "seq": self.seq,
                "lora_rank": self.lora_rank, "options": [o.to_dict() for o in self.options],
                "cheapest": label(self.cheapest), "fastest": label(self.fastest),
                "fewest_gpus": label(self.fewest_gpus), "pareto": [o.label for o in self.pareto],
                "prices_source": self.prices_source, "assumptions": list(self.assumptions)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> HardwareSearch:
        """The inverse of :meth:`to_dict` (the rankings are recomputed from the rows, as the properties they are)."""
        return cls(model=raw["model"], methods=tuple(Method(m) for m in raw["methods"]), seq=int(raw["seq"]),
                   lora_rank=int(raw["lora_rank"]), options=tuple(HardwareOption.from_dict(o) for o in raw["options"]),
                   prices_source=raw["prices_source"], assumptions=tuple(raw["assumptions"]))


def _dominates(p: HardwareOption, o: HardwareOption) -> bool:
    pc, oc = p.usd_per_million_tokens, o.usd_per_million_tokens
    pt, ot = p.tokens_per_s or 0.0, o.tokens_per_s or 0.0
    return pc <= oc and pt >= ot and (pc < oc or pt > ot)


def gpu_counts(max_gpus: int = DEFAULT_COUNTS[-1]) -> tuple[int, ...]:
    """GPUs per node searched: the powers of two up to ``max_gpus``, and ``max_gpus`` itself."""
    return _powers_of_two_to("max_gpus", max_gpus, MAX_GPUS_PER_NODE)


def _check_count(name: str, n: Any, ceiling: int) -> None:
    """``n`` must be an integer from 1 to ``ceiling`` (a count of GPUs or nodes)."""
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= ceiling:
        raise InvalidValueError(f"invalid {name} {n!r}; must be an integer from 1 to {ceiling}")


def _powers_of_two_to(name: str, top: int, ceiling: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``top``, and ``top`` itself; ``top`` must be an integer from 1 to ``ceiling``."""
    _check_count(name, top, ceiling)
    counts = [1]
    while counts[-1] * 2 <= top:
        counts.append(counts[-1] * 2)
    return tuple(counts) if counts[-1] == top else (*counts, top)


def _closest(reached: Sequence[tuple[Evaluation | Floor, Candidate]], n_candidates: int, host_ram_bytes: int,
             evaluator: Evaluator) -> str:
    """Why nothing fits: the candidate closest to fitting (fits the GPUs if any does, else the smallest peak; the first
    reached among equals).  A candidate skipped by its floor is budgeted when its floor could make it the closest
    (a floor's key is never above its budget's: branch and bound, exact)."""
    if not n_candidates:
        return "nothing the plan could recommend runs on this hardware (every configuration is dropped)"
    rows = list(reached)
    while True:
        i = min(range(len(rows)), key=lambda j: (_closeness(rows[j][0], rows[j][1]), j))
        got, c = rows[i]
        if isinstance(got, Evaluation):
            break
        rows[i] = (evaluator(c.setup, route=c.route), c)
    name = remedy_name(c.route, c.strategy, c.method, c.precision, c.optimizer, c.checkpointing, c.setup.lora_rank)
    return f"none of {n_candidates} configurations fits; the closest, {name}: {reason(got, c.setup, host_ram_bytes)}"


def _closeness(got: Evaluation | Floor, c: Candidate) -> tuple[bool, int]:
    """How far from fitting: (misses the GPUs, per-GPU peak); of a floor, a lower bound of its budget's."""
    if isinstance(got, Evaluation):
        return not got.gpu_fits, got.per_gpu_peak_bytes
    return got.peak_bytes > c.setup.gpu.total_memory_bytes, got.peak_bytes


class _MemoEvaluator(Evaluator):
    """The plan's evaluator, remembering each process-per-GPU evaluation: the winners' full budgets
    (:func:`evaluate_remedy`) repeat the micro-batches the search already budgeted; each is also recorded in the
    search's ``floors`` (for the other GPU types)."""

    def __init__(self, host_ram_bytes: int, outside_bytes: int | None, floors: PeakFloors | None = None) -> None:
        super().__init__(host_ram_bytes, outside_bytes)
        self._seen: dict[tuple, Evaluation] = {}
        self._floors = floors

    def __call__(self, setup: TrainingSetup, placement: DeviceMapPlacement | None = None,
                 route: Route = Route.PROCESS_PER_GPU) -> Evaluation:
        if placement is not None or route is not Route.PROCESS_PER_GPU:
            return super().__call__(setup, placement, route)
        if setup not in self._seen:
            ev = self._seen[setup] = super().__call__(setup, placement, route)
            if self._floors is not None:
                self._floors.record(setup, ev.result)
        return self._seen[setup]

    def cannot_fit(self, setup: TrainingSetup, route: Route, batch: int | None = None) -> Floor | None:
        """The floor of ``setup`` (at micro-batch ``batch``) when it shows the setup cannot fit, else None (unknown, or
        it might fit: budget it)."""
        if self._floors is None or route is not Route.PROCESS_PER_GPU:
            return None
        floor = self._floors.floor(setup, batch)
        return None if floor is None or floor.fits(setup.gpu, self.host_ram_bytes) else floor


def _sound_axes(spec: ModelSpec, gpu: GPUSpec) -> tuple[tuple[Precision, ...], tuple[Optimizer, ...]]:
    """The precisions and the optimizers without a harmful caveat (:func:`caveats` of an fp32 AdamW setup with
    each changed), so the grid skips what the plan would never recommend before validating it.

    NB: assumes harm comes from the precision or the optimizer alone, as :func:`caveats` says today; the candidates
    are still checked whole (:attr:`Candidate.may_recommend`)."""
    probe = make_setup(gpus=1, model=spec, gpu=gpu, precision=Precision.FP32, optimizer=Optimizer.ADAMW)
    precisions = tuple(p for p in Precision if not any(c.harmful for c in caveats(replace(probe, precision=p))))
    optimizers = tuple(o for o in Optimizer
                       if o.remedy and not any(c.harmful for c in caveats(replace(probe, optimizer=o))))
    return precisions, optimizers


def best_on(spec: ModelSpec, gpu: GPUSpec, gpus: int, nodes: int, host_ram_bytes: int, *, seq: int,
            methods: tuple[Method, ...], attention: str = "sdpa", lora_rank: int = 8,
            assumptions: Assumptions = DEFAULT_ASSUMPTIONS,
            outside_bytes: int | None = None, floors: PeakFloors | None = None) -> tuple[Remedy | None, str, int, int]:
    """The plan's recommendation on ``nodes`` × ``gpus`` × ``gpu`` (the remedy, or None with the reason), with the
    number of candidates and of those the search reached: branch and bound on the tokens/s each could reach.

    ``floors``: the search's budgets so far (:class:`~oomlab.remedies.peak_floor.PeakFloors`, filled here too): a
    candidate whose floor on this GPU cannot fit is not budgeted (counted as reached); None budgets every candidate
    reached (the reference the tests compare with)."""
    precisions, optimizers = _sound_axes(spec, gpu)
    # the device-map route writes no launch files, so the plan never recommends it (Candidate.may_recommend)
    cands = [c for c in plan_grid(spec, gpu, gpus, nodes, batch=1, seq=seq, attention=attention,
                                  lora_rank=lora_rank, methods=methods, precisions=precisions,
                                  optimizers=optimizers, routes=(Route.PROCESS_PER_GPU,)) if _may_recommend(c)]
    cap = assumptions.throughput_batch_cap
    bounded = []
    for i, c in enumerate(cands):
        bound = step_time(c.setup, assumptions, c.route, batch=cap).tokens_per_s
        bounded.append((rank_key(True, True, bound, c.optimizer, 0)[2], bound, i, c))
    bounded.sort(key=lambda t: (t[0], t[2]))  # best bound first, then the plan's order
    evaluator = _MemoEvaluator(host_ram_bytes, outside_bytes, floors)
    # recommend() may prefer a remedy within speed_uncertainty of the fastest for its headroom: budget every candidate
    # that could be that close (NB: 0.995 covers the fastest's rounding to 3 significant figures)
    keep = (1 - assumptions.speed_uncertainty) * 0.995
    found: list[tuple[tuple, Candidate, Evaluation, float]] = []
    reached: list[tuple[Evaluation | Floor, Candidate]] = []  # budgeted, or shown by its floor not to fit
    fastest = 0.0  # the fastest found's tokens/s, to 3 significant figures (its rank key's)
    for _neg, bound, i, c in bounded:
        if found and bound < fastest * keep:
            break  # no candidate left can come within the uncertainty of the fastest found
        floor = evaluator.cannot_fit(c.setup, c.route)
        if floor is not None:
            reached.append((floor, c))
            continue
        ev = evaluator(c.setup, route=c.route)
        reached.append((ev, c))
        if not ev.fits:
            continue
        placement, known = ev.placement, {1: True}

        def fits_batch(b: int, c: Candidate = c, placement: Any = placement, known: dict = known) -> bool:
            if b not in known:
                known[b] = evaluator.cannot_fit(c.setup, c.route, b) is None and \
                    evaluator(replace(c.setup, batch=b), placement, c.route).fits
            return known[b]

        b = cap if fits_batch(cap) else largest_true(fits_batch, 1, cap)
        tps = bound if b == cap else step_time(c.setup, assumptions, c.route, batch=b).tokens_per_s
        found.append(((*rank_key(True, True, tps, c.optimizer, ev.per_gpu_peak_bytes), i), c, ev, tps))
        fastest = max(fastest, -found[-1][0][2])
    if not found:
        return None, _closest(reached, len(cands), host_ram_bytes, evaluator), len(cands), len(reached)
    found.sort(key=lambda f: f[0])  # the plan's order (its sort is stable over the grid's order)
    _key, _c, best_ev, best_tps = found[0]
    gain = HEADROOM_GAIN * gpu.total_memory_bytes
    # what recommend() can choose: the fastest, or one about as fast with that much more headroom; budgeted in full
    # with their label twins (same figures, another label), folded as the plan folds them
    rivals = [found[0]] + [f for f in found[1:] if f[3] >= best_tps * (1 - assumptions.speed_uncertainty)
                           and f[2].headroom_bytes - best_ev.headroom_bytes >= gain]
    if len(rivals) > 1:  # recommend() takes the most headroom among them: only those can be chosen (tested against
        most = max(f[2].headroom_bytes for f in rivals[1:])  # make_plan's recommendation)
        rivals = rivals[:1] + [f for f in rivals[1:] if f[2].headroom_bytes == most]
    groups = {_twin_key(f) for f in rivals}
    remedies = [evaluate_remedy(c.setup, host_ram_bytes, route=c.route, assumptions=assumptions, evaluator=evaluator,
                                search_seq=False)  # the table shows no length: its search would be wasted
                for f in found if _twin_key(f) in groups for c in (f[1],)]
    folded = tuple(fold_label_twins(remedies, gpu.bf16))
    remedy = recommend(folded, assumptions.speed_uncertainty)[0] or folded[0]
    return remedy, remedy.reason, len(cands), len(reached)


# whether the plan could recommend a candidate reads nothing of the GPU (launch files, caveats): once per twin
_RECOMMENDABLE: BoundedMemo[tuple, bool] = BoundedMemo()


def _may_recommend(c: Candidate) -> bool:
    """:attr:`Candidate.may_recommend`, remembered for its twins on the other GPU types (:mod:`.twins`)."""
    if c.setup is None:
        return False
    key = (c.route, twin_key(c.setup))
    found = _RECOMMENDABLE.get(key)
    if found is None:
        found = _RECOMMENDABLE[key] = c.may_recommend
    return found


def _twin_key(f: tuple[tuple, Candidate, Evaluation, float]) -> tuple:
    """What label twins share (:func:`~oomlab.remedies.plan.fold_label_twins` compares every figure; these suffice to
    gather every possible twin)."""
    key, c, ev, _tps = f
    return c.route, c.strategy, c.method, c.checkpointing, key[2], ev.per_gpu_peak_bytes


def search_hardware(
    model: str | ModelSpec = "llama-13b",
    methods: Iterable[str | Method] | None = None,
    *,
    gpus: Iterable[str] | None = None,
    max_gpus: int = DEFAULT_COUNTS[-1],
    nodes: Iterable[int] = (1,),
    seq: int = 2048,
    host_ram: str | int | None = None,
    prices: PriceTable | str | None = None,
    attention: str = "sdpa",
    lora_rank: int = 8,
    assumptions: Assumptions = DEFAULT_ASSUMPTIONS,
    outside_bytes: int | None = None,
    use_floors: bool = True,
) -> HardwareSearch:
    """For every GPU type (``gpus``: default every shipped one) × 1, 2, 4, ... ``max_gpus`` per node (× each of
    ``nodes``; more than one node is searched with full nodes of ``max_gpus``), the plan's best remedy that fits.

    ``methods``: the methods the plan may choose (default all); ``host_ram``: host RAM per node for every row
    (default or ``"auto"``: each row's assumed machine, :func:`oomlab.core.prices.assumed_host_ram`); ``prices``: a
    :class:`PriceTable` or the path of the user's JSON table (default: the shipped dated list prices);
    ``use_floors``: skip the candidates another GPU type's budget shows cannot fit (:mod:`.peak_floor`; the same
    answer, faster), False to budget every candidate the search reaches.
    """
    start = time.perf_counter()
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    chosen = tuple(dict.fromkeys(choice(Method, m, "method") for m in (methods or tuple(Method))))
    gpu_specs = tuple(load_gpu(g) for g in (known_gpus() if gpus is None else gpus))
    counts = gpu_counts(max_gpus)
    searched_nodes = tuple(dict.fromkeys(nodes))
    for n in searched_nodes:
        _check_count("nodes", n, MAX_NODES)
    if not searched_nodes:
        raise InvalidValueError("no node counts given; give at least one, e.g. nodes=(1,)")
    if seq > spec.max_position_embeddings:
        raise InvalidValueError(f"invalid seq {seq}; {spec.name} has max_position_embeddings "
                                f"{spec.max_position_embeddings}: use a sequence length up to that")
    auto = host_ram is None or (isinstance(host_ram, str) and host_ram.strip().lower() == HOST_RAM_AUTO)
    given_host = None if auto else resolve_host_ram(host_ram, "", 0).host_ram_bytes
    table = prices if isinstance(prices, PriceTable) else load_prices(prices)
    floors = PeakFloors() if use_floors else None
    rows = [(gpu, n_nodes, count) for gpu in gpu_specs for n_nodes in searched_nodes
            for count in (counts if n_nodes == 1 else (max_gpus,))]
    options: dict[int, HardwareOption] = {}  # by row, as shown
    # searched the largest GPUs first (then as given): their budgets reach few candidates, each a floor that lets the
    # smaller GPUs skip many (the answer is the same in any order, test_any_gpu_unchanged); shown as given
    for k in sorted(range(len(rows)), key=lambda k: (-rows[k][0].total_memory_bytes, k)):
        gpu, n_nodes, count = rows[k]
        if given_host is not None:
            host, host_source = given_host, "given"
        else:
            assumed = assumed_host_ram(gpu.name, count, table)
            host, host_source = assumed.host_ram_bytes, f"assumed: {assumed.source}"
        remedy, why, n_cands, n_budgeted = best_on(
            spec, gpu, count, n_nodes, host, seq=seq, methods=chosen, attention=attention,
            lora_rank=lora_rank, assumptions=assumptions, outside_bytes=outside_bytes,
            floors=floors)
        options[k] = HardwareOption(
            gpu=gpu.name, display_name=gpu.display_name, gpus=count, nodes=n_nodes, host_ram_bytes=host,
            host_ram_source=host_source, remedy=remedy, reason=why, candidates=n_cands,
            budgeted=n_budgeted, price=row_price(table, gpu.name, count, n_nodes),
            gpu_capacity_bytes=gpu.total_memory_bytes)
    said = describe_assumptions(gpu_specs[0], assumptions)[1:] if gpu_specs else []
    notes = (f"cost per million training tokens at {table.source}: a dated list price, not a quote",
             "each row: the plan's recommendation on that hardware (no harmful caveat, launch files written)",
             *said)
    return HardwareSearch(model=spec.name, methods=chosen, seq=seq, lora_rank=lora_rank,
                          options=tuple(options[k] for k in range(len(rows))),
                          prices_source=table.source, assumptions=notes, seconds=time.perf_counter() - start)


def node_counts(max_nodes: int = 1) -> tuple[int, ...]:
    """Node counts searched: 1, 2, 4, ... up to ``max_nodes``, and ``max_nodes`` itself."""
    return _powers_of_two_to("nodes", max_nodes, MAX_NODES)
