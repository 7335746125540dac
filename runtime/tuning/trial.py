"""Trials of a tuning experiment: configuration, state, atoms, metric history.

A *trial* is one hyperparameter configuration being trained (HyperSched 3.1);
HyperDrive calls it a *job* (4.2). Its state follows the job manager's
life cycle (HyperDrive 4.2: start, suspend, resume, terminate):

    PENDING -> RUNNING <-> PAUSED
    RUNNING -> COMPLETED   (reached the experiment's maximum iterations R)
    RUNNING -> TERMINATED  (the scheduler stopped it, or the experiment ended)
    RUNNING -> FAILED      (it crashed or reported a non-finite metric)

`Report` is one reported result: the metric after one more iteration (an
epoch, or any unit the user picks), with the wall time of that iteration and
the start-up overhead paid before it (launch, resume from checkpoint, resize).
Metrics are *higher is better* everywhere in the tuning runtime (report
``-loss`` for a loss; HyperDrive 6.3 normalizes rewards the same way).

Only the loop (`loop.py`) writes to a `Trial`; schedulers read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = ["TrialState", "Trial", "Report", "Crash", "ENDED"]


class TrialState(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    PAUSED = "paused"
    TERMINATED = "terminated"
    COMPLETED = "completed"
    FAILED = "failed"


ENDED = frozenset({TrialState.COMPLETED, TrialState.TERMINATED, TrialState.FAILED})  # final states


@dataclass(frozen=True)
class Report:
    """One iteration's result from an executor.

    `iteration` counts the iterations the trial has completed (1 after its
    first); `iteration_s` is the wall (or virtual) time that iteration took on
    `atoms` atoms; `overhead_s` is the start-up time paid just before it (0
    unless the trial was just launched, resumed or resized); `at` is the clock
    time at which the result arrived; `checkpoint`, when the executor
    checkpointed the iteration before reporting it, that checkpoint's
    reference (the trial's `checkpoint` from then on).
    """

    trial_id: int
    iteration: int
    metric: float
    iteration_s: float
    atoms: int
    at: float
    overhead_s: float = 0.0
    checkpoint: Any = None


@dataclass(frozen=True)
class Crash:
    """A trial's process died or its training code raised."""

    trial_id: int
    message: str
    at: float


@dataclass
class Trial:
    """One configuration and everything observed about it so far.

    Per iteration (index i = iteration - 1): `metrics`, `iteration_s` (its
    time), `iteration_atoms` (the atoms it ran on), `reported_at` (clock time).
    `overheads_s` holds the start-up time of each launch (first start, resume,
    resize); `checkpoint` the executor's reference from the last suspend or
    checkpointed result;
    `iterations_since_launch` counts results since the last (re)launch
    (HyperSched's cooldown); `train_s` is the sum of `iteration_s`;
    `interrupted`: the run ended (an interruption, a crash) while the trial was
    running, so its last suspend or stop was the run's, not its scheduler's: a
    resumed run launches it again first.
    """

    trial_id: int
    config: dict[str, Any]
    state: TrialState = TrialState.PENDING
    atoms: int = 0
    metrics: list[float] = field(default_factory=list)
    iteration_s: list[float] = field(default_factory=list)
    iteration_atoms: list[int] = field(default_factory=list)
    overheads_s: list[float] = field(default_factory=list)
    reported_at: list[float] = field(default_factory=list)
    checkpoint: Any = None
    created_at: float = 0.0
    ended_at: float | None = None
    error: str | None = None
    launches: int = 0
    resizes: int = 0
    iterations_since_launch: int = 0
    train_s: float = 0.0
    interrupted: bool = False

    @property
    def iteration(self) -> int:
        """Iterations completed so far."""
        return len(self.metrics)

    @property
    def last_metric(self) -> float:
        return self.metrics[-1] if self.metrics else -math.inf

    @property
    def mean_iteration_s(self) -> float:
        return self.train_s / len(self.iteration_s) if self.iteration_s else math.nan
