"""The ``smt`` method: the training formulation in z3 with exact rational
arithmetic, and the unsat core that explains an infeasible problem.

The model is the one of `thrifty.solver.cpsat` (same data and constraints),
with rationals instead of scaled integers: the compute coefficients are the
simulator's exact lower bounds ``mu + sd * e(k)`` as exact binary fractions,
and the cost is the exact product ``R * D / 3600`` (nonlinear, which z3
decides on these bounded domains). Each constraint a user can change is a
tracked assumption: ``limits.time_s``, ``limits.cost_usd`` and
``instances[i].quota`` (the global batch is a hard constraint: it defines the
job).

Search (``search_smt``): z3's ``Optimize`` handles only linear objectives and
the cost objective is a product, so we minimize by tightening: each round asks
for a candidate whose objective bound is strictly below the best simulated
feasible plan, simulates it and excludes it; ``unsat`` then proves the best
plan optimal (or the problem infeasible).

Unsat core (``unsat_core``): counts may range up to what the global batch
allows, the quotas being assumptions; a candidate the simulator finds over the
time limit is excluded only while that limit is assumed (``time_s ->
not candidate``), likewise for the budget. When the assumptions become
unsatisfiable, z3's core, minimized by deletion (a member is dropped when
the rest stays unsatisfiable under the cuts learned so far), names the
limits and quotas that conflict.
"""

from __future__ import annotations

import time
from fractions import Fraction

from thrifty.core.optional import require
from thrifty.solver.formulation import exchange_bound_table, world_grid
from thrifty.solver.search import SearchResult, better
from thrifty.solver.training import Candidate, Evaluation, TrainingSpace

__all__ = ["search_smt", "unsat_core"]


def _z3():
    return require("z3", None, package="z3-solver")  # a dependency of every install


