"""Online calibration: the compute and exchange models corrected by what a
running job measures, with a stated Bayesian update that shrinks toward the
prior profile by the evidence measured (Srifty 4.5's continual optimization
re-solves with what is left; Pollux learns its model while training).

What is corrected, and what it is compared with
------------------------------------------------
Each window of a running segment, the workers' clock marks give, per rank
and iteration, the *forward* pass, the *backward* pass up to the last
gradient ready on that rank, the *exchange* (from that gradient to the end
of DDP's backward: the communication the backward does not hide, DDP's
finishing work, waiting for slower ranks) and the *step* (optimizer step and
gradient zeroing). They are compared with what the prior models (the
profile and the allreduce model that priced the plan) predict for the same
configuration (`component_predictions`): per instance type, the forward and
backward pass of one device at its batch (co-located and time-shared as the
simulator has them) and the step; per world, the exposed communication of
`IterationSimulator` (``exposed_comm_s``: DDP's overhead included). The
exchange is the smallest over the ranks of the world: the straggler waits
for no one, so its exchange is the communication itself.

The quantity learned is a log factor, ``theta = log(true / prior)``, one for
each compute component of each *device* (``forward``, ``backward``,
``step``: a correction measured on one type carries to every type of the
catalog whose ``device`` is the same, e.g. a V100 on p3.2xlarge and on
p3.8xlarge, or the demo's ``local-a`` and ``local-b`` processes on this
host's CPU) and one ``exchange`` factor for each *instance type* a world ran
on (the slowest type's bandwidth bounds a mixed world, Srifty 4.2, so the
exchange of a mixed world is evidence about each of its types).

The update (`Belief.update`): a local-level model, conjugate normal
-----------------------------------------------------------------
Prior, before anything is measured: ``theta ~ N(0, s0^2)``: the profile is
right on average, with the spread its kind of profile has shown against
measurements (`COMPUTE_PRIOR_SD`, `EXCHANGE_PRIOR_SD`, derived below).

A window's observation of a component: ``y = log(mean measured / prior
predicted)``, with noise variance ``v = (sd / mean)^2 / n`` (the delta
method on the mean of ``n`` iterations, ``sd`` the spread of the window's own
repeated iterations: the segment says how noisy it is). Ranks of one device
in one world run their iterations in lockstep, so ``n`` counts iterations,
not rank-iterations.

Between windows, ``theta`` may move (a host's load changes): a random walk
with variance ``q`` per window, estimated from the run's own windows by the
method of moments, ``q = max(0, mean_w((y_w - y_{w-1})^2 - v_w - v_{w-1}))``
(the squared change between windows beyond what their noise explains); 0
until there are two windows. Each window then is the Kalman step of that
local-level model::

    P   = var + q                       (what the last window leaves, widened)
    K   = P / (P + v)                   (how much this window is trusted)
    mean' = mean + K (y - mean),  var' = (1 - K) P

With ``q = 0`` this is the conjugate normal update of a fixed factor: with
little evidence (few iterations, a noisy window: ``v`` >> ``P``) the
corrected model stays near the prior profile, with much it goes to the
data. The corrected prediction of a component is ``prior x exp(mean)``
(the posterior median of the factor).

The priors' spreads, from data
------------------------------
- A *measured* compute profile: 0.069, the standard deviation of a normal
  whose mean absolute error is the zoo's worst MAPE, 5.5%
  (``benchmarks/perfmodel_accuracy.py``; sd = MAPE x sqrt(pi/2)).
- A *derived* or *published* compute profile: 0.126, the root mean square
  of the log ratios measured / derived of the GPU profiles measured so far
  (``datasets/profiles/derived/README.md``, "Against measured profiles":
  the 18 range ends 0.75-1.17).
- The exchange: ``learned`` 0.20 (the allreduce model's held-out MAPE,
  16.0% for large buffers, ``datasets/allreduce/README.md``, times
  sqrt(pi/2)); ``derived`` 0.31 (the 10-25% errors of any model without
  probes, same README: 25% x sqrt(pi/2)); ``analytic`` ln 2 = 0.69: no data,
  a stated assumption (a factor of two at one standard deviation).

- A machine type whose machines are worker processes of a shared host
  (the catalog's host-worker types: ``local``, the demo's ``local-a`` and
  ``local-b``) adds the contention the host shows while the window runs:
  with ``R`` runnable processes on ``C`` cores (the kernel's count,
  averaged over the window) a CPU-bound process may get ``C / R`` of a core,
  so the prior's spread is widened by ``ln(max(1, R / C))`` (in quadrature,
  `host_contention_sd`): on an idle host the profile's own error, on a
  loaded one as much as the load could slow a pass. The profile was
  measured with its own workers running, so ``R = C`` (two workers on two
  cores) adds nothing.

How the corrections enter the models
------------------------------------
`scaled_model` multiplies a compute model's forward and backward fits (so
their standard deviations, whose coefficients of variation stay), its
co-located model likewise, and its step; the fits stay the same shape, so
the batch threshold and the memory cap do not change. `CorrectedBandwidth`
divides the bus bandwidth and the cap of a type by its exchange factor, and
DDP's per-iteration overhead is multiplied by it: where communication does
not overlap computation (CPU workers) the exposed exchange then scales by
the factor exactly (the event queue of `exchange_time` in a time unit
``factor`` times longer). `CorrectedLibrary` answers the simulator with the
corrected models. Nothing here measures or starts anything.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from thrifty.datasets.catalog import InstanceType
from thrifty.perfmodels.bandwidth import BandwidthModel
from thrifty.perfmodels.cluster import MachineGroup
from thrifty.perfmodels.compute import ComputeModel, PiecewiseLinear
from thrifty.perfmodels.provenance import FigureSource
from thrifty.perfmodels.library import ModelLibrary
from thrifty.perfmodels.profile import ColocatedPoints, ComputeProfile, LayerGrad, ProfilePoint, Provenance
from thrifty.perfmodels.simulator import IterationPrediction, IterationSimulator

__all__ = ["COMPUTE", "EXCHANGE", "COMPUTE_PRIOR_SD", "EXCHANGE_PRIOR_SD", "host_contention_sd", "compute_prior_sd",
           "exchange_prior_sd", "Evidence", "Belief", "Calibration",
           "scaled_model", "CorrectedLibrary", "CorrectedBandwidth", "ComponentPrediction",
           "component_predictions", "corrected_simulator", "corrected_profile"]

COMPUTE = ("forward", "backward", "step")  # per device
EXCHANGE = "exchange"  # per instance type

SQRT_HALF_PI = math.sqrt(math.pi / 2)  # sd of a normal / its mean absolute deviation
COMPUTE_PRIOR_SD = {"measured": 0.055 * SQRT_HALF_PI, "derived": 0.126, "published": 0.126}
EXCHANGE_PRIOR_SD = {"learned": 0.160 * SQRT_HALF_PI, "derived": 0.25 * SQRT_HALF_PI, "analytic": math.log(2.0)}


def host_contention_sd(runnable: float | None, cores: int) -> float:
    """The prior's extra spread on a shared host with `runnable` processes on
    `cores` cores: ``ln(max(1, runnable / cores))`` (0 when unknown)."""
    if runnable is None or cores < 1:
        return 0.0
    return math.log(max(1.0, runnable / cores))


def compute_prior_sd(provenance_kind: str | None, contention_sd: float = 0.0) -> float:
    """The prior's standard deviation of a compute factor for a profile of this
    provenance, widened by a shared host's contention (`host_contention_sd`)."""
    return math.hypot(COMPUTE_PRIOR_SD.get(provenance_kind or "", COMPUTE_PRIOR_SD["derived"]), contention_sd)


