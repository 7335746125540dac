"""Progress against the limits, and when to re-plan (Srifty 4.5, continual optimization).

The monitor tracks the elapsed time ``t``, the spent cost ``c`` (the machines'
prices with per-second billing and the billing minimum,
`thrifty.runtime.providers.base.billed_cost_usd`) and the iterations done
``n``, and keeps a windowed throughput over the last ``K`` seconds (Srifty:
K = 5 minutes): the window is cut into equal bins, each bin's throughput is
the iterations done in it over its width (from the cumulative iteration curve,
linear between reports), and the mean and standard deviation are taken over
the bins. The 95% confidence bound of the mean throughput is
``mean + t_{0.95, k-1} * sd / sqrt(k)`` for k bins: the *optimistic*
throughput. With it the monitor projects the finish time
``t + (N - n) / throughput`` and the cost at that time; a limit is violated
*with high certainty* when even the optimistic projection breaks it.

A re-plan is called for only then, and only once the window is full and the
certain violation has held for at least one bin width. That last condition is
ours, not the paper's: it keeps a single outlying poll from triggering a
switch, whose overheads (stop, relaunch) a transient slowdown never repays.
After a call for a re-plan the monitor holds off (`hold_off`): it goes on
measuring (the live bar keeps its rate and ETA), but calls again only on a
violation seen afresh after the hold, so on a window of new measurements.

Srifty's K = 5 minutes fits jobs of hours. A 30-second job would never fill
such a window: it would show no throughput and never re-plan. So the window
scales with the job (`auto_window_s`): a tenth of its expected length (the
time limit, or the plan's predicted time when that is shorter or there is no
limit), at most K, at least `WINDOW_MIN_S` and at least two predicted
iterations per bin. A resumed run's monitor also counts what earlier sessions
spent (`spent_before_usd`; their time is in `start`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from functools import lru_cache

import numpy as np
from pydantic.dataclasses import dataclass

from thrifty.core.validation import RECORD_CONFIG
from thrifty.runtime.providers.base import Machine

__all__ = ["ThroughputWindow", "Verdict", "ProgressMonitor", "window_throughput", "spent_cost", "projected_cost",
           "auto_window_s", "WINDOW_MAX_S", "WINDOW_MIN_S"]

WINDOW_MAX_S = 300.0  # Srifty's K
WINDOW_MIN_S = 2.0  # shorter windows measure the polling more than the job


@dataclass(frozen=True, config=RECORD_CONFIG)
class ThroughputWindow:
    """Iterations per second over the last `span_s` seconds."""

    mean: float
    sd: float
    bound: float  # optimistic: the upper 95% confidence bound of the mean
    bins: int
    span_s: float


@dataclass(frozen=True, config=RECORD_CONFIG)
class Verdict:
    """One check of the progress against the limits: the ``throughput`` and
    ``slowdown`` events of the run log (`thrifty.core.validation.json_object`)."""

    elapsed_s: float
    iterations: int
    total_iterations: int
    spent_usd: float
    window: ThroughputWindow | None
    projected_total_s: float | None  # at the mean throughput
    optimistic_total_s: float | None  # at the optimistic bound
    projected_cost_usd: float | None
    optimistic_cost_usd: float | None
    violation: tuple[str, ...] = ()  # limits that even the optimistic projection breaks: "time", "cost"
    replan: bool = False  # violation certain for long enough: call for a re-plan


@lru_cache(maxsize=64)
def _t95(dof: int) -> float:
    from scipy.stats import t

    return float(t.ppf(0.95, dof))


def window_throughput(times: Iterable[float], iterations: Iterable[float], end: float, span_s: float,
                      bins: int) -> ThroughputWindow | None:
    """Throughput statistics over ``[end - span_s, end]`` from the cumulative
    iteration curve (`iterations` done at `times`); None when the curve does
    not cover the window."""
    t = np.asarray(list(times), dtype=float)
    n = np.asarray(list(iterations), dtype=float)
    if bins < 2 or t.size < 2 or t[0] > end - span_s:
        return None
    edges = np.linspace(end - span_s, end, bins + 1)
    # past the last report nothing is known to be done yet: the curve stays flat
    done = np.interp(edges, t, n)
    rates = np.diff(done) / (span_s / bins)
    mean, sd = float(rates.mean()), float(rates.std(ddof=1))
    return ThroughputWindow(mean, sd, mean + _t95(bins - 1) * sd / math.sqrt(bins), bins, span_s)


PREDICTION_OFF_FACTOR = 1.5


def prediction_off(window: ThroughputWindow | None, predicted_iteration_s: float | None,
                   factor: float = PREDICTION_OFF_FACTOR) -> float | None:
    """Measured over predicted iteration time, when a full window of
    throughput says they differ by more than `factor` in either direction
    with 95% confidence (the window's confidence interval of the rate lies
    wholly beyond the factor: a warm-up or a noisy window says nothing);
    None otherwise."""
    if window is None or not predicted_iteration_s or predicted_iteration_s <= 0 or window.mean <= 0:
        return None
    predicted_rate = 1.0 / predicted_iteration_s
    half = window.bound - window.mean
    if window.bound * factor < predicted_rate or window.mean - half > factor * predicted_rate:
        return (1.0 / window.mean) / predicted_iteration_s
    return None


def auto_window_s(time_limit_s: float | None, predicted_total_s: float | None, iteration_s: float | None = None,
                  bins: int = 10) -> float:
    """The monitor's window for a job: a tenth of its expected length (the
    shorter of the time limit and the predicted total time, whichever are
    known), at most `WINDOW_MAX_S` (Srifty's K); at least `WINDOW_MIN_S`, and
    at least two predicted iterations in each of the `bins` bins, so that no
    bin is empty by construction."""
    known = [t for t in (time_limit_s, predicted_total_s) if t is not None and t > 0]
    window = min(WINDOW_MAX_S, min(known) / 10) if known else WINDOW_MAX_S
    floor = max(WINDOW_MIN_S, 2 * bins * iteration_s if iteration_s else 0.0)
    return max(window, floor)


def spent_cost(machines: Iterable[Machine], now: float, min_billed_s: float = 60.0) -> float:
    """What the machines have cost so far (per-second billing with a minimum)."""
    return sum(m.cost_usd(now=now, min_billed_s=min_billed_s) for m in machines)


def projected_cost(machines: Iterable[Machine], now: float, finish: float, min_billed_s: float = 60.0) -> float:
    """The cost at `finish` if the running machines run until then."""
    return sum(m.cost_usd(now=finish if m.terminated_at is None else now, min_billed_s=min_billed_s)
               for m in machines)


class ProgressMonitor:
    """Observes (time, iterations done) and judges the progress.

    `start` is the run's start (unix seconds): elapsed time counts from it, as
    the plan's total time (launch overhead included) does; a resumed run's
    start lies that much earlier than its session's, by the time earlier
    sessions spent. `spent_before_usd` is what they cost.
    """

    def __init__(self, total_iterations: int, time_limit_s: float | None, cost_limit_usd: float | None,
                 start: float, window_s: float = 300.0, bins: int = 10, min_billed_s: float = 60.0,
                 spent_before_usd: float = 0.0):
        if window_s <= 0 or bins < 2:
            raise ValueError(f"window_s {window_s} must be positive and bins {bins} at least 2")
        self.total_iterations = total_iterations
        self.time_limit_s, self.cost_limit_usd = time_limit_s, cost_limit_usd
        self.start, self.window_s, self.bins, self.min_billed_s = start, window_s, bins, min_billed_s
        self.spent_before_usd = spent_before_usd
        self._points: deque[tuple[float, int]] = deque()
        self._violating_since: float | None = None
        self._quiet_until = -math.inf
        self.iterations = 0

    def reset(self, iterations: int) -> None:
        """A new world started (or the run rolled back to a checkpoint): the
        window restarts, since the old one measured other machines."""
        self._points.clear()
        self._violating_since = None
        self._quiet_until = -math.inf
        self.iterations = iterations

    def hold_off(self, now: float, seconds: float) -> None:
        """Call for no re-plan before ``now + seconds``; the measurements go on."""
        self._quiet_until = now + seconds
        self._violating_since = None

    def observe(self, at: float, iterations: int) -> None:
        if self._points and at <= self._points[-1][0]:
            return
        self._points.append((at, iterations))
        self.iterations = iterations
        horizon = at - 2 * self.window_s
        while len(self._points) > 2 and self._points[1][0] < horizon:
            self._points.popleft()

    def window(self, now: float) -> ThroughputWindow | None:
        if not self._points:
            return None
        times, done = zip(*self._points)
        return window_throughput(times, done, now, self.window_s, self.bins)

    def check(self, now: float, machines: Iterable[Machine]) -> Verdict:
        machines = list(machines)
        elapsed = now - self.start
        spent = self.spent_before_usd + spent_cost(machines, now, self.min_billed_s)
        left = self.total_iterations - self.iterations
        window = self.window(now)
        projected = optimistic = cost_mean = cost_opt = None
        violation: list[str] = []
        if window is not None and window.mean > 0:
            projected = elapsed + left / window.mean
            optimistic = elapsed + left / window.bound
            cost_mean = self.spent_before_usd + projected_cost(machines, now, self.start + projected, self.min_billed_s)
            cost_opt = self.spent_before_usd + projected_cost(machines, now, self.start + optimistic, self.min_billed_s)
            if self.time_limit_s is not None and optimistic > self.time_limit_s:
                violation.append("time")
            if self.cost_limit_usd is not None and cost_opt > self.cost_limit_usd:
                violation.append("cost")
        elif window is not None and left > 0:  # no progress at all over a full window
            violation = [k for k, v in (("time", self.time_limit_s), ("cost", self.cost_limit_usd)) if v is not None]
        if violation and now >= self._quiet_until:
            self._violating_since = self._violating_since if self._violating_since is not None else now
        else:
            self._violating_since = None
        held = self._violating_since is not None and now - self._violating_since >= self.window_s / self.bins
        return Verdict(elapsed, self.iterations, self.total_iterations, spent, window, projected, optimistic,
                       cost_mean, cost_opt, tuple(violation), held)
