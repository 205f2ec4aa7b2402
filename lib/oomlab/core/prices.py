"""Cloud GPU prices: dated on-demand list prices per instance (``specs/prices.json``), or a table the user passes.

Each price is one row of a provider's catalog snapshot (SkyPilot's catalog CSVs, commit in ``source``), with its
date as far as it is known: a list price, not a quote. ``usd_per_gpu_hour`` is the instance price split evenly over
its GPUs; :func:`row_price` prices a row of hardware (GPUs per node x nodes) from the table.  A user's own table
has the same shape: ``{"instances": [{"provider", "instance", "gpu",
"gpus_per_instance", "usd_per_hour", ...}, ...]}``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from oomlab.core.errors import InvalidValueError
from oomlab.core.gpus import known_gpus
from oomlab.core.paths import SPECS_DIR
from oomlab.core.seed import SEED_GPU, SEED_GPUS
from oomlab.core.units import check_host_ram, format_size, parse_memory_size
from oomlab.core.user_input import load_user_json, read_user_text, shown

PRICES_JSON = SPECS_DIR / "prices.json"
REQUIRED = ("provider", "instance", "gpu", "gpus_per_instance", "usd_per_hour")


@dataclass(frozen=True)
class InstancePrice:
    """One cloud instance type: its GPUs, host RAM and on-demand list price."""

    provider: str
    instance: str
    gpu: str  # an oomlab GPU spec name (t4, a100-80gb, ...)
    gpus_per_instance: int
    usd_per_hour: float
    region: str
    host_ram_bytes: int | None  # None when the catalog does not say (or says something unreliable)
    source: str
    date: str

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.usd_per_hour / self.gpus_per_instance

    @property
    def label(self) -> str:
        return f"{self.provider} {self.instance}"

    def host_text(self, gpu: str) -> str:
        """The instance as the host-RAM sentences name it: ``aws g4dn.12xlarge (4 x t4)``."""
        return f"{self.label} ({self.gpus_per_instance} x {gpu})"

    @property
    def host_size(self) -> str:
        return format_size(self.host_ram_bytes or 0)

    def to_dict(self) -> dict[str, Any]:
        """The instance as a price table lists it (:meth:`from_dict` reads it back)."""
        return {"provider": self.provider, "instance": self.instance, "gpu": self.gpu,
                "gpus_per_instance": self.gpus_per_instance, "usd_per_hour": self.usd_per_hour, "region": self.region,
                "host_ram_bytes": self.host_ram_bytes, "source": self.source, "date": self.date}

    @classmethod
    def from_dict(cls, raw: Any, where: str = "a results JSON") -> InstancePrice:
        """An instance from its :meth:`to_dict` (or a price table's row), checked as a table's rows are."""
        return _instance(raw, where, 0)


@dataclass(frozen=True)
class PriceTable:
    """Every instance of a table, and where the table came from."""

    instances: tuple[InstancePrice, ...]
    source: str  # "oomlab's shipped list prices (...)" or the user's file

    def for_gpu(self, gpu: str) -> tuple[InstancePrice, ...]:
        return tuple(i for i in self.instances if i.gpu == gpu)

    def cheapest_per_gpu_hour(self, gpu: str) -> InstancePrice | None:
        """The instance with the lowest price per GPU-hour for ``gpu`` (None when the table has none)."""
        rows = self.for_gpu(gpu)
        return min(rows, key=lambda i: (i.usd_per_gpu_hour, i.label)) if rows else None

    def host_for(self, gpu: str, gpus: int) -> InstancePrice | None:
        """The instance a node of ``gpus`` x ``gpu`` most likely is: the one with exactly that many GPUs and a
        stated host RAM, cheapest first (None when no such instance is listed)."""
        rows = [i for i in self.for_gpu(gpu) if i.gpus_per_instance == gpus and i.host_ram_bytes]
        return min(rows, key=lambda i: (i.usd_per_hour, i.label)) if rows else None


MAX_GPUS_PER_INSTANCE = 64  # the largest cloud instances carry 8 or 16 GPUs
MAX_USD_PER_HOUR = 10_000.0  # the dearest listed instance costs about $100/hour
MAX_TEXT_CHARS = 500  # a provider, instance, region, source URL or date


def _instance(raw: Any, where: str, index: int) -> InstancePrice:
    """One row of a table, every field checked: names as short strings, counts and prices finite and in range."""
    row = f"{where}: instance {index}"
    if not isinstance(raw, dict):
        raise InvalidValueError(f"{row} must be an object with {', '.join(REQUIRED)}; got {shown(raw)}")
    missing = [k for k in REQUIRED if k not in raw]
    if missing:
        raise InvalidValueError(f"{row} lacks {', '.join(missing)}")
    gpus, price = raw["gpus_per_instance"], raw["usd_per_hour"]
    if not isinstance(gpus, int) or isinstance(gpus, bool) or not 1 <= gpus <= MAX_GPUS_PER_INSTANCE:
        raise InvalidValueError(f"{row} has gpus_per_instance {shown(gpus)}; must be an integer from 1 to "
                                f"{MAX_GPUS_PER_INSTANCE}")
    if not isinstance(price, int | float) or isinstance(price, bool) or not 0 < price <= MAX_USD_PER_HOUR:
        raise InvalidValueError(f"{row} has usd_per_hour {shown(price)}; must be a finite number of dollars > 0 and "
                                f"at most {MAX_USD_PER_HOUR:,.0f}")
    reliable = raw.get("host_ram_reliable", True)
    if not isinstance(reliable, bool):
        raise InvalidValueError(f"{row} has host_ram_reliable {shown(reliable)}; must be true or false")
    host = raw.get("host_ram_bytes")
    if host is not None:
        if isinstance(host, bool) or not isinstance(host, int | float) or not math.isfinite(host) \
                or host != int(host):
            raise InvalidValueError(f"{row} has host_ram_bytes {shown(host)}; must be a whole number of bytes "
                                    f"(or null when unknown), e.g. {192 * 2**30}")
        check_host_ram(int(host), f"{row}'s host_ram_bytes", host)
    texts = {key: raw.get(key, default) for key, default in (
        ("provider", ""), ("instance", ""), ("gpu", ""), ("region", ""), ("source", where), ("date", "undated"))}
    for key, value in texts.items():
        if not isinstance(value, str) or len(value) > MAX_TEXT_CHARS:
            raise InvalidValueError(f"{row} has {key} {shown(value)}; must be a string of at most "
                                    f"{MAX_TEXT_CHARS} characters")
    return InstancePrice(
        provider=texts["provider"], instance=texts["instance"], gpu=texts["gpu"], gpus_per_instance=gpus,
        usd_per_hour=float(price), region=texts["region"], host_ram_bytes=int(host) if host and reliable else None,
        source=texts["source"], date=texts["date"],
    )


@dataclass(frozen=True)
class RowPrice:
    """What one row of hardware (``gpus`` x ``gpu`` per node, ``nodes`` nodes) costs per hour, and from which listed
    instance."""

    usd_per_hour: float  # every GPU of the row together
    instance: InstancePrice
    basis: str  # how the price was made from the listed instance

    def to_dict(self) -> dict[str, Any]:
        return {"usd_per_hour": self.usd_per_hour, "instance": self.instance.to_dict(), "basis": self.basis}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RowPrice:
        """The inverse of :meth:`to_dict`."""
        return cls(float(raw["usd_per_hour"]), InstancePrice.from_dict(raw["instance"]), str(raw["basis"]))


def row_price(table: PriceTable, gpu: str, gpus: int, nodes: int) -> RowPrice | None:
    """The row's $/hour: the cheapest listed instance with exactly ``gpus`` GPUs, once per node; else ``gpus`` x
    ``nodes`` GPU-hours at the cheapest listed $/GPU-hour (None when the table lists no instance with this GPU)."""
    exact = [i for i in table.for_gpu(gpu) if i.gpus_per_instance == gpus]
    times = f"{nodes} × " if nodes > 1 else ""
    if exact:
        inst = min(exact, key=lambda i: (i.usd_per_hour, i.label))
        return RowPrice(nodes * inst.usd_per_hour, inst,
                        f"{times}{inst.label} at ${inst.usd_per_hour:.2f}/h (list price, {inst.date})")
    inst = table.cheapest_per_gpu_hour(gpu)
    if inst is None:
        return None
    n = gpus * nodes
    return RowPrice(n * inst.usd_per_gpu_hour, inst,
                    f"{n} GPU-hours at ${inst.usd_per_gpu_hour:.2f} ({inst.label}, {inst.gpus_per_instance} GPUs; "
                    f"no {gpus}-GPU instance listed; list price, {inst.date})")


def load_prices(path: str | os.PathLike[str] | None = None) -> PriceTable:
    """The shipped table, or the user's JSON file at ``path``; GPUs oomlab does not know are left out (a
    table's ``a10`` is not an ``a10g``)."""
    if path is None:
        return _shipped()
    return _read(Path(path), f"price table {shown(str(path))}")


@cache
def _shipped() -> PriceTable:
    return _read(PRICES_JSON, "oomlab's shipped list prices")


def _read(path: Path, where: str) -> PriceTable:
    """A price table, read within :mod:`oomlab.core.user_input`'s bounds (a regular file of a few MiB, UTF-8, JSON
    without NaN or infinities)."""
    text = read_user_text(path, "price table")
    try:
        raw = load_user_json(text, where)
    except json.JSONDecodeError as err:
        raise InvalidValueError(f"{where} is not valid JSON: line {err.lineno}: {err.msg}") from err
    if not isinstance(raw, dict) or not isinstance(raw.get("instances"), list):
        raise InvalidValueError(f"{where} must be an object with a list 'instances' ({{\"instances\": [{{\"provider\": "
                                "..., \"instance\": ..., \"gpu\": ..., \"gpus_per_instance\": ..., \"usd_per_hour\": "
                                "...}, ...]}})")
    known = set(known_gpus())
    rows = tuple(r for r in (_instance(x, where, i) for i, x in enumerate(raw["instances"])) if r.gpu in known)
    source = where if path != PRICES_JSON else (
        "on-demand list prices from SkyPilot's catalog snapshots (" + raw.get("_source_date", "undated") + ")")
    return PriceTable(rows, source)


HOST_RAM_AUTO = "auto"  # the host_ram value that asks for the assumed host RAM of the GPUs' machine


@dataclass(frozen=True)
class HostRam:
    """Host RAM per node: given by the user, or assumed from the instance that carries these GPUs."""

    host_ram_bytes: int
    source: str  # one sentence: where the figure comes from
    assumed: bool  # True unless the user gave it

    @property
    def text(self) -> str:
        if not self.assumed:
            return f"host RAM {format_size(self.host_ram_bytes)} per node (given)"
        return (f"host RAM {format_size(self.host_ram_bytes)} per node (an assumption: {self.source}; set host_ram to "
                "your machine's)")


def assumed_host_ram(gpu: str, gpus: int, table: PriceTable | None = None) -> HostRam:
    """The host RAM of the machine most likely behind ``gpus`` x ``gpu``: the listed instance with exactly that many
    GPUs (:meth:`PriceTable.host_for`), else the smallest listed one with more of them, else the seed's machine."""
    table = table or load_prices()
    where = "specs/prices.json" if table is _shipped() else table.source
    found = table.host_for(gpu, gpus)
    if found is not None and found.host_ram_bytes:
        return HostRam(found.host_ram_bytes, f"{found.host_text(gpu)} has {found.host_size}, in {where}", True)
    bigger = [i for i in table.for_gpu(gpu) if i.gpus_per_instance > gpus and i.host_ram_bytes]
    if bigger:
        i = min(bigger, key=lambda i: (i.gpus_per_instance, i.usd_per_hour, i.label))
        return HostRam(i.host_ram_bytes or 0, f"no {gpus} x {gpu} instance is listed; the smallest with more, "
                                              f"{i.host_text(gpu)}, has {i.host_size}, in {where}", True)
    seed = seed_instance()
    return HostRam(seed.host_ram_bytes, f"no {gpu} instance is listed in the price table; {seed_machine_text()}",
                   True)


def seed_machine_text(sentence: bool = True) -> str:
    """The fallback host in words, read from the shipped table: as a sentence ("oomlab's fallback machine, an aws
    g4dn.12xlarge (4 x t4), has 192.00 GiB, in specs/prices.json") or as a name for help texts ("oomlab's fallback
    machine, an aws g4dn.12xlarge (4 x t4, 192.00 GiB)"). Said without "the seed": a user of another case never
    read the seed report."""
    seed = seed_instance()
    if sentence:
        return f"oomlab's fallback machine, an {seed.host_text(SEED_GPU)}, has {seed.host_size}, in specs/prices.json"
    return f"oomlab's fallback machine, an {seed.label} ({seed.gpus_per_instance} x {SEED_GPU}, {seed.host_size})"


@cache
def seed_instance() -> InstancePrice:
    """The seed's machine in the shipped table (4 x T4: AWS g4dn.12xlarge), the fallback host of any GPU not listed."""
    found = _shipped().host_for(SEED_GPU, SEED_GPUS)
    if found is None or not found.host_ram_bytes:
        raise InvalidValueError(f"specs/prices.json lists no {SEED_GPUS} x {SEED_GPU} instance with its host RAM "
                                "(the seed's machine, the fallback host)")
    return found


def resolve_host_ram(host_ram: str | int | None, gpu: str, gpus: int) -> HostRam:
    """``host_ram`` as given (a size with its unit, or an integer of bytes), or, for ``None`` / ``"auto"``,
    :func:`assumed_host_ram`."""
    if host_ram is None or (isinstance(host_ram, str) and host_ram.strip().lower() == HOST_RAM_AUTO):
        return assumed_host_ram(gpu, gpus)
    given = check_host_ram(host_ram) if isinstance(host_ram, int) and not isinstance(host_ram, bool) \
        else parse_memory_size(host_ram)
    return HostRam(given, "given", False)
