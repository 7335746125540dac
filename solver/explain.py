"""Why a training problem has no plan, and what would change that.

Constraints
-----------
What a user may change: the time limit (``limits.time_s``), the budget
(``limits.cost_usd``), each quota (``instances[i].quota``), the global batch
(``global_batch``) and the per-machine batch rule (``batch_sizes``,
``respect_threshold``). The conflict analysis is over the limits and quotas;
the global batch and the batch rule are the background every plan must meet.
A quota counts as dropped when raised to ``global_batch // smallest batch``
(no plan can use more machines of that choice).

Conflict sets (`_MinimalConflicts`)
-----------------------------------
Every minimal conflict set: a set of limits and quotas that no plan meets
together, while dropping any one member admits a plan. Feasibility is monotone
(fewer constraints never remove a plan), so MARCO's map works on bit masks:
the largest subset not yet decided is tested; a feasible one grows to a
maximal feasible subset (every subset of it is feasible), an infeasible one
shrinks by deletion to a minimal one (every superset of it is infeasible),
until every subset is decided. Large subsets are cheap to test (the quotas
keep their spaces small), and a plan found on the way meets every smaller
subset it satisfies, so the costly tests of barely constrained problems are
rarely run. A set of quotas alone that conflicts (the batches cannot add up
within them) is reported with ``global_batch``, its other side; when the
batches cannot add up even with no quota, ``[global_batch]`` is the one set.
Past `MUS_MAX_CONSTRAINTS` constraints, `MUS_BUDGET_S` CPU seconds or a test
CP-SAT cannot decide within `CPSAT_TEST_WORK` (spaces of more than
`EXHAUSTIVE_TEST_LIMIT` candidates whose limits leave more than
`BOUNDED_TEST_LIMIT`), the sets found so far are returned and marked
incomplete (z3's unsat core when none was found, said to be not shown
minimal; none when z3 cannot decide in its time either). A search stopped
by its time limit without a plan is not analysed: the problem may have one.

Relaxations
-----------
A relaxation changes the fields of one minimal hitting set of the conflict
sets (every set loses a member), each to the least value that admits a plan,
in a fixed order (quotas by index, then the limits; both orders for the two
limits): each value is found with the fields after it dropped and the fields
before it at their values. So every value is tight given the others:

- a limit: the least figure (time or cost) of a plan that meets the rest,
  from an exact search that minimizes it; feasible at that value, infeasible
  at any smaller one (1% short included);
- a quota: the least quota that admits a plan (binary search; feasibility is
  monotone in a quota), infeasible one machine short;
- the global batch (when it is in every set): the nearest global batch below
  and above with a plan, all else as it is; every global batch in between is
  out of the machines' reach or was searched without a plan, so one sample
  closer has none. When none of the `BATCH_SCAN_LIMIT` nearest reachable ones
  has a plan within the limits, the nearest reachable one with the least
  change of the limits there (a closer one stays out of reach whatever the
  limits);
- the batch rule (when the global batch is in a conflict): ``batch_sizes``
  ``"pow2"`` (or ``"gpu_pow2"``) and ``respect_threshold`` false, alone or
  with the least change of the limits.

A limit is a conflict set on its own only when no plan meets it whatever the
quotas (Srifty case 6: no plan costs $1.3 or less); a limit that only the
quotas make unreachable is in a set with them (case 6: the fastest plan
within the quotas takes 316 s against 300 s, and more of any machine type
would be faster), so raising any member of that set is a way out.

Values are stored exactly as computed (never rounded); the command line prints
limits rounded up (a printed limit is never below what is needed).

JSON keys (``plan.model_dump()["infeasibility"]``)
-----------------------------------------------
- ``conflict_sets``: ``[[name, ...], ...]`` every minimal conflict set, names
  in the order limits, ``global_batch``, quotas;
- ``conflict_reasons``: one sentence for each set, in the same order;
- ``conflict_sets_complete``: false when the enumeration stopped early;
- ``conflicts``: the union of the sets, in the same order (the key of the
  first contract, kept for its consumers);
- ``reason``: one sentence;
- ``relaxations``: ``[{...}, ...]``, each with ``changes`` (``{field:
  value}``: every field to set), the plan the change admits (``plan`` in
  Srifty's notation, ``allocation`` as a plan's), its ``total_s`` and
  ``cost_usd``, optionally a ``note``; a change of one field also has
  ``field``, ``current``, ``needed`` and ``direction`` (``raise``, ``lower``
  or ``set``; ``instance`` for a quota), a change of several ``fields``
  (a list) with ``current`` and ``needed`` as ``{field: value}``.
  Single-field relaxations come first, the two limits together last.

Tuning problems (`explain_tuning_infeasibility`) answer with the same keys:
the deadline (``deadline_s``) against the fleet bounds (``max_instances``,
``max_gpus_per_trial``); each relaxation also has ``jct_s_p95``, its
``total_s`` is the plan's mean JCT and its ``plan`` the plan's stages.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Any

import numpy as np
from thrifty.solver.plan import Infeasibility, limits_note
from thrifty.solver.problem import MAX_GLOBAL_BATCH
from thrifty.solver.search import SearchResult, search_exhaustive
from thrifty.solver.training import Evaluation, TrainingSpace, batch_unit, group_sums

__all__ = ["CORE_TIME_S", "QUOTA_SEARCH_CAP", "explain_infeasibility", "explain_tuning_infeasibility",
           "limit_relaxations", "relaxed_problem"]

QUOTA_SEARCH_CAP = 4096
CORE_TIME_S = 3.0  # z3's budget for the unsat core when the enumeration found no set
MUS_MAX_CONSTRAINTS = 10  # 2^10 subsets in MARCO's map at most
# past it, the conflict sets found so far, marked incomplete. CPU seconds of this process, not wall-clock seconds:
# a busy host stretches the wall time of the same work several-fold, and the same problem must get the same answer
MUS_BUDGET_S = 5.0
BATCH_SCAN_LIMIT = 40  # global batches searched each side for the nearest one with a plan
EXHAUSTIVE_TEST_LIMIT = 50_000  # candidates a feasibility test enumerates; past it, CP-SAT decides
# a larger space is enumerated too when its limits' bounds leave at most this many candidates (found out at the
# cost of enumerating that many: so few that giving up costs little beside CP-SAT's budget)
BOUNDED_TEST_LIMIT = 5_000
# CP-SAT's budget for one feasibility test, in its deterministic time (work, not wall-clock seconds, so that a busy
# host gets the same answer), and a wall-clock backstop far past it
CPSAT_TEST_WORK = 5.0
CPSAT_TEST_WALL_S = 120.0
MAX_HITTING_SET = 3  # fields one relaxation may change together
MAX_JOINT_RELAXATIONS = 8

LIMITS = {"limits.time_s": ("time_s", "min_time", "total_s"), "limits.cost_usd": ("cost_usd", "min_cost", "cost_usd")}

# a setting of the constraints: name -> value; None drops it (no limit, the quota unbounded)
Values = dict[str, Any]


def explain_infeasibility(space: TrainingSpace, proven: bool = True) -> Infeasibility:
    """The conflict sets and relaxations of `space`'s problem (module docstring).

    `proven` false: the search stopped at its time limit without a plan, so
    the problem may well have one; nothing is analysed (the analysis would
    claim conflicts the search never established, and take longer than the
    limit the user gave) and the answer says so: no conflict sets, marked
    incomplete, no relaxations."""
    if not proven:
        reason = ("no feasible plan was found within the time limit (not proven infeasible: the search stopped "
                  "before it could finish); give the solver more time")
        return Infeasibility(conflicts=[], relaxations=[], reason=reason, conflict_sets=[],
                             conflict_sets_complete=False, conflict_reasons=[])
    analysis = _Analysis(space)
    sets, complete = analysis.conflict_sets()
    members = analysis.names + ["global_batch"]
    conflicts = [n for n in _ordered(members) if any(n in s for s in sets)]
    relaxations = analysis.relaxations(sets)
    reasons = [_conflict_reason(space, s) for s in sets]
    if len(sets) == 1:
        reason = reasons[0]
    elif sets:
        reason = f"{len(sets)} separate conflicts: " + "; ".join(reasons)
    else:
        reason = "no plan meets the limits"
    if analysis.from_core:  # one set: its reason is the answer's
        caveat = (" (z3's unsat core: these conflict together, but there were more constraints than the analysis "
                  "could check in its time, so the set is not shown minimal: relaxing one member may not be enough)")
        reason, reasons = reason + caveat, [r + caveat for r in reasons]
    return Infeasibility(conflicts=conflicts, relaxations=relaxations, reason=reason, conflict_sets=sets,
                         conflict_sets_complete=complete, conflict_reasons=reasons)


def limit_relaxations(space: TrainingSpace) -> list[dict[str, Any]]:
    """The relaxations of the limits alone, the quotas as they are: the least
    time limit, the least budget, or both together when neither alone admits a
    plan (the entries of `explain_infeasibility`'s ``relaxations``, without the
    conflict analysis, which a running job that must answer within a window
    cannot wait for)."""
    return _Analysis(space).limit_repairs()


def relaxed_problem(problem: Any, changes: dict[str, Any]) -> Any:
    """`problem` (a `TrainingProblem`) with a relaxation's ``changes`` applied."""
    limits = problem.limits
    instances = list(problem.instances)
    update: dict[str, Any] = {}
    for name, value in changes.items():
        if name in LIMITS:
            limits = limits.model_copy(update={LIMITS[name][0]: value})
        elif name.startswith("instances["):
            i = _quota_index(name)
            instances[i] = instances[i].model_copy(update={"quota": value})
        else:
            update[name] = value
    return problem.model_copy(update={**update, "limits": limits, "instances": instances})


