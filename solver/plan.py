"""The answer of `solve()`: a plan, or a proof that none exists with the reason.

JSON keys every consumer may rely on (docs/architecture.md, "Plan JSON"): ``kind``,
``status`` (``optimal`` | ``feasible`` | ``infeasible``), ``objective``,
``allocation: [{instance_type, market, count, batch_per_instance}]``,
``predicted: {iteration_s, total_s, cost_usd, total_s_p95}``,
``solver: {method, wall_s, gap}``, and for infeasible problems
``infeasibility: {conflicts: [...], relaxations: [...]}`` (with
``conflict_sets``, ``conflict_reasons``, ``conflict_sets_complete`` and
``reason``; `Infeasibility`). A plan the solver wrote also has
``provenance: {instance_type: {compute: {...}, allreduce: {...}}}`` for every
instance type of its problem (`TypeProvenance`): where each kind of figure
came from (``kind``: ``measured``, ``corrected``, ``derived``, ``published``
or ``analytic``; ``model``; ``fallback``; where known ``file``, ``machine``,
``command``, ``script``, ``date``, ``note``; ``passed_over``: why the models
asked first passed the type on; ``prior``: what a corrected figure started
from). A tuning plan's types also say where their SCALE and INIT latencies
came from (``scale_latency``, ``init_latency``: `LatencyProvenance`).

The plan is a frozen pydantic model owned by this layer: the solver builds it,
``plan.model_dump()`` is its JSON object (`Plan.to_json` its text), and the
runtime reads a plan file back with
``thrifty.core.validation.validate_model(Plan, data)`` (every error names the
JSON path of the bad field), so the schema of a plan file is the model's
(``thrifty schema plan``).

Unknown keys are refused (``extra="forbid"``), as in problem files: a plan is
input to ``thrifty run``, and a misspelt optional key (``predicted.totl_s``)
would otherwise be dropped without a word. Every key that ``model_dump``
writes is read back, ``name`` included (the problem's name,
`Plan.problem_name`), so ``validate_model(Plan, plan.model_dump()) == plan``.
Open-ended parts stay open where
the solver's answer is open: ``solver.details`` and each relaxation are JSON
objects of any keys.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from thrifty.core.validation import validate_model
from thrifty.perfmodels.provenance import FigureSource, TypeSources

__all__ = ["PlanRecord", "Allocation", "Prediction", "SolverInfo", "Infeasibility", "Plan", "PlanStatus",
           "Count", "FigureProvenance", "LatencyProvenance", "TypeProvenance", "provenance_lines"]

R = TypeVar("R", bound="PlanRecord")

PlanStatus = Literal["optimal", "feasible", "infeasible"]
# a number of machines, samples, trials, iterations or GPUs: a JSON integer of at least 1 (no 2.0, no true)
Count = Annotated[int, Field(strict=True, ge=1)]


class PlanRecord(BaseModel):
    """A frozen part of a plan, read and written as its JSON object.

    Its JSON (``model_dump()``, JSON names such as ``name`` for
    `problem_name`) is read back with `thrifty.core.validation.validate_model`
    (every error names the JSON path). Keys named in `_omit_empty` are left
    out of the JSON while None or empty text (a key the plan does not know,
    such as a hand-written stage's ``start_s``). Fields are read as
    attributes only (``stage.trials``): a record is no mapping. `with_changes`
    is a validated copy: the record itself never changes."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True, defer_build=True)

    _omit_empty: ClassVar[frozenset[str]] = frozenset()  # JSON keys written only when set

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.model_dump(), indent=indent)

    def with_changes(self: R, **changes: Any) -> R:
        """A copy with `changes` (by field name), validated as a new record is."""
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        return validate_model(type(self), {**fields, **(self.model_extra or {}), **changes})

    @model_serializer(mode="wrap")
    def serialize_json_keys(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        omit = self._omitted()
        return {k: v for k, v in out.items() if k not in omit}

    def _omitted(self) -> set[str]:
        """The keys (JSON names and field names) left out of this record's JSON."""
        out = set()
        for name, info in type(self).model_fields.items():
            key = info.alias or name
            value = getattr(self, name)
            if key in self._omit_empty and (value is None or value == "" or value == []):
                out |= {key, name}
        return out


FigureProvenance = FigureSource  # a plan holds the models' own record of where a figure came from


class LatencyProvenance(PlanRecord):
    """Where a tuning plan's SCALE or INIT latency of a type came from:
    ``measured`` by ``thrifty profile-scaling --cluster`` (the bundle
    `file` the problem names: the launch-to-ready time of that type's
    machines), ``stated`` in the problem's ``cloud``, or the schema's
    ``default`` (nothing said it)."""

    _omit_empty = frozenset({"file"})

    kind: Literal["measured", "stated", "default"]
    seconds: float
    file: str | None = None

    def describe(self) -> str:
        return f"{self.seconds:g} s {self.kind}" + (f" ({self.file})" if self.file else "")


class TypeProvenance(PlanRecord):
    """Where one instance type's figures came from: its compute figures
    (a compute profile; a tuning plan's scaling profile), its allreduce
    figures (an allreduce model; in a tuning plan the scaling profile's
    iteration times, which include the exchange) and, in a tuning plan, its
    SCALE and INIT latencies."""

    _omit_empty = frozenset({"scale_latency", "init_latency"})

    compute: FigureProvenance
    allreduce: FigureProvenance
    scale_latency: LatencyProvenance | None = None
    init_latency: LatencyProvenance | None = None

    @classmethod
    def of(cls, sources: TypeSources, **latencies: LatencyProvenance) -> "TypeProvenance":
        return cls(compute=sources.compute, allreduce=sources.allreduce, **latencies)

    @property
    def fallback(self) -> bool:
        return self.compute.fallback or self.allreduce.fallback


def provenance_lines(provenance: dict[str, TypeProvenance] | None) -> list[str]:
    """The provenance of a plan in words, one line per type and kind of figure:
    ``g5.12xlarge compute: derived (...)``; nothing for a plan without it."""
    lines = []
    for name, p in (provenance or {}).items():
        lines.append(f"{name} compute: {p.compute.describe()}")
        lines.append(f"{name} allreduce: {p.allreduce.describe()}")
        if p.scale_latency is not None and p.init_latency is not None:
            lines.append(f"{name} SCALE latency {p.scale_latency.describe()}, INIT latency "
                         f"{p.init_latency.describe()}")
    return lines


class Allocation(PlanRecord):
    """`count` machines of one type in one market, each with `batch_per_instance` samples per iteration."""

    instance_type: Annotated[str, Field(min_length=1)]
    market: Literal["on_demand", "spot"]
    count: Count
    batch_per_instance: Count


class Prediction(PlanRecord):
    """The simulator's prediction of the plan: seconds and USD."""

    iteration_s: float
    total_s: float
    cost_usd: float
    total_s_p95: float
    iteration_s_p95: float | None = None
    throughput_samples_s: float | None = None


class SolverInfo(PlanRecord):
    method: str
    wall_s: float
    gap: float | None  # relative gap between the plan's objective and the best proven bound
    candidates_simulated: int = 0
    details: dict[str, Any] = Field(default_factory=dict)  # the method's own figures, any keys


def limits_note(which: str) -> str:
    """The ``note`` of the relaxation of both limits that admits the
    ``which`` ("fastest" or "cheapest") plan within the quotas."""
    return f"the {which} plan within the quotas"


class Infeasibility(PlanRecord):
    """Why no plan exists.

    `conflict_sets`: every minimal set of constraints that cannot hold
    together (`conflict_sets_complete` False when the search stopped early),
    each with one sentence in `conflict_reasons`; `conflicts`: every
    constraint in some set (the key of the first contract). `relaxations`:
    the least change of one field (``field``, ``current``, ``needed``,
    ``direction``) or of several (``fields``, ``current`` and ``needed`` by
    field) that admits a plan, always with ``changes`` (``{field: value}``)
    and that plan (``plan``, ``allocation``, ``total_s``, ``cost_usd``).
    `thrifty.solver.explain` documents every key and how tight each value is.
    A tuning plan's infeasibility has the same keys (its relaxations' ``plan``
    is a list of stages)."""

    # in the order of the JSON
    conflict_sets: list[list[str]] = Field(default_factory=list)
    conflict_reasons: list[str] = Field(default_factory=list)
    conflict_sets_complete: bool = True
    conflicts: list[str]
    reason: str = ""
    relaxations: list[dict[str, Any]]

    def limits_needed(self, which: str = "fastest") -> dict[str, Any]:
        """``needed`` of the joint relaxation of the time and cost limits that
        admits the fastest (or, ``which="cheapest"``, the cheapest) plan within
        the quotas: ``{"limits.time_s": ..., "limits.cost_usd": ...}``; empty
        when there is none (a quota, not a limit, is what binds)."""
        note = limits_note(which)
        return next((dict(r["needed"]) for r in self.relaxations if r.get("note") == note), {})


class Plan(PlanRecord):
    """A training plan (module docstring). `solver` is None for a plan written
    by hand; `problem_name` is the problem's ``name``, written as ``name``."""

    _omit_empty = frozenset({"infeasibility", "name", "provenance"})

    kind: Literal["training"]
    status: PlanStatus
    objective: Literal["min_cost", "min_time"]
    objective_value: float | None = None
    allocation: list[Allocation]
    predicted: Prediction | None = None
    provenance: dict[str, TypeProvenance] | None = None
    solver: SolverInfo | None = None
    infeasibility: Infeasibility | None = None
    problem_name: str | None = Field(default=None, alias="name")

    @property
    def feasible(self) -> bool:
        return self.status in ("optimal", "feasible")

    @property
    def config(self) -> str:
        """Srifty's notation: ``4xp3.8xlarge@512+1xg4dn.8xlarge@64``."""
        return "+".join(f"{a.count}x{a.instance_type}@{a.batch_per_instance}" for a in self.allocation)
