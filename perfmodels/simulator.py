"""The iteration simulator of Srifty 4.3: one synchronous data-parallel
training iteration on any mix of machine types and local batch sizes.

    t_iter = t_fw + max(t_bw, t_pe) + t_step

Compute (``t_fw``, ``t_bw``). For each device in the cluster Srifty samples a
per-iteration latency from ``Normal(mean = prediction, sd = profiled sd)``
and takes, per iteration, the maximum over devices: the slowest machine bounds
a synchronous iteration. We sample that maximum directly: the maximum of ``k``
independent ``Normal(mu, sd)`` draws has CDF ``Phi((x - mu)/sd)^k``, so one
uniform ``u`` per group and iteration gives ``x = mu + sd * Phi^-1(u^(1/k))``
(exact, and independent of k in cost). Forward and backward are sampled
separately, per group, then maximized over groups. The uniforms are
stratified: each row is a seeded permutation of ``(i + 1/2) / S``, fixed per
simulator (common random numbers), so predictions are reproducible and
comparable across configurations, and the sample mean of one group's maximum
is exactly ``mu + sd * e(k)`` with ``e(k) = mean_i Phi^-1(((i + 1/2)/S)^(1/k))``
(``e(1) = 0``). `expected_max_factor` exposes ``e(k)``; the solver's lower
bounds rely on it.

Parameter exchange (``t_pe``): an event queue from the start of the backward
pass (time 0). Each transfer (a layer's gradient, or a DDP bucket of layers)
starts at its gradient-ready timestamp, ``ready_frac * t_bw`` (the slowest
device's mean backward). On a start event the concurrency counter ``c`` grows
and the transfer's bus bandwidth ``b_bus(s)`` from the allreduce model is added
to the aggregate ``b_agg``; every active transfer then moves at
``b_tra = b_bus`` if ``b_agg < b_cap`` else ``min(b_bus, b_cap / c)``. On every
event all active transfers' progress is advanced and their finish times
recomputed; ``t_pe`` is the time of the last event. A transfer of ``s`` bytes
on ``n`` workers carries ``2 s (n - 1) / n`` bus bytes (the definition of bus
bandwidth, Srifty 4.2). In a mixed cluster the slowest type's bandwidth and
cap bound every transfer (Srifty 4.2).

Choices beyond the paper, documented here and selectable:

- ``transfer="ddp"`` (default) groups consecutive ready layers into
  PyTorch DDP's gradient buckets (first bucket 1 MiB, then 25 MiB; DDP
  rebuilds buckets in gradient-ready order after the first iteration), since
  that is what DDP actually sends; a bucket starts when its last layer is
  ready. ``transfer="layer"`` is the paper's per-layer queue.
- With DDP buckets, the forward pass also waits for DDP's broadcast of the
  model's buffers (``buffer_bytes`` in the profile; BatchNorm statistics),
  priced at half a lone allreduce of those bytes (one pass around the
  ring, not two; `_buffer_broadcast_s`).
- With DDP buckets, DDP's own per-iteration work besides the allreduce
  (``ddp_overhead_s`` in the profile: gradient copies into the buckets and
  back, hooks, collective launches; measured as DDP on a world of one
  against the plain model) is added to the exposed communication, the
  slowest device's, on a world of one too: thrifty's worker (and any
  ordinary DDP script) wraps the model in DDP whatever the world size.
- Devices of a shared-host type (``shared_host_types``, default
  ``{"local"}``, and every catalog type marked ``host_worker``: worker
  processes on this machine, counted together) run at the profile's
  co-located points while at least that many workers compute on the host
  at once (`host_stats`): co-located passes contend for memory bandwidth
  and caches, so they are slower than alone, and a pass that follows a
  gradient exchange is slower than one that follows more compute (the
  profile measures both: its co-located workers exchange gradients in
  every iteration, `thrifty.runtime.measure.colocated`). With more such
  workers computing than the host has cores (the co-located points'
  ``host_cores``), each pass takes ``workers / cores`` times as long: the
  cores are time-shared. Contention lasts only while workers compute
  together: with unequal batches a worker that is done waits for the
  allreduce without computing, and the others run the rest of their
  passes with fewer beside them (`_contention` follows their progress).
- ``t_step`` is the profiled per-iteration constant (optimizer step, gradient
  zeroing), which the paper's formula leaves out; it is zero in profiles that
  do not measure it.
- Devices in ``shared_core_devices`` (default ``{"cpu"}``: a CPU worker's
  gloo threads run on the cores its backward pass uses) cannot hide
  communication behind computation: their transfers start when the backward
  pass ends (with gloo on the cores, DDP's "overlapped" allreduce lengthens
  the backward pass by about the serial allreduce time; the accuracy
  benchmark, `benchmarks/perfmodel_accuracy.py`, measures it). GPUs (NCCL on
  its own engines) overlap as in the paper.

Returns the mean, standard deviation and 95th percentile of the iteration
time over the samples, with the breakdown. It is the solver's hot path:
results are cached per configuration, bandwidth queries per (types, world
size, machines), and transfer lists per (model, device).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import asdict, dataclass
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import numpy as np

from thrifty.datasets.catalog import InstanceType
from thrifty.core.errors import ProblemError
from thrifty.perfmodels.bandwidth import AnalyticAllreduce, BandwidthModel, ConcurrentBandwidthModel, allreduce_time
from thrifty.perfmodels.cluster import MachineGroup, merge_groups
from thrifty.perfmodels.compute import ComputeModel
from thrifty.perfmodels.library import ModelLibrary, shipped_library
from thrifty.perfmodels.normal import normal_quantile
from thrifty.perfmodels.provenance import TypeSources

__all__ = [
    "IterationPrediction",
    "IterationSimulator",
    "exchange_time",
    "ddp_buckets",
    "DDP_FIRST_BUCKET_BYTES",
    "DDP_BUCKET_BYTES",
]

DDP_FIRST_BUCKET_BYTES = 1024 * 1024
DDP_BUCKET_BYTES = 25 * 1024 * 1024


@dataclass(frozen=True)
class IterationPrediction:
    """One predicted iteration; times in seconds."""

    mean_s: float
    sd_s: float
    p95_s: float
    forward_s: float  # mean over iterations of the slowest forward
    backward_s: float  # mean over iterations of the slowest backward
    exchange_s: float  # t_pe, from the start of backward
    exposed_comm_s: float  # mean of max(0, t_pe - t_bw): communication not hidden
    step_s: float
    world_size: int
    instances: int
    bandwidth_sources: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def ddp_buckets(
    grad_bytes: Iterable[int],
    ready_frac: Iterable[float],
    first_bucket_bytes: int = DDP_FIRST_BUCKET_BYTES,
    bucket_bytes: int = DDP_BUCKET_BYTES,
) -> tuple[np.ndarray, np.ndarray]:
    """Group layers (in ready order) into DDP buckets: (bucket bytes, ready fraction).

    A bucket closes once it holds at least its cap; it is ready when its last
    layer is.
    """
    sizes, readies = [], []
    cap, current, ready = first_bucket_bytes, 0, 0.0
    for g, r in zip(grad_bytes, ready_frac):
        current += g
        ready = max(ready, r)
        if current >= cap:
            sizes.append(current)
            readies.append(ready)
            cap, current, ready = bucket_bytes, 0, 0.0
    if current:
        sizes.append(current)
        readies.append(ready)
    return np.array(sizes, dtype=float), np.array(readies, dtype=float)


def exchange_time(
    starts: list[float], work: list[float], bus_bw: Sequence[float] | Sequence[Sequence[float]], cap: float
) -> float:
    """Srifty 4.3's event queue: the time the last transfer finishes.

    `starts` ascending (seconds from backward start), `work` in bus bytes
    (``2 s (n-1)/n``), `cap` the shared total. `bus_bw[j]` is transfer
    ``j``'s bus bandwidth from the allreduce model: one number, or a sequence
    ``(b_j(1), ..., b_j(C))`` over the number of transfers in flight (the
    "number of asynchronous transfers" feature of Srifty 4.2), ``b_j(c)`` for
    ``c >= C`` being the last. Rates are Srifty's: with ``c`` transfers
    active, each runs at ``b = b_j(c)`` while the aggregate of the active
    ``b`` is below the cap, else at ``min(b, cap / c)``; every start and
    finish is an event.

    Exact, without re-rating every transfer at every event: while ``c``
    stays at or beyond ``C`` each transfer's ``b`` is fixed, and transfers at
    the fair share ``cap / c`` (set S) all progress alike, so they are kept
    on a virtual clock ``V`` (the work each has been served, advancing at the
    share) and finish when ``V`` reaches their key; transfers at their own
    rate (set L) keep a real finish time. When the share changes, only the
    transfers whose ``b`` crosses it move between the sets (heaps ordered by
    ``b``); stale heap entries are skipped by version. Each such event costs
    O(log n) instead of O(active). An event that changes ``min(c, C)``
    changes every ``b``, so the active set (at most ``C`` transfers on one
    side of it) is re-rated and the sets rebuilt. Equal to the direct event
    loop to 1e-15 relative (6e-16 at worst over 30,000 random cases; see the
    property test against the literal queue).
    """
    n = len(starts)
    # all numbers or all sequences: the first says which (a cast, as mypy cannot narrow a list by one item)
    rows: Sequence[Sequence[float]]
    if n and isinstance(bus_bw[0], (list, tuple)):
        rows = cast("Sequence[Sequence[float]]", bus_bw)
    else:
        rows = [(b,) for b in cast("Sequence[float]", bus_bw)]
    levels = len(rows[0]) if n else 1
    inf = math.inf
    push, pop = heapq.heappush, heapq.heappop
    ver = [0] * n
    kind = [0] * n          # 0 inactive, 1 own rate (L), 2 share (S)
    key = [0.0] * n         # L: finish time; S: virtual finish
    cur = [row[-1] for row in rows]  # b at the current level
    active: set[int] = set()
    # heaps of (key, transfer, version): L by finish time and by -b, S by virtual finish and by b
    Lfin: list[tuple[float, int, int]] = []
    Svk: list[tuple[float, int, int]] = []
    Sb: list[tuple[float, int, int]] = []
    Lb: list[tuple[float, int, int]] = []
    t = V = agg = 0.0
    share = inf
    c = i = level = 0
    while True:
        while Lfin and (kind[Lfin[0][1]] != 1 or ver[Lfin[0][1]] != Lfin[0][2]):
            pop(Lfin)
        while Svk and (kind[Svk[0][1]] != 2 or ver[Svk[0][1]] != Svk[0][2]):
            pop(Svk)
        t_l = Lfin[0][0] if Lfin else inf
        t_s = t + (Svk[0][0] - V) / share if Svk else inf
        t_f = t_l if t_l <= t_s else t_s
        t_start = starts[i] if i < n else inf
        if t_start == inf and t_f == inf:
            return t
        t_new = t_start if t_start <= t_f else t_f
        if Svk:
            V += share * (t_new - t)
        t = t_new
        admitted = i
        if t_start <= t_f:
            while i < n and starts[i] <= t:
                active.add(i)
                c += 1
                i += 1
        else:
            j = Lfin[0][1] if t_l <= t_s else Svk[0][1]
            kind[j] = 0
            active.discard(j)
            agg -= cur[j]
            c -= 1
            if not c:
                agg = 0.0
        new_level = c if c < levels else levels
        if new_level != level and c:
            # every rate changes: re-rate the active transfers from what each has left
            left = {}
            for j in active:
                if kind[j] == 1:
                    left[j] = (key[j] - t) * cur[j]
                elif kind[j] == 2:
                    left[j] = key[j] - V
                else:
                    left[j] = work[j]
            agg = 0.0
            for j in active:
                cur[j] = rows[j][new_level - 1]
                agg += cur[j]
            share = cap / c if agg >= cap else inf
            Lfin, Svk, Sb, Lb = [], [], [], []
            V = 0.0
            for j, rem in left.items():
                b = cur[j]
                ver[j] += 1
                if b >= share:
                    kind[j], key[j] = 2, rem
                    push(Svk, (rem, j, ver[j])); push(Sb, (b, j, ver[j]))
                else:
                    kind[j], key[j] = 1, t + rem / b
                    push(Lfin, (key[j], j, ver[j])); push(Lb, (-b, j, ver[j]))
            level = new_level
            continue
        level = new_level
        for j in range(admitted, i):
            agg += cur[j]
        share = cap / c if (c and agg >= cap) else inf
        for j in range(admitted, i):  # place the new ones
            b = cur[j]
            ver[j] += 1
            if b >= share:
                kind[j], key[j] = 2, V + work[j]
                push(Svk, (key[j], j, ver[j])); push(Sb, (b, j, ver[j]))
            else:
                kind[j], key[j] = 1, t + work[j] / b
                push(Lfin, (key[j], j, ver[j])); push(Lb, (-b, j, ver[j]))
        while Sb:  # share rose above some: they run at their own rate now
            b, j, v = Sb[0]
            if kind[j] != 2 or ver[j] != v:
                pop(Sb); continue
            if b >= share:
                break
            pop(Sb)
            rem = key[j] - V
            ver[j] += 1
            kind[j], key[j] = 1, t + rem / b
            push(Lfin, (key[j], j, ver[j])); push(Lb, (-b, j, ver[j]))
        while Lb:  # share fell to or below some: they take the share now
            nb, j, v = Lb[0]
            if kind[j] != 1 or ver[j] != v:
                pop(Lb); continue
            b = -nb
            if b < share:
                break
            pop(Lb)
            rem = (key[j] - t) * b
            ver[j] += 1
            kind[j], key[j] = 2, V + rem
            push(Svk, (key[j], j, ver[j])); push(Sb, (b, j, ver[j]))


def _contention(devices: dict[int, int],
                compute_s: Callable[[int, int], float]) -> dict[int, dict[int, float]]:
    """How the workers of one host progress through their compute when they
    start together: ``devices[j]`` workers of group j, each needing
    ``compute_s(j, m)`` seconds with ``m`` workers computing at once. While
    ``m`` compute, each advances by ``dt / compute_s[j](m)`` of its work; at
    each finish ``m`` drops. Per group, the share of its work done at each
    ``m`` (summing to 1)."""
    left = {j: 1.0 for j in devices}
    mix: dict[int, dict[int, float]] = {j: {} for j in devices}
    while left:
        m = sum(devices[j] for j in left)
        seconds = {j: compute_s(j, m) for j in left}
        dt = min(left[j] * seconds[j] for j in left)
        for j in list(left):
            done = dt / seconds[j]
            finished = done >= left[j] * (1.0 - 1e-12)
            done = left[j] if finished else done
            mix[j][m] = mix[j].get(m, 0.0) + done
            left[j] -= done
            if finished:
                del left[j]
    return mix


class IterationSimulator:
    """Predict one iteration of `model` on machine groups (see module docstring).

    `library` finds compute models by (model, device) (default: the shipped
    profiles); `bandwidth` answers bus-bandwidth queries (default: the analytic
    ring fallback). `samples` iterations are sampled per prediction.
    """

    def __init__(
        self,
        model: str,
        library: ModelLibrary | None = None,
        bandwidth: BandwidthModel | None = None,
        samples: int = 256,
        seed: int = 0,
        transfer: str = "ddp",
        max_groups: int = 32,
        shared_core_devices: frozenset[str] = frozenset({"cpu"}),
        shared_host_types: frozenset[str] = frozenset({"local"}),
    ):
        if transfer not in ("ddp", "layer"):
            raise ProblemError(f"transfer is '{transfer}', but must be 'ddp' or 'layer'")
        if samples < 1:
            raise ProblemError(f"samples is {samples}, but must be at least 1")
        self.model = model
        self.library = library or shipped_library()
        self.bandwidth = bandwidth or AnalyticAllreduce()
        self.samples = samples
        self.transfer = transfer
        self.shared_core_devices = frozenset(shared_core_devices)
        self.shared_host_types = frozenset(shared_host_types)
        rng = np.random.default_rng(seed)
        # common random numbers: two stratified uniform streams (forward, backward) per group slot
        strata = (np.arange(samples) + 0.5) / samples
        self._strata = strata
        self._uniform = np.stack([rng.permutation(strata) for _ in range(2 * max_groups)])
        self._max_groups = max_groups
        self._cache: dict[tuple, IterationPrediction] = {}
        self._bw_cache: dict[tuple, tuple[list[list[float]], float]] = {}
        self._broadcast_cache: dict[tuple, float] = {}
        self._tail_cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._cap_cache: dict[tuple, float] = {}
        self._host_work: dict[tuple[str, int], tuple[float, float, int] | None] = {}
        self._transfers: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
        self._log_u = np.log(self._uniform)
        self._stats: dict[tuple[str, bool, int], tuple[float, float, float, float, float]] = {}
        self._draws: dict[tuple, np.ndarray] = {}
        self._standard: dict[tuple[int, int], np.ndarray] = {}  # max of standard normals per (devices, row)
        self._max_factor: dict[int, float] = {}
        self._p95_index = (samples - 1) * 0.95

    # -- pieces ---------------------------------------------------------------
    def compute_model(self, itype: InstanceType) -> ComputeModel:
        return self.library.get(self.model, itype.device, itype.name)

    def sources(self, itype: InstanceType) -> TypeSources:
        """Where the compute and allreduce figures of `itype` come from
        (`thrifty.perfmodels.provenance`): a plan reports them per type."""
        return TypeSources(compute=self.library.source_of(self.model, itype.device, itype.name),
                           allreduce=self.bandwidth.provenance_of(itype))

    def transfers(self, cm: ComputeModel) -> tuple[np.ndarray, np.ndarray]:
        """(bytes, ready fraction) of each transfer of one iteration, in ready order."""
        key = (cm.model, cm.device)
        if key not in self._transfers:
            if self.transfer == "ddp":
                self._transfers[key] = ddp_buckets(cm.grad_bytes, cm.ready_frac)
            else:
                self._transfers[key] = (np.array(cm.grad_bytes, float), np.array(cm.ready_frac, float))
        return self._transfers[key]

    def _bandwidth(self, types: tuple[InstanceType, ...], sizes: np.ndarray, key: tuple,
                   world: int, instances: int) -> tuple[list[list[float]], float]:
        """(bus bandwidth per transfer, a list per transfer over the
        concurrency levels 1..C; ``b_cap``): the slowest type's, per Srifty 4.2."""
        cached = self._bw_cache.get(key)
        if cached is None:
            levels = max(self._levels(t) for t in types)
            bus = np.stack([
                np.min([self._bus(t, sizes, world, instances, c) for t in types], axis=0)
                for c in range(1, levels + 1)
            ], axis=1)
            cap = min(self.bandwidth.bandwidth_cap(t, world, instances) for t in types)
            cached = self._bw_cache[key] = (np.maximum(bus, 1.0).tolist(), float(cap))
        return cached

    def _buffer_broadcast_s(self, types: tuple[InstanceType, ...], cm: ComputeModel, world: int,
                            instances: int) -> float:
        """DDP's broadcast of the model's buffers from rank 0 before every
        forward pass (``broadcast_buffers=True``, its default): half a lone
        allreduce of the buffer bytes. A ring allreduce is two passes around
        the ring (reduce-scatter, then all-gather: 2 (n-1) steps, 2 s (n-1)/n
        bytes per link); a pipelined broadcast is one pass (n-1 steps, s bytes
        per link), so half of both the latency and (up to n / (n-1)) the
        bandwidth term. For the small buffers models have (BatchNorm
        statistics) the latency is all of it. (Until 2026-11-25 this was a
        whole allreduce, which overpredicted what DDP's forward pass measured
        over a buffer-less model's for small-cnn's few kB of buffers.)"""
        key = (tuple(t.name for t in types), world, instances, cm.buffer_bytes)
        cached = self._broadcast_cache.get(key)
        if cached is None:
            size = np.array([float(cm.buffer_bytes)])
            bus = min(float(self.bandwidth.bus_bandwidth(t, size, world, instances)[0]) for t in types)
            allreduce = float(allreduce_time(cm.buffer_bytes, world, max(bus, 1.0)))
            cached = self._broadcast_cache[key] = 0.5 * allreduce
        return cached

    def _levels(self, itype: InstanceType) -> int:
        levels = getattr(self.bandwidth, "concurrency_levels", None)
        return max(1, int(levels(itype))) if levels is not None else 1

    def _bus(self, itype: InstanceType, sizes: np.ndarray, world: int, instances: int, c: int) -> np.ndarray:
        """Bus bandwidth at concurrency `c` (a model answers beyond its levels as at its last)."""
        if c == 1:
            return self.bandwidth.bus_bandwidth(itype, sizes, world, instances)
        # c > 1 only up to `_levels`, which is 1 unless the model has concurrency_levels
        model = cast(ConcurrentBandwidthModel, self.bandwidth)
        return model.bus_bandwidth(itype, sizes, world, instances, concurrent=c)

    def exposed_lower_bound(self, types: tuple[InstanceType, ...], world: int, instances: int,
                            slowest: ComputeModel, backward_s: float) -> float:
        """A lower bound on the mean of ``max(t_bw, t_pe)`` of `_simulate`
        given a lower bound `backward_s` on the mean slowest backward pass.

        Transfer ``j`` cannot start before ``ready_j * mean(t_bw)`` and all
        transfers together move at most ``cap`` bytes per second (the rates
        of `exchange_time` never sum past it), so
        ``t_pe >= max_j(ready_j * t_bw + sum_{k >= j} work_k / cap)``.
        """
        if world <= 1:
            return backward_s
        key = (slowest.model, slowest.device, any(t.device in self.shared_core_devices for t in types))
        tail = self._tail_cache.get(key)
        if tail is None:
            sizes, ready = self.transfers(slowest)
            if key[2]:
                ready = np.ones_like(ready)
            tail = self._tail_cache[key] = (np.asarray(ready, float), np.cumsum(np.asarray(sizes, float)[::-1])[::-1])
        cap_key = (tuple(t.name for t in types), world, instances)
        cap = self._cap_cache.get(cap_key)
        if cap is None:
            cap = self._cap_cache[cap_key] = min(self.bandwidth.bandwidth_cap(t, world, instances) for t in types)
        ready, suffix = tail
        factor = 2.0 * (world - 1) / world / cap
        return max(backward_s, float(np.max(ready * backward_s + suffix * factor)))

    def expected_max_factor(self, devices: int) -> float:
        """``e(k)``: the sample mean of the max of `devices` standard normals here."""
        value = self._max_factor.get(devices)
        if value is None:
            value = self._max_factor[devices] = float(np.mean(normal_quantile(self._strata ** (1.0 / devices))))
        return value

    def device_stats(self, itype: InstanceType, device_batch: int) -> tuple[float, float, float, float, float]:
        """(forward mean, forward sd, backward mean, backward sd, step) of one device of `itype`.

        For a shared-host type whose profile has co-located points, each the
        smaller of alone and co-located, so that bounds built on these hold
        whichever `_simulate` uses."""
        cm = self.compute_model(itype)
        alone = self._device_stats(cm, device_batch)
        if cm.colocated is None or not self.shares_host(itype):
            return alone
        shared = self._device_stats(cm.colocated, device_batch, colocated=True)
        return tuple(min(a, b) for a, b in zip(alone, shared))  # type: ignore[return-value]

    def shares_host(self, itype: InstanceType) -> bool:
        """Whether `itype`'s machines are worker processes of this one host
        (a name in `shared_host_types`, or a catalog host-worker type such
        as the demo's ``local-a``): all of them share its cores."""
        return itype.host_worker or itype.name in self.shared_host_types

    def host_work(self, itype: InstanceType, device_batch: int) -> tuple[float, float, int] | None:
        """For a lower bound on a cluster's iteration under `host_stats`: one
        device of a shared-host type `itype` with co-located points at
        `device_batch` gives (its passes' work, its step's work, the host's
        cores), the work being what the pass takes alone or co-located,
        whichever is less; None for any other type (its passes do not
        contend for the host in `host_stats`).

        While ``m`` workers compute, a pass takes at least ``max(1, m /
        cores)`` times its work (`host_stats`' ``level``), so together they
        finish at most ``cores`` works a second: the passes of all of them
        take at least the sum of their works over the cores
        (`host_lower_bound`)."""
        key = (itype.name, device_batch)
        if key in self._host_work:
            return self._host_work[key]
        cm = self.compute_model(itype)
        work = None
        if cm.colocated is not None and cm.host_cores and self.shares_host(itype):
            mu_f, _, mu_b, _, step = self.device_stats(itype, device_batch)
            work = (mu_f + mu_b, step, cm.host_cores)
        self._host_work[key] = work
        return work

    @staticmethod
    def host_lower_bound(work_s: float, step_work_s: float, workers: int, cores: int) -> tuple[float, float]:
        """(passes, step): lower bounds on the slowest forward and backward
        passes together, and on the optimizer step, of an iteration whose
        shared-host devices (`host_work`) add up to `work_s` seconds of pass
        work on a host of `cores` cores (the most of theirs), `step_work_s`
        being their largest step's work, and `workers` counting every
        shared-host worker (those without co-located points keep the host
        busy too). The step runs on all workers at once, at ``max(1, workers
        / cores)`` times its work."""
        if cores <= 0:
            return 0.0, 0.0
        return work_s / cores, max(1.0, workers / cores) * step_work_s

    def host_stats(self, bases: Sequence[ComputeModel],
                   groups: Sequence[MachineGroup]) -> list[tuple[float, float, float, float, float]]:
        """(forward mean, forward sd, backward mean, backward sd, step) of
        each group's devices, `bases[j]` being group j's compute model.

        All groups of shared-host types (``local`` processes, and any catalog
        host-worker type) are worker processes of this one host, whatever
        their names, and contend for it only while they compute together.
        A pass with ``m`` workers computing at once runs at the co-located
        points when ``m`` reaches their number of workers, alone at 1, and
        in between at the straight line between the two (in ``m``); with
        more workers computing than the host has cores (the co-located
        points' ``host_cores``), the cores are time-shared: each pass takes
        ``m / cores`` times as long. The workers start an iteration's forward
        and backward passes together (the previous iteration's allreduce
        ended on all of them at once), and one that is done waits for the
        others' allreduce without computing: on a host of two cores a
        worker at batch 8 beside one at batch 32 is done after about a
        third of the other's compute, which then runs the rest of its
        passes alone, at the speed of one worker, not of two. `_contention`
        follows the workers' progress through these phases, and each
        group's passes are the mix of the levels it computed at, weighted by
        the share of its work done at each. The optimizer step runs on all
        workers at once (after the allreduce), at the level of all of them.
        Groups of other types run at their profile alone."""
        alone = [self._device_stats(cm, g.device_batch) for cm, g in zip(bases, groups)]
        busy = [j for j, g in enumerate(groups) if self.shares_host(g.instance_type)]
        on_host = [j for j in busy if bases[j].colocated is not None]
        if not on_host:
            return alone
        workers = sum(groups[j].devices for j in busy)
        shared = {j: self._device_stats(bases[j].colocated, groups[j].device_batch, True)  # type: ignore[arg-type]
                  for j in on_host}

        def level(j: int, m: int) -> tuple[float, float, float, float, float]:
            """Group j's stats with `m` workers computing on the host."""
            cm = bases[j]
            w = min(1.0, (m - 1) / max(1, cm.colocated_workers - 1))
            share = max(1.0, m / cm.host_cores) if cm.host_cores else 1.0
            a, c = alone[j], shared[j]
            return (share * (a[0] + w * (c[0] - a[0])), share * (a[1] + w * (c[1] - a[1])),
                    share * (a[2] + w * (c[2] - a[2])), share * (a[3] + w * (c[3] - a[3])),
                    share * (a[4] + w * (c[4] - a[4])))

        out = list(alone)
        if len(busy) == len(on_host) and len({(bases[j].model, groups[j].device_batch) for j in busy}) == 1:
            for j in on_host:  # one model at one batch: all compute together to the end
                out[j] = level(j, workers)
            return out

        def compute(j: int, m: int) -> float:
            # every shared-host worker, with or without co-located points, keeps the host busy while it computes
            if j in shared:
                stats = level(j, m)
                return stats[0] + stats[2]
            return alone[j][0] + alone[j][2]

        mix = _contention({j: groups[j].devices for j in busy}, compute)
        for j in on_host:
            levels = {m: level(j, m) for m in mix[j]}
            passes = [sum(f * levels[m][k] for m, f in mix[j].items()) for k in range(4)]
            out[j] = (passes[0], passes[1], passes[2], passes[3], level(j, workers)[4])
        return out

    def _device_stats(self, cm: ComputeModel, batch: int,
                      colocated: bool = False) -> tuple[float, float, float, float, float]:
        """(forward mean, forward sd, backward mean, backward sd, step) at a per-device batch."""
        key = (cm.device, colocated, batch)
        stats = self._stats.get(key)
        if stats is None:
            if batch > cm.max_batch:
                raise ProblemError(
                    f"batch {batch} per device is beyond the memory limit of {cm.model} on "
                    f"{cm.device} (max_batch {cm.max_batch})"
                )
            stats = self._stats[key] = (
                float(cm.forward_s(batch)), float(cm.forward_sd_s(batch)),
                float(cm.backward_s(batch)), float(cm.backward_sd_s(batch)), cm.step_s,
            )
        return stats

    def _sample_max(self, mean: float, sd: float, devices: int, row: int) -> np.ndarray:
        """Samples of the max of `devices` iid Normal(mean, sd) (inverse-CDF):
        ``mean + sd * z`` with ``z`` the max of `devices` standard normals,
        drawn once per (devices, row), so that a mean that varies from one
        configuration to the next (a shared host's contention mix) costs no
        quantile evaluations."""
        key = (mean, sd, devices, row)
        draws = self._draws.get(key)
        if draws is None:
            if sd <= 0.0:
                draws = np.full(self.samples, mean)
            else:
                z = self._standard.get((devices, row))
                if z is None:
                    u = np.exp(self._log_u[row] / devices) if devices > 1 else self._uniform[row]
                    z = self._standard[(devices, row)] = normal_quantile(u)
                draws = mean + sd * z
            if len(self._draws) > 100_000:
                self._draws.clear()
            self._draws[key] = draws
        return draws

    # -- the simulation ---------------------------------------------------------
    def simulate(self, groups: list[MachineGroup] | tuple[MachineGroup, ...]) -> IterationPrediction:
        """The iteration of a cluster of machine `groups`. Groups of the same
        instance type at the same batch (a type's spot and on-demand machines)
        are one group of their machines together: the cluster, not how a plan
        splits it by market, decides the prediction, so such splits are one
        simulation (`merge_groups`)."""
        key = tuple((g.instance_type.name, g.count, g.batch) for g in groups)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if not groups:
            raise ProblemError("a cluster needs at least one machine group")
        merged = merge_groups(groups)
        if len(merged) < len(groups):
            result = self.simulate(merged)
            self._cache[key] = result
            return result
        if len(groups) > self._max_groups:
            raise ProblemError(f"{len(groups)} machine groups; at most {self._max_groups} are supported")
        result = self._simulate(list(groups))
        if len(self._cache) > 200_000:
            self._cache.clear()
        self._cache[key] = result
        return result

    def _simulate(self, groups: list[MachineGroup]) -> IterationPrediction:
        fw = np.empty((len(groups), self.samples))
        bw = np.empty((len(groups), self.samples))
        mean_bw, slowest, step, ddp_overhead = -1.0, None, 0.0, 0.0
        bases = [self.compute_model(g.instance_type) for g in groups]
        for cm, g in zip(bases, groups):
            if g.device_batch > cm.max_batch:
                raise ProblemError(f"{g}: batch {g.device_batch} per device is beyond the memory limit of "
                                   f"{cm.model} on {cm.device} (max_batch {cm.max_batch})")
        for j, (g, base, stats) in enumerate(zip(groups, bases, self.host_stats(bases, groups))):
            mu_f, sd_f, mu_b, sd_b, step_j = stats
            fw[j] = self._sample_max(mu_f, sd_f, g.devices, 2 * j)
            bw[j] = self._sample_max(mu_b, sd_b, g.devices, 2 * j + 1)
            if mu_b > mean_bw:
                mean_bw, slowest = mu_b, base
            step = max(step, step_j)
            ddp_overhead = max(ddp_overhead, base.ddp_overhead_s)
        t_fw = fw.max(axis=0) if len(groups) > 1 else fw[0]
        t_bw = bw.max(axis=0) if len(groups) > 1 else bw[0]
        world = sum(g.devices for g in groups)
        instances = sum(g.count for g in groups)
        types = tuple(sorted({g.instance_type.name: g.instance_type for g in groups}.values(),
                             key=lambda t: t.name))
        sources = {t.name: self.bandwidth.source(t) for t in types}
        t_pe = 0.0
        if world > 1:
            assert slowest is not None  # groups is not empty, and a mean backward pass is more than -1
            sizes, ready = self.transfers(slowest)
            bus, cap = self._bandwidth(
                types, sizes, (tuple(t.name for t in types), world, instances, slowest.device), world, instances
            )
            work = 2.0 * sizes * (world - 1) / world
            if any(g.instance_type.device in self.shared_core_devices for g in groups):
                ready = np.ones_like(ready)  # no overlap: communication waits for the core
            t_pe = exchange_time((ready * float(t_bw.mean())).tolist(), work.tolist(), bus, cap)
            if self.transfer == "ddp" and slowest.buffer_bytes:
                t_fw = t_fw + self._buffer_broadcast_s(types, slowest, world, instances)
        exposed = np.maximum(t_bw, t_pe)
        if self.transfer == "ddp":  # DDP wraps the model on a world of one too (thrifty's worker does)
            exposed = exposed + ddp_overhead
        t_iter = t_fw + exposed + step
        return IterationPrediction(
            mean_s=float(t_iter.mean()),
            sd_s=float(t_iter.std()),
            p95_s=self._p95(t_iter),
            forward_s=float(t_fw.mean()),
            backward_s=float(t_bw.mean()),
            exchange_s=float(t_pe),
            exposed_comm_s=float((exposed - t_bw).mean()),
            step_s=float(step),
            world_size=world,
            instances=instances,
            bandwidth_sources=sources,
        )

    def _p95(self, values: np.ndarray) -> float:
        """The 95th percentile (linear interpolation, as numpy's default)."""
        ordered = np.sort(values)
        lo = int(self._p95_index)
        frac = self._p95_index - lo
        hi = min(lo + 1, len(ordered) - 1)
        return float(ordered[lo] + (ordered[hi] - ordered[lo]) * frac)

    def cache_clear(self) -> None:
        self._cache.clear()
