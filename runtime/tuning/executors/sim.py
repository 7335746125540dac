"""Simulated executor: trials as events on a clock, for synthetic and replayed workloads.

`SimulatedExecutor` implements the loop's executor interface without running
any training: each running trial has one pending "iteration finished" event on
a heap keyed by ``(time, insertion counter)`` (ties first-in, first-out, as
Syne Tune's simulator backend). With a `VirtualClock` (the default) time
jumps from event to event and a whole experiment costs only the scheduler's
own work; with a `RealClock` the executor sleeps until each event, so the same
loop and scheduler run in real time. Launching, resuming or resizing a trial
costs `startup_s` before its next iteration (HyperSched 6.2's "startup
delay"), reported as the measured overhead. With `checkpoint_every`, every
that many iterations a report carries a checkpoint reference (as the local
executor's durable iterations do); otherwise only a suspend checkpoints.

Workloads say what a trial reports after its k-th iteration and how long that
iteration takes on `a` atoms:

- `SyntheticWorkload`: HyperSched 6's simulated training function
  ``Score(k) = (2 - (1 / (0.01 b0 k + 0.1 b1 + 0.5) + 0.01 b2)) / 2`` with
  ``b1, b2 ~ U(0, 1)`` and ``b0 ~ Exponential(scale 0.1)``; one step takes
  0.1 time units on one atom, divided by s(a) for LINEAR (a), SQRT (sqrt a)
  or NONE (1) scaling (6.0.1). The paper's function has no noise; neither has
  this one.
- `TraceWorkload`: HyperDrive 7.1's trace-driven simulation: it replays the
  recorded validation accuracy and epoch time of each configuration (a trial's
  config is ``{"trace": i}``); `configuration_orders` is the trace generator's
  reordering of configurations for sensitivity runs, and `record_traces` turns
  the trials of a finished (live) experiment into replayable traces. Replayed
  epochs run on one atom; with `scaling` other than NONE, more atoms shorten
  the recorded epoch time by s(a) (an assumption: traces hold no scaling data).

A workload that raises is a crashed trial; one that returns NaN is caught by
the loop. Both become FAILED trials.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from thrifty.core.errors import ProblemError
from thrifty.runtime.tuning.schedulers.base import ScalingFunction, check_positive, scaling_function
from thrifty.runtime.tuning.clock import Clock, VirtualClock
from thrifty.runtime.tuning.loop import ExperimentResult
from thrifty.runtime.tuning.search_space import ConfigList, Exponential, RandomSearch, Uniform
from thrifty.runtime.tuning.trial import Crash, Report, Trial, TrialState

__all__ = ["Workload", "SimulatedExecutor", "SyntheticWorkload", "TraceWorkload", "synthetic_score",
           "synthetic_search_space", "configuration_orders", "record_traces"]


class Workload(Protocol):
    def metric(self, config: dict[str, Any], iteration: int) -> float: ...

    def iteration_s(self, config: dict[str, Any], iteration: int, atoms: int) -> float: ...


def synthetic_score(k: float, b0: float, b1: float, b2: float) -> float:
    """HyperSched 6: the simulated model accuracy after k steps, in [0, 1)."""
    return (2.0 - (1.0 / (0.01 * b0 * k + 0.1 * b1 + 0.5) + 0.01 * b2)) / 2.0


def synthetic_search_space(seed: int, max_configs: int | None = None) -> RandomSearch:
    """HyperSched 6's hyperparameter space: b0 ~ Exponential(0.1), b1, b2 ~ U(0, 1)."""
    return RandomSearch({"b0": Exponential(0.1), "b1": Uniform(0.0, 1.0), "b2": Uniform(0.0, 1.0)},
                        seed=seed, max_configs=max_configs)


class SyntheticWorkload:
    """`synthetic_score` with step time `step_s` / s(atoms)."""

    def __init__(self, scaling: str | ScalingFunction = "LINEAR", step_s: float = 0.1):
        check_positive("step_s", step_s)
        self.scale = scaling_function(scaling)
        self.step_s = step_s

    def metric(self, config: dict[str, Any], iteration: int) -> float:
        return synthetic_score(iteration, config["b0"], config["b1"], config["b2"])

    def iteration_s(self, config: dict[str, Any], iteration: int, atoms: int) -> float:
        return self.step_s / self.scale(atoms)


