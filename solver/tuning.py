"""Tuning plans (RubberBand, EuroSys 2021): per-stage allocations of a
successive-halving / Hyperband job at least cost under a deadline.

`TuningSpace` turns a `TuningProblem` into an `ExperimentSpec`, scaling and
cloud profiles, a `JobSimulator` and, per stage, the allocations worth
considering with their simulated coefficients. Planners:

- `plan_static`: the cheapest feasible static cluster (RubberBand 3.2): m
  instances for the whole job, shared fairly within each stage;
- `plan_naive_elastic`: fixed GPUs per trial, every trial of a stage in
  parallel, the cluster shrinking with the trials (6.3.1);
- `plan_greedy`: RubberBand's Algorithm 2 (4.3): from warm starts at 1x, 2x, 3x
  the static size, repeatedly decrement one stage's GPU total by the smallest
  step that keeps it a factor or multiple of the stage's trials, taking the
  candidate of largest ``(C(a*) - C(a')) / (T(a') - T(a*))``; stop when none
  improves cost within the deadline;
- `plan_exact`: thrifty's exact formulation, below, solved with CP-SAT and
  verified by Monte Carlo simulation;
- `plan_tuning`: all of them; the answer is the exact plan unless its
  simulated cost is higher than greedy's (or it is infeasible under
  simulation), in which case greedy's plan is returned and the plan says so
  (``fallback_to_greedy=False`` returns the exact plan alone, so tests can
  compare it with greedy's).

Exact formulation (`plan_exact`)
--------------------------------
Data. Stages k = 1..K with n_k trials. Options o in O_k: an instance type
t(o), g(o) GPUs per trial and m(o) instances, the fewest that run P trials at
once (P ranges over the distinct values of ceil(n_k / w), w = 1..n_k waves, so
every wave count is offered once). For each option, from the simulator's
TRAIN phase (common random numbers): D_ko = E[time from the first TRAIN node
to SYNC], Q_ko = its p95, C_ko = its expected cost (per-instance billing:
m(o) * price_t * D_ko; per-function: busy GPU-seconds * price per GPU-second;
both: expected spot re-downloads * data price). Per type t: price_t, SCALE
latency Ls_t, INIT latency Li_t, data cost per new instance d_t, and
f_t(j) = E[SCALE + max of j INIT latencies] (f_t(0) = 0).

Variables. x_ko in {0, 1} (option o in stage k); M_kt = sum_o m(o) x_ko
instances of type t held in stage k (M_0t = 0); Keep_kt = min(M_(k-1)t, M_kt);
New_kt = M_kt - Keep_kt; b_k in {0, 1} (stage k scales up); tau_k >= 0
(scale-up latency); H_kt >= 0 (cost of instances waiting for the scale-up).

Constraints.
  (1) sum_o x_ko = 1                                  one option per stage
  (2) New_kt <= Mmax_t * b_k                          a new instance needs a SCALE
  (3) tau_k = max_t f_t(New_kt)                        (element constraints)
  (4) H_kt >= price_t (Li_t M_kt + Ls_t Keep_kt) - BIG (1 - b_k)   [per-instance billing]
  (5) sum_k (sum_o D_ko x_ko + tau_k) <= deadline      mean JCT
  (5') sum_k (sum_o Q_ko x_ko + tau_k) <= deadline     if the deadline is on p95
Objective. minimize sum_k [ sum_o C_ko x_ko + sum_t (H_kt + d_t New_kt) ].

Because SYNC is a barrier, JCT is the sum of independent stage times, so (5)
is the simulator's mean JCT exactly. (5') bounds p95 JCT by the sum of stage
p95s (conservative). The cost is the simulator's expected cost except for the
60 s billing minimum per instance and, when INIT latency varies, new
instances waiting for the slowest INIT (both are in the verification).
Times are integers in ms and costs in micro-USD. Verification: the chosen
plan is simulated (Monte Carlo over the DAG) and compared with greedy's.
With fixed SCALE and INIT latencies both terms left out only add cost, so the
model's cost is a lower bound of the simulated cost of every plan, and
`plan_exact` uses it as one: the plans
tried are excluded (6: at least one stage's option differs) and the model
solved again below the cheapest simulated cost so far (7), until no plan is
left below it. The answer is then the cheapest plan under simulation, and
``optimal`` says so; a search stopped by the time limit is ``feasible`` with
its gap to that bound. (Before, the model's optimum was the answer, and a
later deadline could cost more where the billing minimum decides.)

Deviations from RubberBand: options fix the fewest instances for a parallelism
(RubberBand's vector counts GPUs); the instance type may change per stage;
spot preemptions are priced into D and C by the simulator.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Sequence
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from thrifty.datasets.catalog import load_catalog
from thrifty.core.errors import ProblemError, SolverError
from thrifty.perfmodels.experiment import ExperimentSpec, hyperband_spec, sha_spec
from thrifty.perfmodels.jobsim import JobResult, JobSimulator, StageAllocation, p95, slots
from thrifty.perfmodels.bundle import scaling_profile_of
from thrifty.perfmodels.provenance import FigureSource, display_path, from_record
from thrifty.perfmodels.scaling import SCALING_DIR, CloudProfile, ScalingProfile
from thrifty.solver.plan import LatencyProvenance, TypeProvenance
from thrifty.solver.problem import TuningProblem

__all__ = ["TuningSpace", "Option", "Candidate", "plan_static", "plan_naive_elastic", "plan_greedy",
           "plan_exact", "plan_tuning", "brute_force", "model_value", "TuningResult", "gpu_choices"]

MAX_STATIC_WORK = 2 * 10**9  # trial-samples of the static sweep: seconds of simulation, not minutes
TIME_SCALE = 1000.0       # ms
COST_SCALE = 1_000_000.0  # micro-USD


@dataclass(frozen=True)
class Option:
    alloc: StageAllocation
    itype: str
    mean_s: float
    p95_s: float
    cost_usd: float


@dataclass(frozen=True)
class Candidate:
    """A whole-job plan with its simulated result."""

    plan: tuple[StageAllocation, ...]
    result: JobResult

    @property
    def cost(self) -> float:
        return self.result.cost_usd


def gpu_choices(gpus_per_instance: int, max_gpus: int) -> list[int]:
    """GPUs per trial worth offering: divisors of an instance, then whole instances."""
    G = gpus_per_instance
    out = [d for d in range(1, G + 1) if G % d == 0]
    out += [G * j for j in range(2, max_gpus // G + 1)]
    return [g for g in out if g <= max_gpus]


def build_spec(problem: TuningProblem) -> ExperimentSpec:
    if problem.stages is not None:
        return ExperimentSpec.explicit([(s.trials, s.iters) for s in problem.stages])
    e = problem.experiment
    assert e is not None  # TuningProblem: exactly one of experiment and stages
    if e.algorithm == "hyperband":
        return hyperband_spec(e.min_iters, e.max_iters, e.eta)
    assert e.trials is not None  # Experiment: SHA's trials are required
    return sha_spec(e.trials, e.min_iters, e.max_iters, e.eta)


class TuningSpace:
    """The problem's simulator and per-stage options with their coefficients."""

    def __init__(self, problem: TuningProblem):
        self.problem = problem
        self.spec = build_spec(problem)
        catalog = load_catalog(problem.catalog)
        profiles, clouds = {}, {}
        # per type: where its scaling profile and its SCALE and INIT latencies came from (`provenance`)
        self.sources: dict[str, tuple[FigureSource, dict[str, LatencyProvenance]]] = {}
        for i, name in enumerate(problem.instance_types):
            path = "instance_type" if isinstance(problem.instance_type, str) else f"instance_type[{i}]"
            try:
                itype = catalog.get(name)
            except ProblemError as e:
                raise ProblemError(e.message, path=path) from None
            prof, measured = scaling_profile_of(problem.model, name)
            source = self._profile_source(prof, name)
            ov = problem.profile
            if ov.base_iteration_s is not None or ov.iteration_sd_s is not None:
                prof = prof.scaled(ov.base_iteration_s, ov.iteration_sd_s)
                said = ", ".join(f"{k} {v:g} s" for k, v in (("base_iteration_s", ov.base_iteration_s),
                                                              ("iteration_sd_s", ov.iteration_sd_s)) if v is not None)
                source = FigureSource(kind="stated", model="scaling profile", prior=source,
                                      note=f"the profile rescaled by the problem's profile ({said})")
            c = problem.cloud
            price = itype.price(problem.market)
            # SCALE and INIT: the problem's, else what a bundle measured on this type's machines
            latencies = {which: self._latency_source(which, measured) for which in ("scale", "init")}
            scale_s, init_s = latencies["scale"].seconds, latencies["init"].seconds
            self.sources[name] = (source, latencies)
            clouds[name] = CloudProfile(
                name, itype.gpus, price, problem.billing, c.min_billed_s, scale_s,
                c.scale_latency_sd_s, init_s, c.init_latency_sd_s, c.data_usd_per_gb,
                c.dataset_gb, problem.market, c.preemptions_per_hour if problem.market == "spot" else 0.0,
                c.recovery_s)
            profiles[name] = prof
        self.clouds = clouds
        self.profiles = profiles
        self.sim = JobSimulator(self.spec, profiles, clouds, problem.samples, problem.seed)
        self._options: dict[int, list[Option]] | None = None
        self.simulated = 0  # distinct plans simulated
        self._simulations: dict[tuple[StageAllocation, ...], Candidate] = {}
        self._check_static_sweep()

    def _profile_source(self, profile: ScalingProfile, instance_type: str) -> FigureSource:
        """Where a type's scaling profile came from: its file's provenance record."""
        model = self.problem.model
        file = model if model.endswith(".json") else str(SCALING_DIR / f"{model}__{instance_type}.json")
        source = from_record(profile.provenance, "scaling profile", display_path(file))
        if model.endswith(".json") and profile.source != model:  # a bundle
            source = source.with_note(f"the bundle's profile of {instance_type}")
        return source

    def _latency_source(self, which: str, measured: Any) -> LatencyProvenance:
        """The SCALE (`which` "scale") or INIT latency of a type and where it
        came from: the problem's ``cloud`` when it states it, else the
        launch-to-ready time a bundle measured on the type's machines
        (``thrifty profile-scaling --cluster``), else the schema's default."""
        key = f"{which}_latency_s"
        if key in self.problem.cloud.model_fields_set:
            return LatencyProvenance(kind="stated", seconds=float(getattr(self.problem.cloud, key)))
        if measured is not None:
            return LatencyProvenance(kind="measured", seconds=float(getattr(measured, key)),
                                     file=display_path(self.problem.model))
        return LatencyProvenance(kind="default", seconds=float(getattr(self.problem.cloud, key)))

    def provenance(self) -> dict[str, TypeProvenance]:
        """Where each type's figures came from, as a tuning plan records it:
        its scaling profile, whose iteration times at each GPU count include
        the gradient exchange (so its allreduce figures are the profile's),
        and its SCALE and INIT latencies."""
        out = {}
        for name, (source, latencies) in self.sources.items():
            exchange = source.with_note("the profile's iteration times at each GPU count include the gradient exchange")
            out[name] = TypeProvenance(compute=source, allreduce=exchange, scale_latency=latencies["scale"],
                                       init_latency=latencies["init"])
        return out

    def _check_static_sweep(self) -> None:
        """The static baseline (greedy's warm start) simulates every cluster size of
        `static_sweep`, each over all trials and samples (and the first scale-up over
        as many INIT draws as instances): refuse a sweep beyond `MAX_STATIC_WORK`."""
        trials, samples = sum(s.trials for s in self.spec.stages), self.problem.samples
        for t in self.clouds:
            m = static_sweep(self, t)
            work = samples * m * (trials + m // 2)
            if work > MAX_STATIC_WORK:
                fits = int((math.sqrt(trials**2 + 2 * MAX_STATIC_WORK / samples) - trials))
                raise ProblemError(
                    f"is {self.problem.max_instances}: the static baseline would simulate {m:,} cluster sizes "
                    f"of {t} over {trials:,} trials and {samples} samples ({work:,} trial-samples, more than "
                    f"{MAX_STATIC_WORK:,}); use max_instances <= {max(fits, 1):,}, or fewer samples",
                    path="max_instances")

    # the fields that leave the job simulator as it was (it reads the stages, profiles, clouds, samples, seed)
    SIMULATION_FREE = frozenset({"deadline_s", "deadline_on", "max_instances", "max_gpus_per_trial"})

    def derive(self, **changes: Any) -> "TuningSpace":
        """The same problem with `changes`. A change of only `SIMULATION_FREE`
        fields shares this space's job simulator and the plans it simulated (a
        plan's result is the same in both: the simulator's common random
        numbers), so an infeasibility explanation, which plans the problem
        again under a dozen deadlines and fleet bounds, simulates each plan
        once; any other change builds a space of its own."""
        problem = self.problem.model_copy(update=changes)
        if not set(changes) <= self.SIMULATION_FREE:
            return TuningSpace(problem)
        space = copy.copy(self)
        space.problem, space._options, space.simulated = problem, None, 0
        space._check_static_sweep()
        return space

    @property
    def deadline(self) -> float:
        return self.problem.deadline_s

    def max_gpus(self, itype: str) -> int:
        cap = self.profiles[itype].max_gpus
        if self.problem.max_gpus_per_trial:
            cap = min(cap, self.problem.max_gpus_per_trial)
        return min(cap, self.problem.max_instances * self.clouds[itype].gpus_per_instance)

    def simulate(self, plan: tuple[StageAllocation, ...]) -> Candidate:
        """The plan's simulated JCT and cost, once per distinct plan: the
        planners share the space, and the static sweep, greedy's warm starts
        and its neighbourhoods revisit the same plans (the simulator's common
        random numbers make a plan's result the same every time)."""
        plan = tuple(plan)
        hit = self._simulations.get(plan)
        if hit is None:
            self.simulated += 1
            hit = self._simulations[plan] = Candidate(plan, self.sim.simulate(plan))
        return hit

    def jct(self, c: Candidate) -> float:
        return c.result.jct_s_p95 if self.problem.deadline_on == "p95" else c.result.jct_s

    def feasible(self, c: Candidate) -> bool:
        return self.jct(c) <= self.deadline * (1 + 1e-9)

    # -- options -------------------------------------------------------------------
    def options(self, k: int, prune_deadline: float | None = None) -> list[Option]:
        n, iters = self.spec.get_stage(k)
        out: list[Option] = []
        for itype, cloud in self.clouds.items():
            G, prof = cloud.gpus_per_instance, self.profiles[itype]
            for g in gpu_choices(G, self.max_gpus(itype)):
                mean_g, _ = prof.iteration(g)
                seen: set[int] = set()
                for P in sorted({-(-n // w) for w in range(1, n + 1)}):
                    m = -(-P // (G // g)) if g <= G else P * -(-g // G)
                    if m > self.problem.max_instances or m in seen:
                        continue
                    seen.add(m)
                    waves = -(-n // min(n, slots(g, m, G)))
                    if prune_deadline is not None and waves * iters * mean_g * 0.9 > prune_deadline:
                        continue
                    a = StageAllocation(g, m, itype)
                    dur, busy, pre = self.sim.stage_train(k, a)
                    if cloud.billing == "per_instance":
                        cost = m * cloud.usd_per_second * dur
                    else:
                        cost = busy * cloud.usd_per_gpu_second
                    cost = cost + pre * cloud.data_usd_per_instance
                    out.append(Option(a, itype, float(dur.mean()), p95(dur),
                                      float(cost.mean())))
        return _pareto_per_fleet(out)

    def all_options(self) -> dict[int, list[Option]]:
        if self._options is None:
            self._options = {k: self.options(k, self.deadline) for k in range(self.spec.num_stages)}
        return self._options

    def scale_table(self, k: int, itype: str, up_to: int) -> np.ndarray:
        """f_t(j) = E[SCALE + max of j INIT latencies], j = 0..up_to."""
        if up_to <= 0:
            return np.zeros(1)
        inits = self.sim.init_latencies(k, itype, up_to)
        running = np.maximum.accumulate(inits, axis=0).mean(axis=1)
        return np.concatenate([[0.0], self.sim.scale_latency(k, itype).mean() + running])


def _pareto_per_fleet(options: list[Option]) -> list[Option]:
    """Drop an option when another with the same fleet is no slower (mean, p95) and no dearer."""
    keep = []
    for o in options:
        if not any(p is not o and p.itype == o.itype and p.alloc.instances == o.alloc.instances
                   and p.mean_s <= o.mean_s and p.p95_s <= o.p95_s and p.cost_usd <= o.cost_usd
                   and (p.mean_s, p.p95_s, p.cost_usd) != (o.mean_s, o.p95_s, o.cost_usd)
                   for p in options):
            keep.append(o)
    # identical duplicates: keep the first
    out, seen = [], set()
    for o in keep:
        key = (o.itype, o.alloc.instances, o.mean_s, o.p95_s, o.cost_usd)
        if key not in seen:
            seen.add(key)
            out.append(o)
    return out


# -- the additive model of the exact formulation ------------------------------------

def model_value(space: TuningSpace, seq: tuple[Option, ...]) -> tuple[float, float, float]:
    """(mean time, p95-bound time, expected cost) of a sequence of options under the
    exact formulation's model (the same numbers CP-SAT optimizes, unrounded)."""
    t = q = c = 0.0
    held: dict[str, int] = {}
    for k, o in enumerate(seq):
        cloud = space.clouds[o.itype]
        m = o.alloc.instances
        keep = min(held.get(o.itype, 0), m)
        new = m - keep
        tau = float(space.scale_table(k, o.itype, new)[new]) if new else 0.0
        t += o.mean_s + tau
        q += o.p95_s + tau
        c += o.cost_usd + new * cloud.data_usd_per_instance
        if new and cloud.billing == "per_instance":
            c += cloud.usd_per_second * (cloud.init_latency_s * m + cloud.scale_latency_s * keep)
        held = {o.itype: m}
    return t, q, c


def brute_force(space: TuningSpace, limit: int = 2_000_000) -> tuple[tuple[Option, ...] | None, float]:
    """Enumerate every sequence of options (small specs only): the cheapest within the deadline."""
    opts = space.all_options()
    size = math.prod(len(opts[k]) for k in opts)
    if size > limit:
        raise ProblemError(f"brute force over {size} sequences is too large (limit {limit})")
    best, best_cost = None, math.inf
    use_p95 = space.problem.deadline_on == "p95"
    for seq in itertools.product(*(opts[k] for k in sorted(opts))):
        t, q, c = model_value(space, seq)
        if (q if use_p95 else t) <= space.deadline + 1e-6 and c < best_cost:
            best, best_cost = seq, c
    return best, best_cost


# -- CP-SAT ------------------------------------------------------------------------

@dataclass
class ExactResult:
    """One answer of the exact formulation. `status` is CP-SAT's: ``optimal``
    or ``feasible`` with `options` the plan; ``infeasible`` (proven: no plan)
    or ``unknown`` (the time limit passed before any plan was found, which
    proves nothing; ``details["reason"]`` says so) with `options` None."""

    options: tuple[Option, ...] | None
    model_jct_s: float | None
    model_cost_usd: float | None
    status: str
    wall_s: float
    details: dict[str, Any] = field(default_factory=dict)


def solve_cpsat(space: TuningSpace, objective: str = "min_cost", deadline: float | None = None,
                time_limit_s: float = 10.0, exclude: Sequence[tuple[Option, ...]] = (),
                cost_below: float | None = None) -> ExactResult:
    """The formulation of the module docstring, numbered as there; every plan
    of `exclude` left out, and with `cost_below` only plans whose model cost
    is below it (`plan_exact`'s search)."""
    from ortools.sat.python import cp_model

    start = time.perf_counter()
    opts = space.all_options() if deadline is not None else {
        k: space.options(k) for k in range(space.spec.num_stages)}
    K = space.spec.num_stages
    types = list(space.clouds)
    if any(not opts[k] for k in range(K)):
        return ExactResult(None, None, None, "infeasible", time.perf_counter() - start, {"empty_stage": True})
    mmax = {t: max([o.alloc.instances for k in range(K) for o in opts[k] if o.itype == t], default=0) for t in types}
    _check_integer_range(space, opts, mmax)
    model = cp_model.CpModel()
    x = {(k, i): model.new_bool_var(f"x_{k}_{i}") for k in range(K) for i in range(len(opts[k]))}
    time_terms: list[cp_model.LinearExprT] = []
    p95_terms: list[cp_model.LinearExprT] = []
    cost_terms: list[cp_model.LinearExprT] = []
    prev: dict[str, int | cp_model.IntVar] = {t: 0 for t in types}  # instances held after stage k - 1
    for k in range(K):
        model.add_exactly_one(x[k, i] for i in range(len(opts[k])))                      # (1)
        b = model.new_bool_var(f"b_{k}")
        taus: list[cp_model.IntVar] = []
        tau_ub = 0
        for t in types:
            if mmax[t] == 0:
                continue
            cloud = space.clouds[t]
            M = model.new_int_var(0, mmax[t], f"M_{k}_{t}")
            model.add(M == sum(o.alloc.instances * x[k, i] for i, o in enumerate(opts[k]) if o.itype == t))
            keep = model.new_int_var(0, mmax[t], f"keep_{k}_{t}")
            if isinstance(prev[t], int):
                model.add(keep == 0)
            else:
                model.add_min_equality(keep, [prev[t], M])
            new = model.new_int_var(0, mmax[t], f"new_{k}_{t}")
            model.add(new == M - keep)
            model.add(new <= mmax[t] * b)                                                 # (2)
            table = [int(round(v * TIME_SCALE)) for v in space.scale_table(k, t, mmax[t])]
            tau_t = model.new_int_var(0, max(table), f"tau_{k}_{t}")
            model.add_element(new, table, tau_t)                                           # (3)
            taus.append(tau_t)
            tau_ub = max(tau_ub, max(table))
            if cloud.billing == "per_instance":                                           # (4)
                coef_m = int(round(cloud.usd_per_second * cloud.init_latency_s * COST_SCALE))
                coef_k = int(round(cloud.usd_per_second * cloud.scale_latency_s * COST_SCALE))
                big = coef_m * mmax[t] + coef_k * mmax[t]
                hold = model.new_int_var(0, big, f"H_{k}_{t}")
                model.add(hold >= coef_m * M + coef_k * keep - big * (1 - b))
                cost_terms.append(hold)
            cost_terms.append(int(round(cloud.data_usd_per_instance * COST_SCALE)) * new)
            prev[t] = M
        tau = model.new_int_var(0, tau_ub, f"tau_{k}")
        model.add_max_equality(tau, taus)
        time_terms.append(tau)
        p95_terms.append(tau)
        for i, o in enumerate(opts[k]):
            time_terms.append(int(round(o.mean_s * TIME_SCALE)) * x[k, i])
            p95_terms.append(int(round(o.p95_s * TIME_SCALE)) * x[k, i])
            cost_terms.append(int(round(o.cost_usd * COST_SCALE)) * x[k, i])
    total_time = sum(time_terms)
    if deadline is not None:
        limit = int(math.floor(deadline * TIME_SCALE))
        model.add(total_time <= limit)                                                    # (5)
        if space.problem.deadline_on == "p95":
            model.add(sum(p95_terms) <= limit)                                            # (5')
    for plan in exclude:  # (6) not a plan already tried
        model.add_bool_or([~x[k, next(i for i, o in enumerate(opts[k]) if o == chosen)]
                           for k, chosen in enumerate(plan)])
    if cost_below is not None:  # (7) cheaper than the cheapest plan so far
        model.add(sum(cost_terms) < int(math.ceil(cost_below * COST_SCALE)))
    model.minimize(sum(cost_terms) if objective == "min_cost" else total_time)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = 2
    status = solver.solve(model)
    wall = time.perf_counter() - start
    if status == cp_model.INFEASIBLE:
        return ExactResult(None, None, None, "infeasible", wall)
    if status == cp_model.UNKNOWN:  # the time limit passed before any plan was found (a large space, a busy host)
        return ExactResult(None, None, None, "unknown", wall,
                           {"reason": f"CP-SAT found no plan within {time_limit_s:g} s"})
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise SolverError(f"CP-SAT returned {solver.status_name(status)} within {time_limit_s} s")
    chosen = tuple(next(o for i, o in enumerate(opts[k]) if solver.value(x[k, i])) for k in range(K))
    jct, _, c = model_value(space, chosen)
    return ExactResult(chosen, jct, c, "optimal" if status == cp_model.OPTIMAL else "feasible", wall,
                       {"options": sum(len(v) for v in opts.values()), "objective": objective})


INT_SUM_LIMIT = 2**62  # CP-SAT refuses a linear expression whose extreme values leave int64


def _check_integer_range(space: TuningSpace, opts: dict[int, list[Option]], mmax: dict[str, int]) -> None:
    """Refuse, as bad input, a job whose times in ms or costs in micro-USD summed over
    every option (what CP-SAT checks for overflow) leave 64-bit integers, instead of
    letting the model fail. Bounded problem fields never get here with the shipped
    profiles and prices; an extreme profile or catalog price can."""
    worst_s = sum(max(o.mean_s, o.p95_s) for k in opts for o in opts[k])
    worst_usd = sum(o.cost_usd for k in opts for o in opts[k])
    for t, cloud in space.clouds.items():
        per_stage = cloud.usd_per_second * (cloud.init_latency_s + cloud.scale_latency_s) + cloud.data_usd_per_instance
        worst_usd += len(opts) * 2 * mmax.get(t, 0) * per_stage
    where = "experiment" if space.problem.experiment is not None else "stages"
    if not (math.isfinite(worst_s) and worst_s * TIME_SCALE < INT_SUM_LIMIT):
        raise ProblemError(f"the job's allocations take up to {worst_s:.3g} s in all, more than the exact "
                           "planner counts in 64-bit milliseconds; use fewer trials or iterations", path=where)
    if not (math.isfinite(worst_usd) and worst_usd * COST_SCALE < INT_SUM_LIMIT):
        raise ProblemError(f"the job's allocations cost up to ${worst_usd:.3g} in all, more than the exact "
                           "planner counts in 64-bit micro-dollars; use fewer trials or iterations, or check "
                           "the catalog's price", path=where)


# -- baselines -----------------------------------------------------------------------

def fair_allocation(space: TuningSpace, k: int, gpus: int, itype: str) -> StageAllocation:
    """`gpus` GPUs shared fairly by stage k's trials (RubberBand 3.2): each gets
    gpus // n (at least 1, at most the profile's largest point)."""
    n, _ = space.spec.get_stage(k)
    G = space.clouds[itype].gpus_per_instance
    g = min(max(1, gpus // n), space.max_gpus(itype))
    return StageAllocation(g, -(-gpus // G), itype)


def plan_static(space: TuningSpace, itype: str | None = None) -> Candidate | None:
    """The cheapest static cluster within the deadline, over 1..max_instances instances
    (up to `static_sweep`: more instances cannot be cheaper or faster)."""
    best = None
    for t in ([itype] if itype else list(space.clouds)):
        G = space.clouds[t].gpus_per_instance
        for m in range(1, static_sweep(space, t) + 1):
            plan = tuple(fair_allocation(space, k, m * G, t) for k in range(space.spec.num_stages))
            c = space.simulate(plan)
            if space.feasible(c) and (best is None or c.cost < best.cost):
                best = c
    return best


def static_sweep(space: TuningSpace, itype: str) -> int:
    """The static cluster sizes worth simulating: 1..min(max_instances, m*), with
    m* = max_k n_k * ceil(g_max / G). From m* instances on, the fair share gives
    every trial of every stage g_max GPUs and all trials run at once (`slots`), so
    each stage trains exactly as at m*, while the first scale-up waits for the
    slowest of more INIT draws (common random numbers: never faster) and every
    instance more is billed or downloads the dataset (never cheaper)."""
    G = space.clouds[itype].gpus_per_instance
    most_trials = max(s.trials for s in space.spec.stages)
    useful = most_trials * -(-space.max_gpus(itype) // G)
    return min(space.problem.max_instances, useful)


def plan_naive_elastic(space: TuningSpace) -> Candidate | None:
    """Fixed GPUs per trial, every trial of a stage at once, cluster shrinking with trials."""
    best = None
    for t, cloud in space.clouds.items():
        G = cloud.gpus_per_instance
        for g in gpu_choices(G, space.max_gpus(t)):
            plan = []
            for n, _ in (space.spec.get_stage(k) for k in range(space.spec.num_stages)):
                m = -(-n // (G // g)) if g <= G else n * -(-g // G)
                plan.append(StageAllocation(g, m, t))
            if max(a.instances for a in plan) > space.problem.max_instances:
                continue
            c = space.simulate(tuple(plan))
            if space.feasible(c) and (best is None or c.cost < best.cost):
                best = c
    return best


def _decrement(space: TuningSpace, k: int, a: int, itype: str) -> int | None:
    """The largest allocation below `a` that is a factor or a multiple of stage k's
    trials (Algorithm 2's smallest step) and changes what is paid for: the
    instance count under per-instance billing, the GPUs per trial under
    per-function billing. (Deviation: a step that keeps the instances only slows
    the job at the same price, so Algorithm 2 would stop there.)"""
    n = space.spec.stages[k].trials
    cur = fair_allocation(space, k, a, itype)
    per_instance = space.clouds[itype].billing == "per_instance"
    for v in range(a - 1, 0, -1):
        if v % n == 0 or n % v == 0:
            nxt = fair_allocation(space, k, v, itype)
            if (nxt.instances < cur.instances) if per_instance else (nxt != cur):
                return v
    return None


def plan_greedy(space: TuningSpace, static: Candidate | None, factors: tuple[int, ...] = (1, 2, 3),
                min_improvement: float = 1e-9) -> Candidate | None:
    """RubberBand Algorithm 2 from warm starts at 1x, 2x, 3x the static cluster's GPUs."""
    if static is None:
        return None
    itype = static.plan[0].instance_type
    assert itype is not None  # plan_static's allocations name their type
    G = space.clouds[itype].gpus_per_instance
    K = space.spec.num_stages
    cache: dict[tuple[int, ...], Candidate] = {}

    def evaluate(vec: tuple[int, ...]) -> Candidate:
        if vec not in cache:
            cache[vec] = space.simulate(tuple(fair_allocation(space, k, vec[k], itype) for k in range(K)))
        return cache[vec]

    best = static
    for f in factors:
        vec = tuple([static.plan[0].instances * G * f] * K)
        if max(v for v in vec) > space.problem.max_instances * G:
            continue
        cur = evaluate(vec)
        if not space.feasible(cur):
            continue
        while True:
            top, top_benefit = None, -math.inf
            for i in range(K):
                v = _decrement(space, i, vec[i], itype)
                if v is None:
                    continue
                cand_vec = vec[:i] + (v,) + vec[i + 1:]
                cand = evaluate(cand_vec)
                if not space.feasible(cand) or cand.cost >= cur.cost - min_improvement:
                    continue
                dt = space.jct(cand) - space.jct(cur)
                benefit = (cur.cost - cand.cost) / dt if dt > 0 else math.inf
                if benefit > top_benefit:
                    top, top_benefit = (cand_vec, cand), benefit
            if top is None:
                break
            vec, cur = top
        if cur.cost < best.cost:
            best = cur
    return best


# -- thrifty's planner ------------------------------------------------------------------

@dataclass
class TuningResult:
    best: Candidate | None
    chosen: str                  # "exact" | "greedy" | "none"
    note: str
    exact: ExactResult
    static: Candidate | None
    naive: Candidate | None
    greedy: Candidate | None
    fastest: Candidate | None    # for infeasible problems: the plan of least JCT
    wall_s: float
    planning_s: dict[str, float]


MAX_PLANS_TRIED = 64   # plans plan_exact simulates at most
MAX_MISSES = 4         # plans missing the deadline under simulation before plan_exact gives up on a better one


def _cost_is_a_bound(space: TuningSpace) -> bool:
    """Whether the formulation's cost is at most every plan's simulated cost: with fixed SCALE and INIT
    latencies, what it leaves out (the billing minimum, new instances waiting for the slowest INIT) only adds
    cost. With varying ones the simulator's draws can average below the latencies the formulation uses."""
    return all(c.scale_latency_sd_s == 0 and c.init_latency_sd_s == 0 for c in space.clouds.values())


def plan_exact(space: TuningSpace, time_limit_s: float = 10.0) -> tuple[ExactResult, Candidate | None]:
    """The formulation's cheapest plan that meets the deadline under simulation, and optimal there too when
    the search ends within `time_limit_s` (module docstring, "Verification").

    With fixed latencies (`_cost_is_a_bound`) the formulation's cost of a plan is at most its simulated cost.
    So: solve, simulate the plan; while the formulation still has a plan that costs less than the cheapest
    simulated plan that meets the deadline, leave out the plans tried (6) and solve again below that cost
    (7). When none is left, no plan costs less under simulation: the plan is ``optimal``. Stopped by the time
    limit, `MAX_PLANS_TRIED`, `MAX_MISSES` plans missing the deadline under simulation, or a CP-SAT answer not
    proven optimal, it is ``feasible`` with ``gap`` the most it can be above the optimum. With varying
    latencies the formulation's optimum is the answer, as RubberBand's (``optimal`` for the formulation)."""
    start = time.perf_counter()
    bounded = _cost_is_a_bound(space)
    tried: list[tuple[Option, ...]] = []
    first: tuple[ExactResult, Candidate] | None = None
    best: tuple[ExactResult, Candidate] | None = None
    bound: float | None = None  # the least model cost of the plans not tried (the last proven optimum)
    proven = False
    while True:
        left = start + time_limit_s - time.perf_counter()
        if first is not None and (left <= 0 or len(tried) >= MAX_PLANS_TRIED
                                  or (best is None and len(tried) >= MAX_MISSES)):
            break
        try:
            res = solve_cpsat(space, "min_cost", space.deadline, max(left, 0.1), exclude=tried,
                              cost_below=None if best is None else best[1].cost)
        except SolverError:
            if first is None:
                raise
            break  # CP-SAT could not answer in the time left: keep what was found
        if res.options is None:  # no plan (cheaper than the best) is left
            if first is None:
                return res, None
            proven = res.status == "infeasible"
            break
        tried.append(res.options)
        sim = space.simulate(tuple(o.alloc for o in res.options))
        first = first or (res, sim)
        if res.status == "optimal":
            bound = res.model_cost_usd
        if space.feasible(sim) and (best is None or sim.cost < best[1].cost):
            best = (res, sim)
        if not bounded or res.status != "optimal":
            break  # the formulation's optimum is the answer, or CP-SAT stopped at its time limit
        if best is not None and bound is not None and bound >= best[1].cost - 1e-9:
            proven = True  # the formulation's least cost reaches the best simulated cost
            break
    wall = time.perf_counter() - start
    res, sim = best or first
    details = {**res.details, "plans_simulated": len(tried)}
    if not bounded:  # RubberBand's reading: the formulation's own status
        return ExactResult(res.options, res.model_jct_s, res.model_cost_usd, res.status, wall, details), sim
    if best is None:  # every plan tried misses the deadline under simulation: the first, as it is
        return ExactResult(res.options, res.model_jct_s, res.model_cost_usd, "feasible", wall, details), sim
    low = sim.cost if proven else None if bound is None else min(bound, sim.cost)
    details["gap"] = None if low is None else (sim.cost - low) / sim.cost if sim.cost > 0 else 0.0
    return ExactResult(res.options, res.model_jct_s, res.model_cost_usd, "optimal" if proven else "feasible", wall,
                       details), sim


def plan_tuning(space: TuningSpace, time_limit_s: float = 10.0, fallback_to_greedy: bool = True) -> TuningResult:
    """Every planner on `space`. The answer is the exact plan, verified by
    simulation, unless (with `fallback_to_greedy`) greedy's plan is cheaper
    under simulation or the exact plan misses the deadline there: then
    greedy's. With ``fallback_to_greedy=False`` the answer is the exact plan
    alone (None when it misses the deadline under simulation), so that it can
    be compared with the baselines rather than bounded by them."""
    start = time.perf_counter()
    times: dict[str, float] = {}

    def timed(name, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        times[name] = time.perf_counter() - t0
        return out

    exact, verified = timed("exact", plan_exact, space, time_limit_s)
    static = timed("static", plan_static, space)
    naive = timed("naive_elastic", plan_naive_elastic, space)
    greedy = None
    t0 = time.perf_counter()
    for t in space.clouds:  # Algorithm 2 from each type's static warm start
        g = plan_greedy(space, plan_static(space, t) if len(space.clouds) > 1 else static)
        if g is not None and (greedy is None or g.cost < greedy.cost):
            greedy = g
    times["greedy"] = time.perf_counter() - t0
    ok = verified is not None and space.feasible(verified)
    if ok and (not fallback_to_greedy or greedy is None or verified.cost <= greedy.cost + 1e-9):
        best, chosen, note = verified, "exact", "exact plan, verified by simulation"
    elif greedy is not None and fallback_to_greedy:
        best, chosen = greedy, "greedy"
        if exact.status == "unknown":
            note = f"{exact.details['reason']}; greedy's plan is returned"
        elif verified is None:
            note = "the exact formulation found no plan; greedy's plan is returned"
        elif not ok:
            note = (f"the exact plan misses the deadline under simulation ({space.jct(verified):.1f} s); "
                    "greedy's plan is returned")
        else:
            note = (f"the exact plan costs ${verified.cost:.4f} under simulation, more than greedy's "
                    f"${greedy.cost:.4f}; greedy's plan is returned")
    elif verified is not None:  # it misses the deadline under simulation, and greedy's plan is not taken
        why_not_greedy = "greedy found none either" if fallback_to_greedy else "no fallback to greedy"
        best, chosen, note = None, "none", (f"the exact plan misses the deadline under simulation "
                                            f"({space.jct(verified):.1f} s); {why_not_greedy}")
    else:
        best, chosen, note = None, "none", "no plan meets the deadline"
    fastest = None
    if best is None:
        fast = solve_cpsat(space, "min_time", None, time_limit_s)
        if fast.options is not None:
            fastest = space.simulate(tuple(o.alloc for o in fast.options))
    return TuningResult(best, chosen, note, exact, static, naive, greedy, fastest,
                        time.perf_counter() - start, times)