class _SmtModel:
    def __init__(self, space: TrainingSpace, relax_quotas: bool):
        z3 = self.z3 = _z3()
        self.space = space
        p = space.problem
        s = self.solver = z3.Solver()
        self.track: dict[str, object] = {}
        self.x: dict[tuple[int, int], object] = {}

        def tracked(name: str):
            lit = self.track.get(name)
            if lit is None:
                lit = self.track[name] = z3.Bool(name)
            return lit

        fs, ws, steps, world_terms, rate_terms, batch_terms = [], [], [], [], [], []
        present: dict[str, list] = {}
        for c in space.choices:
            used_terms = []
            for b in c.batches:
                top = p.global_batch // b if relax_quotas else min(c.quota, p.global_batch // b)
                if top < 1:
                    continue
                x = z3.Int(f"x_{c.index}_{b}")
                self.x[(c.index, b)] = x
                s.add(x >= 0, x <= top)
                if relax_quotas:
                    s.add(z3.Implies(tracked(f"instances[{c.index}].quota"), x <= c.quota))
                f_terms, w_terms = [], []
                step = 0.0
                for count in range(1, top + 1):
                    f, w, step = space.group_compute_bound(c, count, b)
                    f_terms.append(z3.If(x == count, z3.RealVal(Fraction(f)), 0))
                    w_terms.append(z3.If(x == count, z3.RealVal(Fraction(w)), 0))
                fs.append(z3.Sum(f_terms))
                ws.append(z3.Sum(w_terms))
                steps.append(z3.If(x >= 1, z3.RealVal(Fraction(step)), 0))
                world_terms.append(c.itype.gpus * x)
                rate_terms.append(z3.RealVal(Fraction(c.price_per_hour)) * z3.ToReal(x))
                batch_terms.append(b * x)
                used_terms.append(x >= 1)
                present.setdefault(c.itype.name, []).append(x >= 1)
            if len(used_terms) > 1:  # one batch per choice
                s.add(z3.Sum([z3.If(u, 1, 0) for u in used_terms]) <= 1)
        # the global batch is the problem's definition, not a limit: a hard constraint
        s.add(z3.Sum(batch_terms) == p.global_batch if batch_terms else z3.BoolVal(False))
        fmax, wmax, smax, exch = (z3.Real(n) for n in ("fmax", "wmax", "smax", "E"))
        for f in fs:
            s.add(fmax >= f)
        for w in ws:
            s.add(wmax >= w)
        for st in steps:
            s.add(smax >= st)
        s.add(fmax >= 0, wmax >= 0, smax >= 0, exch >= 0)
        world = z3.Sum(world_terms) if world_terms else z3.IntVal(0)
        grid = world_grid(max(1, sum(
            (p.global_batch // c.batches[0] if relax_quotas else c.quota) * c.itype.gpus
            for c in space.choices if c.batches)))
        for name, lits in present.items():
            index = next(c.index for c in space.choices if c.itype.name == name)
            table = exchange_bound_table(space, index, grid, grid[-1])
            nxt = grid[1:] + [grid[-1] + 1]
            for lo, hi, v in zip(grid, nxt, table):
                if v > 0:
                    s.add(z3.Implies(z3.And(z3.Or(lits), world >= lo, world < hi),
                                     exch >= z3.RealVal(Fraction(v, 10**6))))
        t = self.t = z3.Real("T")
        s.add(t >= fmax + wmax + smax, t >= fmax + exch + smax)
        total = self.total = p.overheads.launch_s + p.iterations * t
        billed = self.billed = z3.Real("D")
        s.add(billed >= total, billed >= p.overheads.min_billed_s)
        rate = z3.Sum(rate_terms) if rate_terms else z3.RealVal(0)
        self.cost = rate * billed / 3600
        if p.limits.time_s is not None:
            s.add(z3.Implies(tracked("limits.time_s"), total <= z3.RealVal(Fraction(p.limits.time_s))))
        if p.limits.cost_usd is not None:
            s.add(z3.Implies(tracked("limits.cost_usd"), self.cost <= z3.RealVal(Fraction(p.limits.cost_usd))))
        self.objective = self.cost if p.objective == "min_cost" else total

    def assumptions(self) -> list:
        return list(self.track.values())

    def candidate(self) -> Candidate:
        model = self.solver.model()
        out = []
        for (i, b), x in self.x.items():
            count = model.eval(x, model_completion=True).as_long()
            if count:
                out.append((i, count, b))
        return tuple(sorted(out))

    def matches(self, candidate: Candidate):
        z3 = self.z3
        used = {(i, b): count for i, count, b in candidate}
        return z3.And([x == used.get(key, 0) for key, x in self.x.items()])

    def check(self, deadline: float | None):
        if deadline is not None:
            left = deadline - time.perf_counter()
            if left <= 0:
                return None
            self.solver.set("timeout", max(1, int(left * 1000)))
        result = self.solver.check(*self.assumptions())
        if result == self.z3.unknown:
            return None
        return result == self.z3.sat


def search_smt(space: TrainingSpace, deadline: float | None = None) -> SearchResult:
    start = time.perf_counter()
    simulated0 = space.simulated
    m = _SmtModel(space, relax_quotas=False)
    z3 = m.z3
    best: Evaluation | None = None
    complete, rounds = False, 0
    while True:
        sat = m.check(deadline)
        rounds += 1
        if sat is None:
            break
        if not sat:
            complete = True
            break
        cand = m.candidate()
        ev = space.evaluate(cand)
        if ev.feasible and better(ev, best):
            best = ev
            m.solver.add(m.objective < z3.RealVal(Fraction(ev.objective_value)))
        m.solver.add(z3.Not(m.matches(cand)))
    return SearchResult(method="smt", best=best, bound=None, complete=complete,
                        simulated=space.simulated - simulated0, wall_s=time.perf_counter() - start,
                        details={"rounds": rounds})


def _minimize_core(m: _SmtModel, core: list[str], deadline: float) -> list[str]:
    """Deletion-based minimization: drop each member whose absence keeps the rest
    unsatisfiable under the cuts learned so far (z3's own minimization is far slower)."""
    kept = list(core)
    for name in core:
        if len(kept) == 1 or time.perf_counter() > deadline:
            break
        trial = [m.track[n] for n in kept if n != name]
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        m.solver.set("timeout", max(1, int(left * 1000)))
        if m.solver.check(*trial) == m.z3.unsat:
            kept.remove(name)
    return kept


def unsat_core(space: TrainingSpace, deadline_s: float = 60.0) -> list[str] | None:
    """The limits and quotas that together admit no plan (empty if a plan exists),
    or None when z3 cannot decide within `deadline_s`."""
    deadline = time.perf_counter() + deadline_s
    m = _SmtModel(space, relax_quotas=True)
    z3 = m.z3
    limits = space.problem.limits
    while True:
        sat = m.check(deadline)
        if sat is None:
            return None  # undecided in time
        if not sat:
            core = {str(lit) for lit in m.solver.unsat_core()}
            return _minimize_core(m, [name for name in m.track if name in core], deadline)
        cand = m.candidate()
        ev = space.evaluate(cand)
        if ev.feasible:
            return []
        excluded = False
        if limits.time_s is not None and ev.total_s > limits.time_s:
            m.solver.add(z3.Implies(m.track["limits.time_s"], z3.Not(m.matches(cand))))
            excluded = True
        if limits.cost_usd is not None and ev.cost_usd > limits.cost_usd:
            m.solver.add(z3.Implies(m.track["limits.cost_usd"], z3.Not(m.matches(cand))))
            excluded = True
        if not excluded:  # within limits but outside quotas: the quota assumptions exclude it
            m.solver.add(z3.Not(m.matches(cand)))
