"""A *derived* allreduce model of cloud GPU instance types: a ring alpha-beta
model whose parameters come from published measurements and vendor
documentation, not from probes (issue 18). The shipped file is
``datasets/allreduce/cloud-derived-model.json`` (format
``thrifty.cloud_allreduce_model/1``, schema `CloudAllreduceModelFile`, printed
by ``thrifty schema cloud-allreduce-model``), written by
``datasets/scripts/derive_cloud_allreduce.py``; every parameter there names its
sources (URLs, and the rows of ``datasets/allreduce/cloud-sources.md``).

What it computes, for an allreduce of ``s`` bytes on ``n`` workers spread over
``N`` machines of a type with ``g`` GPUs each (NCCL ring, Srifty 4.2's bus
bandwidth)::

    t(s)     = alpha + 2 (n - 1) / n * s / beta
    busbw(s) = 2 s (n - 1) / (n t(s)),        b_cap = beta

    across machines (N >= 2):
      B_node   = network_baseline_gbps if given (an "Up to" type), else network_gbps
      B_used   = min(B_node, per_flow_cap_gbps * sockets_per_peer)
      beta     = min(eta * B_used / 8 GB/s, host_cap),  and min(that, beta_intra) when g > 1
      alpha    = max(inter_latency_floor_s, 2 (n - 1) * inter_step_latency_s)
    within one machine (N = 1):
      beta     = beta_intra = intra_efficiency * interconnect_gbps / 8 GB/s
      alpha    = 2 (n - 1) * intra_step_latency_s

A ring moves the same bytes over every hop, so the slowest link class (the
network, or NVLink/PCIe inside a machine) bounds ``beta``. Concurrent transfers
of one machine share ``beta`` (Srifty 4.3's ``b_cap``); a mixed cluster is
bounded by its slowest type (the simulator takes the minimum over types).

Where each part comes from (the file's ``parameters`` hold the citations):

- sourced: the per-flow cap of AWS (5 Gbit/s outside a cluster placement
  group) and NCCL's 16 TCP sockets per peer on AWS ENA (NCCL source code), so
  the per-flow cap does not bind with NCCL's defaults; the baseline bandwidth of
  "Up to" types (AWS documentation) and that the burst lasts only 5-60 minutes,
  shorter than a training job; the host cap of 4.7 GB/s, the only published
  NCCL-over-TCP busbw on AWS (p3dn, one GPU per machine, NCCL 2.4.8); NCCL
  2.4.8's 6 us per ring step; the 150 us small-message floor measured across
  p3dn machines (EFA) and the 60 us measured inside one 8-GPU p3dn (from which
  the per-step latency inside a machine is derived); the PCIe efficiency
  (pinned host copies at 90 of 126 Gbit/s on p3dn).
- **assumptions**: the TCP efficiency ``eta`` = 0.8 (no published NCCL-over-TCP
  figure exists for g3, g4dn or p3 at 25 Gbit/s or less); that TCP is no faster
  than EFA for small messages (the latency floor); that a ring inside a
  machine reaches the PCIe copy efficiency on NVLink too, with GPU peer
  access (no intra-machine busbw of V100, T4 or M60 machines was found); that
  the host cap does not grow with GPUs per machine (a maintainer says it does,
  by an amount nobody published).

Types it answers: the devices of ``parameters.devices`` (GPU types whose
machines talk TCP over ENA), with an ``interconnect_gbps`` when they have
more than one GPU. Others (``local``, CPU types, A100/H100 machines whose
network is EFA with GPUDirect RDMA) go to the fallback (by default the
analytic ring `AnalyticAllreduce`), and ``source(itype)`` says so.

The schema checks the file; `DerivedCloudAllreduce` is the model in the form
the simulators query: a frozen dataclass of floats, no pydantic on the
prediction path. An error in the file names its JSON path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from thrifty.datasets.catalog import InstanceType
from thrifty.core.io import read_json
from thrifty.core.validation import FieldPathError, FileSchema, validate_model
from thrifty.perfmodels.bandwidth import AnalyticAllreduce, BandwidthModel, allreduce_time, bus_bandwidth_from_time
from thrifty.perfmodels.profile import Provenance
from thrifty.perfmodels.provenance import FigureSource, display_path

__all__ = [
    "CLOUD_MODEL_FORMAT",
    "CloudAllreduceParams",
    "DerivedCloudAllreduce",
    "load_cloud_allreduce_model",
    "node_network_gbps",
    "network_bus_bandwidth",
    "interconnect_bus_bandwidth",
    "ring_latency",
    "ring_bus_bandwidth",
    "CloudAllreduceModelFile",
    "CloudParametersFile",
    "SourcedNumber",
    "SourcedNetworkChoice",
    "SourcedDevices",
    "TypeTableRow",
]

CLOUD_MODEL_FORMAT = "thrifty.cloud_allreduce_model/1"
GB = 1e9  # bytes per GB (busbw figures in the sources are GB/s, 1 GB = 1e9 bytes)


# -- the model's parameters and its formulas (pure functions) -------------------------


@dataclass(frozen=True)
class CloudAllreduceParams:
    """The numbers of the model (see the module docstring for the formulas).
    Bandwidths in Gbit/s or bytes/s as named, latencies in seconds."""

    tcp_efficiency: float  # eta
    host_cap_bytes_per_s: float
    per_flow_cap_gbps: float
    sockets_per_peer: int
    use_baseline: bool  # "Up to" types: the sustained baseline rather than the burst rating
    inter_latency_floor_s: float
    inter_step_latency_s: float
    intra_step_latency_s: float
    intra_efficiency: float
    devices: frozenset[str]


def node_network_gbps(itype: InstanceType, use_baseline: bool = True) -> float:
    """``B_node``: the network one machine sustains, Gbit/s. An "Up to N" type
    sustains its baseline once the burst credits are spent (AWS: 5-60 minutes)."""
    baseline = itype.network_baseline_gbps
    if use_baseline and baseline:
        return float(baseline)
    return float(itype.network_gbps)


def network_bus_bandwidth(node_gbps: float, p: CloudAllreduceParams) -> float:
    """Bus bandwidth across machines, bytes/s: ``min(eta * B_used / 8, host_cap)``
    with ``B_used = min(B_node, per_flow_cap * sockets_per_peer)``."""
    used_gbps = min(node_gbps, p.per_flow_cap_gbps * p.sockets_per_peer)
    return min(p.tcp_efficiency * used_gbps * GB / 8, p.host_cap_bytes_per_s)


def interconnect_bus_bandwidth(interconnect_gbps: float, p: CloudAllreduceParams) -> float:
    """Bus bandwidth inside one machine, bytes/s: ``intra_efficiency * interconnect / 8``."""
    return p.intra_efficiency * interconnect_gbps * GB / 8


def ring_latency(world_size: int, instances: int, p: CloudAllreduceParams) -> float:
    """``alpha``, seconds: ``2 (n - 1)`` ring steps, with a floor across machines."""
    steps = 2 * max(world_size - 1, 0)
    if instances > 1:
        return max(p.inter_latency_floor_s, steps * p.inter_step_latency_s)
    return steps * p.intra_step_latency_s


def ring_bus_bandwidth(sizes: np.ndarray, world_size: int, alpha_s: float, beta: float) -> np.ndarray:
    """``busbw(s) = 2 s (n - 1) / (n t(s))`` with ``t(s) = alpha + 2 (n - 1) / n * s / beta``;
    a world of one moves nothing, so its busbw is ``beta``."""
    s = np.asarray(sizes, dtype=float)
    if world_size <= 1:
        return np.full(s.shape, float(beta))
    return bus_bandwidth_from_time(s, world_size, alpha_s + allreduce_time(s, world_size, beta))


# -- the model --------------------------------------------------------------------------


class DerivedCloudAllreduce:
    """The derived cloud allreduce model (a `BandwidthModel`, see the module
    docstring). Build one with `DerivedCloudAllreduce.load(path)` or from
    `CloudAllreduceParams`; `provenance` is the file's record of where it came from."""

    def __init__(self, params: CloudAllreduceParams, fallback: BandwidthModel | None = None,
                 provenance: dict[str, Any] | None = None, path: str | None = None):
        self.params = params
        self.fallback: BandwidthModel = fallback if fallback is not None else AnalyticAllreduce()
        self.provenance = dict(provenance or {})  # the file's provenance record
        self.path = path  # the file it was read from, if any

    def covers(self, itype: InstanceType) -> bool:
        """Whether the model has a basis for `itype`: a device whose machines
        talk TCP over ENA, and an interconnect figure when it has several GPUs."""
        return (itype.device in self.params.devices and itype.network_gbps > 0
                and (itype.gpus == 1 or bool(itype.interconnect_gbps)))

    def source(self, itype: InstanceType) -> str:
        return "derived" if self.covers(itype) else self.fallback.source(itype)

    def why_not(self, itype: InstanceType) -> str | None:
        """Why the model has no basis for `itype` (None when it has)."""
        if itype.device not in self.params.devices:
            return (f"the derived cloud allreduce model has no basis for {itype.device} machines "
                    f"(it covers {', '.join(sorted(self.params.devices))}: TCP over ENA)")
        if itype.network_gbps <= 0:
            return f"the catalog rates no network for {itype.name}"
        if itype.gpus > 1 and not itype.interconnect_gbps:
            return f"the catalog has no interconnect figure for the {itype.gpus} GPUs of {itype.name}"
        return None

    def provenance_of(self, itype: InstanceType) -> FigureSource:
        why = self.why_not(itype)
        if why is not None:
            return self.fallback.provenance_of(itype).passed_on(why)
        return FigureSource(kind="derived", model="derived cloud allreduce model", file=self.path,
                            script=self.provenance.get("script"), date=self.provenance.get("date"))

    def _alpha_beta(self, itype: InstanceType, world_size: int, instances: int) -> tuple[float, float]:
        p = self.params
        intra = interconnect_bus_bandwidth(itype.interconnect_gbps, p) if itype.interconnect_gbps else math.inf
        if instances <= 1:
            beta = intra
        else:
            beta = network_bus_bandwidth(node_network_gbps(itype, p.use_baseline), p)
            if itype.gpus > 1:
                beta = min(beta, intra)
        return ring_latency(world_size, instances, p), beta

    def bus_bandwidth(self, itype: InstanceType, sizes: np.ndarray, world_size: int, instances: int) -> np.ndarray:
        if not self.covers(itype):
            return np.asarray(self.fallback.bus_bandwidth(itype, sizes, world_size, instances), dtype=float)
        alpha, beta = self._alpha_beta(itype, world_size, instances)
        return ring_bus_bandwidth(sizes, world_size, alpha, beta)

    def bandwidth_cap(self, itype: InstanceType, world_size: int, instances: int) -> float:
        if not self.covers(itype):
            return float(self.fallback.bandwidth_cap(itype, world_size, instances))
        return self._alpha_beta(itype, world_size, instances)[1]

    def latency(self, itype: InstanceType, world_size: int, instances: int) -> float:
        """``alpha`` of the model for `itype` (seconds): for tables and tests."""
        return self._alpha_beta(itype, world_size, instances)[0]

    # -- loading ------------------------------------------------------------------------

    @classmethod
    def from_file(cls, file: "CloudAllreduceModelFile", fallback: BandwidthModel | None = None,
                  path: str | None = None) -> "DerivedCloudAllreduce":
        return cls(file.parameters.params(), fallback=fallback,
                   provenance=file.provenance.model_dump(mode="json", exclude_unset=True), path=path)

    @classmethod
    def from_json(cls, data: Any, source: str = "cloud allreduce model", fallback: BandwidthModel | None = None,
                  path: str | None = None) -> "DerivedCloudAllreduce":
        """A model file (parsed JSON), checked against `CloudAllreduceModelFile`;
        an error names the JSON path of the bad field."""
        return cls.from_file(validate_model(CloudAllreduceModelFile, data, source=source), fallback, path)

    @classmethod
    def load(cls, path: str | Path, fallback: BandwidthModel | None = None) -> "DerivedCloudAllreduce":
        return cls.from_json(read_json(path), source=str(path), fallback=fallback, path=display_path(path))


