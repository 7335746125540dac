"""``solve()``: a problem in, a `Plan` out (the contract: docs/architecture.md).

``method``:

- ``exhaustive``: exact branch and bound over the pruned space (`search`);
- ``ilp``: CP-SAT on exact compute coefficients with simulator verification
  (`cpsat`);
- ``smt``: the same model in z3 (`smt`);
- ``auto``: ``exhaustive`` when the pruned space holds at most
  `exhaustive_limit` candidates, else ``ilp``. Srifty's limit (about 10,000)
  counts simulations, since it simulates every candidate; our branch and bound
  enumerates candidates cheaply and simulates only those a bound cannot rule
  out, so its default limit is 50,000 enumerated candidates (the crossover
  with CP-SAT that `benchmarks/solver_speed.py` measures).

Every method returns the same `Plan`. Tuning problems (``kind: "tuning"``)
go to `solve_tuning` and return a `TuningPlan`
(``method`` is ignored: the exact CP-SAT planner is verified against
RubberBand's greedy planner). An infeasible problem is a plan with
status ``infeasible`` and an `Infeasibility`: every minimal set of
conflicting limits and quotas, and each least change that admits a plan, with
that plan (`thrifty.solver.explain`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from thrifty.core.errors import ProblemError, SolverError
from thrifty.solver.plan import Allocation, Plan, Prediction, SolverInfo, TypeProvenance
from thrifty.solver.problem import Problem, TrainingProblem, TuningProblem, load_problem, parse_problem
from thrifty.solver.search import SearchResult, search_exhaustive
from thrifty.solver.training import Evaluation, TrainingSpace

if TYPE_CHECKING:  # the tuning planner takes longer to import: it is imported when a tuning problem is solved
    from thrifty.solver.tuning import TuningSpace
    from thrifty.solver.tuning_plan import TuningPlan

__all__ = ["solve", "solve_tuning", "search_space", "as_problem", "METHODS", "DEFAULT_EXHAUSTIVE_LIMIT"]

METHODS = ("auto", "exhaustive", "ilp", "smt")
DEFAULT_EXHAUSTIVE_LIMIT = 50_000


def as_problem(problem: Problem | dict[str, Any] | str | Path) -> Problem:
    if isinstance(problem, (TrainingProblem, TuningProblem)):
        return problem
    if isinstance(problem, dict):
        return parse_problem(problem)
    if isinstance(problem, (str, Path)):
        return load_problem(problem)
    raise ProblemError(f"a problem must be a Problem, a dict or a file path, not {type(problem).__name__}")


def run_method(space: TrainingSpace, method: str, time_limit_s: float | None) -> SearchResult:
    deadline = None if time_limit_s is None else time.perf_counter() + time_limit_s
    if method == "exhaustive":
        return search_exhaustive(space, deadline=deadline)
    if method == "ilp":
        from thrifty.solver.cpsat import search_cpsat

        return search_cpsat(space, deadline=deadline)
    if method == "smt":
        from thrifty.solver.smt import search_smt

        return search_smt(space, deadline=deadline)
    raise ProblemError(f"method is '{method}', but must be one of {', '.join(METHODS)}")


def search_space(space: TrainingSpace, method: str = "auto", time_limit_s: float | None = None,
                 exhaustive_limit: int = DEFAULT_EXHAUSTIVE_LIMIT) -> SearchResult:
    """The search `solve` makes of a training space, without the plan or the
    infeasibility analysis around it (``method`` ``auto`` chosen by the
    space's size, see the module docstring)."""
    chosen = method
    if method == "auto":
        chosen = "exhaustive" if space.size <= exhaustive_limit else "ilp"
    if space.size == 0:
        return SearchResult(chosen, None, None, True, 0, 0.0)
    return run_method(space, chosen, time_limit_s)


@overload
def solve(problem: TrainingProblem, method: str = ..., time_limit_s: float | None = ...,
          exhaustive_limit: int = ..., space: TrainingSpace | None = ...) -> Plan: ...
@overload
def solve(problem: TuningProblem, method: str = ..., time_limit_s: float | None = ...,
          exhaustive_limit: int = ..., space: TrainingSpace | None = ...) -> TuningPlan: ...
@overload
def solve(problem: Problem | dict[str, Any] | str | Path, method: str = ..., time_limit_s: float | None = ...,
          exhaustive_limit: int = ..., space: TrainingSpace | None = ...) -> Plan | TuningPlan: ...


def solve(problem: Problem | dict[str, Any] | str | Path, method: str = "auto",
          time_limit_s: float | None = None, exhaustive_limit: int = DEFAULT_EXHAUSTIVE_LIMIT,
          space: TrainingSpace | None = None) -> Plan | TuningPlan:
    """Solve a problem (a `Problem`, a dict of its JSON, or a file path)."""
    start = time.perf_counter()
    if method not in METHODS:
        raise ProblemError(f"method is '{method}', but must be one of {', '.join(METHODS)}")
    if time_limit_s is not None and time_limit_s <= 0:
        raise ProblemError(f"time_limit_s is {time_limit_s}, but must be positive")
    problem = as_problem(problem)
    if isinstance(problem, TuningProblem):  # RubberBand plans: solver/tuning.py
        return solve_tuning(problem, time_limit_s=time_limit_s)
    space = space or TrainingSpace(problem)
    result = search_space(space, method, time_limit_s, exhaustive_limit)
    chosen = result.method
    if result.best is not None:
        return _plan(space, result, result.best, chosen, time.perf_counter() - start)
    from thrifty.solver.explain import explain_infeasibility

    why = explain_infeasibility(space, proven=result.complete)
    return Plan(
        kind="training", status="infeasible", objective=problem.objective, objective_value=None,
        allocation=[], predicted=None, provenance=plan_provenance(space),
        solver=SolverInfo(method=chosen, wall_s=time.perf_counter() - start, gap=None,
                          candidates_simulated=result.simulated,
                          details={**result.details, "proven": result.complete, "space_size": space.size}),
        infeasibility=why, problem_name=problem.name,
    )


def plan_provenance(space: TrainingSpace) -> dict[str, TypeProvenance]:
    """Where the figures of each instance type of the problem came from
    (`thrifty.perfmodels.provenance`), by type in the problem's order: a
    plan, and a proof that none exists, rest on all of them."""
    out: dict[str, TypeProvenance] = {}
    for choice in space.choices:
        if choice.itype.name not in out:
            out[choice.itype.name] = TypeProvenance.of(space.simulator.sources(choice.itype))
    return out


def _plan(space: TrainingSpace, result: SearchResult, ev: Evaluation, method: str, wall_s: float) -> Plan:
    """The plan of `ev`, the best that `result` found."""
    allocation = [
        Allocation(instance_type=space.choices[i].itype.name, market=space.choices[i].spec.market, count=count,
                   batch_per_instance=batch)
        for i, count, batch in ev.candidate
    ]
    predicted = Prediction(
        iteration_s=ev.iteration_s, total_s=ev.total_s, cost_usd=ev.cost_usd, total_s_p95=ev.total_s_p95,
        iteration_s_p95=ev.iteration_p95_s,
        throughput_samples_s=space.problem.global_batch / ev.iteration_s,
    )
    return Plan(
        kind="training", status="optimal" if result.complete else "feasible",
        objective=space.problem.objective, objective_value=ev.objective_value,
        allocation=allocation, predicted=predicted, provenance=plan_provenance(space),
        solver=SolverInfo(method=method, wall_s=wall_s, gap=result.gap, candidates_simulated=result.simulated,
                          details={**result.details, "space_size": space.size}),
        problem_name=space.problem.name,
    )


def solve_tuning(problem: TuningProblem, time_limit_s: float | None = None,
                 space: TuningSpace | None = None) -> TuningPlan:
    """The tuning plan of `problem` (RubberBand): the exact CP-SAT planner
    verified against the greedy one, the baselines' answers beside it, and for
    an infeasible problem the `Infeasibility` (`thrifty.solver.explain`)."""
    from thrifty.solver.tuning import TuningSpace, plan_tuning
    from thrifty.solver.tuning_plan import TuningPlan, TuningSolverInfo, candidate_answer

    start = time.perf_counter()
    space = space or TuningSpace(problem)
    res = plan_tuning(space, time_limit_s or 10.0)
    baselines = {"static": candidate_answer(space, res.static),
                 "naive_elastic": candidate_answer(space, res.naive),
                 "greedy": candidate_answer(space, res.greedy)}
    solver = TuningSolverInfo(method="ilp", chosen=res.chosen, note=res.note, wall_s=time.perf_counter() - start,
                              planning_s=res.planning_s, exact_status=res.exact.status,
                              exact_model_cost_usd=res.exact.model_cost_usd, exact_model_jct_s=res.exact.model_jct_s,
                              simulations=space.simulated, samples=problem.samples, **res.exact.details)
    common = dict(problem_name=problem.name, experiment=space.spec.description,
                  deadline_s=problem.deadline_s, billing=problem.billing, provenance=space.provenance())
    if res.best is not None:
        body = candidate_answer(space, res.best)
        status = "optimal" if res.chosen == "exact" and res.exact.status == "optimal" else "feasible"
        return TuningPlan(kind="tuning", status=status, stages=body.stages, predicted=body.predicted,
                          baselines=baselines, solver=solver, **common)
    if res.exact.status == "unknown":  # no plan found, but none proven impossible: not an infeasibility
        raise SolverError(f"{res.exact.details['reason']} and greedy found none; no infeasibility is proven: "
                          f"give the planner more time (thrifty solve --time-limit, or time_limit_s)")
    from thrifty.solver.explain import explain_tuning_infeasibility

    why = explain_tuning_infeasibility(space, res.fastest, time_limit_s or 10.0)
    return TuningPlan(kind="tuning", status="infeasible", stages=[], predicted=None, baselines=baselines,
                      solver=solver, infeasibility=why, **common)