def _ordered(names: list[str]) -> list[str]:
    """Limits, then the global batch, then quotas by index."""
    def key(n: str) -> tuple[int, int]:
        if n in LIMITS:
            return (0, list(LIMITS).index(n))
        if n == "global_batch":
            return (1, 0)
        if n.startswith("instances["):
            return (2, _quota_index(n))
        return (3, 0)
    return sorted(names, key=key)


def _quota_index(name: str) -> int:
    return int(name[len("instances["):name.index("]")])


def _search(space: TrainingSpace) -> SearchResult:
    if space.size == 0:
        return SearchResult("exhaustive", None, None, True, 0, 0.0)
    if space.size <= 50_000:
        return search_exhaustive(space)
    from thrifty.solver.cpsat import search_cpsat

    return search_cpsat(space)


def _consequence(space: TrainingSpace, best: Evaluation) -> dict[str, Any]:
    """What a relaxation buys: the plan it allows, with its time and cost."""
    allocation = [{"instance_type": space.choices[i].itype.name, "market": space.choices[i].spec.market,
                   "count": count, "batch_per_instance": batch} for i, count, batch in best.candidate]
    return {"plan": space.describe(best.candidate), "allocation": allocation, "total_s": best.total_s,
            "cost_usd": best.cost_usd}


