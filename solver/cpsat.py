"""The ``ilp`` method: CP-SAT (OR-Tools) over machine counts and batches with
the real objective, verified by the simulator (Srifty 4.4, improved).

Srifty lowers the search to an ILP only through a proxy (fix an anchor batch,
balance latencies, minimize the number of machines; `anchor` in this module
keeps that method for comparison). Here CP-SAT minimizes the real cost or time.

Data: see `thrifty.solver.formulation` (``F``, ``Bw``, ``S``, ``X_t``, ``g_i``,
``P_i``, ``q_i``, ``B_i``), global batch ``B``, iterations ``N``, launch ``L``,
billing minimum ``m``, limits ``T_lim`` and ``$_lim``.

Variables::

    x[i,b] in 0..q_i        machines of choice i running batch b
    u[i,b] in {0,1}         x[i,b] >= 1
    W = sum g_i x[i,b]      workers;   k: the world-size grid cell of W
    T                       iteration time lower bound (us)

Constraints::

    (1) sum_b u[i,b] <= 1                       one batch per choice (Srifty 4.4)
    (2) sum b x[i,b] = B                        the global batch
    (3) f[i,b] >= F[i,b][c], w[i,b] >= Bw[i,b][c]  if x[i,b] >= c,  c in K(q_i)
    (4) grid[k] <= W < grid[k+1];  present_t -> E >= X_t[k];
        present_t and (sum x >= 2) -> E >= Xm_t[k]
    (5) T >= max f + max w + max S u;  T >= max f + E + max S u;
        T >= max f + rho max w + phi E + max S u   (tail bounds, `tail_fractions`)
    (6) L + N T <= T_lim                        (if a time limit)
    (7) R = sum P_i x[i,b];  D >= L + N T, D >= m;  C = R * D <= $_lim   (if a budget)

Objective: minimize ``C`` (min_cost) or ``L + N T`` (min_time).

(3) reads the tables (non-decreasing in the count: the slowest of more
devices) only at the counts ``K(q)`` (`staircase`: 1..8, then 25% apart), so
between two of them the bound is that of the smaller count: still a lower
bound, with 23 order literals per variable at quota 256 instead of the 257
values an element constraint makes CP-SAT encode (whose presolve alone
dominated the solve time on the 20-choice, quota-256 instance of
`benchmarks/solver_speed.py`). The gap this adds is the growth of the
expected maximum between grid counts, a fraction of one standard deviation
of the compute latency; the simulate-and-cut loop closes it.

Verification: the optimum of this model is a lower bound on the true optimum
over the candidates not yet excluded. Each answer is simulated; its candidate
is excluded with a no-good cut; the loop ends when the model's optimum is no
better than the best simulated feasible plan (proof of optimality, gap 0), when
the model becomes infeasible (every remaining candidate is proven worse or
infeasible: if none was feasible the problem is infeasible), or at the time
limit (the reported gap is then relative to the last bound).
"""

from __future__ import annotations

import math
import time

from thrifty.core.errors import SolverError
from thrifty.core.optional import require
from thrifty.solver.formulation import PRICE_SCALE, US, Coefficients, coefficients
from thrifty.solver.search import SearchResult, better
from thrifty.solver.training import Candidate, Evaluation, TrainingSpace

__all__ = ["search_cpsat", "build_model"]


