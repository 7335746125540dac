"""Online calibration in ``thrifty run``: each window of a segment, the
workers' clock marks correct the compute and exchange models of the machine
types the segment runs on (`thrifty.perfmodels.calibration`: the stated
Bayesian update, the priors and the noise model), every re-plan solves with
the corrected models (`replan.Replanner` asks `OnlineCalibrator.space`), and
the first window whose corrected models leave no plan within the limits says
so, with the least change that would admit one (the solver's relaxations),
instead of the end of the run.

A window is the progress monitor's (Srifty's K, scaled to the job): from
the first clock reading of each rank after the timing warm-up, then every
``window_s`` of training. Each window is logged as a ``calibration`` event:
per component and type, what the prior profile predicted, what the
corrected models predicted before and after the window, and what was
measured; the iteration as a whole (prior, corrected, measured: the span of
rank 0's readings over the iterations it covered, data loading and
checkpoints included); and the factors now in force. An
``infeasible_forecast`` event (said once a run, and again only when what
would be needed grows) carries the solver's explanation.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from thrifty.core.errors import ProblemError
from thrifty.core.io import write_json
from thrifty.datasets.catalog import Catalog, load_catalog
from thrifty.perfmodels.bundle import BUNDLE_FORMAT, parse_bundle
from thrifty.perfmodels.calibration import (COMPUTE, Calibration, ComponentPrediction, Evidence, component_predictions,
                                            compute_prior_sd, corrected_profile, corrected_simulator,
                                            exchange_prior_sd, host_contention_sd)
from thrifty.perfmodels.cluster import MachineGroup
from thrifty.perfmodels.library import ModelLibrary
from thrifty.perfmodels.profile import profile_document, save_profile
from thrifty.perfmodels.simulator import IterationSimulator
from thrifty.solver.problem import TrainingProblem
from thrifty.solver.training import TrainingSpace

__all__ = ["OnlineCalibrator", "InfeasibleForecast", "window_evidence", "save_corrected_profile",
           "MIN_WINDOW_ITERATIONS"]

MIN_WINDOW_ITERATIONS = 2  # a window needs at least this many iterations of every rank (an sd needs two)


def runnable_processes() -> float | None:
    """The processes this host's kernel has runnable now besides the one asking
    (Linux: /proc/stat's ``procs_running`` less one; elsewhere the 1-minute
    load average), None when unknown."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                if line.startswith("procs_running"):
                    return max(0.0, float(line.split()[1]) - 1.0)
    except OSError:
        pass
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
PARTS = ("forward", "backward", "exchange", "step")


def _delta(now: Mapping[str, Any], before: Mapping[str, Any] | None) -> tuple[int, dict[str, float], dict[str, float]]:
    """(count, sums, sums of squares) of the iterations between two cumulative readings."""
    if before is None:
        return int(now["count"]), dict(now["sum"]), dict(now["sumsq"])
    return (int(now["count"]) - int(before["count"]),
            {k: now["sum"][k] - before["sum"][k] for k in PARTS},
            {k: now["sumsq"][k] - before["sumsq"][k] for k in PARTS})


def _mean_sd(count: int, total: float, squares: float) -> tuple[float, float]:
    mean = total / count
    var = max(0.0, (squares - count * mean * mean) / max(1, count - 1))
    return mean, math.sqrt(var)


