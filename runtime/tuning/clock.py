"""Real and virtual time for the one tuning loop.

As in Syne Tune's time keepers, executors and the loop read time only through
a `Clock`, so a scheduler cannot tell whether an experiment runs on real
processes or in a trace-driven simulation (HyperDrive 7.1). `now()` is seconds
(or the experiment's time units) since the clock started; `sleep_until(t)`
waits until `now() >= t`: a real clock sleeps, a virtual clock jumps.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "RealClock", "VirtualClock"]


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float: ...

    def sleep_until(self, t: float) -> None: ...


class RealClock:
    """Monotonic wall time since construction."""

    def __init__(self) -> None:
        self._start = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._start

    def sleep_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)


class VirtualClock:
    """Simulated time: it moves only when someone sleeps; it never goes back."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def sleep_until(self, t: float) -> None:
        if t > self._now:
            self._now = float(t)
