"""Placement controller (RubberBand 4.4, Algorithm "PlacementController").

A pure function from (trial allocations in GPUs, the previous placement, the
nodes and their GPUs, resources reserved but not yet acquired) to a new
placement mapping each trial to ``{node: GPUs}``:

1. trials whose allocation did not change keep their place (if their nodes are
   still there); trials that left or changed give their GPUs back;
2. the trials to place go largest first. A trial of at most one node's GPUs
   sits on one node: the best fit (least free space that holds it). A larger
   trial takes whole free nodes, and its remainder goes to the best fit;
3. when nothing fits, smaller trials are displaced from the node where the
   least of them must move (nodes tried from most free space), and go back to
   the queue;
4. reserved GPUs are locked: never given to any trial.

A trial that cannot be placed even after displacement is reported in
``unplaced`` and holds no GPUs. Deviation: RubberBand places worker by worker
with `canFit(t.unit)`; we place a trial's GPUs on as few nodes as possible at
once, which is the locality the paper's controller aims for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from thrifty.core.errors import ProblemError

__all__ = ["Placement", "place"]


@dataclass(frozen=True)
class Placement:
    assignment: dict[str, dict[str, int]]          # trial -> {node: GPUs}
    unplaced: tuple[str, ...] = ()
    moved: tuple[str, ...] = field(default=())     # trials placed anew (changed, new or displaced)

    def used(self, node: str) -> int:
        return sum(p.get(node, 0) for p in self.assignment.values())


def place(allocations: Mapping[str, int], previous: Mapping[str, Mapping[str, int]] | None,
          nodes: Mapping[str, int], reserved: Mapping[str, int] | None = None) -> Placement:
    """A new placement of `allocations` (trial -> GPUs) on `nodes` (node -> GPUs)."""
    reserved = dict(reserved or {})
    for t, a in allocations.items():
        if a < 1:
            raise ProblemError(f"is {a}, but a trial needs at least 1 GPU", path=f"allocations.{t}")
    for n, r in reserved.items():
        if n not in nodes or not 0 <= r <= nodes[n]:
            raise ProblemError(f"reserves {r} GPUs on a node of {nodes.get(n)}", path=f"reserved.{n}")
    free = {n: c - reserved.get(n, 0) for n, c in nodes.items()}
    assignment: dict[str, dict[str, int]] = {}
    # 1. keep the satisfied trials
    for t, where in (previous or {}).items():
        if (t in allocations and sum(where.values()) == allocations[t] and all(n in nodes for n in where)
                and all(free[n] >= g for n, g in where.items())):
            assignment[t] = dict(where)
            for n, g in where.items():
                free[n] -= g
    queue = sorted((t for t in allocations if t not in assignment), key=lambda t: (-allocations[t], t))
    moved: list[str] = []
    unplaced: list[str] = []
    attempts = 0
    while queue:
        attempts += 1
        if attempts > 10 * (len(allocations) + 1) ** 2:  # displacement chains are finite; be safe
            unplaced.extend(queue)
            break
        t = queue.pop(0)
        want = allocations[t]
        got = _fit(want, free, nodes)
        if got is None:
            displaced = _make_space(t, want, assignment, allocations, free, nodes, reserved)
            if displaced is not None:
                for d in displaced:
                    for n, g in assignment.pop(d).items():
                        free[n] += g
                queue.extend(displaced)
                queue.sort(key=lambda x: (-allocations[x], x))
                got = _fit(want, free, nodes)
        if got is None:
            unplaced.append(t)
            continue
        assignment[t] = got
        for n, g in got.items():
            free[n] -= g
        moved.append(t)
    return Placement(assignment, tuple(sorted(set(unplaced) - set(assignment))),
                     tuple(sorted(set(moved) & set(assignment))))


def _fit(want: int, free: Mapping[str, int], nodes: Mapping[str, int]) -> dict[str, int] | None:
    """GPUs for one trial: best fit on one node, or whole free nodes plus a best-fit rest."""
    fits = [n for n in free if free[n] >= want]
    if fits:
        best = min(fits, key=lambda n: (free[n], n))
        return {best: want}
    got: dict[str, int] = {}
    left = want
    for n in sorted((n for n in free if free[n] == nodes[n] and free[n] > 0), key=lambda n: (-free[n], n)):
        if left >= free[n]:
            got[n] = free[n]
            left -= free[n]
        if left == 0:
            return got
    if left and got:
        rest = [n for n in free if n not in got and free[n] >= left]
        if rest:
            got[min(rest, key=lambda n: (free[n], n))] = left
            return got
    return None


def _make_space(trial: str, want: int, assignment: Mapping[str, Mapping[str, int]],
                allocations: Mapping[str, int], free: Mapping[str, int], nodes: Mapping[str, int],
                reserved: Mapping[str, int]) -> list[str] | None:
    """Smaller trials to displace so that `trial` fits: on one node when it fits a
    node, else enough whole nodes; the fewest GPUs moved."""
    smaller = {t for t in assignment if allocations[t] < want}
    per_node: dict[str, list[str]] = {n: [] for n in nodes}
    for t in smaller:
        for n in assignment[t]:
            per_node[n].append(t)
    best: tuple[int, list[str]] | None = None
    capacity = {n: nodes[n] - reserved.get(n, 0) for n in nodes}
    if any(want <= capacity[n] for n in nodes):
        for n in sorted(nodes, key=lambda n: (-free[n], n)):
            room, chosen = free[n], []
            for t in sorted(per_node[n], key=lambda t: (-assignment[t][n], t)):
                if room >= want:
                    break
                chosen.append(t)
                room += assignment[t][n]
            if room >= want:
                # a displaced trial spanning nodes frees GPUs elsewhere too; count what moves
                cost = sum(allocations[t] for t in chosen)
                if best is None or cost < best[0]:
                    best = (cost, chosen)
        return best[1] if best else None
    # a multi-node trial: empty whole nodes, those with the least to move first
    order = sorted(nodes, key=lambda n: (sum(assignment[t][n] for t in per_node[n]), n))
    chosen = []
    total = 0
    for n in order:
        others = [t for t in assignment if n in assignment[t] and t not in smaller]
        if others or reserved.get(n, 0):
            continue
        chosen.extend(t for t in per_node[n] if t not in chosen)
        total += nodes[n]
        if total >= want:
            return chosen
    return None
