"""The scheduler API of the tuning runtime.

It follows HyperDrive's policy up-calls (4.2) and the shape of Syne Tune's
and Ray Tune's trial schedulers:

- ``choose()`` — HyperDrive's *AllocateJobs*, HyperSched's entrance policy
  plus ``start_next_trial`` (Algorithm 1): asked whenever atoms are free,
  the scheduler answers which trial to start or resume and on how many atoms
  (`Start`), or None to leave the atoms idle for now;
- ``on_result(trial, report)`` — *ApplicationStat* + *OnIterationFinish*:
  the scheduler hears every reported result and answers `Decision.CONTINUE`,
  `PAUSE` (suspend with a checkpoint, may resume later anywhere) or `STOP`;
- ``target_atoms(trial)`` — after a CONTINUE, how many atoms the trial
  should hold from now on (HyperSched's dynamic allocation, 4.3); the loop
  checkpoints and relaunches the trial when the answer differs;
- ``on_trial_start(trial)`` / ``on_trial_end(trial)`` — notifications of a
  launch (new or resumed) and of a final state (completed, terminated, failed).

A scheduler reads the experiment only through `ExperimentView` (time, atoms,
trials, deadline, measured overheads), so it cannot tell a real clock from a
virtual one. Metrics are higher-is-better.
"""

from __future__ import annotations

import heapq
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from thrifty.core.errors import ProblemError
from thrifty.runtime.tuning.trial import Report, Trial

__all__ = [
    "Decision", "Start", "ExperimentView", "ExperimentState", "TrialsView", "Scheduler", "RunningMedian",
    "rung_milestones", "check_positive", "check_eta", "check_min_max_iterations", "check_atoms_per_trial",
    "ScalingFunction", "SCALINGS", "scaling_function",
]


class Decision(str, Enum):
    CONTINUE = "continue"
    PAUSE = "pause"
    STOP = "stop"


@dataclass(frozen=True)
class Start:
    """What to run on free atoms: a paused or pending trial (`trial_id`), or a
    new configuration from the search space (`trial_id=None`), on `atoms` atoms."""

    trial_id: int | None = None
    atoms: int = 1


class ExperimentView(Protocol):
    """What a scheduler may read about the running experiment.

    `deadline` is the clock time at which the experiment ends (None: no
    deadline); `time_left()` is inf without one. `trials` maps trial id to
    `Trial` (read, never write); `median_overhead_s()` is the median measured
    start-up/resize time (NaN before any launch has reported).
    """

    total_atoms: int
    max_iterations: int
    deadline: float | None

    def now(self) -> float: ...

    def time_left(self) -> float: ...

    @property
    def free_atoms(self) -> int: ...

    @property
    def trials(self) -> Mapping[int, Trial]: ...

    def running_trials(self) -> Sequence[Trial]: ...

    def has_more_configs(self) -> bool: ...

    def median_overhead_s(self) -> float: ...


class Scheduler(ABC):
    """Base class of every trial scheduler (see the module docstring)."""

    name = "scheduler"

    def __init__(self) -> None:
        self._experiment: ExperimentView | None = None

    @property
    def experiment(self) -> ExperimentView:
        if self._experiment is None:
            raise RuntimeError(f"{type(self).__name__} is not bound to an experiment; the loop calls bind() first")
        return self._experiment

    def bind(self, experiment: ExperimentView) -> None:
        """Called once by the loop before the first `choose()`."""
        self._experiment = experiment

    @abstractmethod
    def choose(self) -> Start | None:
        """Which trial to start or resume on the free atoms, or None."""

    @abstractmethod
    def on_result(self, trial: Trial, report: Report) -> Decision:
        """Hear one result; answer continue, pause or stop."""

    def target_atoms(self, trial: Trial) -> int:
        """Atoms `trial` should hold after a CONTINUE (default: keep them)."""
        return trial.atoms

    def on_trial_start(self, trial: Trial) -> None:  # noqa: B027 - an optional hook
        """`trial` was just launched, new or resumed."""

    def on_trial_end(self, trial: Trial) -> None:  # noqa: B027 - an optional hook
        """`trial` reached a final state (completed, terminated or failed)."""

    def on_restored(self) -> None:  # noqa: B027 - an optional hook
        """A resumed experiment replayed its recorded results through `on_result`
        (whose answers were ignored): make internal queues agree with the
        trials' recorded states (``experiment.trials``)."""


class RunningMedian:
    """Median of a growing sample in O(log n) per insertion (two heaps)."""

    def __init__(self) -> None:
        self._low: list[float] = []   # max-heap (negated) of the lower half
        self._high: list[float] = []  # min-heap of the upper half

    def __len__(self) -> int:
        return len(self._low) + len(self._high)

    def add(self, x: float) -> None:
        if self._low and x > -self._low[0]:
            heapq.heappush(self._high, x)
        else:
            heapq.heappush(self._low, -x)
        if len(self._low) > len(self._high) + 1:
            heapq.heappush(self._high, -heapq.heappop(self._low))
        elif len(self._high) > len(self._low):
            heapq.heappush(self._low, -heapq.heappop(self._high))

    def median(self, default: float = math.nan) -> float:
        if not self._low:
            return default
        if len(self._low) > len(self._high):
            return -self._low[0]
        return (-self._low[0] + self._high[0]) / 2.0


