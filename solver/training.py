"""The training problem made concrete: the search space and the evaluation of
one candidate (Srifty 4.4).

Data, for each instance choice ``i`` (a type in a market): quota ``CAPS[i]``,
price ``P[i]`` per hour, GPUs per machine ``g[i]``, and the allowed
per-machine batches ``batches[i]`` (Srifty 4.4's pruning: powers of two, or
the machine's GPUs times powers of two; at least the latency-to-throughput
threshold of the device, measured against the best throughput the problem
can reach per device, i.e. up to ``min(memcap, B_global / g)``; at most its
memory cap, per GPU).

A candidate gives each used choice one count and one batch (every machine of a
choice gets the same batch) with ``sum_i count[i] * batch[i] = B_global``.
Its evaluation, with ``t_iter`` from the iteration simulator::

    total_s   = launch_s + N * t_iter
    cost_usd  = sum_i count[i] * P[i] * max(total_s, min_billed_s) / 3600
    total_p95 = launch_s + N * t_mean + 1.645 * sqrt(N) * t_sd   (sum of N iterations)

It is feasible when ``total_s <= T_lim`` and ``cost_usd <= $_lim``; the
objective is ``cost_usd`` (min_cost) or ``total_s`` (min_time).

`lower_bound` is a cheap bound that never exceeds the simulated iteration
time: per group the simulator's sampled mean of the slowest device's forward
is exactly ``mu_f + sd_f * e(k)`` (stratified sampling, see the simulator),
the maximum over groups of a sample mean is at most the sample mean of the
maximum, and ``t_iter >= t_fw + max(t_bw, t_pe) + t_step`` where the exchange
``t_pe`` cannot end before its last bytes, ready late in the backward pass,
have crossed the bandwidth cap. Exact searches use it to skip candidates that
cannot beat the best one simulated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from thrifty.datasets.catalog import Catalog, InstanceType, load_catalog
from thrifty.core.errors import ProblemError
from thrifty.perfmodels.bandwidth import BandwidthModel
from thrifty.perfmodels.cluster import MachineGroup
from thrifty.perfmodels.compute import ComputeModel
from thrifty.perfmodels.library import ModelLibrary
from thrifty.perfmodels.loading import default_bandwidth_model, load_bandwidth_model
from thrifty.perfmodels.profile import load_profile
from thrifty.perfmodels.simulator import IterationSimulator
from thrifty.solver.problem import InstanceChoice, TrainingProblem

__all__ = ["Choice", "Candidate", "Evaluation", "TrainingSpace", "Z95"]

Z95 = 1.6448536269514722  # one-sided 95% normal quantile


def group_sums(ways: np.ndarray, batch: int, quota: int) -> np.ndarray:
    """``out[r] = sum over count = 1..quota of ways[r - count * batch]`` (0 where
    the index is negative): the ways to reach r when one choice adds 1 to
    `quota` machines of `batch` samples to a placement counted by `ways`.

    A sliding window along each residue class mod `batch`, from one cumulative
    sum: O(len(ways)) whatever the quota (shifting once per count was
    O(len(ways) x quota), minutes for a global batch of a million). Counts in
    float64 stay exact below 2^53; beyond, the difference of two cumulative
    sums may lose low digits (the result only sizes the space, and is clipped
    at 0)."""
    n = len(ways)
    rows = -(-n // batch)
    padded = np.zeros(rows * batch, dtype=ways.dtype)
    padded[:n] = ways
    # cum[i] = ways[i] + ways[i - batch] + ways[i - 2 batch] + ...
    cum = np.cumsum(padded.reshape(rows, batch), axis=0).reshape(-1)[:n]
    out = np.zeros_like(ways)
    out[batch:] = cum[:n - batch] if n > batch else out[batch:]
    far = (quota + 1) * batch  # subtract the terms beyond `quota` machines
    if far < n:
        out[far:] -= cum[:n - far]
    if out.dtype.kind == "f":
        np.maximum(out, 0.0, out=out)
    return out


def batch_unit(batches: Iterable[int]) -> int:
    """The greatest common divisor of `batches` (1 for none): every sum of
    them is a multiple of it, so a table of what they can add up to needs
    only one entry per unit (per-machine batches are multiples of 8 or a
    power of two, so tables over a large global batch shrink 8 to 1024
    times)."""
    unit = 0
    for b in batches:
        unit = math.gcd(unit, b)
    return unit or 1


@lru_cache(maxsize=512)
def count_candidates(global_batch: int, groups: tuple[tuple[int, tuple[int, ...]], ...]) -> float:
    """How many candidates a space holds whose choices are `groups`, each
    ``(quota, allowed batches)``: the ways to place `global_batch` samples
    with, per choice, none or 1..quota machines of one of its batches.
    Counted by dynamic programming over the batch still to place (a float,
    since large spaces overflow any sensible int; `placements`).

    The count depends on nothing else (not on limits, prices or the model),
    so it is kept per shape: an infeasibility explanation asks it of many
    variants of one problem that differ only in their limits or one quota,
    and of the global batches near the problem's, and each count is
    O(global batch / unit x batches), where the unit is the batches'
    greatest common divisor (`batch_unit`)."""
    unit = batch_unit(b for _, batches in groups for b in batches)
    if global_batch % unit:
        return 0.0
    groups = tuple((quota, tuple(b // unit for b in batches)) for quota, batches in groups)
    # > global_batch: nearby global batches share one table
    span = 1 << max(10, (global_batch // unit).bit_length())
    return float(placements(groups, span)[global_batch // unit])


@lru_cache(maxsize=4)
def placements(groups: tuple[tuple[int, tuple[int, ...]], ...], span: int) -> np.ndarray:
    """``ways[r]``, r < `span`: the ways to place r samples on `groups`
    (`count_candidates`); the same for every r whatever the span (read-only)."""
    ways = np.zeros(span)
    ways[0] = 1.0
    for quota, batches in groups:
        new = ways.copy()
        for batch in batches:
            new += group_sums(ways, batch, quota)
        ways = new
    ways.setflags(write=False)
    return ways


# The bound sums means in another order than the simulator's sample mean, so
# where the bound is tight (one machine: no exchange) it may come out a few ulps
# above the simulated time; shrunk by this factor it never prunes a candidate
# whose simulated time meets a limit exactly (a relaxation's "needed" value).
BOUND_ROUNDING = 1.0 - 1e-12


NO_HOST_WORK = (0.0, 0.0, 0, 0)


def add_host_work(a: tuple[float, float, int, int], b: tuple[float, float, int, int]) -> tuple[float, float, int, int]:
    """Two parts of a cluster's shared-host work (`TrainingSpace.group_host_work`) together:
    the works and the workers add up, the step's work and the cores are the larger."""
    if b is NO_HOST_WORK:
        return a
    return a[0] + b[0], max(a[1], b[1]), max(a[2], b[2]), a[3] + b[3]


