"""Why a training problem has no plan, and what would change that.

Constraints that can conflict: the time limit (``limits.time_s``), the budget
(``limits.cost_usd``), each quota (``instances[i].quota``) and the global batch
with the allowed per-machine batches (``global_batch``).

Relaxations are exact, computed by re-solving variants of the problem with the
same search (so they are tight with respect to the same simulator):

- deadline needed: the least total time over plans within the budget (and
  quotas); setting ``limits.time_s`` to it is feasible, anything smaller not;
- budget needed: the least cost over plans within the time limit;
- quota needed, per choice: the least quota of that choice, all else equal,
  that admits a feasible plan (binary search on feasibility, which is
  monotone in the quota);
- when no single limit can be relaxed alone, both limits together: the
  figures of the cheapest and of the fastest plan within the quotas.

Conflicts: a minimal conflicting set of limits and quotas, found by
deletion with exact exhaustive searches (`_deletion_core`; constraints whose
relaxation alone restores feasibility are in every minimal set and need no
test). When a test's space is too large to enumerate, the unsat core of the
SMT formulation (`thrifty.solver.smt.unsat_core`), minimized by deletion,
names them instead. When z3 cannot decide within `CORE_TIME_S`
(the cost constraint is a product, which can be slow), the limits whose
relaxation alone restores feasibility are reported instead, or both limits
when neither alone does.
"""

from __future__ import annotations

from thrifty.solver.plan import Infeasibility
from thrifty.solver.search import SearchResult, search_exhaustive
from thrifty.solver.training import TrainingSpace

__all__ = ["explain_infeasibility", "QUOTA_SEARCH_CAP", "CORE_TIME_S"]

QUOTA_SEARCH_CAP = 4096
CORE_TIME_S = 3.0  # z3's budget for the unsat core; past it the relaxation analysis names the conflicts
CORE_CHECK_LIMIT = 200_000  # candidates a deletion test may enumerate before z3 is asked instead


def _search(space: TrainingSpace) -> SearchResult:
    if space.size == 0:
        return SearchResult("exhaustive", None, None, True, 0, 0.0)
    if space.size <= 50_000:
        return search_exhaustive(space)
    from thrifty.solver.cpsat import search_cpsat

    return search_cpsat(space)