def exchange_prior_sd(source: str | None, contention_sd: float = 0.0) -> float:
    """The prior's standard deviation of an exchange factor for an allreduce
    model of this source, widened by a shared host's contention."""
    return math.hypot(EXCHANGE_PRIOR_SD.get(source or "", EXCHANGE_PRIOR_SD["analytic"]), contention_sd)


@dataclass(frozen=True)
class Evidence:
    """One window's measurement of one component: the mean of `count`
    iterations (seconds), their standard deviation, and what the prior
    models predicted for it."""

    measured_s: float
    predicted_s: float
    sd_s: float
    count: int

    def __post_init__(self) -> None:
        if not (self.measured_s > 0 and self.predicted_s > 0 and self.count >= 1 and self.sd_s >= 0):
            raise ValueError(f"evidence needs positive times and at least one iteration, not {self}")

    @property
    def log_ratio(self) -> float:
        return math.log(self.measured_s / self.predicted_s)

    @property
    def variance(self) -> float:
        """The noise variance of `log_ratio`: (sd / mean)^2 / n, at least one
        part in 10^6 (a window of identical clock readings is not exact)."""
        return max((self.sd_s / self.measured_s) ** 2 / self.count, 1e-6)


@dataclass(frozen=True)
class Belief:
    """The posterior of one log factor (see the module docstring)."""

    prior_sd: float
    mean: float = 0.0
    var: float = -1.0  # -1: the prior's
    windows: int = 0
    iterations: int = 0
    last_y: float | None = None
    last_v: float = 0.0
    excess: float = 0.0  # sum over window pairs of (y_w - y_{w-1})^2 - v_w - v_{w-1}
    pairs: int = 0

    def __post_init__(self) -> None:
        if self.var < 0:
            object.__setattr__(self, "var", self.prior_sd ** 2)

    @property
    def q(self) -> float:
        """The random walk's variance per window, estimated from the windows seen."""
        return max(0.0, self.excess / self.pairs) if self.pairs else 0.0

    @property
    def factor(self) -> float:
        """The corrected over the prior prediction: exp(posterior mean)."""
        return math.exp(self.mean)

    @property
    def sd(self) -> float:
        return math.sqrt(self.var)

    def update(self, evidence: Evidence) -> "Belief":
        """The posterior after one more window (the Kalman step of the local-level model)."""
        y, v = evidence.log_ratio, evidence.variance
        excess, pairs = self.excess, self.pairs
        if self.last_y is not None:
            excess += (y - self.last_y) ** 2 - v - self.last_v
            pairs += 1
        q = max(0.0, excess / pairs) if pairs else 0.0
        p = self.var + q
        gain = p / (p + v)
        return replace(self, mean=self.mean + gain * (y - self.mean), var=(1.0 - gain) * p,
                       windows=self.windows + 1, iterations=self.iterations + evidence.count, last_y=y,
                       last_v=v, excess=excess, pairs=pairs)

    def to_json(self) -> dict[str, Any]:
        return {"factor": self.factor, "mean": self.mean, "sd": self.sd, "prior_sd": self.prior_sd,
                "windows": self.windows, "iterations": self.iterations, "q": self.q, "last_y": self.last_y,
                "last_v": self.last_v, "excess": self.excess, "pairs": self.pairs}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Belief":
        return cls(prior_sd=float(data["prior_sd"]), mean=float(data["mean"]), var=float(data["sd"]) ** 2,
                   windows=int(data["windows"]), iterations=int(data["iterations"]),
                   last_y=None if data.get("last_y") is None else float(data["last_y"]),
                   last_v=float(data.get("last_v", 0.0)), excess=float(data.get("excess", 0.0)),
                   pairs=int(data.get("pairs", 0)))


