"""Exact search over the pruned space (Srifty 4.4's exhaustive method), and
the shared result type of every method.

Srifty simulates every candidate of the pruned space when there are fewer
than about 10,000. We do the same, as a branch and bound: each candidate's
cheap lower bound (`TrainingSpace.lower_bound`, never above the simulated
time) gives a lower bound on its objective; candidates are simulated in
ascending order of that bound, and the search stops once the next bound is no
better than the best feasible objective simulated. The answer is the same
optimum as simulating everything (``prune=False`` does exactly that, for
comparison), with far fewer simulations. Candidates whose bound already breaks
a limit are infeasible and never simulated.

Every search leaves a `SearchTrace` on its space (`search_trace(space)`) for
plots: the candidates it ruled out by a bound, each with its lower bound on
the iteration time, at most `TRACE_LIMIT` of them (the simulated candidates
are in ``space.history``). Candidates the enumeration cuts as whole branches
(``candidates(within_limits=True)``) are never seen one by one, so they are
not in the trace; `bound_points` enumerates them when a plot wants them.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import islice

from thrifty.solver.training import Candidate, Evaluation, TrainingSpace

__all__ = ["SearchResult", "SearchTrace", "TRACE_LIMIT", "better", "bound_points", "search_exhaustive",
           "search_trace"]

TRACE_LIMIT = 5_000  # bounded candidates kept per space: enough to fill a plot, a few hundred kB at most


@dataclass
class SearchTrace:
    """The candidates the searches of one space ruled out by a bound without
    simulating them: ``(candidate, lower bound on the iteration time)``, the
    first `limit` of them, and how many there were in all."""

    bounded: list[tuple[Candidate, float]] = field(default_factory=list)
    bounded_total: int = 0
    limit: int = TRACE_LIMIT

    def add(self, entries: Iterable[tuple[Candidate, float]], count: int) -> None:
        """Keep `entries` (`count` of them) while there is room; count them all."""
        self.bounded_total += count
        room = self.limit - len(self.bounded)
        if room > 0:
            self.bounded.extend(islice(entries, room))


_traces: weakref.WeakKeyDictionary[TrainingSpace, SearchTrace] = weakref.WeakKeyDictionary()


def search_trace(space: TrainingSpace) -> SearchTrace:
    """The trace the searches of `space` left (empty when none ran)."""
    trace = _traces.get(space)
    if trace is None:
        trace = _traces[space] = SearchTrace()
    return trace


def bound_points(space: TrainingSpace, limit: int = TRACE_LIMIT) -> list[tuple[Candidate, float, float]]:
    """``(candidate, total_s, cost_usd)`` at the lower bound of the first `limit`
    candidates of the whole pruned space (no limits applied): never above the
    simulated figures (`TrainingSpace.lower_bound`; the cost grows with time)."""
    out = []
    for cand in islice(space.candidates(within_limits=False), limit):
        total = space.launch_s + space.iterations * space.lower_bound(cand)
        out.append((cand, total, space.cost(cand, total)))
    return out


@dataclass
class SearchResult:
    """What a method found: the best feasible evaluation (or none), the best proven
    lower bound on the optimum, and whether the search was complete (a proof)."""

    method: str
    best: Evaluation | None
    bound: float | None
    complete: bool
    simulated: int
    wall_s: float
    details: dict = field(default_factory=dict)

    @property
    def gap(self) -> float | None:
        if self.best is None:
            return None
        if self.complete:
            return 0.0
        if self.bound is None:
            return None
        return max(0.0, (self.best.objective_value - self.bound) / self.best.objective_value)


def better(a: Evaluation, b: Evaluation | None) -> bool:
    """`a` beats `b` (lower objective; ties broken by the candidate, so every method agrees)."""
    if b is None:
        return True
    return (a.objective_value, a.candidate) < (b.objective_value, b.candidate)


def search_exhaustive(space: TrainingSpace, prune: bool = True, deadline: float | None = None,
                      any_feasible: bool = False, max_candidates: int | None = None) -> SearchResult:
    """Exact optimum of the pruned space (see module docstring). With
    `any_feasible`, stop at the first feasible plan: a feasibility test, whose
    `best` is some feasible plan (not the optimum) or None (proven none).
    With `max_candidates`, give up (nothing simulated, not complete, ``capped``
    in the details) when the limits' bounds leave more candidates than that."""
    start = time.perf_counter()
    simulated0 = space.simulated
    ranked: list[tuple[float, Candidate, float]] = []
    beyond_limits: list[tuple[Candidate, float]] = []  # bound breaks a limit (first TRACE_LIMIT)
    total = beyond = 0
    for cand in space.candidates(within_limits=prune):
        total += 1
        if max_candidates is not None and total > max_candidates:
            return SearchResult(method="exhaustive", best=None, bound=None, complete=False, simulated=0,
                                wall_s=time.perf_counter() - start,
                                details={"candidates": total, "pruned": prune, "capped": True})
        if not prune:
            ranked.append((0.0, cand, 0.0))
            continue
        lb = space.lower_bound(cand)
        if not space.bound_feasible(cand, lb):
            beyond += 1
            if beyond <= TRACE_LIMIT:
                beyond_limits.append((cand, lb))
            continue
        ranked.append((space.objective_bound(cand, lb), cand, lb))
    ranked.sort()
    best: Evaluation | None = None
    complete = True
    bound = None
    unsimulated = 0  # ranked[-unsimulated:] were ruled out by the objective bound
    for k, (obj_bound, cand, _) in enumerate(ranked):
        if prune and best is not None and obj_bound >= best.objective_value:
            unsimulated = len(ranked) - k
            break
        if deadline is not None and time.perf_counter() > deadline:
            complete = False
            bound = obj_bound
            break
        ev = space.evaluate(cand)
        if ev.feasible and better(ev, best):
            best = ev
            if any_feasible:
                complete = False
                break
    trace = search_trace(space)
    trace.add(beyond_limits, beyond)
    if unsimulated:
        trace.add(((cand, lb) for _, cand, lb in islice(ranked, len(ranked) - unsimulated, None)), unsimulated)
    return SearchResult(
        method="exhaustive", best=best, bound=bound, complete=complete,
        simulated=space.simulated - simulated0, wall_s=time.perf_counter() - start,
        details={"candidates": total, "pruned": prune},
    )