@dataclass(frozen=True)
class Choice:
    """One instance choice with everything the search needs."""

    index: int
    spec: InstanceChoice
    itype: InstanceType
    price_per_hour: float
    batches: tuple[int, ...]  # allowed per-machine batches, ascending
    shares_host: bool = False  # its machines are worker processes of this host (`IterationSimulator.shares_host`)

    @property
    def quota(self) -> int:
        return self.spec.quota

    @property
    def label(self) -> str:
        return self.spec.label


# A candidate: for each choice index, (count, batch); unused choices are absent.
Candidate = tuple[tuple[int, int, int], ...]  # ((choice index, count, batch), ...)


@dataclass(frozen=True)
class Evaluation:
    candidate: Candidate
    iteration_s: float
    iteration_sd_s: float
    iteration_p95_s: float
    total_s: float
    total_s_p95: float
    cost_usd: float
    feasible: bool
    objective_value: float


class BoundCache:
    """The bounds of each machine group (count machines of a type at a
    batch) that `TrainingSpace.candidates` prunes with, shared by the spaces
    derived from one space (`TrainingSpace.derive`): they depend on the
    simulator and the machines, not on limits, quotas, prices or the global
    batch, and an infeasibility explanation enumerates the candidates of
    dozens of variants that differ only in those (four in five of its group
    bounds were ones it had computed in another variant). Kept per list of
    machine types (a group names its type by its index in it), up to
    `LIMIT` entries each."""

    LIMIT = 200_000

    def __init__(self, simulator: IterationSimulator):
        self.simulator = simulator
        self._by_machines: dict[tuple[tuple[str, bool], ...], dict] = {}

    def of(self, choices: tuple["Choice", ...]) -> dict:
        """The group bounds of `choices`, by ``(choice index, count, batch)``."""
        key = tuple((c.itype.name, c.shares_host) for c in choices)
        return self._by_machines.setdefault(key, {})

    def keep(self, table: dict, key: object, value: object) -> None:
        if len(table) < self.LIMIT:
            table[key] = value