class TraceWorkload:
    """Replays recorded curves: objects with `accuracy` and `epoch_s` arrays (one entry per epoch)."""

    def __init__(self, traces: Sequence[Any], scaling: str | ScalingFunction = "NONE"):
        if len(traces) == 0:
            raise ProblemError("no traces to replay", path="traces")
        self._accuracy = []
        self._epoch_s = []
        for i, t in enumerate(traces):
            acc = np.asarray(t.accuracy, dtype=float)
            sec = np.asarray(t.epoch_s, dtype=float)
            if acc.ndim != 1 or acc.shape != sec.shape or acc.size == 0:
                raise ProblemError("accuracy and epoch_s must be equal-length, non-empty 1-D arrays",
                                   path=f"traces[{i}]")
            self._accuracy.append(acc.tolist())
            self._epoch_s.append(sec.tolist())
        self.scale = scaling_function(scaling)
        self.max_iterations = min(len(a) for a in self._accuracy)

    def __len__(self) -> int:
        return len(self._accuracy)

    def metric(self, config: dict[str, Any], iteration: int) -> float:
        return self._accuracy[config["trace"]][iteration - 1]

    def iteration_s(self, config: dict[str, Any], iteration: int, atoms: int) -> float:
        return self._epoch_s[config["trace"]][iteration - 1] / self.scale(atoms)

    def configs(self, order: Sequence[int]) -> ConfigList:
        """The search space that offers the traces in `order`."""
        return ConfigList([{"trace": int(i)} for i in order])


def configuration_orders(n_configs: int, n_orders: int, seed: int = 0) -> list[list[int]]:
    """HyperDrive 7.1/7.2.2: `n_orders` random permutations of the configurations (seeded)."""
    check_positive("n_configs", n_configs, integer=True)
    check_positive("n_orders", n_orders, integer=True)
    rng = np.random.default_rng(seed)
    return [rng.permutation(n_configs).tolist() for _ in range(n_orders)]


def record_traces(result: ExperimentResult, *, complete_only: bool = True) -> list[Any]:
    """HyperDrive 7.1's trace generator: the curves and iteration timings of a
    finished experiment's trials, as `thrifty.datasets.curves.Trace` objects
    ready for `TraceWorkload` (only COMPLETED trials unless asked otherwise)."""
    from thrifty.datasets.curves import Trace

    return [Trace(config=dict(t.config), accuracy=np.asarray(t.metrics, dtype=float),
                  epoch_s=np.asarray(t.iteration_s, dtype=float))
            for t in result.trials
            if t.metrics and (not complete_only or t.state == TrialState.COMPLETED)]


@dataclass
class _Run:
    trial: Trial
    atoms: int
    iteration: int
    generation: int


class SimulatedExecutor:
    """The executor interface of `loop.py` over a `Workload` and a clock."""

    def __init__(self, workload: Workload, *, clock: Clock | None = None, startup_s: float = 0.0,
                 checkpoint_every: int | None = None):
        if startup_s < 0:
            raise ProblemError(f"`startup_s` is {startup_s!r}, but must be >= 0", path="startup_s")
        self.workload = workload
        self.clock = clock if clock is not None else VirtualClock()
        self.startup_s = float(startup_s)
        self.checkpoint_every = checkpoint_every
        self._runs: dict[int, _Run] = {}
        self._heap: list[tuple[float, int, int, int, Report | Crash]] = []
        self._seq = 0
        self._generation = 0

    def launch(self, trial: Trial, atoms: int, where: Mapping[str, int] | None = None) -> None:
        start = 0 if trial.checkpoint is None else int(trial.checkpoint["iteration"])
        self._generation += 1
        run = _Run(trial, atoms, start, self._generation)
        self._runs[trial.trial_id] = run
        self._schedule(run, self.startup_s)

    def proceed(self, trial: Trial) -> None:
        self._schedule(self._runs[trial.trial_id], 0.0)

    def suspend(self, trial: Trial) -> Any:
        run = self._runs.pop(trial.trial_id, None)
        return trial.checkpoint if run is None else {"iteration": run.iteration}

    def terminate(self, trial: Trial) -> None:
        self._runs.pop(trial.trial_id, None)

    def _schedule(self, run: _Run, overhead_s: float) -> None:
        now = self.clock.now()
        k = run.iteration + 1
        config = run.trial.config
        tid = run.trial.trial_id
        try:
            duration = float(self.workload.iteration_s(config, k, run.atoms))
            if not duration > 0:
                raise ValueError(f"iteration time {duration!r} is not positive")
        except Exception as e:  # the trial's own code failed: a crash, not a loop error
            event: Report | Crash = Crash(tid, f"{type(e).__name__}: {e}", now + overhead_s)
            due = now + overhead_s
        else:
            due = now + overhead_s + duration
            try:
                metric = self.workload.metric(config, k)
            except Exception as e:
                event = Crash(tid, f"{type(e).__name__}: {e}", due)
            else:
                every = self.checkpoint_every
                event = Report(tid, k, metric, duration, run.atoms, due, overhead_s,
                               {"iteration": k} if every is not None and k % every == 0 else None)
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, tid, run.generation, event))

    def next_event(self, until: float | None) -> Report | Crash | None:
        heap = self._heap
        while heap:
            due, _, tid, generation, event = heap[0]
            run = self._runs.get(tid)
            if run is None or run.generation != generation:
                heapq.heappop(heap)  # the trial was suspended, resized or stopped since
                continue
            if until is not None and due > until:
                self.clock.sleep_until(until)
                return None
            heapq.heappop(heap)
            self.clock.sleep_until(due)
            if isinstance(event, Report):
                run.iteration = event.iteration
            return event
        if until is not None:
            self.clock.sleep_until(until)
        return None