def load_cloud_allreduce_model(path: str | Path, fallback: BandwidthModel | None = None) -> DerivedCloudAllreduce:
    """Load a derived cloud allreduce model file (format `CLOUD_MODEL_FORMAT`)."""
    return DerivedCloudAllreduce.load(path, fallback=fallback)


# -- the file format ----------------------------------------------------------------------

Name = Annotated[str, Field(min_length=1)]
Fraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
PositiveFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFinite = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Basis = Literal["published", "measured", "derived", "assumed"]


class Sourced(FileSchema):
    """One parameter: its `value` (and `unit`), then where it comes from:
    `basis` (a published figure, a measurement, derived from such figures,
    or assumed), the keys of the file's `sources`, the rows of
    ``datasets/allreduce/cloud-sources.md`` it rests on, why this value, and
    what is assumed in using it (null: nothing)."""

    value: Any
    unit: Name | None = None
    basis: Basis
    sources: list[Name] = Field(default_factory=list)
    rows: list[Name] = Field(default_factory=list)
    why: Name
    assumption: Name | None = None


class SourcedNumber(Sourced):
    value: PositiveFinite
    unit: Name


class SourcedFraction(Sourced):
    value: Fraction


class SourcedCount(Sourced):
    value: Annotated[int, Field(ge=1)]
    unit: Name


