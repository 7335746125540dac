"""The ``local`` provider: machines are worker slots on this host (127.0.0.1).

Provisioning a machine hands out a slot at once (or after `launch_delay_s`,
to stand in for a cloud's boot time); the training launcher then starts the
machine's worker processes on 127.0.0.1 (one per device of its type:
``gpus`` in the catalog, 1 for ``local``). Prices come from a catalog: the
shipped one prices ``local`` at zero, and a problem may name its own catalog
of local pseudo types with demo prices (``datasets/examples/local-demo-catalog.json``),
so that spot markets, costs and budgets can be exercised here.

Capacity and interruptions can be simulated: `capacity` caps how many machines
of an (instance type, market) may run at once (beyond it `provision` raises
`CapacityError`, as EC2 does with ``InsufficientInstanceCapacity``), and
`interrupt` queues a spot notice for `poll_interruptions`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from thrifty.datasets.catalog import Catalog, load_catalog
from thrifty.core.errors import ProblemError, ProviderError
from thrifty.runtime.events import Preemption
from thrifty.runtime.providers.base import CapacityError, Machine, Market, Provider

__all__ = ["LocalProvider", "LOCALHOST"]

LOCALHOST = "127.0.0.1"
MARKETS = ("on_demand", "spot")


class LocalProvider(Provider):
    name = "local"
    catalog: Catalog

    def __init__(self, run_id: str, catalog: Catalog | str | Path | None = None,
                 capacity: Mapping[tuple[str, str], int] | None = None, launch_delay_s: float = 0.0):
        super().__init__(run_id)
        self.catalog = catalog if isinstance(catalog, Catalog) else load_catalog(catalog)
        self.capacity = dict(capacity or {})
        self.launch_delay_s = launch_delay_s
        self._notices: list[Preemption] = []
        self._ids = itertools.count()

    def _check_type(self, instance_type: str, market: str) -> None:
        if market not in MARKETS:
            raise ProblemError(f"market is '{market}', but must be 'on_demand' or 'spot'")
        device = self.catalog.get(instance_type).device
        if device != "cpu":
            cpu_types = ", ".join(sorted(n for n, t in self.catalog.types.items() if t.device == "cpu")) or "none"
            raise ProblemError(f"the local provider runs CPU worker processes, but {instance_type} is a "
                               f"'{device}' machine; local types in {self.catalog.source}: {cpu_types}")
        self.price(instance_type, market)  # a market the catalog does not price is refused here, not mid-run

    def check_plan(self, allocations: Iterable[tuple[str, str, int]]) -> None:
        """What `provision` would refuse as bad input, for every machine of a
        plan at once: a type that is not a CPU type of the catalog, a market it
        does not price. (A simulated `capacity` is a cloud's capacity: it shows
        when machines are asked for, as a `CapacityError` that re-plans.)"""
        lacking = []
        for instance_type, market, _ in allocations:
            try:
                self._check_type(instance_type, market)
            except ProblemError as e:
                lacking.append(e.message)
        if lacking:
            raise ProblemError("; ".join(dict.fromkeys(lacking)), path="cluster")

    def provision(self, instance_type: str, count: int, market: Market = "on_demand",
                  timeout_s: float = 600.0) -> list[Machine]:
        self._check_type(instance_type, market)
        if count < 1:
            raise ProblemError(f"count is {count}, but must be at least 1")
        if self.launch_delay_s > timeout_s:
            raise ProviderError(f"local machines take {self.launch_delay_s:g} s to start, longer than the "
                                f"timeout {timeout_s:g} s")
        price = self.price(instance_type, market)
        with self._lock:
            cap = self.capacity.get((instance_type, market))
            running = sum(1 for m in self._machines.values()
                          if (m.instance_type, m.market) == (instance_type, market) and m.terminated_at is None)
            if cap is not None and running + count > cap:
                raise CapacityError(instance_type, market, f"no capacity for {count} more {instance_type} "
                                    f"({market}): {running} of {cap} run")
        if self.launch_delay_s > 0:
            time.sleep(self.launch_delay_s)
        now = self.now()
        with self._lock:
            made = [Machine(f"local-{self.run_id}-{next(self._ids)}", instance_type, market, LOCALHOST, now, price,
                            tags={"thrifty-run": self.run_id}) for _ in range(count)]
        self._own(made)
        return made

    def price(self, instance_type: str, market: str = "on_demand") -> float:
        return self.catalog.get(instance_type).price(market)

    def interrupt(self, machine_id: str, time_left_s: float | None = 120.0, reason: str = "simulated") -> Preemption:
        """Queue a spot interruption notice for a machine."""
        with self._lock:
            m = self._machines.get(machine_id)
            if m is None:
                raise ProviderError(f"machine {machine_id} does not belong to run {self.run_id}")
            event = Preemption(m.instance_type, m.market, "injector", machine_id, time_left_s, reason)
            self._notices.append(event)
        return event

    def poll_interruptions(self) -> Sequence[Preemption]:
        with self._lock:
            out, self._notices = self._notices, []
        return out
