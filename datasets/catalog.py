"""The instance catalog: machine types a plan may name, with their GPUs,
rated network and prices (docs/architecture.md, "Problem files and data").

The shipped catalog is ``datasets/catalog/aws-us-east-1.json`` (format
``thrifty.catalog/1``, schema `CatalogFile`; its fields are described in
``datasets/catalog/README.md``), built by ``datasets/scripts/build_catalog.py``;
every price carries its date and source. The ``local`` type is one worker
process on this host (device ``cpu``), used to run and measure plans here.

A `CatalogFile` (rows: `InstanceTypeRow`) is the schema of the file; a
`Catalog` is its types by name, each an `InstanceType`, with the file it came
from. `InstanceType` stays a frozen dataclass: the solver's inner loops read
its fields (about 80,000 times for one of the Srifty example problems), and a
pydantic model's attribute reads are twice as slow.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from thrifty.core.errors import ProblemError, closest_names
from thrifty.core.io import memo_by_file, read_json
from thrifty.core.validation import FieldPathError, FileSchema, validate_model

__all__ = ["HOST_WORKER_SOURCE", "HOST_WORKER_TYPE",
           "InstanceType", "InstanceTypeRow", "CatalogProvenance", "CatalogFile", "Catalog", "parse_catalog_file",
           "parse_catalog", "load_catalog", "DEFAULT_CATALOG", "CATALOG_FORMAT"]

CATALOG_FORMAT = "thrifty.catalog/1"
DEFAULT_CATALOG = Path(__file__).parent / "catalog" / "aws-us-east-1.json"

Name = Annotated[str, Field(min_length=1)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
UsdPerHour = Annotated[float, Field(ge=0, allow_inf_nan=False, description="USD per hour; null when unknown")]


def _null_as_zero(value: Any) -> Any:
    """A host figure the catalog does not know (null) reads as 0, as it always has."""
    return 0 if value is None else value


HostFigure = BeforeValidator(_null_as_zero)

HOST_WORKER_SOURCE = "local"  # hardware_source of a type whose machines are worker processes of this host
HOST_WORKER_TYPE = "local"  # the shipped catalog's such type: what the shipped probes and profiles measured


@dataclass(frozen=True)
class InstanceType:
    """One machine type, as the solver and the simulators read it.

    `host_worker`: a machine of this type is one worker process of the host
    thrifty runs on (``hardware_source: "local"`` in the catalog: ``local``,
    and the demo's priced ``local-a``, ``local-b``): every such type shares
    this host's cores and its loopback allreduce, whatever its name.

    `device` is the key that compute profiles use for this type's accelerator
    (``V100``, ``T4``, ``cpu``...); `gpus` is how many devices (data-parallel
    workers) one machine runs; `interconnect_gbps` the GPU-to-GPU bandwidth
    inside one machine. Prices are USD per hour; ``None`` when unknown
    (e.g. no spot market). Built from a checked `InstanceTypeRow`.
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
    network_baseline_gbps: float | None = None  # sustained network of an "Up to N Gigabit" type (AWS baseline)
    host_worker: bool = False  # one worker process of the host thrifty runs on (catalog hardware_source "local")

    def price(self, market: str) -> float:
        """USD per hour in `market` (``on_demand`` or ``spot``)."""
        value = self.on_demand_usd_per_hour if market == "on_demand" else self.spot_usd_per_hour
        if market not in ("on_demand", "spot"):
            raise ProblemError(f"market is '{market}', but must be 'on_demand' or 'spot'")
        if value is None:
            raise ProblemError(f"the catalog has no {market} price for {self.name}")
        return value


class InstanceTypeRow(FileSchema):
    """A row of a catalog file: the fields of `InstanceType`, then the ones
    that record where its figures came from (thrifty does not read those)."""

    name: Name
    gpus: Annotated[int, Field(gt=0, description="devices per machine: the data-parallel workers it runs")]
    device: Annotated[str, Field(min_length=1, description="the key compute profiles use: V100, T4, cpu...")]
    gpu_model: str | None = None
    gpu_memory_gib: Annotated[NonNegative, HostFigure, Field(description="memory per GPU")] = 0.0
    vcpus: Annotated[int, Field(ge=0), HostFigure] = 0
    memory_gib: Annotated[NonNegative, HostFigure] = 0.0
    network_gbps: Annotated[Positive, Field(description="rated network, Gbit/s ('Up to N Gigabit' -> N)")]
    network_rating: str | None = None
    interconnect_gbps: Annotated[Positive, Field(description="GPU-to-GPU in one machine, Gbit/s per GPU per "
                                                             "direction")] | None = None
    on_demand_usd_per_hour: UsdPerHour | None = None
    spot_usd_per_hour: UsdPerHour | None = None
    price_date: str | None = None
    price_source: str | None = None
    gpu_memory_total_gib: NonNegative | None = None
    network_baseline_gbps: NonNegative | None = None
    interconnect: str | None = None
    interconnect_source: str | None = None
    hardware_source: str | None = None
    offered_in_region: bool | None = None
    on_demand_price_source: str | None = None
    spot_price_date: str | None = None
    spot_price_source: str | None = None
    spot_observations_usd_per_hour: dict[str, NonNegative] | None = None
    spot_usd_per_hour_srifty2022: NonNegative | None = None
    notes: list[str] | None = None

    def instance_type(self) -> InstanceType:
        own = {f.name: getattr(self, f.name) for f in fields(InstanceType) if f.name != "host_worker"}
        return InstanceType(**own, host_worker=self.hardware_source == HOST_WORKER_SOURCE)


class CatalogProvenance(FileSchema):
    """Where a catalog came from: the script or command that built it, its
    inputs and, for published figures, the full citation of every source key
    the rows use (`sources`)."""

    kind: Literal["measured", "published", "derived"]
    command: str | None = None
    source: str | None = None
    script: str | None = None
    date: str | None = None
    region: str | None = None
    inputs: list[str] | str | None = None
    sources: dict[str, str] | None = None
    notes: list[str] | str | None = None

    @model_validator(mode="after")
    def _says_where(self) -> "CatalogProvenance":
        if not (self.script or self.command or self.source or self.sources):
            raise ValueError("a catalog must say where it came from: its script, command or source")
        return self


class CatalogFile(FileSchema):
    """An instance catalog file (format ``thrifty.catalog/1``)."""

    format: Literal["thrifty.catalog/1"]
    provider: Name
    region: Name
    provenance: CatalogProvenance
    instance_types: Annotated[list[InstanceTypeRow], Field(min_length=1)]

    @model_validator(mode="after")
    def _names_are_unique(self) -> "CatalogFile":
        first: dict[str, int] = {}
        for i, t in enumerate(self.instance_types):
            if t.name in first:
                raise FieldPathError(("instance_types", i, "name"),
                                     f"is '{t.name}', which instance_types[{first[t.name]}] already names")
            first[t.name] = i
        return self


@dataclass(frozen=True)
class Catalog:
    """The types of a catalog by name; `source` is the file (or a label)."""

    provider: str
    region: str
    types: dict[str, InstanceType]
    source: str
    provenance: dict[str, Any]

    @classmethod
    def from_file(cls, file: CatalogFile, source: str) -> "Catalog":
        return cls(provider=file.provider, region=file.region,
                   types={row.name: row.instance_type() for row in file.instance_types},
                   source=source, provenance=file.provenance.to_json())

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


def parse_catalog_file(data: Any, source: str) -> CatalogFile:
    """Check catalog data (parsed JSON) against `CatalogFile`; an error names
    the JSON path of the bad field (``instance_types[3].network_gbps``)."""
    return validate_model(CatalogFile, data, source=source)


def parse_catalog(data: Any, source: str) -> Catalog:
    return Catalog.from_file(parse_catalog_file(data, source), source)


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Load a catalog file (default: the shipped AWS us-east-1 catalog),
    read once while the file is unchanged (`memo_by_file`)."""
    source = str(Path(path) if path else DEFAULT_CATALOG)
    return memo_by_file("catalog", source, lambda: parse_catalog(read_json(source), source=source))