class _Analysis:
    """Feasibility tests and least values on variants of one problem, sharing
    the space's simulator and every plan simulated so far (a plan's time and
    cost depend on neither the limits nor the quotas, so a plan found in one
    variant proves every variant it meets feasible without a search)."""

    def __init__(self, space: TrainingSpace):
        self.space = space
        problem = space.problem
        self.limits = [n for n in LIMITS if getattr(problem.limits, LIMITS[n][0]) is not None]
        self.quotas = [f"instances[{i}].quota" for i in range(len(space.choices))]
        self.names = self.limits + self.quotas
        self.unbounded = {f"instances[{c.index}].quota": max(c.quota, problem.global_batch // c.batches[0])
                          if c.batches else c.quota for c in space.choices}
        self.pool: dict[tuple, Evaluation] = {e.candidate: e for e in space.history}
        self.from_core = False  # the conflict set is z3's unsat core, not shown minimal

    # -- variants -------------------------------------------------------------------
    def current(self, name: str) -> Any:
        if name in LIMITS:
            return getattr(self.space.problem.limits, LIMITS[name][0])
        return self.space.problem.instances[_quota_index(name)].quota

    def value(self, values: Values, name: str) -> Any:
        """The value of constraint `name` under `values` (its current one when absent)."""
        v = values[name] if name in values else self.current(name)
        if v is None and name in self.unbounded:
            return self.unbounded[name]
        return v

    def variant(self, values: Values, objective: str | None = None) -> TrainingSpace:
        problem = self.space.problem
        limits = problem.limits.model_copy(update={LIMITS[n][0]: self.value(values, n) for n in LIMITS})
        instances = [inst.model_copy(update={"quota": self.value(values, q)})
                     for inst, q in zip(problem.instances, self.quotas)]
        return self.space.derive(limits=limits, instances=instances, objective=objective or problem.objective)

    def meets(self, plan: Evaluation, values: Values) -> bool:
        for name in LIMITS:
            limit = self.value(values, name)
            if limit is not None and getattr(plan, LIMITS[name][2]) > limit:
                return False
        return all(count <= self.value(values, self.quotas[i]) for i, count, _ in plan.candidate)

    def witness(self, values: Values) -> Evaluation | None:
        return next((e for e in self.pool.values() if self.meets(e, values)), None)

    def remember(self, space: TrainingSpace) -> None:
        self.pool.update((e.candidate, e) for e in space.history)

    def feasible(self, values: Values) -> bool | None:
        """Whether some plan meets `values`; None when CP-SAT could not decide in time."""
        if self.witness(values) is not None:
            return True
        variant = self.variant(values)
        if variant.size == 0:
            return False
        if all(self.value(values, n) is None for n in LIMITS):
            return True  # every candidate meets the quotas, and no limit is left
        found = _any_plan(variant)
        self.remember(variant)
        if isinstance(found, Evaluation):
            self.pool[found.candidate] = found
        return None if found is None else found is not False

    def best(self, values: Values, objective: str | None = None) -> Evaluation | None:
        variant = self.variant(values, objective)
        best = _search(variant).best
        self.remember(variant)
        return best

    # -- conflict sets ----------------------------------------------------------------
    def conflict_sets(self) -> tuple[list[list[str]], bool]:
        if self.variant({n: None for n in self.names}).size == 0:
            return [["global_batch"]], True
        found: list[set[str]]
        if len(self.names) > MUS_MAX_CONSTRAINTS:
            found, complete = [], False
        else:
            found, complete = _MinimalConflicts(self).run()
        if not found and complete:
            return [], True  # every subset has a plan: the search that found none stopped early
        if not found:
            from thrifty.solver.smt import unsat_core

            core = unsat_core(self.space, deadline_s=CORE_TIME_S)
            if not core:  # z3 could not decide in its time either: no conflict is known
                return [], False
            found, complete, self.from_core = [set(core)], False, True
        sets = []
        for members in found:
            names = _ordered(list(members))
            if not any(n in LIMITS for n in names):
                names = ["global_batch"] + names  # the batches cannot add up within these quotas
            sets.append(names)
        return sorted(sets, key=lambda s: (len(s), [self.names.index(n) if n in self.names else -1 for n in s])), \
            complete

    # -- relaxations -------------------------------------------------------------------
    def relaxations(self, sets: list[list[str]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        hitting = _minimal_hitting_sets([set(s) for s in sets], self.names + ["global_batch"])
        singles = [h[0] for h in hitting if len(h) == 1]
        for name in singles:
            if name in LIMITS:
                out += self.limit_relaxation(name)
            elif name in self.unbounded:
                out += self.quota_relaxation(name)
        if "global_batch" in singles:
            out += _global_batch_relaxations(self.space) + _batch_rule_relaxations(self.space)
        joint = []
        for h in hitting:
            if len(h) < 2 or "global_batch" in h:
                continue
            quotas = [n for n in h if n in self.unbounded]
            limits = [n for n in h if n in LIMITS]
            orders = [quotas + limits] if len(limits) < 2 else [quotas + limits[::-1], quotas + limits]
            joint += orders
        joint.sort(key=lambda order: (all(n in LIMITS for n in order), len(order)))  # both limits last
        for order in joint[:MAX_JOINT_RELAXATIONS]:
            found = self.repair(order)
            if found is not None:
                out.append(found)
        return out

    def limit_repairs(self) -> list[dict[str, Any]]:
        """The least change of one limit, or of both when neither alone admits a
        plan (quotas as they are)."""
        out = [r for name in self.limits for r in self.limit_relaxation(name)]
        if not out and len(self.limits) == 2:
            out = [r for order in (["limits.cost_usd", "limits.time_s"], ["limits.time_s", "limits.cost_usd"])
                   if (r := self.repair(order)) is not None]
        return out

    def least(self, name: str, values: Values) -> tuple[Any, Evaluation] | None:
        """The least value of `name` that admits a plan under `values` (its own
        value dropped), with a plan there; None when none does."""
        if name in LIMITS:
            _, objective, figure = LIMITS[name]
            best = self.best({**values, name: None}, objective)
            return None if best is None else (getattr(best, figure), best)
        return self.least_quota(name, values)

    def least_quota(self, name: str, values: Values) -> tuple[int, Evaluation] | None:
        """Binary search between the current quota and the unbounded one; a
        feasible probe's witness lowers the upper end to the machines it uses."""
        index = _quota_index(name)
        cap = min(QUOTA_SEARCH_CAP, self.unbounded[name])
        lo = self.current(name)
        if cap <= lo:
            return None

        def used(quota: int) -> int:
            """The fewest machines of this choice in a known plan within `quota`
            (`quota` itself when the test needed no plan: no limit was left)."""
            at = {**values, name: quota}
            counts = [next((c for i, c, _ in e.candidate if i == index), 0)
                      for e in self.pool.values() if self.meets(e, at)]
            return min(counts, default=quota)

        if not self.feasible({**values, name: cap}):
            return None
        hi = used(cap)
        if hi <= lo:
            return None  # feasible at the current quota: not part of the conflict
        while hi - lo > 1:
            mid = (lo + hi) // 2
            ok = self.feasible({**values, name: mid})
            if ok is None:
                return None
            if ok:
                hi = used(mid)
            else:
                lo = mid
        best = self.best({**values, name: hi})
        return None if best is None else (hi, best)

    def limit_relaxation(self, name: str) -> list[dict[str, Any]]:
        found = self.least(name, {})
        if found is None:
            return []
        needed, best = found
        return [{"field": name, "current": self.current(name), "needed": needed, "direction": "raise",
                 "changes": {name: needed}, **_consequence(self.space, best)}]

    def quota_relaxation(self, name: str) -> list[dict[str, Any]]:
        found = self.least_quota(name, {})
        if found is None:
            return []
        needed, best = found
        choice = self.space.choices[_quota_index(name)]
        return [{"field": name, "instance": choice.label, "current": choice.quota, "needed": needed,
                 "direction": "raise", "changes": {name: needed}, **_consequence(self.space, best)}]

    def repair(self, order: list[str]) -> dict[str, Any] | None:
        """Several fields relaxed together, each to its least value with the
        later ones dropped and the earlier ones at their values."""
        fixed: Values = {}
        best: Evaluation | None = None
        for k, name in enumerate(order):
            found = self.least(name, {**fixed, **{later: None for later in order[k + 1:]}})
            if found is None or found[0] <= self.current(name):
                return None  # this field need not change: a smaller relaxation covers it
            fixed[name], best = found
        assert best is not None  # order names at least one field, so the loop found a plan
        note = None
        if set(order) == set(LIMITS):
            note = limits_note("cheapest" if order[0] == "limits.cost_usd" else "fastest")
        out = {"fields": list(order), "current": {n: self.current(n) for n in order}, "needed": dict(fixed),
               "changes": dict(fixed), **_consequence(self.space, best)}
        if note:
            out["note"] = note
        return out


class _MinimalConflicts:
    """MARCO's enumeration of minimal infeasible and maximal feasible subsets
    over bit masks of `_Analysis.names` (module docstring)."""

    def __init__(self, analysis: _Analysis):
        self.analysis = analysis
        self.names = analysis.names
        self.infeasible: list[int] = []  # known infeasible masks (their supersets are too)
        self.feasible: list[int] = []  # known feasible masks (their subsets are too)
        self.deadline = time.process_time() + MUS_BUDGET_S

    def values(self, mask: int) -> Values:
        return {n: (self.analysis.current(n) if mask >> k & 1 else None) for k, n in enumerate(self.names)}

    def status(self, mask: int) -> bool | None:
        if any(m & mask == m for m in self.infeasible):
            return False
        if any(mask & f == mask for f in self.feasible):
            return True
        if time.process_time() > self.deadline:
            return None
        ok = self.analysis.feasible(self.values(mask))
        if ok is not None:
            (self.feasible if ok else self.infeasible).append(mask)
        return ok

    def run(self) -> tuple[list[set[str]], bool]:
        n = len(self.names)
        order = sorted(range(1 << n), key=lambda m: -m.bit_count())
        minimal: list[int] = []
        complete = True
        while True:
            seed = next((m for m in order if not any(i & m == i for i in self.infeasible)
                         and not any(m & f == m for f in self.feasible)), None)
            if seed is None:
                break
            ok = self.status(seed)
            if ok is None:
                complete = False
                break
            bits = [1 << k for k in range(n)]
            if ok:  # grow to a maximal feasible subset
                for b in bits:
                    if not seed & b:
                        grown = self.status(seed | b)
                        if grown is None:
                            complete = False
                            break
                        if grown:
                            seed |= b
                self.feasible.append(seed)
            else:  # shrink to a minimal infeasible subset
                for b in bits:
                    if seed & b:
                        shrunk = self.status(seed & ~b)
                        if shrunk is None:
                            complete = False
                            break
                        if not shrunk:
                            seed &= ~b
                if complete:
                    minimal.append(seed)
            if not complete:
                break
        sets = [{self.names[k] for k in range(n) if m >> k & 1} for m in minimal]
        return sets, complete


def _any_plan(space: TrainingSpace) -> Evaluation | bool | None:
    """A feasibility test: some plan of `space`, False when none exists, None
    when CP-SAT could not decide within `CPSAT_TEST_WORK`. A space of up to
    `EXHAUSTIVE_TEST_LIMIT` candidates, or a larger one whose limits' bounds
    leave at most `BOUNDED_TEST_LIMIT` (the bounds cut most of a large space
    whose limits are tight), is enumerated (an exact branch and bound); one
    where they cut too little goes to CP-SAT, which minimizes a limited
    figure and proves infeasibility when it completes."""
    if space.size == 0:
        return False
    found = search_exhaustive(space, any_feasible=True,
                              max_candidates=None if space.size <= EXHAUSTIVE_TEST_LIMIT else BOUNDED_TEST_LIMIT)
    if not found.details.get("capped"):
        return found.best or False
    from thrifty.solver.cpsat import search_cpsat

    objective = "min_time" if space.problem.limits.time_s is not None else "min_cost"
    found = search_cpsat(space.derive(objective=objective), deadline=time.perf_counter() + CPSAT_TEST_WALL_S,
                         work=CPSAT_TEST_WORK)
    if found.best is not None:
        return found.best
    return False if found.complete else None


def _minimal_hitting_sets(sets: list[set[str]], universe: list[str]) -> list[list[str]]:
    """Every minimal set of at most `MAX_HITTING_SET` names that meets every set,
    smallest first (names in `universe` order)."""
    if not sets:
        return []
    relevant = [n for n in universe if any(n in s for s in sets)]
    out: list[list[str]] = []
    for size in range(1, MAX_HITTING_SET + 1):
        for combo in itertools.combinations(relevant, size):
            chosen = set(combo)
            if all(chosen & s for s in sets) and not any(set(h) <= chosen for h in out):
                out.append(list(combo))
    return out


def _reachable_sums(space: TrainingSpace, upto: int) -> np.ndarray:
    """Which global batches 0..upto the machines within their quotas could add
    up to, with every batch the rule allows up to each machine's memory (a
    superset of what any global batch allows: a smaller global batch only
    removes batches above it, and the throughput threshold only small ones)."""
    rules = [(c.quota, [b for b in space.rule_batches(c.itype) if b <= upto]) for c in space.choices]
    unit = batch_unit(b for _, batches in rules for b in batches)  # every sum is a multiple: a table per unit
    reach = np.zeros(upto // unit + 1, dtype=np.int64)
    reach[0] = 1
    for quota, batches in rules:
        new = reach.copy()
        for b in batches:
            new += group_sums(reach, b // unit, quota)
        reach = np.minimum(new, 1)
    out = np.zeros(upto + 1, dtype=bool)
    out[::unit] = reach > 0
    return out


def _global_batch_relaxations(space: TrainingSpace) -> list[dict[str, Any]]:
    """The nearest global batches below and above the current one with a plan
    (all limits and quotas as they are). Candidates are the sums the machines
    could reach (`_reachable_sums`), each verified by a search of the problem
    with that global batch; every global batch between the current one and
    the answer is unreachable or was searched without a plan, so one sample
    closer has none (tight). At most `BATCH_SCAN_LIMIT` global batches a side;
    when none of them has a plan within the limits, the nearest one the
    machines reach, with the least change of the limits there
    (`_background_relaxation`)."""
    current = space.problem.global_batch
    upto = min(2 * current, MAX_GLOBAL_BATCH)
    reach = _reachable_sums(space, upto)
    out = []
    for direction, order in (("lower", range(current - 1, 0, -1)), ("raise", range(current + 1, upto + 1))):
        note = ("fewer samples per iteration: the same iterations train on less data" if direction == "lower"
                else "more samples per iteration")
        nearest = None
        for value in itertools.islice((v for v in order if reach[v]), BATCH_SCAN_LIMIT):
            variant = space.derive(global_batch=value)
            if variant.size == 0:
                continue
            nearest = nearest or variant
            if _any_plan(variant):
                nearest = variant
                break
        if nearest is not None:
            out += _background_relaxation(space, nearest, "global_batch", direction, note)
    return out


def _batch_rule_relaxations(space: TrainingSpace) -> list[dict[str, Any]]:
    """Wider per-machine batch rules that admit a plan: powers of two with or
    without the GPU multiple (`batch_sizes`), and batches below the throughput
    threshold (Srifty 4.4, `respect_threshold`); with the least change of the
    limits when the wider rule alone is not enough."""
    problem = space.problem
    rule = problem.batch_sizes
    changes: list[tuple[str, Any]] = [("batch_sizes", r) for r in ("gpu_pow2", "pow2")
                                      if r != rule and not (rule == "pow2" and r == "gpu_pow2")]
    if problem.respect_threshold:
        changes.append(("respect_threshold", False))
    out = []
    for name, value in changes:
        variant = space.derive(**{name: value})
        if variant.size:
            out += _background_relaxation(space, variant, name, "set")
    return out




def _background_relaxation(space: TrainingSpace, variant: TrainingSpace, name: str, direction: str,
                           note: str | None = None) -> list[dict[str, Any]]:
    """`variant` (`space`'s problem with field `name` changed, machines that can
    reach its global batch) as relaxations: the change alone when it has a plan
    within the limits, else with each least change of the limits that admits
    one there (the quotas stay: a closer global batch stays out of their reach)."""
    value = getattr(variant.problem, name)
    current = getattr(space.problem, name)
    extra = {"note": note} if note else {}
    best = _search(variant).best
    if best is not None:
        return [{"field": name, "current": current, "needed": value, "direction": direction,
                 "changes": {name: value}, **extra, **_consequence(variant, best)}]
    out = []
    for r in _Analysis(variant).limit_repairs():
        fields = r["fields"] if "fields" in r else [r["field"]]
        was = r["current"] if "fields" in r else {r["field"]: r["current"]}
        out.append({"fields": [name] + fields, "current": {name: current, **was},
                    "needed": {name: value, **r["changes"]}, "changes": {name: value, **r["changes"]},
                    **extra, **{k: r[k] for k in ("plan", "allocation", "total_s", "cost_usd")}})
    return out


def _conflict_reason(space: TrainingSpace, names: list[str]) -> str:
    """One conflict set in words: what no plan can do, within which quotas."""
    problem = space.problem
    chosen = [space.choices[_quota_index(n)] for n in names if n.startswith("instances[")]
    if not any(n in LIMITS for n in names):  # the global batch against these quotas (or any)
        within = "within the quotas" if chosen else "whatever the quotas"
        parts = "; ".join(f"{c.label}{f' x{c.quota}' if chosen else ''}: batches "
                          f"{', '.join(map(str, c.batches)) or 'none'}" for c in chosen or space.choices)
        return f"no allowed per-machine batches sum to the global batch {problem.global_batch} {within} ({parts})"
    what = {"limits.time_s": lambda: f"takes {problem.limits.time_s:g} s or less",
            "limits.cost_usd": lambda: f"costs ${problem.limits.cost_usd:g} or less"}
    done = " and ".join(what[n]() for n in names if n in LIMITS)
    if not chosen:
        return f"no plan {done}, whatever the quotas"
    quotas = ", ".join(f"{c.label} x{c.quota}" for c in chosen)
    return f"no plan within the quotas of {quotas} {done}"


# -- tuning problems -------------------------------------------------------------------

TUNING_FIELDS = ("max_instances", "max_gpus_per_trial")


def explain_tuning_infeasibility(space: Any, fastest: Any, time_limit_s: float = 10.0) -> dict[str, Any]:
    """Why a tuning problem (RubberBand) has no plan: the deadline against the
    fleet bounds ``max_instances`` and ``max_gpus_per_trial`` (when given),
    with the same keys as a training answer (module docstring).

    A fleet bound is in a conflict when raising it to what any plan could use
    (every trial of the largest stage on the most GPUs a trial can use) lets
    the fastest plan meet the deadline. The fastest plan is the exact
    formulation's least mean JCT over every stage option (RubberBand's JCT is
    the sum of the stage times, which the model adds up exactly), simulated.

    Relaxations: ``deadline_s``, the fastest plan's JCT (on the deadline's
    statistic, mean or p95) rounded up to the millisecond, raised by at most
    0.5% when the planner's integer milliseconds need it, and verified by
    planning again (the plan, its JCT and cost are the consequence); each
    fleet bound in every conflict, the least value whose fastest plan meets
    the deadline (binary search; no smaller one admits a plan), verified the
    same way. For a p95 deadline the exact model bounds p95 by the sum of
    the stage p95s, so the least deadline may be conservative."""
    problem = space.problem
    deadline = problem.deadline_s
    bounds = _fleet_bounds(space)
    complete = True

    def meets(values: dict[str, int]) -> bool | None:
        found = _fastest_tuning(space, values, time_limit_s)
        return None if found is None else found[0] <= deadline * (1 + 1e-9)

    sets: list[list[str]] = []
    if bounds:
        everything = meets({f: hi for f, (_, hi) in bounds.items()})
        complete = everything is not None
        if everything:
            for f in bounds:
                alone = meets({g: hi for g, (_, hi) in bounds.items() if g != f})
                complete = complete and alone is not None
                if alone is False:
                    sets.append(["deadline_s", f])
            sets = sets or [["deadline_s", *bounds]]
    sets = sets or [["deadline_s"]]
    relaxations = _deadline_relaxation(space, fastest, time_limit_s)
    for f in bounds:
        if all(f in s for s in sets):
            relaxations += _fleet_relaxation(space, [f], bounds, time_limit_s)
    if len(sets) == 2:  # one conflict for each fleet bound: both raised, the first with the second unbounded
        relaxations += _fleet_relaxation(space, list(bounds), bounds, time_limit_s)
    reasons = [_tuning_reason(problem, s) for s in sets]
    return {"conflict_sets": sets, "conflict_reasons": reasons, "conflict_sets_complete": complete,
            "conflicts": [n for n in ["deadline_s", *TUNING_FIELDS] if any(n in s for s in sets)],
            "reason": reasons[0] if len(reasons) == 1 else f"{len(sets)} separate conflicts: " + "; ".join(reasons),
            "relaxations": relaxations}


def _fleet_bounds(space: Any) -> dict[str, tuple[int, int]]:
    """The fleet bounds that could be raised: ``{field: (current, unbounded)}``."""
    from thrifty.solver.problem import MAX_INSTANCES

    problem = space.problem
    most_trials = max(s.trials for s in space.spec.stages)
    gpus = {t: space.profiles[t].max_gpus for t in space.clouds}
    out = {}
    useful = min(MAX_INSTANCES, max(most_trials * -(-gpus[t] // c.gpus_per_instance) for t, c in space.clouds.items()))
    if useful > problem.max_instances:
        out["max_instances"] = (problem.max_instances, useful)
    if problem.max_gpus_per_trial is not None and max(gpus.values()) > problem.max_gpus_per_trial:
        out["max_gpus_per_trial"] = (problem.max_gpus_per_trial, max(gpus.values()))
    return out


def _fastest_tuning(base: Any, values: dict[str, Any], time_limit_s: float) -> tuple[float, Any] | None:
    """(JCT on the deadline's statistic, simulated candidate) of the fastest plan
    of the problem of space `base` with `values`; None when it cannot be planned (a bad size)."""
    from thrifty.core.errors import ThriftyError
    from thrifty.solver.tuning import solve_cpsat

    try:
        space = base.derive(**values)
        fast = solve_cpsat(space, "min_time", None, time_limit_s)
    except ThriftyError:
        return None
    if fast.status == "unknown":  # not planned within the time limit: no evidence either way
        return None
    if fast.options is None:
        return (math.inf, None)
    c = space.simulate(tuple(o.alloc for o in fast.options))
    return space.jct(c), c


def _tuning_plan(base: Any, values: dict[str, Any], time_limit_s: float) -> tuple[Any, Any] | None:
    """(space, best candidate) of the problem of space `base` with `values`, planned as `solve` does; None
    without a plan."""
    from thrifty.core.errors import ThriftyError
    from thrifty.solver.tuning import plan_tuning

    try:
        space = base.derive(**values)
        best = plan_tuning(space, time_limit_s).best
    except ThriftyError:
        return None
    return None if best is None else (space, best)


def _tuning_consequence(space: Any, best: Any) -> dict[str, Any]:
    from thrifty.solver.tuning_plan import candidate_answer

    body = candidate_answer(space, best)
    assert body.predicted is not None  # `best` is a plan
    return {"plan": [s.model_dump() for s in body.stages], "total_s": body.predicted.jct_s,
            "jct_s_p95": body.predicted.jct_s_p95, "cost_usd": body.predicted.cost_usd}


def _deadline_relaxation(space: Any, fastest: Any, time_limit_s: float) -> list[dict[str, Any]]:
    if fastest is None:
        return []
    problem = space.problem
    jct = space.jct(fastest)
    stages = len(fastest.plan)
    # the planner counts whole milliseconds per stage term (stage time and scale-up), rounded
    tries = [jct, jct + 0.001 * stages, jct * 1.001, jct * 1.005]
    for value in tries:
        needed = math.ceil(value * 1000) / 1000
        planned = _tuning_plan(space, {"deadline_s": needed}, time_limit_s)
        if planned is not None:
            return [{"field": "deadline_s", "current": problem.deadline_s, "needed": needed, "direction": "raise",
                     "changes": {"deadline_s": needed},
                     "note": f"the fastest plan's {problem.deadline_on} JCT",
                     **_tuning_consequence(*planned)}]
    return []


def _fleet_relaxation(space: Any, names: list[str], bounds: dict[str, tuple[int, int]],
                      time_limit_s: float) -> list[dict[str, Any]]:
    """Fleet bounds `names` of the problem of `space` raised in turn, each to the least value whose fastest
    plan meets the deadline, the later ones unbounded and the earlier ones at
    their values (binary search: the deadline is missed one below)."""
    problem = space.problem
    fixed: dict[str, int] = {}
    for k, name in enumerate(names):
        later = {f: bounds[f][1] for f in names[k + 1:]}
        lo, hi = bounds[name]

        def meets(value: int, name: str = name, later: dict[str, int] = later) -> bool:
            found = _fastest_tuning(space, {**fixed, **later, name: value}, time_limit_s)
            return found is not None and found[0] <= problem.deadline_s * (1 + 1e-9)

        if meets(lo) or not meets(hi):
            return []  # this bound need not change, or raising it is not enough
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if meets(mid) else (mid, hi)
        fixed[name] = hi
    planned = _tuning_plan(space, fixed, time_limit_s)
    if planned is None:
        return []
    if len(names) == 1:
        head = {"field": names[0], "current": bounds[names[0]][0], "needed": fixed[names[0]], "direction": "raise"}
    else:
        head = {"fields": list(names), "current": {f: bounds[f][0] for f in names}, "needed": dict(fixed)}
    return [{**head, "changes": dict(fixed), **_tuning_consequence(*planned)}]


def _tuning_reason(problem: Any, names: list[str]) -> str:
    words = {"max_instances": "instances", "max_gpus_per_trial": "GPUs per trial"}
    within = [f"at most {getattr(problem, f)} {words[f]}" for f in names if f in TUNING_FIELDS]
    fleet = f" with {' and '.join(within)}" if within else ""
    return (f"no allocation{fleet} finishes the job within deadline_s {problem.deadline_s:g} s "
            f"({problem.deadline_on} JCT)")
