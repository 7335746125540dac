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

import itertools
import time
from typing import Any

import numpy as np

from thrifty.solver.plan import Infeasibility
from thrifty.solver.problem import MAX_GLOBAL_BATCH
from thrifty.solver.search import SearchResult, search_exhaustive
from thrifty.solver.training import Evaluation, TrainingSpace, group_sums

__all__ = ["explain_infeasibility", "QUOTA_SEARCH_CAP", "CORE_TIME_S"]

QUOTA_SEARCH_CAP = 4096
CORE_TIME_S = 3.0  # z3's budget for the unsat core; past it the relaxation analysis names the conflicts
MUS_MAX_CONSTRAINTS = 8  # up to 2^8 subset tests for every minimal conflict set
MUS_BUDGET_S = 5.0  # past it, one minimal set (deletion) instead of all of them
BATCH_SCAN_LIMIT = 40  # global batches searched each side for the nearest one with a plan
CORE_CHECK_LIMIT = 200_000  # candidates a deletion test may enumerate before z3 is asked instead


def _search(space: TrainingSpace) -> SearchResult:
    if space.size == 0:
        return SearchResult("exhaustive", None, None, True, 0, 0.0)
    if space.size <= 50_000:
        return search_exhaustive(space)
    from thrifty.solver.cpsat import search_cpsat

    return search_cpsat(space)


