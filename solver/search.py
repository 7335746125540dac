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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from thrifty.solver.training import Candidate, Evaluation, TrainingSpace

__all__ = ["SearchResult", "better", "search_exhaustive"]


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
                      any_feasible: bool = False) -> SearchResult:
    """Exact optimum of the pruned space (see module docstring). With
    `any_feasible`, stop at the first feasible plan: a feasibility test, whose
    `best` is some feasible plan (not the optimum) or None (proven none)."""
    start = time.perf_counter()
    simulated0 = space.simulated
    ranked: list[tuple[float, Candidate, float]] = []
    total = 0
    for cand in space.candidates(within_limits=prune):
        total += 1
        if not prune:
            ranked.append((0.0, cand, 0.0))
            continue
        lb = space.lower_bound(cand)
        if not space.bound_feasible(cand, lb):
            continue
        ranked.append((space.objective_bound(cand, lb), cand, lb))
    ranked.sort()
    best: Evaluation | None = None
    complete = True
    bound = None
    for k, (obj_bound, cand, _) in enumerate(ranked):
        if prune and best is not None and obj_bound >= best.objective_value:
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
    return SearchResult(
        method="exhaustive", best=best, bound=bound, complete=complete,
        simulated=space.simulated - simulated0, wall_s=time.perf_counter() - start,
        details={"candidates": total, "pruned": prune},
    )