class _Model:
    def __init__(self, space: TrainingSpace, co: Coefficients):
        from ortools.sat.python import cp_model

        self.cp = cp_model
        self.space, self.co = space, co
        p = space.problem
        m = self.model = cp_model.CpModel()
        self.x, self.u = {}, {}
        fs, ws, steps = [], [], []
        for key in co.pairs:
            i, b = key
            quota = len(co.forward[key]) - 1
            x = m.new_int_var(0, quota, f"x_{i}_{b}")
            u = m.new_bool_var(f"u_{i}_{b}")
            m.add(x >= 1).only_enforce_if(u)
            m.add(x == 0).only_enforce_if(u.Not())
            f = m.new_int_var(0, max(co.forward[key]), f"f_{i}_{b}")
            w = m.new_int_var(0, max(co.backward[key]), f"w_{i}_{b}")
            for c in staircase(quota):  # (3)
                at_least = u if c == 1 else m.new_bool_var(f"x_{i}_{b}_ge_{c}")
                if c > 1:
                    m.add(x >= c).only_enforce_if(at_least)
                    m.add(x < c).only_enforce_if(at_least.Not())
                m.add(f >= co.forward[key][c]).only_enforce_if(at_least)
                m.add(w >= co.backward[key][c]).only_enforce_if(at_least)
            self.x[key], self.u[key] = x, u
            fs.append(f)
            ws.append(w)
            steps.append((co.step[key], u))
        for i in {i for i, _ in co.pairs}:  # (1)
            m.add(sum(self.u[k] for k in co.pairs if k[0] == i) <= 1)
        m.add(sum(b * self.x[(i, b)] for i, b in co.pairs) == p.global_batch)  # (2)
        t_max = (max((max(t) for t in co.forward.values()), default=0)
                 + max((max(t) for t in co.backward.values()), default=0)
                 + max((max(t) for t in (*co.exchange.values(), *co.exchange_multi.values())), default=0)
                 + max(co.step.values(), default=0))
        fmax = m.new_int_var(0, t_max, "fmax")
        wmax = m.new_int_var(0, t_max, "wmax")
        smax = m.new_int_var(0, t_max, "smax")
        m.add_max_equality(fmax, fs)
        m.add_max_equality(wmax, ws)
        for s, u in steps:
            m.add(smax >= s).only_enforce_if(u)
        # (4) the exchange bound of the present types at the world size's grid cell
        world = m.new_int_var(0, co.max_world, "W")
        m.add(world == sum(co.gpus[i] * self.x[(i, b)] for i, b in co.pairs))
        grid = co.world_grid
        cell = m.new_int_var(0, len(grid) - 1, "k")
        lo = m.new_int_var(0, grid[-1], "grid_k")
        hi = m.new_int_var(1, grid[-1] + 1, "grid_k1")
        m.add_element(cell, grid, lo)
        m.add_element(cell, grid[1:] + [grid[-1] + 1], hi)
        m.add(lo <= world)
        m.add(world < hi)
        exch = m.new_int_var(0, t_max, "E")
        multi = m.new_bool_var("two_or_more_machines")
        machines = sum(self.x.values())
        m.add(machines >= 2).only_enforce_if(multi)
        m.add(machines <= 1).only_enforce_if(multi.Not())
        present_of = {}
        for name, indices in co.types.items():
            us = [self.u[k] for k in co.pairs if k[0] in indices]
            if not us:
                continue
            present = present_of[name] = m.new_bool_var(f"present_{name}")
            m.add_bool_or(us).only_enforce_if(present)
            for u in us:
                m.add_implication(u, present)
            for label, table, when in (("X", co.exchange[name], [present]),
                                       ("Xm", co.exchange_multi[name], [present, multi])):
                xt = m.new_int_var(0, max(table), f"{label}_{name}")
                m.add_element(cell, table, xt)
                m.add(exch >= xt).only_enforce_if(when)
        # (5)
        t = self.t = m.new_int_var(0, t_max, "T")
        m.add(t >= fmax + wmax + smax)
        m.add(t >= fmax + exch + smax)
        for rho, phi in co.tail:  # the exchange's tail after the gradients become ready
            m.add(1000 * t >= 1000 * fmax + rho * wmax + phi * exch + 1000 * smax)
        for name in co.shared_core & present_of.keys():  # communication after the backward pass
            m.add(t >= fmax + wmax + exch + smax).only_enforce_if(present_of[name])
        launch = int(p.overheads.launch_s * US)
        total = self.total = m.new_int_var(0, launch + p.iterations * t_max, "total")
        m.add(total == launch + p.iterations * t)
        if p.limits.time_s is not None:  # (6)
            m.add(total <= int(math.floor(p.limits.time_s * US)))
        need_cost = p.objective == "min_cost" or p.limits.cost_usd is not None
        if need_cost:  # (7) cost in PRICE_SCALE * ms units: rate * billed_ms
            rate_max = sum(co.price[i] * (len(co.forward[(i, b)]) - 1) for i, b in co.pairs)
            rate = m.new_int_var(0, max(rate_max, 0), "R")
            m.add(rate == sum(co.price[i] * self.x[(i, b)] for i, b in co.pairs))
            billed_max = (launch + p.iterations * t_max) // 1000 + int(p.overheads.min_billed_s * 1000) + 1
            billed = m.new_int_var(0, billed_max, "D_ms")
            m.add(billed * 1000 + 999 >= total)
            m.add(billed >= int(p.overheads.min_billed_s * 1000))
            cost = self.cost = m.new_int_var(0, max(rate_max, 0) * billed_max, "C")
            m.add_multiplication_equality(cost, [rate, billed])
            self.cost_scale = PRICE_SCALE * 1000 * 3600.0  # C / cost_scale = USD
            if p.limits.cost_usd is not None:
                m.add(cost <= int(math.floor(p.limits.cost_usd * self.cost_scale)))
        if p.objective == "min_cost":
            self.objective = self.cost
            self.objective_scale = self.cost_scale
        else:
            self.objective = total
            self.objective_scale = US
        m.minimize(self.objective)

    def require_better(self, value: float) -> None:
        """Incumbent cut: only candidates whose bound is below `value` (the
        best simulated objective) are of interest from now on."""
        self.model.add(self.objective <= math.ceil(value * self.objective_scale) - 1)

    def exclude(self, candidate: Candidate) -> None:
        """No-good cut: at least one count differs from `candidate`'s."""
        m = self.model
        used = {(i, b): count for i, count, b in candidate}
        literals = []
        for key in self.co.pairs:
            if key in used:
                eq = m.new_bool_var("")
                m.add(self.x[key] == used[key]).only_enforce_if(eq)
                m.add(self.x[key] != used[key]).only_enforce_if(eq.Not())
                literals.append(eq.Not())
            else:
                literals.append(self.u[key])
        m.add_bool_or(literals)

    def hint(self, candidate: Candidate) -> None:
        self.model.clear_hints()
        used = {(i, b): count for i, count, b in candidate}
        for key, x in self.x.items():
            self.model.add_hint(x, used.get(key, 0))

    def candidate(self, solver) -> Candidate:
        out = []
        for (i, b), x in self.x.items():
            count = solver.value(x)
            if count:
                out.append((i, count, b))
        return tuple(sorted(out))