def _quota_needed(space: TrainingSpace, index: int) -> tuple[int, Evaluation] | None:
    """Least quota of choice `index` that makes the problem feasible, with the
    best plan at that quota; None when no quota up to the cap does. Binary
    search: feasibility is monotone in the quota."""
    choice = space.choices[index]
    if not choice.batches:
        return None
    cap = min(QUOTA_SEARCH_CAP, space.problem.global_batch // choice.batches[0])

    def best_at(q: int) -> Evaluation | None:
        instances = list(space.problem.instances)
        instances[index] = instances[index].model_copy(update={"quota": q})
        return _search(space.derive(instances=instances)).best

    if cap <= choice.quota:
        return None
    best = best_at(cap)
    if best is None:
        return None
    lo, hi = choice.quota, cap  # infeasible at lo, feasible at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        found = best_at(mid)
        if found is not None:
            hi, best = mid, found
        else:
            lo = mid
    return hi, best


def explain_infeasibility(space: TrainingSpace, proven: bool = True) -> Infeasibility:
    problem = space.problem
    relaxations = _limit_relaxations(space)
    relaxations += _quota_relaxations(space)
    single = [r["field"] for r in relaxations if "field" in r]
    sets, complete = _conflict_sets(space, single)
    conflicts = [name for name in _constraint_names(space) + ["global_batch"] if any(name in s for s in sets)]
    if "global_batch" in conflicts:
        relaxations += _global_batch_relaxations(space) + _batch_rule_relaxations(space)
    if space.size == 0:
        reason = _batch_reason(space)
    else:
        reason = ("no plan meets " + " and ".join(sets[0])) if len(sets) == 1 else (
            f"{len(sets)} separate conflicts: " + "; ".join(" and ".join(s) for s in sets)) if sets else \
            "no plan meets the limits"
    if not proven:
        reason = "no feasible plan was found within the time limit (not proven infeasible); " + reason
    return Infeasibility(conflicts=conflicts, relaxations=relaxations, reason=reason, conflict_sets=sets,
                         conflict_sets_complete=complete)


def _consequence(space: TrainingSpace, best: Evaluation) -> dict[str, Any]:
    """What a relaxation buys: the plan it allows, with its time and cost."""
    return {"plan": space.describe(best.candidate), "total_s": best.total_s, "cost_usd": best.cost_usd}


def _limit_relaxations(space: TrainingSpace) -> list[dict[str, Any]]:
    """The least time limit over plans within the budget (and quotas), the
    least budget over plans within the time limit; when neither alone
    suffices, both limits moved to the figures of the cheapest and of the
    fastest plan within the quotas."""
    limits = space.problem.limits
    out: list[dict[str, Any]] = []
    for name, objective, figure in (("time_s", "min_time", "total_s"), ("cost_usd", "min_cost", "cost_usd")):
        current = getattr(limits, name)
        if current is None:
            continue
        variant = space.derive(objective=objective, limits=limits.model_copy(update={name: None}))
        best = _search(variant).best
        if best is not None:
            out.append({"field": f"limits.{name}", "current": current, "needed": getattr(best, figure),
                        "direction": "raise", **_consequence(space, best)})
    if limits.time_s is not None and limits.cost_usd is not None and not out:
        for objective in ("min_cost", "min_time"):
            variant = space.derive(objective=objective, limits=limits.model_copy(
                update={"time_s": None, "cost_usd": None}))
            best = _search(variant).best
            if best is not None:
                out.append({
                    "fields": ["limits.time_s", "limits.cost_usd"],
                    "needed": {"limits.time_s": best.total_s, "limits.cost_usd": best.cost_usd},
                    "note": f"the {'cheapest' if objective == 'min_cost' else 'fastest'} plan within the quotas",
                    **_consequence(space, best),
                })
    return out


def _quota_relaxations(space: TrainingSpace) -> list[dict[str, Any]]:
    out = []
    for i, choice in enumerate(space.choices):
        found = _quota_needed(space, i)
        if found is not None:
            needed, best = found
            out.append({"field": f"instances[{i}].quota", "instance": choice.label, "current": choice.quota,
                        "needed": needed, "direction": "raise", **_consequence(space, best)})
    return out


def _constraint_names(space: TrainingSpace) -> list[str]:
    names = [f"limits.{n}" for n in ("time_s", "cost_usd") if getattr(space.problem.limits, n) is not None]
    return names + [f"instances[{i}].quota" for i in range(len(space.choices))]


def _conflict_sets(space: TrainingSpace, single: list[str]) -> tuple[list[list[str]], bool]:
    """Every minimal conflict set, and whether the list is complete.

    The constraints are the limits and the quotas; the global batch with its
    allowed per-machine batches is the background every plan must meet.
    Feasibility is monotone (enforcing fewer constraints never removes a
    plan), so the minimal infeasible subsets are found by testing subsets in
    order of size and skipping every superset of a set already found: a
    subset tested infeasible then has only feasible proper subsets. A set of
    quotas alone that conflicts (the batches cannot add up within them) is
    reported with ``global_batch``, its other side. When the global batch
    cannot be reached even with every quota raised, ``[global_batch]`` is the
    one set. Past `MUS_MAX_CONSTRAINTS` constraints, `MUS_BUDGET_S` seconds or
    a test space larger than `CORE_CHECK_LIMIT`, one minimal set is found by
    deletion (or z3's core) and the list is marked incomplete."""
    names = _constraint_names(space)
    if _enforcing(space, set()).size == 0:
        return [["global_batch"]], True
    found: list[frozenset[str]] = []
    deadline = time.perf_counter() + MUS_BUDGET_S
    complete = len(names) <= MUS_MAX_CONSTRAINTS
    # plans simulated so far: one that meets the enforced constraints proves a subset feasible
    # without a search (time and cost do not depend on the limits, nor candidates on the quotas)
    pool = {e.candidate: e for e in space.history}
    if complete:
        for size in range(1, len(names) + 1):
            for subset in itertools.combinations(names, size):
                kept = frozenset(subset)
                if any(f <= kept for f in found) or any(_meets(space, e, kept) for e in pool.values()):
                    continue
                variant = _enforcing(space, set(kept))
                if variant.size > CORE_CHECK_LIMIT or time.perf_counter() > deadline:
                    complete = False
                    break
                if variant.size == 0 or search_exhaustive(variant, any_feasible=True).best is None:
                    found.append(kept)
                pool.update((e.candidate, e) for e in variant.history)
            if not complete:
                break
    if not complete:
        core = _deletion_core(space, single)
        if core is None:
            from thrifty.solver.smt import unsat_core

            core = unsat_core(space, deadline_s=CORE_TIME_S)
        if core is None:  # z3 undecided in time: the exact relaxation analysis decides
            core = single or [n for n in names if n.startswith("limits.")]
        found = [frozenset(core)]
    sets = []
    for f in found:
        members = [n for n in names if n in f]
        if not any(n.startswith("limits.") for n in members):
            members = ["global_batch"] + members
        sets.append(members)
    return sets, complete


def _meets(space: TrainingSpace, plan: Evaluation, kept: frozenset[str]) -> bool:
    """Whether `plan` meets the constraints named in `kept` of `space`'s problem."""
    problem = space.problem
    for name in kept:
        if name == "limits.time_s" and plan.total_s > problem.limits.time_s:
            return False
        if name == "limits.cost_usd" and plan.cost_usd > problem.limits.cost_usd:
            return False
    return all(f"instances[{k}].quota" not in kept or count <= problem.instances[k].quota
               for k, count, _ in plan.candidate)


def _reachable_sums(space: TrainingSpace, upto: int) -> np.ndarray:
    """Which global batches 0..upto the machines within their quotas could add
    up to, with every batch the rule allows up to each machine's memory (a
    superset of what any global batch allows: a smaller global batch only
    removes batches above it, and the throughput threshold only small ones)."""
    reach = np.zeros(upto + 1, dtype=np.int64)
    reach[0] = 1
    for c in space.choices:
        batches = space.rule_batches(c.itype)
        new = reach.copy()
        for b in batches:
            if b <= upto:
                new += group_sums(reach, b, c.quota)
        reach = np.minimum(new, 1)
    return reach > 0


def _global_batch_relaxations(space: TrainingSpace) -> list[dict[str, Any]]:
    """The nearest global batches below and above the current one with a plan
    (all limits and quotas as they are). Candidates are the sums the machines
    could reach (`_reachable_sums`), each verified by a search of the problem
    with that global batch; every global batch between the current one and
    the answer is unreachable or was searched without a plan, so one sample
    closer has none (tight). At most `BATCH_SCAN_LIMIT` searches a side."""
    problem = space.problem
    current = problem.global_batch
    upto = min(2 * current, MAX_GLOBAL_BATCH)
    reach = _reachable_sums(space, upto)
    out = []
    for direction, order in (("lower", range(current - 1, 0, -1)), ("raise", range(current + 1, upto + 1))):
        tried = 0
        for value in order:
            if not reach[value]:
                continue
            tried += 1
            if tried > BATCH_SCAN_LIMIT:
                break
            variant = space.derive(global_batch=value)
            best = _search(variant).best if variant.size else None
            if best is not None:
                out.append({"field": "global_batch", "current": current, "needed": value, "direction": direction,
                            "note": "fewer samples per iteration: the same iterations train on less data"
                            if direction == "lower" else "more samples per iteration",
                            **_consequence(variant, best)})
                break
    return out


def _batch_rule_relaxations(space: TrainingSpace) -> list[dict[str, Any]]:
    """Wider per-machine batch rules that admit a plan: any power of two (not
    only multiples of the GPU count), and batches below the throughput
    threshold (Srifty 4.4)."""
    problem = space.problem
    out = []
    changes = []
    if problem.batch_sizes == "gpu_pow2":
        changes.append(("batch_sizes", "pow2"))
    if problem.respect_threshold:
        changes.append(("respect_threshold", False))
    for name, value in changes:
        variant = space.derive(**{name: value})
        best = _search(variant).best if variant.size else None
        if best is not None:
            out.append({"field": name, "current": getattr(problem, name), "needed": value,
                        **_consequence(variant, best)})
    return out


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
