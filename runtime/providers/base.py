"""The provider interface every machine source implements.

Operations (issue 7): provision ``count`` machines of one instance type in one
market and wait until they run (with a timeout); terminate machines; list the
machines this run owns; the current price of an (instance type, market); and
the interruption events seen since the last poll, which reach the runtime
through the provider's one `interruptions` feed (with the notices and losses
other sources push into it). A provider owns what it
provisioned: `close()` terminates everything still running, and a provider is
a context manager so that happens on normal exit, on error and on Ctrl-C.

Billing (`billed_cost_usd`) is per second with a minimum billed duration per
machine (60 s on EC2), the same rule the solver's formulations use.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from thrifty.core.errors import ProviderError
from thrifty.datasets.catalog import Catalog
from thrifty.runtime.events import Preemption
from thrifty.runtime.providers.interruptions import InterruptionFeed

if TYPE_CHECKING:
    from thrifty.runtime.worlds import Launcher

__all__ = ["Machine", "MachineState", "Market", "Provider", "CapacityError", "billed_cost_usd"]

MachineState = Literal["pending", "running", "stopping", "terminated"]
Market = Literal["on_demand", "spot"]


@dataclass(frozen=True)
class Machine:
    """One rented machine (or one local worker slot).

    `host` is where its workers run (``127.0.0.1`` for local machines);
    `launched_at` and `terminated_at` are Unix seconds, the billing interval.
    `price_per_hour` is the price the run is charged, from the provider's
    price at launch.
    """

    id: str
    instance_type: str
    market: Market
    host: str
    launched_at: float
    price_per_hour: float
    state: MachineState = "running"
    terminated_at: float | None = None
    tags: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def ended(self, at: float | None = None) -> "Machine":
        return replace(self, state="terminated", terminated_at=time.time() if at is None else at)

    def cost_usd(self, now: float | None = None, min_billed_s: float = 60.0) -> float:
        end = self.terminated_at if self.terminated_at is not None else (time.time() if now is None else now)
        return billed_cost_usd(self.price_per_hour, end - self.launched_at, min_billed_s)


def billed_cost_usd(price_per_hour: float, seconds: float, min_billed_s: float = 60.0) -> float:
    """Per-second billing with a minimum: ``price * max(seconds, minimum) / 3600``."""
    return price_per_hour * max(max(seconds, 0.0), min_billed_s) / 3600.0


class CapacityError(ProviderError):
    """No capacity for ``(instance_type, market)`` now (EC2
    ``InsufficientInstanceCapacity``, spot capacity errors). The runtime marks
    that pair depleted and re-plans."""

    def __init__(self, instance_type: str, market: str, message: str):
        super().__init__(message)
        self.instance_type = instance_type
        self.market = market

    def as_preemption(self) -> Preemption:
        return Preemption(self.instance_type, self.market, source="capacity", reason=str(self))


class Provider(abc.ABC):
    """Where machines come from. Subclasses: local processes, EC2.

    The base keeps the ledger of what the run owns (`_own`, and default
    `terminate`, `machines`, `all_machines` that only update it), with times
    from `now()`; a provider whose machines live elsewhere (EC2) overrides
    them.

    Optional abilities have defaults here, so callers ask every provider
    alike: `check_plan` (checks nothing), `pool_capacity` (None: machines are
    started on demand), `world_launcher` (None: the local launcher),
    `catalog` (None: the provider prices machines without one)."""

    name: str = "provider"
    local_workers: bool = True  # whether its machines' workers run on this host (`world_launcher` is None)
    catalog: Catalog | None = None  # the catalog its machines' types (and devices) come from, when it has one

    def __init__(self, run_id: str):
        self.run_id = run_id
        self._machines: dict[str, Machine] = {}
        self._lock = threading.RLock()
        # every interruption of this run's machines: the provider's own notices and what other sources push
        self.interruptions = InterruptionFeed(self.poll_interruptions)

    def now(self) -> float:
        """The time machines are billed by (Unix seconds; a virtual clock's time in simulation)."""
        return time.time()

    def _own(self, made: Iterable[Machine]) -> None:
        with self._lock:
            self._machines.update((m.id, m) for m in made)

    @abc.abstractmethod
    def provision(self, instance_type: str, count: int, market: Market = "on_demand",
                  timeout_s: float = 600.0) -> list[Machine]:
        """Start `count` machines and wait until they run; raise
        `CapacityError` when the market has none, `ProviderError` on timeout
        (after terminating what did start)."""

    def terminate(self, machines: Iterable[Machine]) -> list[Machine]:
        """Give machines back; returns them with their termination time."""
        now = self.now()
        out = []
        with self._lock:
            for m in machines:
                current = self._machines.get(m.id)
                if current is None:
                    raise ProviderError(f"machine {m.id} does not belong to run {self.run_id}")
                if current.terminated_at is None:
                    current = current.ended(now)
                    self._machines[m.id] = current
                out.append(current)
        return out

    def machines(self) -> list[Machine]:
        """Machines this run owns that are not terminated."""
        with self._lock:
            return [m for m in self._machines.values() if m.terminated_at is None]

    def all_machines(self) -> list[Machine]:
        """Every machine of this run, terminated ones included (for billing)."""
        with self._lock:
            return list(self._machines.values())

    @abc.abstractmethod
    def price(self, instance_type: str, market: str = "on_demand") -> float:
        """Current USD per hour of one machine."""

    @abc.abstractmethod
    def poll_interruptions(self) -> Sequence[Preemption]:
        """Interruption events seen since the last call (never blocks long)."""

    def check_plan(self, allocations: Iterable[tuple[str, str, int]]) -> None:
        """Raise `ProblemError` (one line, every lack named) when this provider
        cannot give machines ``(instance type, market, count)``, before anything
        starts (`thrifty.runtime.training.preflight.check_run`); the default
        checks nothing (a cloud's capacity shows only when machines are asked
        for, and is then a `CapacityError`, which re-plans)."""
        return None

    def pool_capacity(self) -> dict[tuple[str, str], int] | None:
        """How many machines of each (instance type, market) a fixed pool
        holds (the nodes of a running Ray cluster), so that a plan and its
        re-plans pick only from it; None (the default): machines are started
        on demand, as many as the problem's quotas allow."""
        return None

    def world_launcher(self, machine_ids: Sequence[str], preload: Sequence[str] = ()) -> Launcher | None:
        """The launcher (`thrifty.runtime.worlds.Launcher`) of a
        world whose rank r runs on machine `machine_ids[r]`; None (the
        default): the local launcher, which starts ranks on this host."""
        return None

    def close(self) -> None:
        """Terminate everything this run still owns."""
        owned = self.machines()
        if owned:
            self.terminate(owned)

    def __enter__(self) -> "Provider":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