def window_evidence(readings: Mapping[int, tuple[Mapping[str, Any] | None, Mapping[str, Any]]],
                    rank_types: Sequence[str], prior: ComponentPrediction) -> tuple[dict[str, dict[str, Evidence]],
                                                                                      Evidence | None]:
    """The evidence of one window: per instance type, each compute
    component of its ranks pooled (iterations counted once: the ranks run in
    lockstep); the exchange of the rank with the least (the straggler's,
    which waits for no one). `readings` maps a rank to its cumulative clock
    readings at the window's start (None: the world's start) and end."""
    pooled: dict[str, dict[str, list[float]]] = {}
    exchange: list[tuple[float, float, int]] = []
    for rank, (before, after) in readings.items():
        count, sums, squares = _delta(after, before)
        if count < MIN_WINDOW_ITERATIONS:
            continue
        entry = pooled.setdefault(rank_types[rank], {c: [0.0, 0.0, 0.0, math.inf] for c in COMPUTE})
        for c in COMPUTE:
            entry[c][0] += sums[c]
            entry[c][1] += squares[c]
            entry[c][2] += count
            entry[c][3] = min(entry[c][3], count)
        mean, sd = _mean_sd(count, sums["exchange"], squares["exchange"])
        exchange.append((mean, sd, count))
    compute: dict[str, dict[str, Evidence]] = {}
    for name, entry in pooled.items():
        for c in COMPUTE:
            total, square_sum, n, iterations = entry[c]
            mean, sd = _mean_sd(int(n), total, square_sum)
            predicted = prior.compute.get(name, {}).get(c, 0.0)
            if mean > 0 and predicted > 0:
                compute.setdefault(name, {})[c] = Evidence(mean, predicted, sd, int(iterations))
    ex = None
    if exchange and len(rank_types) > 1 and prior.exchange_s > 0:
        mean, sd, count = min(exchange)
        if mean > 0:
            ex = Evidence(mean, prior.exchange_s, sd, count)
    return compute, ex


class InfeasibleForecast:
    """What the corrected models say when no plan meets what is left of the
    limits: the window, the reason and the least changes (in whole-run terms)."""

    def __init__(self, window: int, elapsed_s: float, reason: str, relaxations: list[dict[str, Any]],
                 assumed: str, kept_total_s: float | None):
        self.window, self.elapsed_s, self.reason = window, elapsed_s, reason
        self.relaxations, self.assumed, self.kept_total_s = relaxations, assumed, kept_total_s

    def to_json(self) -> dict[str, Any]:
        return {"window": self.window, "elapsed_s": self.elapsed_s, "reason": self.reason,
                "relaxations": self.relaxations, "assumed": self.assumed, "kept_total_s": self.kept_total_s}

    def least_change(self) -> str:
        """The relaxations in words, the least first."""
        words = []
        for r in self.relaxations:
            needed = r.get("needed_total")
            if isinstance(needed, dict):
                text = " and ".join(_limit_words(f, v) for f, v in needed.items())
            elif r.get("field") in ("limits.time_s", "limits.cost_usd") and needed is not None:
                text = _limit_words(r["field"], needed)
            else:
                text = f"{r.get('field') or r.get('fields')} -> {r.get('needed')}"
            words.append(f"{text} ({r.get('plan')})")
        return "; or ".join(words) if words else "none found"

    def __str__(self) -> str:
        return (f"window {self.window} ({self.elapsed_s:.1f} s): no plan meets the limits with the corrected models "
                f"({self.assumed}): {self.reason}; least change: {self.least_change()}")


def _limit_words(field: str, value: float) -> str:
    if field == "limits.time_s":
        return f"time limit >= {math.ceil(value * 10) / 10:g} s"
    return f"budget >= ${math.ceil(value * 1e4) / 1e4:g}"


