"""Baselines of Srifty 5.1 with the solver's interface, for benchmarks.

- `anchor`: Srifty 4.4's approximation. For each allowed batch ``B_anchor`` of
  the slowest type (largest compute latency at a common batch), the target
  latency is that type's compute latency at ``B_anchor``; every other type
  gets the largest allowed batch whose latency does not exceed it (binary
  search); an ILP then minimizes the number of machines
  ``sum_i counts[i]`` subject to the global batch and the quotas; each
  anchor's answer is simulated and the best feasible one kept.
- `cgf`: full batch, cheapest GPU first: machines of the cheapest choice (per
  GPU-hour) at their largest batch, then the next cheapest, until the global
  batch is placed (a smaller allowed batch fills the rest).
- `fgf`: batch 64 per GPU, fastest GPU first (per-GPU seconds per sample at
  that batch, or at the largest that fits in memory); if the GPUs run out, all GPUs
  are packed with the largest batch that fits.
- `best_homogeneous`: the exact optimum among plans that use one choice only.
- `apm_optimized`: the exact optimum under APM's predictions (linear compute,
  alpha-beta allreduce, no variance), evaluated afterwards with thrifty's
  simulator.

Each returns a `SearchResult` whose evaluation comes from ``space`` (thrifty's
simulator), so every plan is judged by the same yardstick; heuristics ignore
the limits, so their plans may be infeasible (``best.feasible``).
"""

from __future__ import annotations

import time
from typing import cast

from thrifty.perfmodels.simulator import IterationSimulator
from thrifty.solver.search import SearchResult, search_exhaustive
from thrifty.solver.training import Candidate, Choice, TrainingSpace

__all__ = ["anchor", "cgf", "fgf", "best_homogeneous", "apm_optimized", "BASELINES"]


def _result(method: str, space: TrainingSpace, candidate: Candidate | None, start: float,
            simulated0: int, **details) -> SearchResult:
    ev = space.evaluate(candidate) if candidate else None
    return SearchResult(method, ev, None, False, space.simulated - simulated0, time.perf_counter() - start,
                        details)


