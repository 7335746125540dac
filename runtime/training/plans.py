"""Reading a training plan and checking it against its problem.

A plan (``thrifty solve --out PLAN.json``; its keys: docs/architecture.md) is run only if it
fits its problem: a training plan with a feasible status, every allocation an
(instance type, market) the problem offers, within its quota, the per-machine
batches adding up to the problem's global batch, and each batch at least the
machine's worker count (every worker needs a sample). Each error names the
JSON path of the field.

`run_plan` takes what ``thrifty run`` and `train` accept (`PlanArgument`): a
plan and its problem, or a training problem alone (a file, a dict or a
`Problem`), which is solved first; when a run is resumed, its run record
fills in what is not given. It makes them one type, `RunPlan`, at the edge:
the driver works on that alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thrifty.datasets.catalog import Catalog
from thrifty.core.errors import ProblemError
from thrifty.core.io import read_document, read_json
from thrifty.core.validation import short_value, validate_model
from thrifty.runtime.training.rundir import RECORD_NAME, RunRecord
from thrifty.solver.plan import Plan
from thrifty.solver.problem import Problem, TrainingProblem, TuningProblem, load_problem, parse_problem

__all__ = ["as_plan", "check_plan", "plan_problems", "run_plan", "RunPlan", "PlanArgument", "ProblemArgument",
           "as_training_problem"]


def as_plan(plan: Plan | dict[str, Any] | str | Path, source: str | None = None) -> Plan:
    """A training `Plan` from a `Plan`, its JSON object or a plan file (`source`
    names where the object came from): validated with the plan's model
    (`thrifty.core.validation.validate_model`), so every error names the JSON path of the bad field."""
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, (str, Path)):
        return as_plan(read_json(plan), source=str(plan))
    if not isinstance(plan, dict):
        raise ProblemError(f"a plan must be a Plan, its JSON object or a file path, not {type(plan).__name__}",
                           source=source)
    if plan.get("kind") != "training":
        raise ProblemError(f"is {short_value(plan.get('kind'))}, but the training runtime runs 'training' plans",
                           path="kind", source=source)
    return validate_model(Plan, plan, source=source)


def _is_problem(data: Any) -> bool:
    # a plan always has a status and an allocation; a problem has neither (its schema forbids extra keys)
    return isinstance(data, dict) and "allocation" not in data and "status" not in data and "kind" in data


def as_training_problem(problem: Problem | dict[str, Any] | str | Path) -> TrainingProblem:
    from thrifty.solver.solve import as_problem

    made = as_problem(problem)
    if not isinstance(made, TrainingProblem):
        raise ProblemError(f"is '{made.kind}', but the training runtime runs 'training' problems", path="kind")
    return made


PlanArgument = Plan | Problem | dict[str, Any] | str | Path | None
"""What `train` and ``thrifty run`` take as the plan: a `Plan`, a problem
(`Problem`) to solve first, either's JSON object, either's file, or None (a
resumed run's plan in force)."""
ProblemArgument = Problem | dict[str, Any] | str | Path | None


@dataclass(frozen=True)
class RunPlan:
    """A plan argument made one type: the plan to run, its problem, and the
    file it was read from (named in its errors; None when not from a file)."""

    plan: Plan
    problem: TrainingProblem
    source: str | None = None


def run_plan(plan: PlanArgument, problem: ProblemArgument, resumed: RunRecord | None = None,
             run_dir: str | Path | None = None) -> RunPlan:
    """The plan and problem of a run from a plan and its problem, or from a
    training problem alone (given in place of the plan, as a file, a dict or
    a `Problem`), solved here; the plan may be infeasible (`Plan.feasible`).

    `resumed` is the record of the run being resumed (in `run_dir`): it gives
    the plan when none is given (its plan in force), and the problem when a
    plan comes without one."""
    given = str(plan) if isinstance(plan, (str, Path)) else None
    if plan is None and resumed is not None:
        plan = as_plan(resumed.plan, source=str(Path(run_dir or ".") / RECORD_NAME))
    if plan is None:
        raise ProblemError("nothing to run: give a plan and its problem, or a training problem"
                           + (f" ({run_dir} holds no run record to resume)" if run_dir is not None else ""))
    source = str(plan) if isinstance(plan, (str, Path)) else None
    data: Any = plan
    if isinstance(plan, (str, Path)):
        data = read_document(plan)
    if isinstance(plan, (TrainingProblem, TuningProblem)) or _is_problem(data):
        if problem is not None:
            raise ProblemError("is a problem, and another problem is given with it: give a plan with its problem, "
                               "or the problem alone", source=source)
        if isinstance(plan, (TrainingProblem, TuningProblem)):
            made: Problem = plan
        elif source is not None:
            made = load_problem(source)  # resolves the file's relative paths
        else:
            made = parse_problem(data)
        from thrifty.solver.solve import solve

        training = as_training_problem(made)
        return RunPlan(solve(training), training, given)
    if problem is None and resumed is not None:
        problem = resumed.problem
    if problem is None:
        raise ProblemError("--problem PROBLEM.json is required with a plan (problem= in train()): the runtime "
                           "re-plans with it", source=source)
    return RunPlan(as_plan(data, source=source), as_training_problem(problem), given)


def check_plan(plan: Plan, problem: TrainingProblem, catalog: Catalog) -> None:
    """Raise a `ProblemError` naming the field when `plan` cannot run `problem` (the first of `plan_problems`)."""
    problems = plan_problems(plan, problem, catalog)
    if problems:
        raise problems[0]


def plan_problems(plan: Plan, problem: TrainingProblem, catalog: Catalog,
                  source: str | None = None) -> list[ProblemError]:
    """Every reason `plan` cannot run `problem`, each a `ProblemError` naming
    the field (and `source`, the plan's file, when given); empty when it can."""
    out: list[ProblemError] = []

    def bad(message: str, path: str) -> None:
        out.append(ProblemError(message, path=path, source=source))

    if plan.kind != "training":
        bad(f"is '{plan.kind}', but the training runtime runs 'training' plans", "kind")
        return out
    if not plan.feasible:
        why = f" ({plan.infeasibility.reason})" if plan.infeasibility is not None and plan.infeasibility.reason else ""
        bad(f"is '{plan.status}': there is nothing to run{why}", "status")
        return out
    if not plan.allocation:
        bad("is empty", "allocation")
        return out
    quotas = {(c.instance_type, c.market): c.quota for c in problem.instances}
    used: dict[tuple[str, str], int] = {}
    for i, a in enumerate(plan.allocation):
        key = (a.instance_type, a.market)
        if key not in quotas:
            offered = ", ".join(f"{t} ({m})" for t, m in quotas)
            bad(f"{a.instance_type} ({a.market}) is not offered by the problem; it offers {offered}",
                f"allocation[{i}]")
            continue
        if a.count < 1:
            bad(f"is {a.count}, but must be at least 1", f"allocation[{i}].count")
        used[key] = used.get(key, 0) + a.count
        if used[key] > quotas[key]:
            bad(f"uses {used[key]} machines of {a.instance_type} ({a.market}), over the quota {quotas[key]}",
                f"allocation[{i}].count")
        try:
            gpus = catalog.get(a.instance_type).gpus
        except ProblemError as e:  # names the closest known types
            bad(e.message, f"allocation[{i}].instance_type")
            continue
        if a.batch_per_instance < gpus:
            bad(f"is {a.batch_per_instance}, less than the {gpus} workers of {a.instance_type}",
                f"allocation[{i}].batch_per_instance")
    total = sum(a.count * a.batch_per_instance for a in plan.allocation)
    if total != problem.global_batch:
        bad(f"places {total} samples per iteration, but the problem's global batch is {problem.global_batch}",
            "allocation")
    return out


def within_capacity(problem: TrainingProblem, capacity: dict[tuple[str, str], int]) -> TrainingProblem:
    """`problem` with each machine choice's quota capped at what a fixed pool
    of machines (the nodes of a running Ray cluster) has of it, and the
    choices it has none of dropped, so that a re-plan only picks machines the
    pool can give. `ProblemError` (path ``cluster``) when nothing is left."""
    kept = []
    for choice in problem.instances:
        have = capacity.get((choice.instance_type, choice.market), 0)
        if have > 0:
            kept.append(choice.model_copy(update={"quota": min(choice.quota, have)}))
    if not kept:
        offered = ", ".join(f"{n} x {t} ({m})" for (t, m), n in sorted(capacity.items())) or "nothing"
        raise ProblemError(f"the cluster offers none of the problem's machines; it offers {offered}",
                           path="cluster")
    return problem.model_copy(update={"instances": kept})