class SourcedNetworkChoice(Sourced):
    """Which network figure of an "Up to" type the model uses: the sustained
    ``baseline`` or the ``burst`` rating (``network_gbps``)."""

    value: Literal["baseline", "burst"]


class SourcedDevices(Sourced):
    """The device keys (catalog ``device``) the model has a basis for."""

    value: Annotated[list[Name], Field(min_length=1)]


class CloudParametersFile(FileSchema):
    """The parameters of the model, each with its sources (module docstring)."""

    devices: SourcedDevices
    network: SourcedNetworkChoice
    tcp_efficiency: SourcedFraction
    host_cap_gbytes_per_s: SourcedNumber
    per_flow_cap_gbps: SourcedNumber
    sockets_per_peer: SourcedCount
    inter_latency_floor_s: SourcedNumber
    inter_step_latency_s: SourcedNumber
    intra_step_latency_s: SourcedNumber
    intra_efficiency: SourcedFraction

    def params(self) -> CloudAllreduceParams:
        return CloudAllreduceParams(
            tcp_efficiency=self.tcp_efficiency.value,
            host_cap_bytes_per_s=self.host_cap_gbytes_per_s.value * GB,
            per_flow_cap_gbps=self.per_flow_cap_gbps.value,
            sockets_per_peer=self.sockets_per_peer.value,
            use_baseline=self.network.value == "baseline",
            inter_latency_floor_s=self.inter_latency_floor_s.value,
            inter_step_latency_s=self.inter_step_latency_s.value,
            intra_step_latency_s=self.intra_step_latency_s.value,
            intra_efficiency=self.intra_efficiency.value,
            devices=frozenset(self.devices.value),
        )