def _compute_latency(space: TrainingSpace, choice: Choice, batch: int) -> float:
    mu_f, _, mu_b, _, _ = space.simulator.device_stats(choice.itype, -(-batch // choice.itype.gpus))
    return mu_f + mu_b


def _min_machines(space: TrainingSpace, batches: dict[int, int]) -> Candidate | None:
    """ILP: minimize sum counts s.t. sum batch_i * count_i = B, count_i <= quota_i (CP-SAT)."""
    from ortools.sat.python import cp_model

    m = cp_model.CpModel()
    counts = {i: m.new_int_var(0, space.choices[i].quota, f"c{i}") for i in batches}
    m.add(sum(b * counts[i] for i, b in batches.items()) == space.problem.global_batch)
    m.minimize(sum(counts.values()))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    if solver.solve(m) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return tuple(sorted((i, solver.value(c), batches[i]) for i, c in counts.items() if solver.value(c)))


def anchor(space: TrainingSpace) -> SearchResult:
    start, sim0 = time.perf_counter(), space.simulated
    usable = [c for c in space.choices if c.batches]
    if not usable:
        return _result("anchor", space, None, start, sim0)
    common = min(c.batches[0] for c in usable)
    slowest = max(usable, key=lambda c: _compute_latency(space, c, common) / c.itype.gpus)
    best = None
    tried = 0
    for b_anchor in slowest.batches:
        target = _compute_latency(space, slowest, b_anchor)
        batches = {}
        for c in usable:
            fitting = [b for b in c.batches if _compute_latency(space, c, b) <= target * (1 + 1e-9)]
            if fitting:
                batches[c.index] = fitting[-1]
        cand = _min_machines(space, batches)
        if cand is None:
            continue
        tried += 1
        ev = space.evaluate(cand)
        key = (not ev.feasible, ev.objective_value)
        if best is None or key < (not best.feasible, best.objective_value):
            best = ev
    return _result("anchor", space, best.candidate if best else None, start, sim0, anchors=tried)


def _greedy_fill(space: TrainingSpace, order: list[Choice], batch_of) -> Candidate | None:
    remaining = space.problem.global_batch
    used: dict[int, tuple[int, int]] = {}
    for c in order:
        b = batch_of(c)
        if b is None or remaining <= 0:
            continue
        count = min(c.quota, remaining // b)
        if count:
            used[c.index] = (count, b)
            remaining -= count * b
    # fill what is left with a smaller allowed batch on a choice with quota to spare
    for c in order:
        if remaining <= 0:
            break
        if c.index in used:
            continue
        smaller = [b for b in c.batches if b <= remaining]
        if smaller:
            b = smaller[-1]
            count = min(c.quota, remaining // b)
            used[c.index] = (count, b)
            remaining -= count * b
    if remaining != 0:
        return None
    return tuple(sorted((i, count, b) for i, (count, b) in used.items()))


def cgf(space: TrainingSpace) -> SearchResult:
    start, sim0 = time.perf_counter(), space.simulated
    order = sorted((c for c in space.choices if c.batches), key=lambda c: c.price_per_hour / c.itype.gpus)
    cand = _greedy_fill(space, order, lambda c: c.batches[-1])
    return _result("cgf", space, cand, start, sim0)


def fgf(space: TrainingSpace, device_batch: int = 64) -> SearchResult:
    start, sim0 = time.perf_counter(), space.simulated
    usable = [c for c in space.choices if c.batches]

    def gpu_seconds_per_sample(c: Choice) -> float:
        # per-GPU speed at the fixed device batch, or at the largest batch that fits when it does not
        b = min(device_batch * c.itype.gpus, c.batches[-1])
        return _compute_latency(space, c, b) * c.itype.gpus / b

    order = sorted(usable, key=gpu_seconds_per_sample)

    def fixed(c: Choice) -> int | None:
        b = device_batch * c.itype.gpus
        return b if b in c.batches else None

    cand = _greedy_fill(space, order, fixed)
    if cand is None:  # not enough GPUs at batch 64: pack every GPU with the largest batch that fits
        cand = _greedy_fill(space, order, lambda c: c.batches[-1])
    return _result("fgf", space, cand, start, sim0)


def best_homogeneous(space: TrainingSpace) -> SearchResult:
    start, sim0 = time.perf_counter(), space.simulated
    best = None
    for c in space.choices:
        sub = space.derive(instances=[c.spec])
        res = search_exhaustive(sub)
        if res.best is not None:
            cand = tuple((c.index, count, b) for _, count, b in res.best.candidate)
            ev = space.evaluate(cand)
            if best is None or ev.objective_value < best.objective_value:
                best = ev
    return _result("homogeneous", space, best.candidate if best else None, start, sim0)


def apm_optimized(space: TrainingSpace) -> SearchResult:
    from thrifty.perfmodels.apm import ApmSimulator

    start, sim0 = time.perf_counter(), space.simulated
    apm = ApmSimulator(space.model, library=space.library, bandwidth=space.simulator.bandwidth)
    # APM predicts iterations with IterationSimulator's simulate(), its whole interface: the
    # search without pruning asks for nothing else (no lower bounds, no device statistics)
    apm_space = TrainingSpace(space.problem, library=space.library, catalog=space.catalog,
                              simulator=cast(IterationSimulator, apm))
    res = search_exhaustive(apm_space, prune=False)
    cand = res.best.candidate if res.best else None
    return _result("apm", space, cand, start, sim0, apm_predicted=res.best.objective_value if res.best else None)


BASELINES = {"anchor": anchor, "cgf": cgf, "fgf": fgf, "homogeneous": best_homogeneous, "apm": apm_optimized}
