"""APM, the model-based baseline of Srifty 2.3, with the simulator's interface.

APM combines three published models, each simpler than Srifty's:

- compute (Nexus): one linear model per pass, ``t(B) = a B + b``, fitted by
  least squares over all profiled batches (no segments);
- communication (Daydream / NCCL's documentation): the analytic ring
  allreduce ``t(s) = 2 (n-1) alpha + 2 (n-1)/n * s / beta`` per layer, with
  ``alpha`` and ``beta`` either fitted to allreduce probes
  (`AlphaBetaAllreduce.fit`) or taken from the catalog's rated network
  (`AnalyticAllreduce`);
- iteration (Cynthia): naive overlap with no variance,
  ``t_iter = t_fw + max(t_bw, sum_layers t_allreduce) + t_step``, the
  slowest machine's mean latencies bounding a mixed cluster.

It ignores cloud variance, concurrency limits and the order in which
gradients become ready, which is what the benchmarks compare against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from thrifty.datasets.catalog import InstanceType
from thrifty.perfmodels.bandwidth import AnalyticAllreduce, BandwidthModel, allreduce_time
from thrifty.perfmodels.cluster import MachineGroup
from thrifty.perfmodels.compute import ComputeModel
from thrifty.perfmodels.library import ModelLibrary, shipped_library
from thrifty.perfmodels.provenance import FigureSource
from thrifty.perfmodels.simulator import IterationPrediction

__all__ = ["AlphaBetaAllreduce", "ApmSimulator", "linear_fit"]


def linear_fit(batches: np.ndarray, latencies: np.ndarray) -> tuple[float, float]:
    """Nexus's linear latency model: least-squares ``(slope, intercept)``."""
    slope, intercept = np.polyfit(np.asarray(batches, float), np.asarray(latencies, float), 1)
    return float(slope), float(intercept)


class AlphaBetaAllreduce:
    """Ring allreduce with per-type ``alpha`` (s per step) and ``beta`` (bytes/s).

    Implements the `BandwidthModel` protocol: ``busbw(s) = s / (n alpha + s / beta)``.
    Types without fitted parameters use `fallback`.
    """

    def __init__(self, params: dict[str, tuple[float, float]], fallback: BandwidthModel | None = None):
        self.params = dict(params)
        self.fallback = fallback or AnalyticAllreduce()

    @classmethod
    def fit(cls, instance_type: str, world_sizes, sizes, seconds,
            fallback: BandwidthModel | None = None) -> "AlphaBetaAllreduce":
        """Least-squares ``alpha``, ``1/beta`` (non-negative, relative errors) from lone-transfer probes."""
        n = np.asarray(world_sizes, float)
        s = np.asarray(sizes, float)
        t = np.asarray(seconds, float)
        design = np.column_stack([2 * (n - 1), 2 * (n - 1) / n * s]) / t[:, None]
        (alpha, inv_beta), _ = nnls(design, np.ones_like(t))
        beta = 1.0 / inv_beta if inv_beta > 0 else 1e15
        return cls({instance_type: (float(alpha), float(beta))}, fallback)

    def bus_bandwidth(self, itype: InstanceType, sizes: np.ndarray, world_size: int, instances: int) -> np.ndarray:
        if itype.name not in self.params:
            return self.fallback.bus_bandwidth(itype, sizes, world_size, instances)
        alpha, beta = self.params[itype.name]
        s = np.asarray(sizes, float)
        return s / (world_size * alpha + s / beta)

    def bandwidth_cap(self, itype: InstanceType, world_size: int, instances: int) -> float:
        if itype.name not in self.params:
            return self.fallback.bandwidth_cap(itype, world_size, instances)
        return self.params[itype.name][1]

    def source(self, itype: InstanceType) -> str:
        return "alpha-beta fit" if itype.name in self.params else self.fallback.source(itype)

    def provenance_of(self, itype: InstanceType) -> FigureSource:
        if itype.name not in self.params:
            why = f"the alpha-beta fit has no measurements of {itype.name}"
            return self.fallback.provenance_of(itype).passed_on(why)
        alpha, beta = self.params[itype.name]
        return FigureSource(kind="measured", model="alpha-beta fit (APM)",
                            note=f"alpha {alpha * 1e6:.3g} us, beta {beta / 1e9:.3g} GB/s fitted on allreduce times")


@dataclass(frozen=True)
class _Linear:
    fw: tuple[float, float]
    bw: tuple[float, float]
    step_s: float


class ApmSimulator:
    """APM's iteration prediction for machine groups (same interface as `IterationSimulator`)."""

    def __init__(self, model: str, library: ModelLibrary | None = None, bandwidth: BandwidthModel | None = None):
        self.model = model
        self.library = library or shipped_library()
        self.bandwidth = bandwidth or AnalyticAllreduce()
        self._linear: dict[str, _Linear] = {}

    def _fit(self, cm: ComputeModel) -> _Linear:
        if cm.device not in self._linear:
            xs = np.array(cm.cv_batches)
            self._linear[cm.device] = _Linear(
                linear_fit(xs, np.array(cm.profiled_forward_s)),
                linear_fit(xs, np.array(cm.profiled_backward_s)),
                cm.step_s,
            )
        return self._linear[cm.device]

    def simulate(self, groups: list[MachineGroup]) -> IterationPrediction:
        t_fw = t_bw = step = 0.0
        grads: tuple[int, ...] = ()
        for g in groups:
            cm = self.library.get(self.model, g.instance_type.device, g.instance_type.name)
            lin = self._fit(cm)
            b = g.device_batch
            fw = max(lin.fw[0] * b + lin.fw[1], 1e-6)
            bw = max(lin.bw[0] * b + lin.bw[1], 1e-6)
            if bw >= t_bw:
                grads = cm.grad_bytes
            t_fw, t_bw, step = max(t_fw, fw), max(t_bw, bw), max(step, lin.step_s)
        world = sum(g.devices for g in groups)
        instances = sum(g.count for g in groups)
        types = {g.instance_type.name: g.instance_type for g in groups}.values()
        comm = 0.0
        if world > 1:
            sizes = np.array(grads, float)
            bus = np.min([self.bandwidth.bus_bandwidth(t, sizes, world, instances) for t in types], axis=0)
            comm = float(np.sum(allreduce_time(sizes, world, bus)))
        t_iter = t_fw + max(t_bw, comm) + step
        return IterationPrediction(
            mean_s=t_iter, sd_s=0.0, p95_s=t_iter, forward_s=t_fw, backward_s=t_bw, exchange_s=comm,
            exposed_comm_s=max(0.0, comm - t_bw), step_s=step, world_size=world, instances=instances,
            bandwidth_sources={t.name: self.bandwidth.source(t) for t in types},
        )