@dataclass
class Calibration:
    """The beliefs of one run: compute factors by (device, component), exchange factors by instance type."""

    compute: dict[tuple[str, str], Belief] = field(default_factory=dict)
    exchange: dict[str, Belief] = field(default_factory=dict)

    def observe_compute(self, device: str, component: str, evidence: Evidence, prior_sd: float) -> Belief:
        if component not in COMPUTE:
            raise ValueError(f"component is '{component}', but must be one of {', '.join(COMPUTE)}")
        key = (device, component)
        belief = self.compute.get(key) or Belief(prior_sd)
        self.compute[key] = belief = belief.update(evidence)
        return belief

    def observe_exchange(self, instance_type: str, evidence: Evidence, prior_sd: float) -> Belief:
        belief = self.exchange.get(instance_type) or Belief(prior_sd)
        self.exchange[instance_type] = belief = belief.update(evidence)
        return belief

    def compute_factors(self, device: str) -> dict[str, float]:
        """forward, backward, step factors of `device` (1 where nothing was measured)."""
        return {c: self.compute[(device, c)].factor if (device, c) in self.compute else 1.0 for c in COMPUTE}

    def exchange_factor(self, instance_type: str) -> float:
        belief = self.exchange.get(instance_type)
        return belief.factor if belief is not None else 1.0

    @property
    def empty(self) -> bool:
        return not self.compute and not self.exchange

    def corrects(self, itype: InstanceType) -> bool:
        return itype.name in self.exchange or any(d == itype.device for d, _ in self.compute)

    def to_json(self) -> dict[str, Any]:
        devices: dict[str, dict[str, Any]] = {}
        for (device, component), belief in sorted(self.compute.items()):
            devices.setdefault(device, {})[component] = belief.to_json()
        return {"compute": devices, "exchange": {t: b.to_json() for t, b in sorted(self.exchange.items())}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Calibration":
        compute = {(device, component): Belief.from_json(b) for device, parts in data.get("compute", {}).items()
                   for component, b in parts.items()}
        return cls(compute, {t: Belief.from_json(b) for t, b in data.get("exchange", {}).items()})

    def summary(self) -> str:
        """One line: what the corrected models assume (factors over the prior profile)."""
        parts = []
        devices = sorted({d for d, _ in self.compute})
        for device in devices:
            f = self.compute_factors(device)
            parts.append(f"{device} compute forward x{f['forward']:.2f}, backward x{f['backward']:.2f}, "
                         f"step x{f['step']:.2f}")
        for name, belief in sorted(self.exchange.items()):
            parts.append(f"{name} exchange x{belief.factor:.2f}")
        return "; ".join(parts) if parts else "the prior profile (nothing measured yet)"


def _scaled(fit: PiecewiseLinear, factor: float) -> PiecewiseLinear:
    return PiecewiseLinear(fit.intercept * factor, fit.slope * factor, fit.knots,
                           tuple(c * factor for c in fit.slope_changes))


def scaled_model(cm: ComputeModel, forward: float = 1.0, backward: float = 1.0, step: float = 1.0,
                 ddp: float = 1.0, device: str | None = None) -> ComputeModel:
    """`cm` with its forward and backward passes, step and DDP overhead
    multiplied by the factors (its co-located model too); `device` renames
    its key (the simulator caches per device key)."""
    colocated = None if cm.colocated is None else scaled_model(cm.colocated, forward, backward, step, ddp, device)
    return replace(
        cm, device=device or cm.device, forward=_scaled(cm.forward, forward), backward=_scaled(cm.backward, backward),
        profiled_forward_s=tuple(v * forward for v in cm.profiled_forward_s),
        profiled_backward_s=tuple(v * backward for v in cm.profiled_backward_s),
        step_s=cm.step_s * step, ddp_overhead_s=cm.ddp_overhead_s * ddp, colocated=colocated,
        min_latency_s=cm.min_latency_s)


class CorrectedLibrary(ModelLibrary):
    """A library that answers with `inner`'s models corrected by `calibration`:
    the compute factors of the type's device, the DDP overhead by the type's
    exchange factor."""

    def __init__(self, inner: ModelLibrary, calibration: Calibration):
        super().__init__(paths=[])
        self.inner, self.calibration = inner, calibration
        self._corrected: dict[tuple[str, str, str | None], ComputeModel] = {}

    def add(self, model: ComputeModel, file: str | Path | None = None) -> None:
        self.inner.add(model, file)

    def add_file(self, path: str | Path) -> ComputeModel:
        return self.inner.add_file(path)

    def keys(self) -> list[tuple[str, str]]:
        return self.inner.keys()

    def get(self, model: str, device: str, instance_type: str | None = None) -> ComputeModel:
        key = (model, device, instance_type)
        hit = self._corrected.get(key)
        if hit is not None:
            return hit
        base = self.inner.get(model, device, instance_type)
        f, ddp = self._factors(device, instance_type)
        if f is None:
            out = base
        else:
            out = scaled_model(base, f["forward"], f["backward"], f["step"], ddp,
                               device=f"{base.device}@{instance_type or ''}~corrected")
        self._corrected[key] = out
        return out

    def _factors(self, device: str, instance_type: str | None) -> tuple[dict[str, float] | None, float]:
        """The device's compute factors and the type's DDP-overhead factor;
        None for the compute factors when nothing is corrected."""
        f = self.calibration.compute_factors(device)
        ddp = self.calibration.exchange_factor(instance_type) if instance_type is not None else 1.0
        return (None if all(v == 1.0 for v in f.values()) and ddp == 1.0 else f), ddp

    def source_of(self, model: str, device: str, instance_type: str | None = None) -> FigureSource:
        """`inner`'s source, said to be corrected online (with it as the
        prior) when the type's device or exchange carries a correction."""
        base = self.inner.source_of(model, device, instance_type)
        f, ddp = self._factors(device, instance_type)
        if f is None:
            return base
        factors = ", ".join(f"{k} x{v:.3g}" for k, v in f.items())
        return base.corrected(f"{factors}; DDP overhead x{ddp:.3g}, from the run's clock marks")


class CorrectedBandwidth:
    """`inner`'s bus bandwidth and cap of each type divided by its exchange factor."""

    def __init__(self, inner: BandwidthModel, calibration: Calibration):
        self.inner, self.calibration = inner, calibration
        levels = getattr(inner, "concurrency_levels", None)
        if levels is not None:
            self.concurrency_levels = levels

    def bus_bandwidth(self, itype: InstanceType, sizes: np.ndarray, world_size: int, instances: int,
                      concurrent: int = 1) -> np.ndarray:
        if concurrent == 1:
            bus = self.inner.bus_bandwidth(itype, sizes, world_size, instances)
        else:
            bus = self.inner.bus_bandwidth(itype, sizes, world_size, instances, concurrent=concurrent)  # type: ignore[call-arg]
        return np.asarray(bus, dtype=float) / self.calibration.exchange_factor(itype.name)

    def bandwidth_cap(self, itype: InstanceType, world_size: int, instances: int) -> float:
        return float(self.inner.bandwidth_cap(itype, world_size, instances)) / \
            self.calibration.exchange_factor(itype.name)

    def source(self, itype: InstanceType) -> str:
        base = self.inner.source(itype)
        return f"{base}, corrected online" if itype.name in self.calibration.exchange else base

    def provenance_of(self, itype: InstanceType) -> FigureSource:
        """`inner`'s provenance, corrected online (with it as the prior) when the type's exchange is corrected."""
        base = self.inner.provenance_of(itype)
        if itype.name not in self.calibration.exchange:
            return base
        return base.corrected(f"bus bandwidth / {self.calibration.exchange_factor(itype.name):.3g}, from the run's "
                              "clock marks")


def corrected_simulator(base: IterationSimulator, calibration: Calibration) -> IterationSimulator:
    """A simulator like `base` (its samples, transfer and host rules; seed 0, as spaces have)
    whose models are corrected by `calibration`; fresh caches."""
    return IterationSimulator(base.model, library=CorrectedLibrary(base.library, calibration),
                             bandwidth=CorrectedBandwidth(base.bandwidth, calibration), samples=base.samples,
                             transfer=base.transfer, shared_core_devices=base.shared_core_devices,
                             shared_host_types=base.shared_host_types)


@dataclass(frozen=True)
class ComponentPrediction:
    """What a simulator predicts of one configuration, by component: per
    instance type, one device's forward, backward and step (seconds); for
    the world, the exposed exchange, and the whole iteration."""

    compute: dict[str, dict[str, float]]  # instance type -> forward, backward, step
    exchange_s: float
    iteration: IterationPrediction

    def to_json(self) -> dict[str, Any]:
        return {"compute": self.compute, "exchange_s": self.exchange_s, "iteration_s": self.iteration.mean_s}


def component_predictions(sim: IterationSimulator, groups: Sequence[MachineGroup]) -> ComponentPrediction:
    """The components `sim` predicts for `groups` (see the module docstring),
    as the simulator prices each group's devices (co-located, time-shared)."""
    compute: dict[str, dict[str, float]] = {}
    stats = sim.host_stats([sim.compute_model(g.instance_type) for g in groups], list(groups))
    for g, (forward, _, backward, _, step) in zip(groups, stats):
        compute[g.instance_type.name] = {"forward": float(forward), "backward": float(backward), "step": float(step)}
    iteration = sim.simulate(list(groups))
    return ComponentPrediction(compute, iteration.exposed_comm_s, iteration)


def _points(cm: ComputeModel, forward: float, backward: float) -> list[ProfilePoint]:
    return [ProfilePoint(batch=int(b), forward_s=f * forward, backward_s=w * backward,
                         forward_sd_s=cf * f * forward, backward_sd_s=cb * w * backward)
            for b, f, w, cf, cb in zip(cm.cv_batches, cm.profiled_forward_s, cm.profiled_backward_s,
                                       cm.cv_forward, cm.cv_backward)]


def corrected_profile(cm: ComputeModel, calibration: Calibration, device: str, exchange_types: Iterable[str] = (),
                      command: str = "thrifty run --save-profile", notes: str | None = None) -> ComputeProfile:
    """The compute profile of `cm` (its profiled points, layers and figures)
    with `device`'s corrections applied: the file format a problem names as
    its ``model``, saying how it was derived (the factors and their evidence
    in ``extra.calibration``). The DDP overhead takes the mean exchange
    factor of `exchange_types` (the types the run measured on this device)."""
    f = calibration.compute_factors(device)
    types = [t for t in exchange_types if t in calibration.exchange]
    ddp = math.exp(float(np.mean([calibration.exchange[t].mean for t in types]))) if types else 1.0
    colocated = None
    if cm.colocated is not None:
        colocated = ColocatedPoints(workers=cm.colocated_workers, host_cores=cm.host_cores or None,
                                    step_s=cm.colocated.step_s * f["step"],
                                    points=_points(cm.colocated, f["forward"], f["backward"]))
    beliefs = {c: calibration.compute[(device, c)].to_json() for c in COMPUTE if (device, c) in calibration.compute}
    source = cm.provenance.get("command") or cm.provenance.get("script") or cm.provenance.get("source") or "profile"
    return ComputeProfile(
        model=cm.model, device=device,
        provenance=Provenance(kind="derived", script=command, inputs=[f"{cm.model} on {cm.device}: {source}"],
                              notes=notes or "corrected online: the prior profile's passes times the posterior "
                                             "factors of thrifty.perfmodels.calibration"),
        max_batch=cm.max_batch, step_s=cm.step_s * f["step"], points=_points(cm, f["forward"], f["backward"]),
        layers=[LayerGrad(name=n, grad_bytes=g, ready_frac=r)
                for n, g, r in zip(cm.layer_names, cm.grad_bytes, cm.ready_frac)],
        buffer_bytes=cm.buffer_bytes, ddp_overhead_s=cm.ddp_overhead_s * ddp, colocated=colocated,
        extra={"calibration": {"factors": f, "ddp_factor": ddp, "beliefs": beliefs,
                               "exchange": {t: calibration.exchange[t].to_json() for t in types}}})