class TrialsView(Mapping[int, Trial]):
    """Trials by id, read-only (ids are 0, 1, 2, ... in creation order)."""

    def __init__(self, trials: list[Trial]):
        self._trials = trials

    def __getitem__(self, trial_id: int) -> Trial:
        if not isinstance(trial_id, int) or not 0 <= trial_id < len(self._trials):
            raise KeyError(trial_id)
        return self._trials[trial_id]

    def __iter__(self):
        return iter(range(len(self._trials)))

    def __len__(self) -> int:
        return len(self._trials)


class ExperimentState:
    """The bookkeeping behind an `ExperimentView`, shared by the loop and the
    Ray adapter: the clock, the atoms in use, the trials (by id, in creation
    order), the running ones and the measured overheads. Subclasses say
    whether more configurations can start (`has_more_configs`)."""

    def __init__(self, clock, total_atoms: int, max_iterations: int, deadline: float | None):
        self.clock = clock
        self.total_atoms = total_atoms
        self.max_iterations = max_iterations
        self.deadline = deadline  # clock time, or None
        self.trial_list: list[Trial] = []
        self.running: dict[int, Trial] = {}
        self.used_atoms = 0
        self.overheads = RunningMedian()

    def now(self) -> float:
        return self.clock.now()

    def time_left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - self.clock.now()

    @property
    def free_atoms(self) -> int:
        return self.total_atoms - self.used_atoms

    @property
    def trials(self) -> Mapping[int, Trial]:
        return TrialsView(self.trial_list)

    def running_trials(self) -> Sequence[Trial]:
        return list(self.running.values())

    def has_more_configs(self) -> bool:
        raise NotImplementedError

    def median_overhead_s(self) -> float:
        """Median measured start-up / resize overhead so far (HyperSched's T_o); NaN before any."""
        return self.overheads.median()



def check_positive(name: str, value: float, *, integer: bool = False) -> None:
    """`value` must be a positive number (an integer if asked)."""
    if integer and (not isinstance(value, int) or isinstance(value, bool)):
        raise ProblemError(f"`{name}` is {value!r}, but must be a positive integer", path=name)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ProblemError(f"`{name}` is {value!r}, but must be a positive number", path=name)


def check_eta(eta: float) -> None:
    if not isinstance(eta, (int, float)) or isinstance(eta, bool) or not math.isfinite(eta) or eta <= 1:
        raise ProblemError(f"`eta` is {eta!r}, but must be greater than 1", path="eta")


def check_min_max_iterations(r: int, R: int | None) -> None:
    check_positive("min_iterations", r, integer=True)
    if R is not None:
        check_positive("max_iterations", R, integer=True)
        if r > R:
            raise ProblemError(f"`min_iterations` (r) {r} is larger than `max_iterations` (R) {R}",
                               path="min_iterations")


def check_atoms_per_trial(atoms_per_trial: int, total_atoms: int) -> None:
    check_positive("atoms_per_trial", atoms_per_trial, integer=True)
    if atoms_per_trial > total_atoms:
        raise ProblemError(f"`atoms_per_trial` {atoms_per_trial} is larger than the experiment's "
                           f"{total_atoms} atoms", path="atoms_per_trial")


def rung_milestones(r: int, R: int, eta: float) -> list[int]:
    """Iterations at which trials are compared: r, r*eta, r*eta^2, ... below R
    (HyperSched 3.3; at R a trial completes). Non-integer milestones round up."""
    milestones: list[int] = []
    i = 0
    while True:
        m = math.ceil(r * eta**i - 1e-9)
        if m >= R:
            return milestones
        if not milestones or m > milestones[-1]:
            milestones.append(m)
        i += 1


ScalingFunction = Callable[[int], float]

# HyperSched 6.0.1: training progress per unit time on `a` atoms, relative to one atom
SCALINGS: dict[str, ScalingFunction] = {
    "LINEAR": lambda a: float(a),
    "SQRT": lambda a: math.sqrt(a),
    "NONE": lambda a: 1.0,
}


def scaling_function(spec: str | ScalingFunction) -> ScalingFunction:
    """A scaling function s(atoms) -> relative progress rate, by name or as given."""
    if callable(spec):
        return spec
    key = str(spec).upper()
    if key not in SCALINGS:
        raise ProblemError(f"unknown scaling {spec!r}; known: {', '.join(SCALINGS)}", path="scaling")
    return SCALINGS[key]
