"""Reading a training plan and checking it against its problem.

A plan (``thrifty solve --out PLAN.json``, DESIGN.md keys) is run only if it
fits its problem: a training plan with a feasible status, every allocation an
(instance type, market) the problem offers, within its quota, the per-machine
batches adding up to the problem's global batch, and each batch at least the
machine's worker count (every worker needs a sample). Each error names the
JSON path of the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from thrifty.datasets.catalog import Catalog
from thrifty.datasets.errors import ProblemError
from thrifty.datasets.io import read_json
from thrifty.solver.plan import Allocation, Plan, Prediction, SolverInfo
from thrifty.solver.problem import TrainingProblem

__all__ = ["as_plan", "plan_from_dict", "check_plan"]


def plan_from_dict(data: Any, source: str | None = None) -> Plan:
    """A `Plan` from its JSON form (only the keys DESIGN.md promises are read)."""
    if not isinstance(data, dict):
        raise ProblemError(f"a plan must be a JSON object, not {type(data).__name__}", source=source)
    if data.get("kind") != "training":
        raise ProblemError(f"is {data.get('kind')!r}, but the training runtime runs 'training' plans",
                           path="kind", source=source)
    allocation = []
    for i, row in enumerate(data.get("allocation") or []):
        try:
            allocation.append(Allocation(str(row["instance_type"]), str(row["market"]), int(row["count"]),
                                         int(row["batch_per_instance"])))
        except (KeyError, TypeError, ValueError) as e:
            raise ProblemError(f"is malformed ({type(e).__name__}: {e}); needs instance_type, market, count, "
                               "batch_per_instance", path=f"allocation[{i}]", source=source) from None
    predicted = data.get("predicted")
    try:
        prediction = None if predicted is None else Prediction(**predicted)
    except TypeError as e:
        raise ProblemError(f"is malformed: {e}", path="predicted", source=source) from None
    solver = data.get("solver") or {}
    return Plan(kind="training", status=str(data.get("status", "")), objective=str(data.get("objective", "")),
                objective_value=data.get("objective_value"), allocation=allocation, predicted=prediction,
                solver=SolverInfo(str(solver.get("method", "")), float(solver.get("wall_s", 0.0)), solver.get("gap")),
                problem_name=data.get("name"))


def as_plan(plan: Plan | dict[str, Any] | str | Path) -> Plan:
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, dict):
        return plan_from_dict(plan)
    if isinstance(plan, (str, Path)):
        return plan_from_dict(read_json(plan), source=str(plan))
    raise ProblemError(f"a plan must be a Plan, a dict or a file path, not {type(plan).__name__}")


def check_plan(plan: Plan, problem: TrainingProblem, catalog: Catalog) -> None:
    """Raise a `ProblemError` naming the field when `plan` cannot run `problem`."""
    if plan.kind != "training":
        raise ProblemError(f"is '{plan.kind}', but the training runtime runs 'training' plans", path="kind")
    if not plan.feasible:
        raise ProblemError(f"is '{plan.status}': there is nothing to run", path="status")
    if not plan.allocation:
        raise ProblemError("is empty", path="allocation")
    quotas = {(c.instance_type, c.market): c.quota for c in problem.instances}
    used: dict[tuple[str, str], int] = {}
    for i, a in enumerate(plan.allocation):
        key = (a.instance_type, a.market)
        if key not in quotas:
            offered = ", ".join(f"{t} ({m})" for t, m in quotas)
            raise ProblemError(f"{a.instance_type} ({a.market}) is not offered by the problem; it offers {offered}",
                               path=f"allocation[{i}]")
        if a.count < 1:
            raise ProblemError(f"is {a.count}, but must be at least 1", path=f"allocation[{i}].count")
        used[key] = used.get(key, 0) + a.count
        if used[key] > quotas[key]:
            raise ProblemError(f"uses {used[key]} machines of {a.instance_type} ({a.market}), over the quota "
                               f"{quotas[key]}", path=f"allocation[{i}].count")
        gpus = catalog.get(a.instance_type).gpus
        if a.batch_per_instance < gpus:
            raise ProblemError(f"is {a.batch_per_instance}, less than the {gpus} workers of {a.instance_type}",
                               path=f"allocation[{i}].batch_per_instance")
    total = sum(a.count * a.batch_per_instance for a in plan.allocation)
    if total != problem.global_batch:
        raise ProblemError(f"places {total} samples per iteration, but the problem's global batch is "
                           f"{problem.global_batch}", path="allocation")
