"""One feed of interruptions, whatever delivers them: spot notices, lost machines, markets without capacity.

A machine is taken away in several ways, and each reaches the runtime
through a different door: the provider's own notices
(`Provider.poll_interruptions`: an EC2 spot ``instance-action`` seen by
IMDSv2, an instance that left ``running``, a Ray node that died, a notice
queued by `LocalProvider.interrupt`), the fault injector of a test or demo,
a notice planted in a worker that travels driver -> rank -> driver, and
ranks that exit without notice. Each source `push`es what it sees into one
`InterruptionFeed` (the provider's own notices are pulled from it when a
reader polls), and every reader gets every event, typed by what it asks of
the reader:

- `Notice`: the machine goes at `Notice.deadline` (Unix seconds); there is
  time to checkpoint and stop (Srifty 4.5: EC2 gives two minutes);
- `MachineLost`: the machine is gone now (or its warning is unknown): what
  ran on it is lost since its last checkpoint;
- `CapacityChange`: a market has no capacity (the provider says so while
  the run goes on): no new machine of it, none that runs stops. (A launch
  that fails for capacity raises `CapacityError` to whoever asked for the
  machines, which re-plans at once.)

Each event carries its `Preemption` (`thrifty.runtime.events`), the record
the run log and the hooks get. Every provider has one feed
(`Provider.interruptions`), so the training driver and the tuning executors
read the same events; each reader (`InterruptionFeed.reader`) has its own
place in the feed and may keep to the machines it runs on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from thrifty.runtime.events import Preemption

__all__ = ["Interruption", "Notice", "MachineLost", "CapacityChange", "interruption", "InterruptionFeed",
           "FeedReader"]


@dataclass(frozen=True)
class Interruption:
    """One machine (or one market) taken away; `preemption` says which, from where and why."""

    preemption: Preemption

    @property
    def machine_id(self) -> str | None:
        return self.preemption.machine_id

    @property
    def key(self) -> tuple[str, str]:
        """The (instance type, market) it depletes."""
        return self.preemption.key

    @property
    def at(self) -> float:
        """When it was seen (Unix seconds)."""
        return self.preemption.at


@dataclass(frozen=True)
class Notice(Interruption):
    """The machine goes at `deadline`: time to checkpoint and stop."""

    @property
    def deadline(self) -> float:
        assert self.preemption.time_left_s is not None  # `interruption` makes a notice only with time left
        return self.preemption.at + self.preemption.time_left_s


@dataclass(frozen=True)
class MachineLost(Interruption):
    """The machine is gone (no time left, or none known)."""


@dataclass(frozen=True)
class CapacityChange(Interruption):
    """A market has no capacity: no new machine of it is asked for."""


def interruption(event: Preemption | Interruption) -> Interruption:
    """The typed event of a `Preemption`: no machine, a `CapacityChange`;
    time left, a `Notice`; else (none, or unknown) `MachineLost`."""
    if isinstance(event, Interruption):
        return event
    if event.machine_id is None:
        return CapacityChange(event)
    if event.time_left_s is not None and event.time_left_s > 0:
        return Notice(event)
    return MachineLost(event)


class InterruptionFeed:
    """Every interruption of one provider's machines, in the order seen.

    `pull` is the provider's own source (`Provider.poll_interruptions`),
    asked when a reader polls; other sources `push`. Thread-safe: a source
    may push from its own thread."""

    def __init__(self, pull: Callable[[], Iterable[Preemption]]):
        self._pull = pull
        self._events: list[Interruption] = []
        self._lock = threading.Lock()

    def push(self, *events: Preemption | Interruption) -> None:
        """Add what a source saw."""
        with self._lock:
            self._events.extend(interruption(e) for e in events)

    def reader(self) -> FeedReader:
        """A reader that gets the events from now on."""
        with self._lock:
            return FeedReader(self, len(self._events))

    def _since(self, position: int, pull: bool) -> tuple[list[Interruption], int]:
        if pull:
            self.push(*self._pull())
        with self._lock:
            return self._events[position:], len(self._events)


class FeedReader:
    """One reader's place in a feed."""

    def __init__(self, feed: InterruptionFeed, position: int):
        self.feed, self._position = feed, position

    def poll(self, machines: Collection[str] | None = None, *, pull: bool = True) -> list[Interruption]:
        """The events since the last poll, oldest first: every `CapacityChange`,
        and the others of `machines` only (None: of every machine; the others'
        are passed over). `pull=False` leaves the provider's own source
        unasked (what the sources pushed only)."""
        events, self._position = self.feed._since(self._position, pull)
        return [e for e in events if machines is None or e.machine_id is None or e.machine_id in machines]
