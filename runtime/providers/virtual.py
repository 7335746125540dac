"""The ``virtual`` provider: machines on a clock, for simulating a plan.

Provisioning takes the cloud's SCALE latency plus the slowest new machine's
INIT latency, drawn as the planner's simulator draws them (RubberBand 4.2), on
whatever clock the caller runs (a virtual clock under simulation, where the
wait is a jump), so the plan executor (`thrifty.runtime.tuning.executors.plan`,
`simulated_backend`) carries a plan out against machines that start and bill
as the planner assumed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from thrifty.core.errors import ProblemError, ProviderError
from thrifty.datasets.catalog import Catalog, load_catalog
from thrifty.runtime.events import Preemption
from thrifty.runtime.providers.base import Machine, Market, Provider

if TYPE_CHECKING:  # for the annotation alone: the tuning package imports this module
    from thrifty.runtime.tuning.clock import Clock

__all__ = ["VirtualProvider"]


class VirtualProvider(Provider):
    """Machines on a `Clock` (virtual under simulation): provisioning takes a
    SCALE latency plus the slowest of the new machines' INIT latencies, each
    drawn from N(mean, sd) (truncated at 0) as the planner's simulator draws
    them; billing starts when SCALE ends (RubberBand 4.2). Prices and GPUs
    come from a catalog. Times (`launched_at`, `terminated_at`, `now()`) are
    clock times."""

    name = "virtual"
    catalog: Catalog

    def __init__(self, run_id: str, clock: Clock, catalog: Catalog | str | None = None, *,
                 scale_latency_s: float = 0.0, scale_latency_sd_s: float = 0.0, init_latency_s: float = 0.0,
                 init_latency_sd_s: float = 0.0, seed: int = 0):
        super().__init__(run_id)
        for name, value in (("scale_latency_s", scale_latency_s), ("scale_latency_sd_s", scale_latency_sd_s),
                            ("init_latency_s", init_latency_s), ("init_latency_sd_s", init_latency_sd_s)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ProblemError(f"`{name}` is {value!r}, but must be >= 0", path=name)
        self.clock = clock
        self.catalog = catalog if isinstance(catalog, Catalog) else load_catalog(catalog)
        self.scale = (float(scale_latency_s), float(scale_latency_sd_s))
        self.init = (float(init_latency_s), float(init_latency_sd_s))
        self._rng = np.random.default_rng(seed)
        self._ids = itertools.count()
        self._notices: list[Preemption] = []

    def now(self) -> float:
        return self.clock.now()

    def provision(self, instance_type: str, count: int, market: Market = "on_demand",
                  timeout_s: float = 600.0) -> list[Machine]:
        if count < 1:
            raise ProblemError(f"count is {count}, but must be at least 1")
        price = self.price(instance_type, market)
        scale = max(0.0, self.scale[0] + self.scale[1] * self._rng.standard_normal())
        init = max(0.0, float((self.init[0] + self.init[1] * self._rng.standard_normal(count)).max()))
        if scale + init > timeout_s:
            raise ProviderError(f"{count} x {instance_type} would take {scale + init:.1f} s to start, longer than "
                                f"the timeout {timeout_s:g} s")
        start = self.clock.now()
        made = [Machine(f"virtual-{self.run_id}-{next(self._ids)}", instance_type, market, "127.0.0.1",
                        start + scale, price, tags={"thrifty-run": self.run_id}) for _ in range(count)]
        self.clock.sleep_until(start + scale + init)
        self._own(made)
        return made

    def price(self, instance_type: str, market: str = "on_demand") -> float:
        return self.catalog.get(instance_type).price(market)

    def poll_interruptions(self) -> Sequence[Preemption]:
        out, self._notices = self._notices, []
        return out
