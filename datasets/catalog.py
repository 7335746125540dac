"""The instance catalog: machine types a plan may name, with their GPUs,
rated network and prices (DESIGN.md, Data).

The shipped catalog is ``datasets/catalog/aws-us-east-1.json`` (format
``thrifty.catalog/1``), built by ``datasets/scripts/build_catalog.py``; every
price carries its date and source. The ``local`` type is one worker process on
this host (device ``cpu``), used to run and measure plans here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from thrifty.datasets.errors import ProblemError, closest_names
from thrifty.datasets.io import read_json

__all__ = ["InstanceType", "Catalog", "load_catalog", "DEFAULT_CATALOG", "CATALOG_FORMAT"]

CATALOG_FORMAT = "thrifty.catalog/1"
DEFAULT_CATALOG = Path(__file__).parent / "catalog" / "aws-us-east-1.json"


@dataclass(frozen=True)
class InstanceType:
    """One machine type.

    `device` is the key that compute profiles use for this type's accelerator
    (``V100``, ``T4``, ``cpu``...); `gpus` is how many devices (data-parallel
    workers) one machine runs; `interconnect_gbps` the GPU-to-GPU bandwidth
    inside one machine. Prices are USD per hour; ``None`` when unknown
    (e.g. no spot market).
    """

    name: str
    gpus: int
    device: str
    gpu_memory_gib: float
    vcpus: int
    memory_gib: float
    network_gbps: float
    on_demand_usd_per_hour: float | None
    spot_usd_per_hour: float | None
    price_date: str | None = None
    price_source: str | None = None
    interconnect_gbps: float | None = None  # GPU-to-GPU within one machine (NVLink/PCIe)

    def price(self, market: str) -> float:
        """USD per hour in `market` (``on_demand`` or ``spot``)."""
        value = self.on_demand_usd_per_hour if market == "on_demand" else self.spot_usd_per_hour
        if market not in ("on_demand", "spot"):
            raise ProblemError(f"market is '{market}', but must be 'on_demand' or 'spot'")
        if value is None:
            raise ProblemError(f"the catalog has no {market} price for {self.name}")
        return value


@dataclass(frozen=True)
class Catalog:
    provider: str
    region: str
    types: dict[str, InstanceType]
    source: str
    provenance: dict[str, Any]

    def get(self, name: str) -> InstanceType:
        """The type called `name`; an unknown name lists the closest known ones."""
        try:
            return self.types[name]
        except KeyError:
            close = closest_names(name, self.types)
            hint = f"; closest known: {', '.join(close)}" if close else ""
            raise ProblemError(
                f"unknown instance type '{name}' in catalog {self.source}{hint}"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self.types


def _parse_type(row: dict[str, Any], where: str) -> InstanceType:
    try:
        return InstanceType(
            name=str(row["name"]),
            gpus=int(row["gpus"]),
            device=str(row["device"]),
            gpu_memory_gib=float(row.get("gpu_memory_gib") or 0.0),
            vcpus=int(row.get("vcpus") or 0),
            memory_gib=float(row.get("memory_gib") or 0.0),
            network_gbps=float(row["network_gbps"]),
            on_demand_usd_per_hour=_maybe_float(row.get("on_demand_usd_per_hour")),
            spot_usd_per_hour=_maybe_float(row.get("spot_usd_per_hour")),
            price_date=row.get("price_date"),
            price_source=row.get("price_source"),
            interconnect_gbps=_maybe_float(row.get("interconnect_gbps")),
        )
    except KeyError as e:
        raise ProblemError(f"is missing the field {e.args[0]!r}", path=where) from None
    except (TypeError, ValueError) as e:
        raise ProblemError(f"has a malformed field: {e}", path=where) from None


def _maybe_float(x: Any) -> float | None:
    return None if x is None else float(x)


def parse_catalog(data: dict[str, Any], source: str) -> Catalog:
    if not isinstance(data, dict) or data.get("format") != CATALOG_FORMAT:
        raise ProblemError(f"is not a thrifty catalog (format must be {CATALOG_FORMAT!r})", source=source)
    types: dict[str, InstanceType] = {}
    for i, row in enumerate(data.get("instance_types", [])):
        try:
            t = _parse_type(row, f"instance_types[{i}]")
        except ProblemError as e:
            raise ProblemError(e.message, path=e.path, source=source) from None
        types[t.name] = t
    return Catalog(
        provider=str(data.get("provider", "")),
        region=str(data.get("region", "")),
        types=types,
        source=source,
        provenance=dict(data.get("provenance", {})),
    )


@lru_cache(maxsize=8)
def _load_cached(path: str) -> Catalog:
    return parse_catalog(read_json(path), source=path)


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Load a catalog file (default: the shipped AWS us-east-1 catalog)."""
    return _load_cached(str(Path(path) if path else DEFAULT_CATALOG))
