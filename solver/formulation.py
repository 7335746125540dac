"""Integer coefficients shared by the CP-SAT and SMT formulations.

Notation (Srifty 4.4, extended): choices ``i`` (instance type and market) with
quota ``q_i``, ``g_i`` GPUs per machine, price ``P_i``; allowed batches
``b in B_i``; ``N`` iterations; launch overhead ``L``; billing minimum ``m``.

Coefficients, all lower bounds of what the simulator will compute, rounded
down to integers (microseconds, milli-dollars per hour):

- ``F[i,b][c]``, ``Bw[i,b][c]``: the simulator's sampled mean of the slowest of
  ``c * g_i`` devices' forward / backward latency at per-device batch
  ``ceil(b / g_i)`` (exact: ``mu + sd * e(c g_i)``; ``F[i,b][0] = 0``);
- ``S[i,b]``: the per-iteration step constant;
- ``X_t(W)``: a lower bound on the exchange time with ``W`` workers when type
  ``t`` is present: every transfer's bus bytes pass through at most the cap
  ``b_cap`` (Srifty 4.3's aggregate never exceeds it), so
  ``t_pe >= 2 S (W - 1) / (W * max_cap_t)`` with ``S`` the total gradient
  bytes and ``max_cap_t`` the largest cap of type ``t`` over the world sizes
  and machine counts the problem allows. It is tabulated on a grid of world
  sizes and, since it grows with ``W``, read at the grid point at or below
  ``W``. ``Xm_t(W)`` is the same bound over two machines or more (the
  network's cap, not one machine's interconnect), used when the plan has
  at least two machines.

Then ``t_iter >= max F + max(max Bw, max_t X_t(W)) + max S``, which the
formulations minimize through, and the simulator verifies. The CP-SAT model
adds the tail bounds of `tail_fractions` (the exchange cannot start before
the gradients are ready) and, on shared-core devices (a CPU worker, where
communication waits for the backward pass), ``F + Bw + E + S``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from thrifty.solver.training import TrainingSpace

__all__ = ["Coefficients", "coefficients", "world_grid", "exchange_bound_table", "US", "PRICE_SCALE"]

US = 1e6  # integer time unit: microseconds
PRICE_SCALE = 1000  # integer price unit: milli-dollars per hour


@dataclass(frozen=True)
class Coefficients:
    pairs: tuple[tuple[int, int], ...]  # (choice index, batch) with a variable each
    forward: dict[tuple[int, int], list[int]]  # per pair: table over counts 0..quota
    backward: dict[tuple[int, int], list[int]]
    step: dict[tuple[int, int], int]
    gpus: dict[int, int]  # per choice
    price: dict[int, int]  # per choice, PRICE_SCALE units, rounded down
    types: dict[str, tuple[int, ...]]  # instance type name -> choice indices
    world_grid: list[int]  # ascending, starts at 1
    exchange: dict[str, list[int]]  # per type: lower bound at each grid point
    exchange_multi: dict[str, list[int]]  # the same for plans of two machines or more
    tail: tuple[tuple[int, int], ...]  # (rho, phi) in thousandths: see `tail_fractions`
    shared_core: frozenset[str]  # types whose communication waits for the backward pass
    max_world: int


def world_grid(max_world: int) -> list[int]:
    """World sizes 1..64, then steps of about 8% up to `max_world`."""
    grid = list(range(1, min(max_world, 64) + 1))
    w = 64
    while w < max_world:
        w = min(max_world, max(w + 1, int(w * 1.08)))
        grid.append(w)
    return grid


def coefficients(space: TrainingSpace) -> Coefficients:
    pairs, fw, bw, step = [], {}, {}, {}
    gpus = {c.index: c.itype.gpus for c in space.choices}
    price = {c.index: int(math.floor(c.price_per_hour * PRICE_SCALE)) for c in space.choices}
    for c in space.choices:
        for b in c.batches:  # allowed batches never exceed the global batch
            key = (c.index, b)
            pairs.append(key)
            f_tab, b_tab = [0], [0]
            quota = min(c.quota, space.problem.global_batch // b)
            for count in range(1, quota + 1):
                f, w, s = space.group_compute_bound(c, count, b)
                f_tab.append(int(f * US))
                b_tab.append(int(w * US))
            fw[key], bw[key] = f_tab, b_tab
            step[key] = int(s * US)
    types: dict[str, list[int]] = {}
    for c in space.choices:
        types.setdefault(c.itype.name, []).append(c.index)
    max_world = max(1, sum(c.quota * c.itype.gpus for c in space.choices))
    grid = world_grid(max_world)
    exchange = {name: exchange_bound_table(space, indices[0], grid, max_world) for name, indices in types.items()}
    multi = {name: exchange_bound_table(space, indices[0], grid, max_world, multi=True)
             for name, indices in types.items()}
    shared = frozenset(c.itype.name for c in space.choices
                       if c.itype.device in space.simulator.shared_core_devices)
    return Coefficients(tuple(pairs), fw, bw, step, gpus, price,
                        {k: tuple(v) for k, v in types.items()}, grid, exchange, multi,
                        tail_fractions(space), shared, max_world)


def tail_fractions(space: TrainingSpace, points: int = 8) -> tuple[tuple[int, int], ...]:
    """Pairs ``(rho, phi)`` (thousandths, rounded down) such that at least a
    fraction ``phi`` of the gradient bytes becomes ready no earlier than
    ``rho`` of the backward pass, whichever type's layers the simulator uses.

    A transfer cannot start before its bytes are ready, and all transfers
    share at most the cap, so the exchange ends no earlier than
    ``rho * Bw + phi * X``: hence ``T >= F + rho Bw + phi E + S`` for each
    pair, which bounds the communication tail after the backward pass that
    ``T >= F + Bw + S`` leaves out. Up to `points` thresholds are kept, the
    distinct ready fractions spread evenly.
    """
    sim = space.simulator
    per_type = []
    for itype in {c.itype.name: c.itype for c in space.choices}.values():
        sizes, ready = sim.transfers(sim.compute_model(itype))
        total = float(np.sum(sizes))
        if total > 0:
            per_type.append((np.asarray(sizes, float) / total, np.asarray(ready, float)))
    if not per_type:
        return ()
    rhos = np.unique(np.concatenate([r for _, r in per_type]))
    if len(rhos) > points:
        rhos = rhos[np.linspace(0, len(rhos) - 1, points).round().astype(int)]
    out = []
    for rho in rhos:
        phi = min(float(frac[ready >= rho].sum()) for frac, ready in per_type)
        out.append((int(math.floor(rho * 1000)), int(math.floor(phi * 1000 - 1e-9))))
    return tuple(sorted(set((r, max(f, 0)) for r, f in out if f > 0)))


def exchange_bound_table(space: TrainingSpace, index: int, grid: list[int], max_world: int,
                         multi: bool = False) -> list[int]:
    """``X_t`` (microseconds) at each grid world size for the type of choice `index`.

    With `multi`, the bound holds only for plans of two machines or more, so
    the caps of one machine alone (its NVLink or PCIe, often 100x the
    network) are left out and the bound is far tighter.
    """
    choice = space.choices[index]
    sim = space.simulator
    cm = sim.compute_model(choice.itype)
    total_bytes = float(np.sum(sim.transfers(cm)[0]))
    g = choice.itype.gpus
    probe_worlds = sorted({w for w in grid if w >= 2} | {max_world}) if max_world >= 2 else []
    caps = []
    for w in probe_worlds[:: max(1, len(probe_worlds) // 24)] + probe_worlds[-1:]:
        machine_counts = {2, max(2, -(-w // g)), w} if multi else {1 if w <= g else 2, max(1, -(-w // g)), w}
        for machines in machine_counts:
            caps.append(sim.bandwidth.bandwidth_cap(choice.itype, w, machines))
    max_cap = max(caps) if caps else math.inf
    table = []
    for w in grid:
        if w < 2 or not math.isfinite(max_cap):
            table.append(0)
        else:
            table.append(int(2.0 * total_bytes * (w - 1) / (w * max_cap) * US))
    return table
