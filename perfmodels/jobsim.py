"""Job simulator of elastic tuning plans (RubberBand 4.2, Algorithm 1).

A plan gives each stage of an `ExperimentSpec` an allocation: GPUs per trial
``g``, instances ``m`` and (beyond RubberBand) an instance type. The simulator
builds the job's DAG stage by stage, extending the frontier:

- if the stage needs instances the cluster does not hold, a blocking SCALE node
  (provider queuing delay) after the previous SYNC, then one INIT_INSTANCE node
  per new instance; switching instance type replaces the whole fleet; shrinking
  is free and instant ("deprovisioning is unrepresented", 4.2);
- one TRAIN node per trial: ``P = min(n, slots)`` run in parallel and trial
  ``j >= P`` is chained after trial ``j - P`` (queued trials), where the slots
  follow the placement rule of 4.4: a trial of ``g <= G`` GPUs sits on one
  instance of G GPUs (``m * floor(G / g)`` slots), a larger one takes
  ``ceil(g / G)`` whole instances (``floor(m / ceil(g / G))`` slots);
- a SYNC node after every TRAIN node of the stage (the SHA barrier).

Latencies are sampled per node (seeded; common random numbers: the same draw
for the same node of the same stage in every plan, so plans compare without
sampling noise): SCALE ~ N(scale, sd), INIT ~ N(init, sd), TRAIN = start-up +
iters * X with ``X ~ N(mu(g), sd(g))`` from the scaling profile, one draw per
TRAIN node (per-iteration noise would average out over a trial and hide the
stragglers of 6.1.1; truncated below at 5% of the mean). JCT is the critical
path (Algorithm 1), vectorized over samples with numpy: because SYNC is a
barrier, the critical path is the sum over stages of (scale-up + the longest
chain of TRAIN nodes), which `simulate` computes stage by stage;
`critical_path` evaluates an explicit DAG node by node on the same draws (the
two agree exactly; tests check it).

Cost (4.2):

- ``per_instance``: every instance is billed per second from the end of its
  SCALE node until it is released, held through stragglers until the stage's
  SYNC, with a 60 s minimum per instance lifetime (instances released last-in
  first-out when the cluster shrinks);
- ``per_function``: only TRAIN nodes pay, ``g`` GPUs for their duration at the
  per-GPU share of the instance price;
- both: data ingress (price per GB x dataset GB) once per new instance.

Spot (beyond RubberBand): each TRAIN node is preempted ``K ~ Poisson(rate *
ceil(g / G) * duration)`` times; each preemption costs SCALE + INIT + recovery
latency plus the lost part of the current iteration (uniform), and one more
dataset download. The replacement's billing is folded into the stage's
instance-time (a deviation: we do not model the gap between losing and
regaining the instance).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from thrifty.core.errors import ProblemError
from thrifty.perfmodels.experiment import ExperimentSpec
from thrifty.perfmodels.scaling import CloudProfile, ScalingProfile

__all__ = ["StageAllocation", "Node", "JobResult", "JobSimulator", "slots", "build_dag", "critical_path",
           "dag_latencies"]

MIN_FRACTION = 0.05  # truncation of sampled iteration latency, as a fraction of the mean


@dataclass(frozen=True)
class StageAllocation:
    """One stage's allocation: GPUs per trial, instances, and instance type
    (None: the simulator's only type)."""

    gpus_per_trial: int
    instances: int
    instance_type: str | None = None


def slots(gpus_per_trial: int, instances: int, gpus_per_instance: int) -> int:
    """Trials that run at once (placement rule of RubberBand 4.4)."""
    g, G = gpus_per_trial, gpus_per_instance
    if g <= G:
        return instances * (G // g)
    return instances // math.ceil(g / G)


def wave_chains(lat: np.ndarray, parallel: int) -> np.ndarray:
    """(parallel, S) busy time of each of `parallel` slots when the n trials
    of `lat` (n, S) run in waves, trial j in slot j mod parallel after trial
    j - parallel: the full waves summed in place of a zero-padded copy, then
    the last wave's r < parallel trials added to the first r slots."""
    full, rest = divmod(lat.shape[0], parallel)
    chains = lat[:full * parallel].reshape(full, parallel, lat.shape[1]).sum(axis=0)
    if rest:
        chains[:rest] += lat[full * parallel:]
    return chains


@dataclass(frozen=True)
class Node:
    id: int
    kind: str            # SCALE | INIT_INSTANCE | TRAIN | SYNC
    stage: int
    deps: tuple[int, ...]
    index: int = 0       # trial or new-instance index within the stage


@dataclass
class JobResult:
    jct_s: float
    jct_s_p95: float
    cost_usd: float
    cost_usd_p95: float
    jct_samples: np.ndarray = field(repr=False)
    cost_samples: np.ndarray = field(repr=False)
    stage_end_s: list[float] = field(default_factory=list)      # mean time of each SYNC
    stage_start_s: list[float] = field(default_factory=list)    # mean time each stage begins (after prev SYNC)
    stage_cost_usd: list[float] = field(default_factory=list)   # mean compute cost charged per stage (no minimum)
    data_usd: float = 0.0


@dataclass(frozen=True)
class _Draws:
    scale: np.ndarray     # (S,)
    train: np.ndarray     # (n, S) standard normal
    preempt_u: np.ndarray  # (n, S) uniform, for the Poisson count
    lost_u: np.ndarray    # (n, S) uniform, the lost part of an iteration


def p95(x: np.ndarray) -> float:
    """``np.percentile(x, 95)`` (linear interpolation) by partial sorting: the
    job simulator's hot path calls it for every plan it scores."""
    n = len(x)
    pos = 0.95 * (n - 1)
    lo = int(pos)
    if lo + 1 >= n:
        return float(np.max(x))
    part = np.partition(x, (lo, lo + 1))
    return float(part[lo] + (pos - lo) * (part[lo + 1] - part[lo]))


class JobSimulator:
    """Monte Carlo simulator of one tuning job over any allocation plan.

    `profiles` and `clouds` map instance type -> its scaling and cloud profile.
    """

    def __init__(self, spec: ExperimentSpec, profiles: Mapping[str, ScalingProfile],
                 clouds: Mapping[str, CloudProfile], samples: int = 200, seed: int = 0):
        if samples < 1:
            raise ProblemError(f"is {samples}, but must be at least 1", path="samples")
        if set(profiles) != set(clouds) or not clouds:
            raise ProblemError("profiles and clouds must name the same instance types")
        self.spec = spec
        self.profiles = dict(profiles)
        self.clouds = dict(clouds)
        self.samples = samples
        self.seed = seed
        self.default_type = next(iter(self.clouds))
        self._draws: dict[int, _Draws] = {}
        self._init: dict[int, np.ndarray] = {}
        self._train_cache: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._latency_cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._sums_cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._scale_cache: dict[tuple, np.ndarray] = {}
        self._scale_up_cache: dict[tuple, np.ndarray] = {}
        self._means: dict[int, tuple[np.ndarray, float]] = {}
        self._zeros: np.ndarray | None = None

    # -- random draws (common random numbers per stage) --------------------------
    def draws(self, k: int) -> _Draws:
        if k not in self._draws:
            rng = np.random.default_rng([self.seed, k])
            n, S = self.spec.stages[k].trials, self.samples
            self._draws[k] = _Draws(rng.standard_normal(S), rng.standard_normal((n, S)),
                                    rng.random((n, S)), rng.random((n, S)))
        return self._draws[k]

    def init_draws(self, k: int, new: int) -> np.ndarray:
        """(new, S) standard normal draws of the stage's INIT nodes (a prefix of one stream)."""
        have = self._init.get(k)
        if have is None or have.shape[0] < new:
            rng = np.random.default_rng([self.seed, k, 1])
            have = rng.standard_normal((max(new, 1), self.samples))
            self._init[k] = have
        return have[:new]

    def type_of(self, a: StageAllocation) -> str:
        t = a.instance_type or self.default_type
        if t not in self.clouds:
            raise ProblemError(f"instance type '{t}' is not one of {', '.join(self.clouds)}")
        return t

    # -- node latencies -----------------------------------------------------------
    def scale_latency(self, k: int, itype: str) -> np.ndarray:
        key = (k, itype)
        hit = self._scale_cache.get(key)
        if hit is None:
            c = self.clouds[itype]
            hit = self._scale_cache[key] = np.maximum(
                c.scale_latency_s + c.scale_latency_sd_s * self.draws(k).scale, 0.0)
        return hit

    def init_latencies(self, k: int, itype: str, new: int) -> np.ndarray:
        c = self.clouds[itype]
        return np.maximum(c.init_latency_s + c.init_latency_sd_s * self.init_draws(k, new), 0.0)

    def scale_up(self, k: int, itype: str, new: int) -> np.ndarray:
        """Latency from the previous SYNC to the first TRAIN node: SCALE + the slowest INIT."""
        if new <= 0:
            if self._zeros is None:
                self._zeros = np.zeros(self.samples)
                self._zeros.flags.writeable = False
            return self._zeros
        key = (k, itype, new)
        hit = self._scale_up_cache.get(key)
        if hit is None:
            hit = self._scale_up_cache[key] = (self.scale_latency(k, itype)
                                               + self.init_latencies(k, itype, new).max(axis=0))
        return hit

    def train_latencies(self, k: int, itype: str, g: int) -> tuple[np.ndarray, np.ndarray]:
        """(n, S) TRAIN node latencies of stage k at g GPUs per trial, and
        preemption counts (computed once per stage, type and GPU count: every
        cluster size of a stage shares them; read-only)."""
        key = (k, itype, g)
        hit = self._latency_cache.get(key)
        if hit is None:
            hit = self._latency_cache[key] = self._train_latencies(k, itype, g)
            for array in hit:
                array.flags.writeable = False
        return hit

    def _train_latencies(self, k: int, itype: str, g: int) -> tuple[np.ndarray, np.ndarray]:
        n, iters = self.spec.get_stage(k)
        prof, cloud = self.profiles[itype], self.clouds[itype]
        mean, sd = prof.iteration(g)
        d = self.draws(k)
        lat = d.train * sd  # in place from here: (n, S) arrays, a few MB each on large stages
        lat += mean
        np.maximum(lat, MIN_FRACTION * mean, out=lat)
        lat *= iters
        lat += prof.startup_s
        if cloud.preemptions_per_hour > 0:
            from scipy.stats import poisson

            rate = cloud.preemptions_per_hour / 3600.0 * math.ceil(g / cloud.gpus_per_instance)
            count = poisson.ppf(d.preempt_u * (1 - 1e-12), rate * lat)
            penalty = cloud.scale_latency_s + cloud.init_latency_s + cloud.recovery_s + d.lost_u * mean
            lat = lat + count * penalty
        else:
            count = np.broadcast_to(0.0, lat.shape)  # no preemptions: a read-only view, no memory
        return lat, count

    def _train_sums(self, k: int, itype: str, g: int) -> tuple[np.ndarray, np.ndarray]:
        """(S,) sums over stage k's trials of their TRAIN latencies and
        preemption counts at g GPUs per trial: the same for every cluster
        size of the stage, so computed once."""
        key = (k, itype, g)
        hit = self._sums_cache.get(key)
        if hit is None:
            lat, count = self.train_latencies(k, itype, g)
            hit = self._sums_cache[key] = (lat.sum(axis=0), count.sum(axis=0))
        return hit

    def stage_train(self, k: int, a: StageAllocation) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Stage k's TRAIN phase: (duration to SYNC, busy GPU-seconds, preemptions), each (S,)."""
        itype = self.type_of(a)
        key = (k, itype, a.gpus_per_trial, a.instances)
        hit = self._train_cache.get(key)
        if hit is not None:
            return hit
        n, _ = self.spec.get_stage(k)
        parallel = min(n, slots(a.gpus_per_trial, a.instances, self.clouds[itype].gpus_per_instance))
        if parallel < 1:
            raise ProblemError(f"stage {k}: {a.instances} x {itype} cannot hold one trial of "
                               f"{a.gpus_per_trial} GPUs")
        lat, _ = self.train_latencies(k, itype, a.gpus_per_trial)
        lat_sum, count_sum = self._train_sums(k, itype, a.gpus_per_trial)
        out = (wave_chains(lat, parallel).max(axis=0), a.gpus_per_trial * lat_sum, count_sum)
        self._train_cache[key] = out
        return out

    # -- the whole job --------------------------------------------------------------
    def simulate(self, plan: Sequence[StageAllocation]) -> JobResult:
        """Mean and p95 JCT and cost of `plan` (one allocation per stage)."""
        if len(plan) != self.spec.num_stages:
            raise ProblemError(f"the plan has {len(plan)} stages, but the experiment has {self.spec.num_stages}")
        S = self.samples
        now = np.zeros(S)
        cost = np.zeros(S)
        data = 0.0
        cohorts: list[list] = []  # [type, count, billed seconds (S,)], oldest first
        held_type, held = None, 0
        starts, ends, stage_costs = [], [], []
        clock = 0.0  # mean of `now`
        for k, a in enumerate(plan):
            itype = self.type_of(a)
            cloud = self.clouds[itype]
            if itype != held_type:
                cost += self._release(cohorts, len(cohorts) and sum(c[1] for c in cohorts))
                held_type, held = itype, 0
            elif a.instances < held:
                cost += self._release(cohorts, held - a.instances)
            new = max(0, a.instances - held)
            up = self.scale_up(k, itype, new)
            train, busy, preempt = self.stage_train(k, a)
            stage = up + train
            # means are linear: per-stage figures from the cached parts' means, no pass over samples
            stage_mean = self._mean(up) + self._mean(train)
            starts.append(clock)
            if new:
                cohorts.append([itype, new, np.zeros(S)])
            if cloud.billing == "per_instance":
                if new:
                    scale = self.scale_latency(k, itype)
                    for c in cohorts[:-1]:
                        c[2] = c[2] + stage
                    cohorts[-1][2] = cohorts[-1][2] + stage - scale
                    scale_mean = self._mean(scale)
                else:
                    for c in cohorts:
                        c[2] = c[2] + stage
                    scale_mean = 0.0
                stage_costs.append((a.instances * stage_mean - new * scale_mean) * cloud.usd_per_second)
            else:
                cost += busy * cloud.usd_per_gpu_second
                stage_costs.append(self._mean(busy) * cloud.usd_per_gpu_second)
            if cloud.data_usd_per_instance:
                cost += (new + preempt) * cloud.data_usd_per_instance
                data += (new + self._mean(preempt)) * cloud.data_usd_per_instance
            held = a.instances
            now = now + stage
            clock += stage_mean
            ends.append(clock)
        cost += self._release(cohorts, sum(c[1] for c in cohorts))
        return JobResult(float(now.mean()), p95(now), float(cost.mean()), p95(cost),
                         now, cost, ends, starts, stage_costs, data)

    def _mean(self, x: np.ndarray) -> float:
        """Mean of an array the caches hold (the same object every time), memoized by identity."""
        hit = self._means.get(id(x))
        if hit is None or hit[0] is not x:
            hit = self._means[id(x)] = (x, float(x.mean()))
        return hit[1]

    def _release(self, cohorts: list[list], count: int) -> np.ndarray:
        """Bill and drop `count` instances, newest first (per-instance billing, 60 s minimum)."""
        out = np.zeros(self.samples)
        while count > 0 and cohorts:
            itype, n, billed = cohorts[-1]
            cloud = self.clouds[itype]
            take = min(n, count)
            if cloud.billing == "per_instance":
                out += take * np.maximum(billed, cloud.min_billed_s) * cloud.usd_per_second
            count -= take
            if take == n:
                cohorts.pop()
            else:
                cohorts[-1][1] = n - take
        return out


# -- the explicit DAG (RubberBand 4.2, Figure 7) --------------------------------------

def build_dag(spec: ExperimentSpec, plan: Sequence[StageAllocation],
              gpus_per_instance: Mapping[str | None, int]) -> list[Node]:
    """SCALE / INIT_INSTANCE / TRAIN / SYNC nodes, stage by stage, from the frontier."""
    nodes: list[Node] = []
    frontier: tuple[int, ...] = ()
    held_type, held = None, 0

    def add(kind: str, stage: int, deps: tuple[int, ...], index: int = 0) -> int:
        nodes.append(Node(len(nodes), kind, stage, deps, index))
        return len(nodes) - 1

    for k, a in enumerate(plan):
        n, _ = spec.get_stage(k)
        G = gpus_per_instance[a.instance_type]
        if a.instance_type != held_type:
            held_type, held = a.instance_type, 0
        new = max(0, a.instances - held)
        if new:
            s = add("SCALE", k, frontier)
            frontier = tuple(add("INIT_INSTANCE", k, (s,), i) for i in range(new))
        parallel = min(n, slots(a.gpus_per_trial, a.instances, G))
        if parallel < 1:
            raise ProblemError(f"stage {k}: {a.instances} instances cannot hold one trial of {a.gpus_per_trial} GPUs")
        train: list[int] = []
        for j in range(n):
            deps = frontier if j < parallel else (train[j - parallel],)
            train.append(add("TRAIN", k, deps, j))
        frontier = (add("SYNC", k, tuple(train)),)
        held = a.instances
    return nodes


def critical_path(nodes: Sequence[Node], latency: Mapping[int, np.ndarray]) -> np.ndarray:
    """Algorithm 1: finish time of the last node, per sample (nodes in topological order)."""
    # per-sample arrays, but 0.0 after nodes without a latency: numpy's types have no max over that mix
    finish: dict[int, Any] = {}
    for v in nodes:
        start = np.max([finish[d] for d in v.deps], axis=0) if v.deps else 0.0
        finish[v.id] = latency.get(v.id, 0.0) + start
    return finish[nodes[-1].id]


def dag_latencies(sim: JobSimulator, plan: Sequence[StageAllocation], nodes: Sequence[Node]) -> dict[int, np.ndarray]:
    """Each node's sampled latency, from the simulator's draws."""
    out: dict[int, np.ndarray] = {}
    for v in nodes:
        a = plan[v.stage]
        itype = sim.type_of(a)
        if v.kind == "SCALE":
            out[v.id] = sim.scale_latency(v.stage, itype)
        elif v.kind == "INIT_INSTANCE":
            out[v.id] = sim.init_latencies(v.stage, itype, v.index + 1)[v.index]
        elif v.kind == "TRAIN":
            out[v.id] = sim.train_latencies(v.stage, itype, a.gpus_per_trial)[0][v.index]
        else:
            out[v.id] = np.zeros(sim.samples)
    return out