class TypeTableRow(FileSchema):
    """For readers: what the model answers for one type of a catalog (the
    script writes one row per GPU type). Not read by the model."""

    instance_type: Name
    device: Name
    gpus: Annotated[int, Field(ge=1)]
    network_gbps: PositiveFinite
    network_baseline_gbps: NonNegativeFinite | None = None
    answered_by: Literal["derived", "fallback"]
    b_node_gbps: PositiveFinite | None = None
    per_flow_limit_gbps: PositiveFinite | None = None
    per_flow_binds: bool | None = None
    busbw_inter_gbytes_per_s: PositiveFinite | None = None
    inter_bound_by: Literal["network", "host cap", "interconnect"] | None = None
    busbw_intra_gbytes_per_s: PositiveFinite | None = None
    alpha_one_machine_s: NonNegativeFinite | None = None
    alpha_two_machines_s: PositiveFinite | None = None


class CloudAllreduceModelFile(FileSchema):
    """A derived cloud allreduce model file (format ``thrifty.cloud_allreduce_model/1``)."""

    format: Literal["thrifty.cloud_allreduce_model/1"]
    model: str | None = None  # for readers: the formulas
    parameters: CloudParametersFile
    sources: dict[Name, Name]
    table_catalog: Name | None = None  # for readers: the catalog the table was computed on
    table: list[TypeTableRow] | None = None
    provenance: Provenance  # as every data file's: a derived file names its script

    @model_validator(mode="after")
    def _cited_sources_exist(self) -> "CloudAllreduceModelFile":
        for name in CloudParametersFile.model_fields:
            entry: Sourced = getattr(self.parameters, name)
            for i, key in enumerate(entry.sources):
                if key not in self.sources:
                    raise FieldPathError(("parameters", name, "sources", i),
                                         f"is {key!r}, which is not a key of sources {sorted(self.sources)}")
        return self
