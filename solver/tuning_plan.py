"""The answer of `solve()` for ``kind: "tuning"`` (DESIGN.md contract).

JSON keys every consumer may rely on: ``kind``, ``status``
(``optimal`` | ``feasible`` | ``infeasible``),
``stages: [{trials, iters_per_trial, gpus, gpus_per_trial, instances}]``
(plus ``instance_type``, ``start_s``, ``end_s``),
``predicted: {jct_s, cost_usd, jct_s_p95}`` (plus ``cost_usd_p95``),
``baselines: {static, naive_elastic, greedy}`` (each ``{status, stages,
predicted}``), ``solver: {method, chosen, note, wall_s, planning_s}`` and, for
infeasible problems, ``infeasibility: {conflict_sets, conflict_reasons,
conflict_sets_complete, conflicts, relaxations, reason}`` whose relaxations
give the shortest feasible deadline and the least fleet bounds, each with the
plan it admits (`thrifty.solver.explain.explain_tuning_infeasibility`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from thrifty.solver.problem import TuningProblem
from thrifty.solver.tuning import Candidate, TuningSpace, plan_tuning

__all__ = ["TuningPlan", "solve_tuning", "candidate_json"]


def candidate_json(space: TuningSpace, c: Candidate | None) -> dict[str, Any]:
    if c is None:
        return {"status": "infeasible", "stages": [], "predicted": None}
    r = c.result
    stages = []
    for k, a in enumerate(c.plan):
        n, iters = space.spec.get_stage(k)
        G = space.clouds[a.instance_type].gpus_per_instance
        stages.append({"trials": n, "iters_per_trial": iters, "gpus": a.instances * G,
                       "gpus_per_trial": a.gpus_per_trial, "instances": a.instances,
                       "instance_type": a.instance_type, "start_s": round(r.stage_start_s[k], 3),
                       "end_s": round(r.stage_end_s[k], 3), "cost_usd": round(r.stage_cost_usd[k], 6)})
    return {"status": "feasible", "stages": stages,
            "predicted": {"jct_s": r.jct_s, "cost_usd": r.cost_usd, "jct_s_p95": r.jct_s_p95,
                          "cost_usd_p95": r.cost_usd_p95, "data_usd": r.data_usd}}


@dataclass(frozen=True)
class TuningPlan:
    kind: str
    status: str
    stages: list[dict[str, Any]]
    predicted: dict[str, float] | None
    baselines: dict[str, dict[str, Any]]
    solver: dict[str, Any]
    infeasibility: dict[str, Any] | None = None
    problem_name: str | None = None
    experiment: str = ""
    deadline_s: float = 0.0
    billing: str = "per_instance"

    @property
    def feasible(self) -> bool:
        return self.status in ("optimal", "feasible")

    def to_dict(self) -> dict[str, Any]:
        out = {"kind": self.kind, "status": self.status, "experiment": self.experiment,
               "deadline_s": self.deadline_s, "billing": self.billing, "stages": self.stages,
               "predicted": self.predicted, "baselines": self.baselines, "solver": self.solver}
        if self.infeasibility is not None:
            out["infeasibility"] = self.infeasibility
        if self.problem_name:
            out["name"] = self.problem_name
        return out

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)


def solve_tuning(problem: TuningProblem, time_limit_s: float | None = None,
                 space: TuningSpace | None = None) -> TuningPlan:
    start = time.perf_counter()
    space = space or TuningSpace(problem)
    res = plan_tuning(space, time_limit_s or 10.0)
    baselines = {"static": candidate_json(space, res.static),
                 "naive_elastic": candidate_json(space, res.naive),
                 "greedy": candidate_json(space, res.greedy)}
    solver = {"method": "ilp", "chosen": res.chosen, "note": res.note,
              "wall_s": time.perf_counter() - start, "planning_s": res.planning_s,
              "exact_status": res.exact.status, "exact_model_cost_usd": res.exact.model_cost_usd,
              "exact_model_jct_s": res.exact.model_jct_s, "simulations": space.simulated,
              "samples": problem.samples, **res.exact.details}
    common = dict(problem_name=problem.name, experiment=space.spec.description,
                  deadline_s=problem.deadline_s, billing=problem.billing)
    if res.best is not None:
        body = candidate_json(space, res.best)
        status = "optimal" if res.chosen == "exact" and res.exact.status == "optimal" else "feasible"
        return TuningPlan("tuning", status, body["stages"], body["predicted"], baselines, solver, **common)
    from thrifty.solver.explain import explain_tuning_infeasibility

    why = explain_tuning_infeasibility(space, res.fastest, time_limit_s or 10.0)
    return TuningPlan("tuning", "infeasible", [], None, baselines, solver, why, **common)
