"""Bus-bandwidth models for allreduce (Srifty 4.2): the interface the
iteration simulator queries, and the analytic ring-allreduce fallback.

Srifty learns the *bus bandwidth* of an allreduce rather than its latency::

    busbw = 2 * s * (n - 1) / (n * t)        s bytes, n workers, t seconds

so one transfer of ``s`` bytes on ``n`` workers alone takes
``t = 2 * s * (n - 1) / (n * busbw)``; with ``c`` concurrent transfers each
gets a share of the machine's total bus bandwidth ``b_cap`` (Srifty 4.3).

A model answers two queries for one instance type:

- ``bus_bandwidth(itype, sizes, world_size, instances)``: bus bandwidth in
  bytes/s of a lone allreduce of each buffer size (array in, array out);
- ``bandwidth_cap(itype, world_size, instances)``: ``b_cap``, the total bus
  bandwidth all concurrent transfers of one machine can share;

and says how it answers for a type (``source(itype)``: ``"learned"`` or
``"analytic"``) and, with the files and the reasons behind that,
``provenance_of(itype)``: a `thrifty.perfmodels.provenance.FigureSource` that
says where the figures came from, and says FALLBACK when the models with a
basis passed the type on to the analytic ring. A model that knows how a transfer's bus bandwidth changes
with the number of transfers in flight (Srifty 4.2's "number of asynchronous
transfers" feature) also has ``concurrency_levels(itype)``, the largest
``c`` it was probed at, and takes ``bus_bandwidth(..., concurrent=c)``
(answering a larger ``c`` as its largest, and a type it has no levels for
as a lone transfer); the
simulator then rates each transfer at the concurrency of the moment. Models
without it answer for lone transfers. A mixed cluster is bounded by its slowest type (Srifty 4.2):
the simulator takes the minimum over the types present.

The analytic fallback is a ring allreduce with a latency and a bandwidth term
(the alpha-beta model used by NCCL's documentation and Daydream)::

    t(s) = 2 (n - 1) * alpha + 2 (n - 1) / n * s / beta

with ``beta`` the catalog's rated network bandwidth (times an efficiency) when
the workers span several machines, or the intra-machine interconnect when
they are all on one, and ``alpha`` a per-step latency. Hence
``busbw(s) = s / (n * alpha + s / beta)`` and ``b_cap = beta``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from thrifty.datasets.catalog import InstanceType
from thrifty.perfmodels.provenance import FigureSource

__all__ = [
    "MTU_BYTES",
    "BandwidthModel",
    "ConcurrentBandwidthModel",
    "AnalyticAllreduce",
    "OnOneMachine",
    "bus_bandwidth_from_time",
    "allreduce_time",
]

MTU_BYTES = 9001  # EC2 jumbo frames (Srifty 4.2 splits its models here)


def bus_bandwidth_from_time(size_bytes: np.ndarray | float, world_size: int, seconds: np.ndarray | float):
    """``busbw = 2 s (n - 1) / (n t)`` in bytes/s (Srifty 4.2)."""
    n = world_size
    return 2.0 * np.asarray(size_bytes, dtype=float) * (n - 1) / (n * np.asarray(seconds, dtype=float))


def allreduce_time(size_bytes: np.ndarray | float, world_size: int, busbw: np.ndarray | float):
    """Seconds a lone allreduce of `size_bytes` takes at bus bandwidth `busbw`."""
    n = world_size
    return 2.0 * np.asarray(size_bytes, dtype=float) * (n - 1) / (n * np.asarray(busbw, dtype=float))


@runtime_checkable
class BandwidthModel(Protocol):
    def bus_bandwidth(
        self, itype: InstanceType, sizes: np.ndarray, world_size: int, instances: int
    ) -> np.ndarray: ...

    def bandwidth_cap(self, itype: InstanceType, world_size: int, instances: int) -> float: ...

    def source(self, itype: InstanceType) -> str: ...

    def provenance_of(self, itype: InstanceType) -> FigureSource: ...


class ConcurrentBandwidthModel(BandwidthModel, Protocol):
    """A model that also rates a transfer by the transfers in flight (see above):
    ``concurrency_levels(itype)`` and ``bus_bandwidth(..., concurrent=c)``."""

    def bus_bandwidth(
        self, itype: InstanceType, sizes: np.ndarray, world_size: int, instances: int, concurrent: int = 1
    ) -> np.ndarray: ...

    def concurrency_levels(self, itype: InstanceType) -> int: ...


class AnalyticAllreduce:
    """Ring allreduce with latency + bandwidth terms from the catalog.

    `network_efficiency` is the fraction of the rated network a TCP ring
    achieves; `alpha_s` the per-step latency across machines and
    `intra_alpha_s` within one. Types whose catalog entry has no
    ``interconnect_gbps`` use `default_interconnect_gbps` within a machine.
    """

    def __init__(
        self,
        alpha_s: float = 30e-6,
        intra_alpha_s: float = 8e-6,
        network_efficiency: float = 0.85,
        default_interconnect_gbps: float = 100.0,
    ):
        self.alpha_s = alpha_s
        self.intra_alpha_s = intra_alpha_s
        self.network_efficiency = network_efficiency
        self.default_interconnect_gbps = default_interconnect_gbps

    def _alpha_beta(self, itype: InstanceType, instances: int) -> tuple[float, float]:
        if instances > 1:
            return self.alpha_s, itype.network_gbps * 1e9 / 8 * self.network_efficiency
        gbps = getattr(itype, "interconnect_gbps", None) or self.default_interconnect_gbps
        return self.intra_alpha_s, gbps * 1e9 / 8

    def bus_bandwidth(self, itype: InstanceType, sizes: np.ndarray, world_size: int, instances: int) -> np.ndarray:
        alpha, beta = self._alpha_beta(itype, instances)
        s = np.asarray(sizes, dtype=float)
        return s / (world_size * alpha + s / beta)

    def bandwidth_cap(self, itype: InstanceType, world_size: int, instances: int) -> float:
        return self._alpha_beta(itype, instances)[1]

    def source(self, itype: InstanceType) -> str:
        return "analytic"

    def provenance_of(self, itype: InstanceType) -> FigureSource:
        gbps = getattr(itype, "interconnect_gbps", None) or self.default_interconnect_gbps
        return FigureSource(
            kind="analytic", model="analytic ring",
            note=(f"alpha-beta ring: across machines the catalog's rated {itype.network_gbps:g} Gbit/s at "
                  f"{self.network_efficiency:g} efficiency and {self.alpha_s * 1e6:g} us per step; within one "
                  f"{gbps:g} Gbit/s and {self.intra_alpha_s * 1e6:g} us per step"))


class OnOneMachine:
    """A model's answers for one machine of `itype`, whatever type and
    machine count it is asked about: ranks that are the GPUs of one host
    (``thrifty validate --device cuda``: each rank a ``local`` machine to the
    simulator, all of them one machine of the host's type) exchange over
    that machine's interconnect, priced by the model of that type."""

    def __init__(self, model: BandwidthModel, itype: InstanceType):
        self.model = model
        self.itype = itype

    def bus_bandwidth(self, itype: InstanceType, sizes: np.ndarray, world_size: int, instances: int) -> np.ndarray:
        return self.model.bus_bandwidth(self.itype, sizes, world_size, 1)

    def bandwidth_cap(self, itype: InstanceType, world_size: int, instances: int) -> float:
        return self.model.bandwidth_cap(self.itype, world_size, 1)

    def source(self, itype: InstanceType) -> str:
        return self.model.source(self.itype)

    def provenance_of(self, itype: InstanceType) -> FigureSource:
        answer = self.model.provenance_of(self.itype)
        said = f"the ranks are GPUs of one machine, priced as one {self.itype.name}"
        return answer.with_note(f"{answer.note}; {said}" if answer.note else said)