def _quota_needed(space: TrainingSpace, index: int) -> int | None:
    """Least quota of choice `index` that makes the problem feasible, or None."""
    choice = space.choices[index]
    if not choice.batches:
        return None
    cap = min(QUOTA_SEARCH_CAP, space.problem.global_batch // choice.batches[0])

    def feasible(q: int) -> bool:
        instances = list(space.problem.instances)
        instances[index] = instances[index].model_copy(update={"quota": q})
        return _search(space.derive(instances=instances)).best is not None

    if cap <= choice.quota or not feasible(cap):
        return None
    lo, hi = choice.quota, cap  # infeasible at lo, feasible at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    return hi


def explain_infeasibility(space: TrainingSpace, proven: bool = True) -> Infeasibility:
    problem = space.problem
    limits = problem.limits
    relaxations: list[dict] = []
    single: list[str] = []
    # (limit, the objective that minimizes it, the figure of a plan it is compared with)
    for name, objective, figure in (("time_s", "min_time", "total_s"), ("cost_usd", "min_cost", "cost_usd")):
        current = getattr(limits, name)
        if current is None:
            continue
        variant = space.derive(objective=objective, limits=limits.model_copy(update={name: None}))
        best = _search(variant).best
        if best is not None:
            relaxations.append({"field": f"limits.{name}", "current": current, "needed": getattr(best, figure),
                                "plan": space.describe(best.candidate)})
            single.append(f"limits.{name}")
    both = limits.time_s is not None and limits.cost_usd is not None
    if both and not single:
        # no single limit suffices: the cheapest plan with no time limit, and the fastest with
        # no budget, each meeting both limits once both are moved to its figures
        for objective in ("min_cost", "min_time"):
            variant = space.derive(objective=objective, limits=limits.model_copy(
                update={"time_s": None, "cost_usd": None}))
            best = _search(variant).best
            if best is not None:
                relaxations.append({
                    "fields": ["limits.time_s", "limits.cost_usd"],
                    "needed": {"limits.time_s": best.total_s, "limits.cost_usd": best.cost_usd},
                    "plan": space.describe(best.candidate),
                    "note": f"the {'cheapest' if objective == 'min_cost' else 'fastest'} plan within the quotas",
                })
    for i, choice in enumerate(space.choices):
        needed = _quota_needed(space, i)
        if needed is not None:
            relaxations.append({"field": f"instances[{i}].quota", "instance": choice.label,
                                "current": choice.quota, "needed": needed})
            single.append(f"instances[{i}].quota")
    if space.size == 0:
        reason = _batch_reason(space)
        conflicts = ["global_batch"] + [f"instances[{i}].quota" for i in range(len(space.choices))]
    else:
        from thrifty.solver.smt import unsat_core

        conflicts = _deletion_core(space, single)
        if conflicts is None:
            conflicts = unsat_core(space, deadline_s=CORE_TIME_S)
        if conflicts is None:  # z3 undecided in time: the exact relaxation analysis decides
            conflicts = single or [name for name in ("limits.time_s", "limits.cost_usd")
                                   if getattr(limits, name.split(".")[1]) is not None]
        reason = ("no plan meets " + " and ".join(conflicts)) if conflicts else "no plan meets the limits"
    if not proven:
        reason = "no feasible plan was found within the time limit (not proven infeasible); " + reason
    return Infeasibility(conflicts=conflicts, relaxations=relaxations, reason=reason)



def _deletion_core(space: TrainingSpace, single: list[str]) -> list[str] | None:
    """A minimal conflicting set of limits and quotas by deletion, each test
    an exact exhaustive search; None when a test would enumerate more than
    `CORE_CHECK_LIMIT` candidates (z3 is asked instead).

    Start with every constraint enforced (no plan). Constraints in `single`
    (relaxing one alone restores feasibility) are in every minimal set and are
    kept without a test. Each other constraint is dropped (a limit removed, a
    quota raised to what the global batch allows) for good when the problem
    stays infeasible without it. What remains is infeasible, and dropping any
    one member makes it feasible: a minimal core."""
    problem = space.problem
    names = [f"limits.{n}" for n in ("time_s", "cost_usd") if getattr(problem.limits, n) is not None]
    names += [f"instances[{i}].quota" for i in range(len(space.choices))]
    kept = set(names)
    for name in names:
        if name in single:
            continue
        variant = _enforcing(space, kept - {name})
        if variant.size > CORE_CHECK_LIMIT:
            return None
        if search_exhaustive(variant, any_feasible=True).best is None:
            kept.discard(name)
    return [n for n in names if n in kept]


def _enforcing(space: TrainingSpace, kept: set[str]) -> TrainingSpace:
    """`space` with only the limits and quotas named in `kept` enforced."""
    problem = space.problem
    limits = problem.limits.model_copy(update={
        name: None for name in ("time_s", "cost_usd") if f"limits.{name}" not in kept})
    instances = [
        inst if f"instances[{i}].quota" in kept or not c.batches
        else inst.model_copy(update={"quota": max(inst.quota, problem.global_batch // c.batches[0])})
        for i, (inst, c) in enumerate(zip(problem.instances, space.choices))
    ]
    return space.derive(limits=limits, instances=instances)


def _batch_reason(space: TrainingSpace) -> str:
    parts = []
    for c in space.choices:
        allowed = ", ".join(map(str, c.batches)) or "none"
        parts.append(f"{c.label} x{c.quota}: batches {allowed}")
    return (f"no allowed per-machine batches sum to the global batch {space.problem.global_batch} "
            f"within the quotas ({'; '.join(parts)})")
