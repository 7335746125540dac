"""The answer of `solve()` for ``kind: "tuning"`` (the contract: docs/architecture.md).

JSON keys every consumer may rely on: ``kind``, ``status``
(``optimal`` | ``feasible`` | ``infeasible``),
``stages: [{trials, iters_per_trial, gpus, gpus_per_trial, instances}]``
(plus ``instance_type``, ``start_s``, ``end_s``),
``predicted: {jct_s, cost_usd, jct_s_p95}`` (plus ``cost_usd_p95``),
``baselines: {static, naive_elastic, greedy}`` (each ``{status, stages,
predicted}``), ``provenance: {instance_type: {compute, allreduce,
scale_latency, init_latency}}`` (where each type's scaling profile and SCALE
and INIT latencies came from: `thrifty.solver.plan.TypeProvenance`,
`thrifty.solver.tuning.TuningSpace.provenance`),
``solver: {method, chosen, note, wall_s, planning_s}`` and, for infeasible
problems, ``infeasibility: {conflict_sets, conflict_reasons,
conflict_sets_complete, conflicts, relaxations, reason}`` whose relaxations
give the shortest feasible deadline and the least fleet bounds, each with the
plan it admits (`thrifty.solver.explain.explain_tuning_infeasibility`).

`TuningPlan` and its parts (`TuningStage`, `TuningPrediction`,
`TuningBaseline`, `TuningSolverInfo`, and the training plan's
`Infeasibility`) are frozen pydantic models: the planners build them
directly (`candidate_answer`, `solve_tuning`), ``model_dump()`` writes the
keys a plan read, in the order above, and
``thrifty.core.validation.validate_model(TuningPlan, data)`` reads one
(errors name the JSON path: ``stages[1].trials``). Fields are read as
attributes (``plan.stages[0].trials``). Unknown keys are refused as in a
training plan, except in ``solver``: the exact formulation's own figures
(``options``, ``objective``, ...) vary with it.
``thrifty schema tuning-plan`` prints the schema.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from thrifty.solver.plan import Count, Infeasibility, PlanRecord, PlanStatus, TypeProvenance
from thrifty.solver.tuning import Candidate, TuningSpace

__all__ = ["TuningPlan", "TuningStage", "TuningPrediction", "TuningBaseline", "TuningSolverInfo",
           "candidate_answer"]


class TuningStage(PlanRecord):
    """One stage of a tuning plan: `trials` trials, each trained `iters_per_trial`
    more iterations on `gpus_per_trial` GPUs, on `instances` machines of
    `instance_type` (`gpus` GPUs in all), from `start_s` to `end_s` of the job
    at `cost_usd` (predicted). The planner writes every key; a hand-written
    stage may leave out those after the four counts (the plan executor takes
    the instance type from its caller), and they stay out of its JSON."""

    _omit_empty = frozenset({"gpus", "instance_type", "start_s", "end_s", "cost_usd"})

    trials: Count
    iters_per_trial: Count
    gpus: Count | None = None
    gpus_per_trial: Count
    instances: Count
    instance_type: str | None = None
    start_s: float | None = None
    end_s: float | None = None
    cost_usd: float | None = None


class TuningPrediction(PlanRecord):
    """The job simulator's prediction (mean and p95 over its samples): JCT in
    seconds, cost in USD, of which `data_usd` is data ingress."""

    _omit_empty = frozenset({"cost_usd_p95", "data_usd"})

    jct_s: float
    cost_usd: float
    jct_s_p95: float
    cost_usd_p95: float | None = None
    data_usd: float | None = None


class TuningBaseline(PlanRecord):
    """A baseline planner's answer to the same problem (static, naive elastic,
    greedy): its stages and prediction, none when it found no plan."""

    status: Literal["feasible", "infeasible"]
    stages: list[TuningStage]
    predicted: TuningPrediction | None


class TuningSolverInfo(PlanRecord):
    """How the plan was found: ``chosen`` is the planner whose plan is the
    answer (``exact``, ``greedy`` or ``none``) and ``note`` why; the exact
    formulation's status and model figures; ``planning_s`` by planner. Other
    keys are the exact formulation's own figures (``options``,
    ``objective``, ...), kept as they come (``extra="allow"``)."""

    model_config = ConfigDict(extra="allow")

    method: str | None = None
    chosen: str | None = None
    note: str | None = None
    wall_s: float | None = None
    planning_s: dict[str, float] | None = None
    exact_status: str | None = None
    exact_model_cost_usd: float | None = None
    exact_model_jct_s: float | None = None
    simulations: int | None = None
    samples: int | None = None


class TuningPlan(PlanRecord):
    """A tuning plan (module docstring). The solver writes every key; a plan
    read from JSON needs only `kind`, `status` and `stages`, the others
    defaulting to "not known" (`deadline_s` 0: none given; `solver` None: a
    plan written by hand). `problem_name` is the problem's ``name``, written
    as ``name``."""

    _omit_empty = frozenset({"infeasibility", "name", "provenance"})

    kind: Literal["tuning"]
    status: PlanStatus
    experiment: str = ""
    deadline_s: float = 0.0
    billing: Literal["per_instance", "per_function"] = "per_instance"
    stages: list[TuningStage]
    predicted: TuningPrediction | None = None
    baselines: dict[str, TuningBaseline] = Field(default_factory=dict)
    provenance: dict[str, TypeProvenance] | None = None
    solver: TuningSolverInfo | None = None
    infeasibility: Infeasibility | None = None
    problem_name: str | None = Field(default=None, alias="name")

    @property
    def feasible(self) -> bool:
        return self.status in ("optimal", "feasible")


def candidate_answer(space: TuningSpace, c: Candidate | None) -> TuningBaseline:
    """One planner's answer (``{status, stages, predicted}``): a baseline of
    a plan, the body of the plan itself, and the plan a relaxation admits."""
    if c is None:
        return TuningBaseline(status="infeasible", stages=[], predicted=None)
    r = c.result
    stages = []
    for k, a in enumerate(c.plan):
        n, iters = space.spec.get_stage(k)
        assert a.instance_type is not None  # the planners name each stage's type
        G = space.clouds[a.instance_type].gpus_per_instance
        stages.append(TuningStage(trials=n, iters_per_trial=iters, gpus=a.instances * G,
                                  gpus_per_trial=a.gpus_per_trial, instances=a.instances,
                                  instance_type=a.instance_type, start_s=round(r.stage_start_s[k], 3),
                                  end_s=round(r.stage_end_s[k], 3), cost_usd=round(r.stage_cost_usd[k], 6)))
    predicted = TuningPrediction(jct_s=r.jct_s, cost_usd=r.cost_usd, jct_s_p95=r.jct_s_p95,
                                 cost_usd_p95=r.cost_usd_p95, data_usd=r.data_usd)
    return TuningBaseline(status="feasible", stages=stages, predicted=predicted)