class OnlineCalibrator:
    """One run's online calibration: the beliefs, the windows, the corrected space."""

    def __init__(self, base_space: Callable[[], TrainingSpace], catalog: Catalog, window_s: float,
                 calibration: Calibration | None = None):
        self._base_space = base_space
        self.catalog = catalog
        self.window_s = window_s
        self.calibration = calibration or Calibration()
        self.windows = 0  # calibrated windows of the run
        self.version = 0  # bumped by every update
        self._space: tuple[int, TrainingSpace] | None = None
        self._prior: dict[tuple, ComponentPrediction] = {}
        self._latest: dict[int, dict[str, Any]] = {}
        self._start: dict[int, dict[str, Any] | None] = {}
        self._first: dict[str, Any] | None = None  # rank 0's first reading of the world (the first window's span)
        self._window_at: float | None = None
        self._runnable: list[float] = []  # the host's runnable processes, sampled as readings come
        self.infeasible: InfeasibleForecast | None = None

    # -- the corrected models ------------------------------------------------------
    @property
    def base(self) -> TrainingSpace:
        return self._base_space()

    def simulator(self) -> IterationSimulator:
        """The simulator with the corrected models (the prior's when nothing is measured)."""
        return self.space().simulator

    def space(self) -> TrainingSpace:
        """The base space with its simulator's models corrected (cached per update)."""
        base = self.base
        if self.calibration.empty:
            return base
        if self._space is None or self._space[0] != self.version:
            sim = corrected_simulator(base.simulator, self.calibration)
            self._space = (self.version, TrainingSpace(base.problem, library=sim.library, catalog=base.catalog,
                                                       simulator=sim))
        return self._space[1]

    def assumed(self) -> str:
        return self.calibration.summary()

    # -- the windows ---------------------------------------------------------------
    def segment_started(self) -> None:
        """A new world: its ranks' readings start afresh."""
        self._latest.clear()
        self._start.clear()
        self._first = None
        self._window_at = None
        self._runnable.clear()

    def observe(self, clocks: Mapping[int, dict[str, Any]], now: float) -> None:
        """New cumulative clock readings of ranks (and a sample of the host's runnable processes)."""
        runnable = runnable_processes()
        if runnable is not None:
            self._runnable.append(runnable)
        for rank, reading in clocks.items():
            self._latest[rank] = reading
            if rank == 0 and self._first is None:
                self._first = reading
            if rank not in self._start:
                self._start[rank] = None  # the window starts at the world's first counted iteration
        if self._window_at is None and clocks:
            self._window_at = now

    def window_due(self, now: float, ranks: int) -> bool:
        return (self._window_at is not None and now - self._window_at >= self.window_s
                and len(self._latest) == ranks)

    def close_window(self, now: float, groups: Sequence[MachineGroup],
                     rank_types: Sequence[str]) -> dict[str, Any] | None:
        """Update the beliefs from the window that ends now; the ``calibration``
        event's fields (None when the window holds too few iterations)."""
        readings = {r: (self._start.get(r), self._latest[r]) for r in self._latest}
        prior = self._prior_prediction(groups)
        compute, exchange = window_evidence(readings, rank_types, prior)
        if not compute:
            return None
        before = component_predictions(self.simulator(), groups)
        base = self.base
        runnable = sum(self._runnable) / len(self._runnable) if self._runnable else None
        contention = host_contention_sd(runnable, os.cpu_count() or 1)
        measured: dict[str, Any] = {}
        for name, parts in compute.items():
            itype = self.catalog.get(name)
            kind = base.simulator.compute_model(itype).provenance.get("kind")
            sd = compute_prior_sd(kind, contention if itype.host_worker else 0.0)
            for c, ev in parts.items():
                self.calibration.observe_compute(itype.device, c, ev, sd)
            measured[name] = {c: ev.measured_s for c, ev in parts.items()}
        if exchange is not None:
            for name in sorted({g.instance_type.name for g in groups}):
                itype = self.catalog.get(name)
                sd = exchange_prior_sd(base.simulator.bandwidth.source(itype), contention if itype.host_worker else 0.0)
                self.calibration.observe_exchange(name, exchange, sd)
        self.version += 1
        self.windows += 1
        after = component_predictions(self.simulator(), groups)
        iteration = self._measured_iteration(readings, self._first)
        for r, (_, end) in readings.items():
            self._start[r] = end
        self._window_at = now
        self._runnable.clear()
        return {"window": self.windows, "runnable": runnable,
                "iterations": min(_delta(e, s)[0] for s, e in readings.values()),
                "prior": prior.to_json(), "corrected_before": before.to_json(), "corrected": after.to_json(),
                "measured": {"compute": measured, "exchange_s": None if exchange is None else exchange.measured_s,
                             "iteration_s": iteration},
                "factors": self.calibration.to_json(), "assumed": self.assumed()}

    def _prior_prediction(self, groups: Sequence[MachineGroup]) -> ComponentPrediction:
        key = tuple((g.instance_type.name, g.count, g.batch) for g in groups)
        hit = self._prior.get(key)
        if hit is None:
            hit = self._prior[key] = component_predictions(self.base.simulator, groups)
        return hit

    @staticmethod
    def _measured_iteration(readings: Mapping[int, tuple[Mapping[str, Any] | None, Mapping[str, Any]]],
                            first: Mapping[str, Any] | None) -> float | None:
        """Seconds per iteration of rank 0 over the window (its readings' span;
        the first window's from the world's first reading), None when unknown."""
        if 0 not in readings:
            return None
        before, after = readings[0]
        before = before if before is not None else first
        if before is None or after["iteration"] <= before["iteration"]:
            return None
        return (after["at"] - before["at"]) / (after["iteration"] - before["iteration"])

    # -- what the corrected models say of the limits ----------------------------------
    def iteration_s(self, groups: Sequence[MachineGroup]) -> float:
        """The corrected models' iteration time of `groups`."""
        return self.simulator().simulate(list(groups)).mean_s

    def forecast(self, found: Sequence[Mapping[str, Any]], reason: str, *, elapsed_s: float, spent_usd: float,
                 kept_total_s: float | None) -> InfeasibleForecast:
        """The forecast of a window whose corrected models leave no plan of what
        is left within the limits: the least changes of the limits the solver
        found for what is left (`found`), in whole-run terms (plus what was
        spent), and keeping the plan in force (no switch) as a way out too."""
        relaxations: list[dict[str, Any]] = []
        for r in found:
            entry = {k: r.get(k) for k in ("field", "fields", "current", "needed", "plan", "total_s", "cost_usd",
                                           "note") if r.get(k) is not None}
            needed = r.get("needed")
            if isinstance(needed, dict):
                entry["needed_total"] = {f: _total(f, v, elapsed_s, spent_usd) for f, v in needed.items()
                                         if f in ("limits.time_s", "limits.cost_usd") and v is not None}
            elif r.get("field") in ("limits.time_s", "limits.cost_usd") and needed is not None:
                entry["needed_total"] = _total(r["field"], needed, elapsed_s, spent_usd)
            relaxations.append(entry)
        if kept_total_s is not None:
            relaxations.append({"field": "limits.time_s", "needed_total": kept_total_s,
                                "plan": "the plan in force, kept",
                                "note": "no switch: the plan in force at the corrected iteration time"})
        relaxations.sort(key=lambda r: (r.get("field") != "limits.time_s", _first(r.get("needed_total"))))
        self.infeasible = InfeasibleForecast(self.windows, elapsed_s, reason, relaxations, self.assumed(), kept_total_s)
        return self.infeasible