class TrainingSpace:
    """The search space and evaluator of one training problem."""

    def __init__(self, problem: TrainingProblem, library: ModelLibrary | None = None,
                 bandwidth: BandwidthModel | None = None, catalog: Catalog | None = None,
                 samples: int = 256, seed: int = 0, simulator: IterationSimulator | None = None,
                 bounds: "BoundCache | None" = None):
        self.problem = problem
        self.catalog = catalog or load_catalog(problem.catalog)
        self.library = library or ModelLibrary()
        model = problem.model
        if problem.job is not None:
            _add_job_profiles(self.library, problem, self.catalog)
        elif model.endswith(".json") or Path(model).exists():
            model = self.library.add_file(model).model
        self.model = model
        if simulator is None:
            if bandwidth is None:
                bandwidth = (load_bandwidth_model(problem.allreduce) if problem.allreduce
                             else default_bandwidth_model())
            simulator = IterationSimulator(model, library=self.library, bandwidth=bandwidth,
                                           samples=samples, seed=seed)
        self.simulator = simulator
        self.choices = tuple(self._choice(i, c) for i, c in enumerate(problem.instances))
        # the bounds are the simulator's and the machines': shared with the spaces derived from this one
        self._bounds = bounds if bounds is not None and bounds.simulator is simulator else BoundCache(simulator)
        self._group_bounds = self._bounds.of(self.choices)
        self.simulated = 0
        self.history: list[Evaluation] = []  # every candidate simulated, in order (for plots)

    def derive(self, **changes) -> "TrainingSpace":
        """The same problem with some fields changed (``limits``, ``objective``,
        ``instances``...), sharing this space's simulator and its caches."""
        problem = self.problem.model_copy(update=changes)
        return TrainingSpace(problem, library=self.library, catalog=self.catalog, simulator=self.simulator,
                             bounds=self._bounds)

    # -- data -------------------------------------------------------------------
    def _choice(self, index: int, spec: InstanceChoice) -> Choice:
        try:
            itype = self.catalog.get(spec.instance_type)
        except ProblemError as e:
            raise ProblemError(e.message, path=f"instances[{index}].instance_type") from None
        try:
            price = itype.price(spec.market)
        except ProblemError as e:
            raise ProblemError(e.message, path=f"instances[{index}].market") from None
        try:
            cm = self.library.get(self.model, itype.device, itype.name)
        except ProblemError as e:
            raise ProblemError(e.message, path="model") from None
        # the threshold is relative to the best throughput this problem can reach per device
        usable = min(cm.max_batch, -(-self.problem.global_batch // itype.gpus))
        return Choice(index, spec, itype, price,
                      self._allowed_batches(itype, cm.max_batch, cm.threshold_within(usable)),
                      self.simulator.shares_host(itype))

    def rule_batches(self, itype: InstanceType, max_device_batch: int | None = None,
                     upto: int | None = None) -> tuple[int, ...]:
        """The per-machine batches the problem's rule (``batch_sizes``) allows on
        `itype` up to its memory (and `upto`), before the throughput threshold."""
        if max_device_batch is None:
            max_device_batch = self.library.get(self.model, itype.device, itype.name).max_batch
        rule = self.problem.batch_sizes
        top = max_device_batch * itype.gpus if upto is None else min(max_device_batch * itype.gpus, upto)
        if isinstance(rule, list):
            values = sorted(set(rule))
        else:
            unit = itype.gpus if rule == "gpu_pow2" else 1
            values, b = [], unit
            while b <= top:
                values.append(b)
                b *= 2
        return tuple(b for b in values if b <= top and -(-b // itype.gpus) <= max_device_batch)

    def _allowed_batches(self, itype: InstanceType, max_device_batch: int, threshold: int) -> tuple[int, ...]:
        low = threshold * itype.gpus if self.problem.respect_threshold else 1
        return tuple(b for b in self.rule_batches(itype, max_device_batch, self.problem.global_batch) if b >= low)

    @property
    def iterations(self) -> int:
        return self.problem.iterations

    @property
    def launch_s(self) -> float:
        return self.problem.overheads.launch_s

    # -- evaluation -------------------------------------------------------------
    def groups(self, candidate: Candidate) -> list[MachineGroup]:
        return [MachineGroup(self.choices[i].itype, count, batch) for i, count, batch in candidate]

    def candidate(self, groups: list[tuple[str, int, int]]) -> Candidate:
        """The candidate of ``[(instance type, count, batch per machine), ...]``
        (each type one of the problem's instance choices)."""
        names = [c.itype.name for c in self.choices]
        for name, _, _ in groups:
            if name not in names:
                raise ProblemError(f"'{name}' is not one of the problem's instance types ({', '.join(names)})")
        return tuple(sorted((names.index(name), count, batch) for name, count, batch in groups))

    def describe(self, candidate: Candidate) -> str:
        """Srifty's notation: ``4xp3.8xlarge@512+1xg4dn.8xlarge@64``."""
        return "+".join(f"{count}x{self.choices[i].itype.name}@{batch}" for i, count, batch in candidate)

    def rate_per_hour(self, candidate: Candidate) -> float:
        return sum(self.choices[i].price_per_hour * count for i, count, _ in candidate)

    def cost(self, candidate: Candidate, total_s: float) -> float:
        return self.rate_per_hour(candidate) * max(total_s, self.problem.overheads.min_billed_s) / 3600.0

    def evaluate(self, candidate: Candidate) -> Evaluation:
        it = self.simulator.simulate(self.groups(candidate))
        self.simulated += 1
        n = self.iterations
        total = self.launch_s + n * it.mean_s
        total_p95 = self.launch_s + n * it.mean_s + Z95 * math.sqrt(n) * it.sd_s
        cost = self.cost(candidate, total)
        limits = self.problem.limits
        feasible = (limits.time_s is None or total <= limits.time_s) and (
            limits.cost_usd is None or cost <= limits.cost_usd)
        value = cost if self.problem.objective == "min_cost" else total
        ev = Evaluation(candidate, it.mean_s, it.sd_s, it.p95_s, total, total_p95, cost, feasible, value)
        if len(self.history) < 100_000:
            self.history.append(ev)
        return ev

    # -- bounds -----------------------------------------------------------------
    def group_compute_bound(self, choice: Choice, count: int, batch: int) -> tuple[float, float, float]:
        """(forward, backward, step) lower bounds for `count` machines of `choice` at `batch`."""
        mu_f, sd_f, mu_b, sd_b, step = self.simulator.device_stats(choice.itype, -(-batch // choice.itype.gpus))
        e = self.simulator.expected_max_factor(count * choice.itype.gpus)
        return mu_f + sd_f * e, mu_b + sd_b * e, step

    def group_bound(self, k: int, count: int, batch: int) -> tuple[float, float, float, tuple[float, float, int, int]]:
        """`count` machines of choice `k` at `batch`: their (forward, backward,
        step) lower bounds and their shared-host work (`group_compute_bound`,
        `group_host_work`), kept (`BoundCache`)."""
        key = (k, count, batch)
        known = self._group_bounds.get(key)
        if known is None:
            c = self.choices[k]
            known = (*self.group_compute_bound(c, count, batch), self.group_host_work(c, count, batch))
            self._bounds.keep(self._group_bounds, key, known)
        return known

    def group_host_work(self, choice: Choice, count: int, batch: int) -> tuple[float, float, int, int]:
        """`count` machines of `choice` at `batch` on the shared host: (their
        passes' work, their step's work, the host's cores, their workers)
        (`IterationSimulator.host_work`); zeros for machines of their own."""
        itype = choice.itype
        if not choice.shares_host:
            return NO_HOST_WORK
        devices = count * itype.gpus
        work = self.simulator.host_work(itype, -(-batch // itype.gpus))
        if work is None:
            return 0.0, 0.0, 0, devices
        return devices * work[0], work[1], work[2], devices

    @staticmethod
    def bound_s(fw: float, rest: float, step: float, host: tuple[float, float, int, int]) -> float:
        """An iteration's lower bound from the slowest forward, what follows it
        (the slowest backward, or the exposed exchange), the largest step and
        the shared host's work (`group_host_work`, summed; the most cores;
        the workers summed): the passes take at least the host's work over
        its cores, the step at least its share of the cores
        (`IterationSimulator.host_lower_bound`)."""
        if host is NO_HOST_WORK:
            return (fw + rest + step) * BOUND_ROUNDING
        work, step_work, cores, workers = host
        passes, host_step = IterationSimulator.host_lower_bound(work, step_work, workers, cores)
        return (max(fw + rest, passes) + max(step, host_step)) * BOUND_ROUNDING

    def lower_bound(self, candidate: Candidate) -> float:
        """A lower bound on the simulated iteration time of `candidate`: the
        slowest forward, then the larger of the slowest backward and the
        exchange's tail (`IterationSimulator.exposed_lower_bound`), then the
        step; with machines that share this host (local workers), the host's
        cores time-shared by their passes and steps (`bound_s`)."""
        sim = self.simulator
        fw = bw = step = 0.0
        slowest, slowest_mu_b = None, -1.0
        world = machines = 0
        types = {}
        host = NO_HOST_WORK
        for i, count, batch in candidate:
            itype = self.choices[i].itype
            mu_f, sd_f, mu_b, sd_b, s = sim.device_stats(itype, -(-batch // itype.gpus))
            e = sim.expected_max_factor(count * itype.gpus)
            fw, bw, step = max(fw, mu_f + sd_f * e), max(bw, mu_b + sd_b * e), max(step, s)
            if mu_b > slowest_mu_b:
                slowest, slowest_mu_b = itype, mu_b
            world += count * itype.gpus
            machines += count
            types[itype.name] = itype
            host = add_host_work(host, self.group_host_work(self.choices[i], count, batch))
        if world <= 1 or slowest is None:
            return self.bound_s(fw, bw, step, host)
        ordered = tuple(types[name] for name in sorted(types))
        exposed = sim.exposed_lower_bound(ordered, world, machines, sim.compute_model(slowest), bw)
        return self.bound_s(fw, exposed, step, host)

    def objective_bound(self, candidate: Candidate, iteration_s: float) -> float:
        total = self.launch_s + self.iterations * iteration_s
        return self.cost(candidate, total) if self.problem.objective == "min_cost" else total

    def bound_feasible(self, candidate: Candidate, iteration_s: float) -> bool:
        """False when even `iteration_s` (a lower bound) breaks a limit."""
        total = self.launch_s + self.iterations * iteration_s
        limits = self.problem.limits
        return (limits.time_s is None or total <= limits.time_s) and (
            limits.cost_usd is None or self.cost(candidate, total) <= limits.cost_usd)

    # -- the space ----------------------------------------------------------------
    def candidates(self, within_limits: bool = False) -> Iterator[Candidate]:
        """Every candidate of the pruned space (Srifty 4.4).

        With `within_limits`, branches whose partial lower bound already
        breaks a limit are cut: adding machine groups only raises the slowest
        forward, backward and step (maxima) and the hourly rate (a sum), so a
        partial candidate's bound (`lower_bound`, `bound_feasible`) never
        falls as it grows, and no extension of a cut branch is within the
        limits. The candidates left out are exactly those `bound_feasible`
        rejects."""
        choices = self.choices
        # sample counts in units of the batches' common divisor: every sum of batches is a multiple of it
        unit = batch_unit(b for c in choices for b in c.batches)
        if self.problem.global_batch % unit:
            return
        target = self.problem.global_batch // unit
        # reach[k][r]: choices k.. can place exactly r units (so dead branches are never entered)
        reach = [np.zeros(target + 1, dtype=bool) for _ in range(len(choices) + 1)]
        reach[len(choices)][0] = True
        for k in range(len(choices) - 1, -1, -1):
            nxt = reach[k + 1]
            cur = nxt.astype(np.int64)
            for batch in choices[k].batches:
                cur += group_sums(nxt.astype(np.int64), batch // unit, choices[k].quota)
            reach[k] = cur > 0
        # the same as lists, whose lookups of one count are faster than numpy's; not for a huge global batch in
        # units, where converting them would cost more than it saves
        reachable = [r.tolist() for r in reach] if target <= 1 << 16 else reach

        limits = self.problem.limits
        check = within_limits and (limits.time_s is not None or limits.cost_usd is not None)
        n, launch, floor_s = self.iterations, self.launch_s, self.problem.overheads.min_billed_s

        def breaks(fw: float, bw: float, step: float, rate: float, host: tuple[float, float, int, int]) -> bool:
            total = launch + n * self.bound_s(fw, bw, step, host)  # as `lower_bound`
            return (limits.time_s is not None and total > limits.time_s) or (
                limits.cost_usd is not None and rate * max(total, floor_s) / 3600.0 > limits.cost_usd)

        group_bound = self.group_bound

        def rec(k: int, remaining: int, chosen: tuple, fw: float, bw: float, step: float,
                rate: float, host: tuple[float, float, int, int]) -> Iterator[Candidate]:
            if remaining == 0:
                if chosen:
                    yield chosen
                return
            nxt = reachable[k + 1]
            if nxt[remaining]:
                yield from rec(k + 1, remaining, chosen, fw, bw, step, rate, host)  # choice k unused
            c = choices[k]
            for batch in c.batches:
                units = batch // unit
                if units > remaining:
                    break
                top = min(c.quota, remaining // units)
                # the counts that leave a batch the later choices can place (a scan of many counts in numpy)
                counts = [n for n in range(1, top + 1) if nxt[remaining - n * units]] if top <= 32 else \
                    (np.flatnonzero(reach[k + 1][remaining - units * np.arange(1, top + 1)]) + 1).tolist()
                for count in counts:
                    left = remaining - count * units
                    if check:
                        f, b, st, work = group_bound(k, count, batch)
                        bounds = (max(fw, f), max(bw, b), max(step, st), rate + c.price_per_hour * count,
                                  add_host_work(host, work))
                        if breaks(*bounds):
                            break  # more machines of this batch only raise the bound
                    else:
                        bounds = (fw, bw, step, rate, host)
                    yield from rec(k + 1, left, chosen + ((k, count, batch),), *bounds)

        if reach[0][target]:
            yield from rec(0, target, (), 0.0, 0.0, 0.0, 0.0, NO_HOST_WORK)

    @cached_property
    def size(self) -> float:
        """How many candidates the pruned space holds (`count_candidates`)."""
        return count_candidates(self.problem.global_batch, tuple((c.quota, c.batches) for c in self.choices))


def _add_job_profiles(library: ModelLibrary, problem: TrainingProblem, catalog: Catalog) -> None:
    """Add to `library`, under the problem's model name, the profile of its
    job measured on (or on the device of) each instance type it may use
    (`thrifty.perfmodels.job_profiles`).

    A type without one is an error (exit code 2) naming every such type and
    the commands that measure them, rather than a plan over the priced types
    only: a plan that quietly leaves out machines the user offered would
    answer another problem than the one asked (the user who wants that
    removes the types from ``instances``), and a profile of another job or of
    a shipped model would price code that does not run."""
    from thrifty.perfmodels.job_profiles import job_key, measure_command, profiles_for

    assert problem.job is not None
    key = job_key(problem.job, problem.job_args)
    types: dict[str, str] = {}
    for index, choice in enumerate(problem.instances):
        try:
            types[choice.instance_type] = catalog.get(choice.instance_type).device
        except ProblemError as e:
            raise ProblemError(e.message, path=f"instances[{index}].instance_type") from None
    found = profiles_for(key, types)
    missing = [name for name in types if name not in found]
    if missing:
        listed = ", ".join(f"{name} ({types[name]})" for name in missing)
        raise ProblemError(
            f"job '{problem.job}' (key {key}) has no profile for instance type{'s' if len(missing) > 1 else ''} "
            f"{listed}, so they cannot be priced; measure them: "
            f"{measure_command(problem.job, problem.job_args, missing)}",
            path="job")
    for name, path in found.items():
        profile = load_profile(path)
        library.add_typed(replace(ComputeModel.from_profile(profile), model=problem.model), name)