def staircase(quota: int, exact_up_to: int = 8, growth: float = 1.25) -> list[int]:
    """The counts at which the compute tables are read: every count up to
    `exact_up_to`, then a geometric grid up to `quota` (always included)."""
    counts = list(range(1, min(quota, exact_up_to) + 1))
    while counts and counts[-1] < quota:
        counts.append(min(quota, max(counts[-1] + 1, math.ceil(counts[-1] * growth))))
    return counts


def build_model(space: TrainingSpace) -> _Model:
    return _Model(space, coefficients(space))


def search_cpsat(space: TrainingSpace, deadline: float | None = None, workers: int = 2,
                 work: float | None = None) -> SearchResult:
    """The best plan of `space` by CP-SAT, round after round (each round's
    candidate simulated, then excluded). `deadline`: a wall-clock end
    (``time.perf_counter()``); `work`: a budget in CP-SAT's deterministic
    time over all rounds (its count of work done, in about seconds on a
    reference machine), which a busy host does not shorten, for answers that
    must not depend on the load. Past either, the best found so far, marked
    incomplete."""
    start = time.perf_counter()
    used = 0.0
    simulated0 = space.simulated
    cp_model = require("ortools.sat.python.cp_model", None, package="ortools")  # a dependency of every install
    model = build_model(space)
    best: Evaluation | None = None
    bound: float | None = None
    complete = False
    rounds = 0
    while True:
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = workers
        if deadline is not None:
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            solver.parameters.max_time_in_seconds = left
        if work is not None:
            if work - used <= 0:
                break
            solver.parameters.max_deterministic_time = work - used
        status = solver.solve(model.model)
        used += solver.deterministic_time
        rounds += 1
        if status == cp_model.INFEASIBLE:  # no candidate left can beat the best one
            complete = True
            if best is not None:
                bound = best.objective_value
            break
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            if status == cp_model.MODEL_INVALID:
                raise SolverError(f"CP-SAT rejected the model: {model.model.validate()}")
            break  # out of time
        round_bound = solver.best_objective_bound / model.objective_scale
        bound = round_bound if bound is None else max(bound, round_bound)
        if best is not None and round_bound >= best.objective_value * (1 - 1e-9):
            complete = True
            break
        cand = model.candidate(solver)
        ev = space.evaluate(cand)
        if ev.feasible and better(ev, best):
            best = ev
            model.hint(cand)
            model.require_better(ev.objective_value)
        model.exclude(cand)
    return SearchResult(
        method="ilp", best=best, bound=bound, complete=complete, simulated=space.simulated - simulated0,
        wall_s=time.perf_counter() - start, details={"rounds": rounds, "variables": len(model.x)},
    )
