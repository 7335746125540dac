"""The answer of `solve()`: a plan, or a proof that none exists with the reason.

JSON keys every consumer may rely on (DESIGN.md, training): ``kind``,
``status`` (``optimal`` | ``feasible`` | ``infeasible``), ``objective``,
``allocation: [{instance_type, market, count, batch_per_instance}]``,
``predicted: {iteration_s, total_s, cost_usd, total_s_p95}``,
``solver: {method, wall_s, gap}``, and for infeasible problems
``infeasibility: {conflicts: [...], relaxations: [...]}`` (with
``conflict_sets``, ``conflict_reasons``, ``conflict_sets_complete`` and
``reason``; `Infeasibility`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Allocation", "Prediction", "SolverInfo", "Infeasibility", "Plan"]


@dataclass(frozen=True)
class Allocation:
    instance_type: str
    market: str
    count: int
    batch_per_instance: int


@dataclass(frozen=True)
class Prediction:
    iteration_s: float
    total_s: float
    cost_usd: float
    total_s_p95: float
    iteration_s_p95: float | None = None
    throughput_samples_s: float | None = None


@dataclass(frozen=True)
class SolverInfo:
    method: str
    wall_s: float
    gap: float | None  # relative gap between the plan's objective and the best proven bound
    candidates_simulated: int = 0
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Infeasibility:
    """Why no plan exists.

    `conflict_sets`: every minimal set of constraints that cannot hold
    together (`conflict_sets_complete` False when the search stopped early),
    each with one sentence in `conflict_reasons`; `conflicts`: every
    constraint in some set (the key of the first contract). `relaxations`:
    the least change of one field (``field``, ``current``, ``needed``,
    ``direction``) or of several (``fields``, ``current`` and ``needed`` by
    field) that admits a plan, always with ``changes`` (``{field: value}``)
    and that plan (``plan``, ``allocation``, ``total_s``, ``cost_usd``).
    `thrifty.solver.explain` documents every key and how tight each value is."""

    conflicts: list[str]
    relaxations: list[dict[str, Any]]
    reason: str = ""
    conflict_sets: list[list[str]] = field(default_factory=list)
    conflict_sets_complete: bool = True
    conflict_reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"conflict_sets": self.conflict_sets, "conflict_reasons": self.conflict_reasons,
                "conflict_sets_complete": self.conflict_sets_complete, "conflicts": self.conflicts,
                "reason": self.reason, "relaxations": self.relaxations}


@dataclass(frozen=True)
class Plan:
    kind: str
    status: str
    objective: str
    objective_value: float | None
    allocation: list[Allocation]
    predicted: Prediction | None
    solver: SolverInfo
    infeasibility: Infeasibility | None = None
    problem_name: str | None = None

    @property
    def feasible(self) -> bool:
        return self.status in ("optimal", "feasible")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "status": self.status,
            "objective": self.objective,
            "objective_value": self.objective_value,
            "allocation": [asdict(a) for a in self.allocation],
            "predicted": asdict(self.predicted) if self.predicted else None,
            "solver": asdict(self.solver),
        }
        if self.infeasibility is not None:
            out["infeasibility"] = self.infeasibility.to_dict()
        if self.problem_name:
            out["name"] = self.problem_name
        return out

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @property
    def config(self) -> str:
        """Srifty's notation: ``4xp3.8xlarge@512+1xg4dn.8xlarge@64``."""
        return "+".join(f"{a.count}x{a.instance_type}@{a.batch_per_instance}" for a in self.allocation)