def _total(field: str, value: float, elapsed_s: float, spent_usd: float) -> float:
    return value + (elapsed_s if field == "limits.time_s" else spent_usd)


def _first(value: Any) -> float:
    if isinstance(value, dict):
        return min(value.values(), default=math.inf)
    return float(value) if value is not None else math.inf


def save_corrected_profile(events: Sequence[Mapping[str, Any]], problem: TrainingProblem, path: str | Path) -> str:
    """Write the compute profile the run's models ended with (its log's last
    ``calibration`` event) to `path`, atomically, in the format a problem
    names as its ``model``: one ``thrifty.compute_profile/1`` when the run
    measured one device, else a ``thrifty.profile_bundle/1`` with a profile
    for each of the problem's instance types of the devices it measured.
    Returns what was written, in words; `ProblemError` when the run measured
    no window."""
    last = [e for e in events if e["event"] == "calibration"]
    if not last:
        raise ProblemError("the run measured no calibration window (it ended before a whole window of training): "
                           "no corrected profile to save", path="--save-profile")
    calibration = Calibration.from_json(last[-1]["factors"])
    library = ModelLibrary()
    model = problem.model
    if model.endswith(".json") or Path(model).exists():
        model = library.add_file(model).model
    catalog = load_catalog(problem.catalog)
    types: dict[str, list[str]] = {}
    for choice in problem.instances:
        itype = catalog.get(choice.instance_type)
        if any(d == itype.device for d, _ in calibration.compute) and itype.name not in types.get(itype.device, []):
            types.setdefault(itype.device, []).append(itype.name)
    measured = [t for names in types.values() for t in names if t in calibration.exchange]
    profiles = {}
    for device, names in types.items():
        cm = library.get(model, device, names[0])
        profiles[device] = (names, corrected_profile(cm, calibration, device, [t for t in names if t in measured]))
    if len(profiles) == 1:
        (names, profile), = profiles.values()
        save_profile(profile, path)
        return f"the corrected profile of {model} on {profile.device} ({', '.join(names)})"
    bundle = {"format": BUNDLE_FORMAT, "kind": "compute", "model": model,
              "command": "thrifty run --save-profile (online calibration)",
              "profiles": {name: profile_document(profile) for names, profile in profiles.values() for name in names}}
    parse_bundle(bundle, source=str(path))  # a bundle that would not load is not written
    write_json(path, bundle)
    return f"a bundle of the corrected profiles of {model} on {', '.join(profiles)}"
