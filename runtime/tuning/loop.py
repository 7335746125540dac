"""The one tuning loop: a scheduler, an executor and a search space under a clock.

The loop is HyperSched's Algorithm 1 made event-driven (HyperDrive's
"schedule-as-it-goes", 4.2): whenever atoms are free it asks the scheduler
what to start (``choose``); it waits for the executor's next event; every
result goes to the scheduler (``on_result``), whose answer it carries out:

- CONTINUE: ask ``target_atoms``; if it differs from the trial's atoms, resize
  (suspend with a checkpoint, relaunch on the new atoms: HyperSched 4.3), else
  let the trial run its next iteration;
- PAUSE: suspend with a checkpoint (the trial may resume later, anywhere);
- STOP: terminate.

A trial that reaches `max_iterations` (R) completes. A trial that crashes, or
reports a NaN or infinite metric, is marked FAILED with the reason and the
experiment goes on (``fail_fast=True`` raises `TrialFailedError` instead). The
experiment ends at the deadline, when a result reaches `target` (HyperDrive's
time-to-target experiments), or when nothing runs and the scheduler starts
nothing more. Trials still running then are terminated.

Executor interface (small on purpose; the simulated executor is in
``executor_sim.py``, a real one launches processes):

- ``clock``: the `Clock` the experiment runs on;
- ``launch(trial, atoms)``: start the trial on `atoms` atoms, restoring
  ``trial.checkpoint`` when it is not None; the first report after a launch
  carries the start-up time in ``overhead_s``;
- ``proceed(trial)``: run the next iteration (after a CONTINUE);
- ``suspend(trial) -> checkpoint``: stop at the iteration boundary, return a
  checkpoint reference that a later ``launch`` restores;
- ``terminate(trial)``: stop and discard;
- ``next_event(until) -> Report | Crash | None``: wait for the next result or
  crash of a running trial; None if none arrives by clock time `until` (then
  the clock reads `until`) or if nothing runs.

The loop also measures the scheduler's own decision time per reported result
(``ExperimentResult.decision_s``).

Stopping early (Ctrl-C, SIGTERM: ``stop``): the loop asks `stop()` between
events; once it gives a reason, no trial starts, each running trial finishes
the iteration it is in (its result is heard as any other) and is suspended
with a checkpoint, marked ``interrupted`` (its scheduler did not pause it),
unless its scheduler stops or pauses it or it completes; what is still
running after ``stop_grace_s`` is stopped where it is, as it is when
anything raises out of the loop (a crash of the driver, a second Ctrl-C).
Trials running at the experiment's own end (deadline, target, nothing
left) are terminated for good.

Resuming (``thrifty tune --resume``): an experiment can start from a
previous run's trials (`Resumed`). Finished trials keep their state; the
trials that were running when the run ended are launched again first, on
the atoms they held, from their last checkpoint (or from the start without
one); paused trials resume from their checkpoints when the scheduler
promotes them; other trials without a checkpoint start again as new
configurations (before any fresh draw). The scheduler is rebuilt by
replaying what it heard in the run (`Resumed.steps`: launches through
``on_trial_start``, results through ``on_result`` and ``target_atoms``,
ends through ``on_trial_end``; its answers are ignored: what happened is
recorded), each shown as the scheduler saw it: the trials in the states
they had (the running ones running, on their atoms), every trial's history
up to that result and the clock at its arrival (a forecast from a trial's
whole curve would not be the one that was made). A trial that was running
at the end and whose last kept step is a result (executors with durable
iterations checkpoint every result, so a kill can fall between a result
and the answer to it) gets that answer carried out (`_settle`): it
completes, stops, pauses, or is launched first on the atoms asked. Then
``on_restored()`` lets the scheduler make its queues agree with the
trials' states. Time already spent counts against the deadline.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from thrifty.core.errors import ProblemError, ThriftyError
from thrifty.runtime.tuning.schedulers.base import Decision, ExperimentState, Scheduler, Start, check_positive
from thrifty.runtime.tuning.clock import Clock
from thrifty.runtime.tuning.search_space import SearchSpace
from thrifty.runtime.tuning.trial import ENDED, Crash, Report, Trial, TrialState

__all__ = ["Executor", "Experiment", "ExperimentResult", "Resumed", "ReplayStep", "TrialFailedError",
           "SchedulerError", "run_experiment"]

STOP_POLL_S = 0.2     # how often a run with a `stop` to watch asks it while waiting for events
STOP_GRACE_S = 30.0   # how long running trials may take to finish their iteration once a stop is asked


class TrialFailedError(ThriftyError, RuntimeError):
    """A trial failed and the experiment was asked to fail fast."""


class SchedulerError(ThriftyError, RuntimeError):
    """A scheduler answered something the loop cannot carry out (a bug in the scheduler)."""


class Executor(Protocol):
    clock: Clock

    def launch(self, trial: Trial, atoms: int, where: Mapping[str, int] | None = None) -> None:
        """Start or resume `trial` on `atoms` atoms; `where` (machine id ->
        atoms) is the placement a plan chose, where the executor places ranks."""

    def proceed(self, trial: Trial) -> None: ...

    def suspend(self, trial: Trial) -> Any: ...

    def terminate(self, trial: Trial) -> None: ...

    def next_event(self, until: float | None) -> Report | Crash | None:
        """The next event that came by `until` (clock time; None: whenever it comes), or None when none
        did: an event that came after `until` is given at a later call, so none after the experiment's
        deadline counts toward it."""


@dataclass
class ExperimentResult:
    """What an experiment did. Times are clock times (seconds or time units)."""

    trials: list[Trial]
    ended_at: float
    end_reason: str                      # "deadline" | "target" | "exhausted"
    best_trial_id: int | None
    best_metric: float
    time_to_target: float | None
    results: int
    decision_s: float                    # scheduler time spent in on_result + target_atoms
    failed: dict[int, str] = field(default_factory=dict)

    @property
    def decision_s_per_result(self) -> float:
        return self.decision_s / self.results if self.results else math.nan

    @property
    def best_config(self) -> dict[str, Any] | None:
        return None if self.best_trial_id is None else self.trials[self.best_trial_id].config

    def count(self, state: TrialState) -> int:
        return sum(t.state == state for t in self.trials)


@dataclass(frozen=True)
class ReplayStep:
    """One thing the scheduler of a previous run heard: a trial's ``launch``
    (on `atoms`), a ``result`` (`report`), a ``pause`` it asked for, or the
    trial's ``end`` (in `state`); `at` is relative to the experiment's start."""

    kind: str
    trial_id: int
    at: float
    atoms: int = 0
    report: Report | None = None
    state: TrialState | None = None


@dataclass
class Resumed:
    """A previous run of the same experiment, to go on from.

    `trials` are numbered 0..n-1 in creation order, each in the state it
    reached (COMPLETED, TERMINATED, FAILED, PAUSED with its `checkpoint`, or
    PENDING: to start again); `results` are the kept trials' reports in
    arrival order; `steps` what the run's scheduler heard, in order (None:
    only the results are known, replayed as if each trial ran alone);
    `running` the trials that were running when the run ended (trial id ->
    atoms), launched again first; `dropped` the results of those trials that
    were newer than their last checkpoint, left out (trial id -> first and
    last iteration): they are trained again. Every time (`reported_at`, `created_at`,
    `ended_at`, `Report.at`) is relative to the experiment's start;
    `elapsed_s` is how long the previous runs took together.
    """

    trials: list[Trial]
    results: list[Report]
    elapsed_s: float
    steps: list[ReplayStep] | None = None
    running: dict[int, int] = field(default_factory=dict)
    dropped: dict[int, tuple[int, int]] = field(default_factory=dict)


class Experiment(ExperimentState):
    """The loop's state and the read-only view schedulers get (`ExperimentView`).

    `keep_checkpoints`: a trial that reaches `max_iterations` is suspended
    (its final checkpoint kept in ``trial.checkpoint``) instead of
    terminated, so that the best trial's model can be kept."""

    def __init__(self, scheduler: Scheduler, executor: Executor, search_space: SearchSpace, *,
                 total_atoms: int, max_iterations: int, deadline: float | None = None,
                 target: float | None = None, fail_fast: bool = False, resume: Resumed | None = None,
                 keep_checkpoints: bool = False, stop: Callable[[], str | None] | None = None,
                 stop_grace_s: float = STOP_GRACE_S):
        check_positive("total_atoms", total_atoms, integer=True)
        check_positive("max_iterations", max_iterations, integer=True)
        if deadline is not None:
            check_positive("deadline", deadline)
        if target is not None and not math.isfinite(target):
            raise ProblemError(f"`target` is {target!r}, but must be a finite number", path="target")
        if not search_space.has_more() and resume is None:
            raise ProblemError("the search space is empty: it produced no configuration", path="search_space")
        started_at = executor.clock.now() - (resume.elapsed_s if resume is not None else 0.0)
        super().__init__(executor.clock, total_atoms, max_iterations,
                         None if deadline is None else started_at + deadline)
        self.scheduler = scheduler
        self.executor = executor
        self.search_space = search_space
        self.started_at = started_at
        self.target = target
        self.fail_fast = fail_fast
        self._best: tuple[float, int] | None = None
        self._time_to_target: float | None = None
        self._results = 0
        self._decision_s = 0.0
        self._failed: dict[int, str] = {}
        self.keep_checkpoints = keep_checkpoints
        self._resume = resume
        self._requeued: list[int] = []   # trials to start again, before any new configuration
        self._relaunch: list[tuple[int, int]] = []  # (trial, atoms) running when the resumed run ended
        self.stop = stop
        self.stop_grace_s = stop_grace_s
        if resume is not None:
            self._restore(resume)

    # --- ExperimentView (the rest is `ExperimentState`) ----------------------------
    def has_more_configs(self) -> bool:
        return bool(self._requeued) or self.search_space.has_more()

    # --- resuming ---------------------------------------------------------------------
    def _restore(self, resume: Resumed) -> None:
        t0 = self.started_at
        for i, trial in enumerate(resume.trials):
            if trial.trial_id != i:
                raise ProblemError(f"resumed trial {i} has id {trial.trial_id}; ids must be 0, 1, 2, ...",
                                   path=f"trials[{i}]")
            if trial.state == TrialState.RUNNING:
                raise ProblemError(f"resumed trial {i} is running; it must be paused, pending or finished",
                                   path=f"trials[{i}]")
            trial.created_at += t0
            trial.reported_at = [t0 + at for at in trial.reported_at]
            if trial.ended_at is not None:
                trial.ended_at += t0
            if trial.trial_id in resume.running and trial.state in (TrialState.PENDING, TrialState.PAUSED):
                self._relaunch.append((trial.trial_id, resume.running[trial.trial_id]))
            elif trial.state == TrialState.PENDING:
                self._requeued.append(trial.trial_id)
            if trial.state == TrialState.FAILED:
                self._failed[trial.trial_id] = trial.error or "failed"
            self.trial_list.append(trial)

    def _replay(self, resume: Resumed) -> None:
        """The recorded steps through the freshly bound scheduler, as it heard them in the run: each
        launch (`on_trial_start`), each result (`on_result`, then `target_atoms` after a CONTINUE; the
        answers are ignored: what happened is recorded), each end (`on_trial_end`), with the trials in the
        states they had then (running ones in `running_trials`, on their atoms), every trial's history up
        to that result and the clock at its arrival (a forecast from a trial's whole curve, or with the
        time left at the restart, is not what was decided); then `on_restored`."""
        steps = resume.steps if resume.steps is not None else _result_steps(resume, self.trial_list)
        whole = {trial.trial_id: _History.of(trial) for trial in self.trial_list}
        final = {trial.trial_id: (trial.state, trial.iterations_since_launch) for trial in self.trial_list}
        for trial in self.trial_list:
            whole[trial.trial_id].show(trial, 0)
            trial.state = TrialState.PENDING
        answers: dict[int, tuple[Decision, int] | None] = {}  # each trial's last step, if a result: its answer
        live, self.clock = self.clock, _AtResult()
        try:
            for step in steps:
                trial = self.trial_list[step.trial_id]
                self.clock.at = self.started_at + step.at
                answers[trial.trial_id] = None
                if step.kind == "launch":
                    self._replay_release(trial, TrialState.PAUSED)
                    trial.state, trial.atoms, trial.iterations_since_launch = TrialState.RUNNING, step.atoms, 0
                    self.running[trial.trial_id] = trial
                    self.used_atoms += step.atoms
                    self.scheduler.on_trial_start(trial)
                elif step.kind == "result" and step.report is not None:
                    answers[trial.trial_id] = self._replay_result(trial, step.report, whole[trial.trial_id])
                elif step.kind == "pause":
                    self._replay_release(trial, TrialState.PAUSED)
                elif step.kind == "end":
                    self._replay_release(trial, step.state or TrialState.TERMINATED)
                    self.scheduler.on_trial_end(trial)
        finally:
            self.clock = live
            self.running.clear()
            self.used_atoms = 0
            for trial in self.trial_list:
                whole[trial.trial_id].show(trial, None)
                trial.state, trial.iterations_since_launch = final[trial.trial_id]
                trial.atoms = 0
        self._settle({tid: answer for tid, answer in answers.items() if answer is not None})
        self.scheduler.on_restored()

    def _settle(self, answers: dict[int, tuple[Decision, int]]) -> None:
        """The trials that were running when the resumed run ended, whose last step is a result: the run's
        scheduler may never have carried out its answer to it (the driver was killed or crashed in between;
        with durable iterations a trial's every result is kept), so the answer the replay gave (`answers`:
        decision and target atoms) is carried out now, as `_on_report` would have: a trial at
        `max_iterations` completes, STOP ends it, PAUSE leaves it paused at its checkpoint (both recorded
        through the executor, for which it does not run), CONTINUE launches it first on the atoms asked."""
        relaunch = []
        for trial_id, atoms in self._relaunch:
            trial = self.trial_list[trial_id]
            answer = answers.get(trial_id)
            if answer is None or trial.state != TrialState.PAUSED:
                relaunch.append((trial_id, atoms))
                continue
            decision, target = answer
            if trial.iteration < self.max_iterations and decision == Decision.CONTINUE:
                relaunch.append((trial_id, target if isinstance(target, int) and target >= 1 else atoms))
                continue
            trial.interrupted = False
            if trial.iteration >= self.max_iterations:
                state = TrialState.COMPLETED
            else:
                state = TrialState.TERMINATED if decision == Decision.STOP else TrialState.PAUSED
            if state == TrialState.PAUSED or (state == TrialState.COMPLETED and self.keep_checkpoints):
                trial.checkpoint = self.executor.suspend(trial)
            else:
                self.executor.terminate(trial)
            trial.state = state
            if state in ENDED:
                trial.ended_at = self.clock.now()
                self.scheduler.on_trial_end(trial)
        self._relaunch = relaunch

    def _replay_result(self, trial: Trial, report: Report, history: _History) -> tuple[Decision, int]:
        report = Report(report.trial_id, report.iteration, report.metric, report.iteration_s, report.atoms,
                        self.started_at + report.at, report.overhead_s)
        if trial.trial_id not in self.running:  # a result without its launch (only results are known)
            trial.state, trial.atoms = TrialState.RUNNING, report.atoms
            self.running[trial.trial_id] = trial
            self.used_atoms += report.atoms
        history.show(trial, report.iteration)
        trial.iterations_since_launch += 1
        if trial.iterations_since_launch == 1 and report.overhead_s > 0:  # the first result after a launch
            self.overheads.add(report.overhead_s)
        self._count(report)
        decision = self.scheduler.on_result(trial, report)
        return decision, self.scheduler.target_atoms(trial) if decision == Decision.CONTINUE else trial.atoms

    def _replay_release(self, trial: Trial, state: TrialState) -> None:
        if self.running.pop(trial.trial_id, None) is not None:
            self.used_atoms -= trial.atoms
        trial.state, trial.atoms = state, 0

    # --- the loop -------------------------------------------------------------------
    def run(self) -> ExperimentResult:
        self.scheduler.bind(self)
        if self._resume is not None:
            self._replay(self._resume)
        ended = False
        try:
            try:
                reason = self._loop()
            except KeyboardInterrupt:  # asked to stop at once (a second Ctrl-C): what runs stops where it is
                if self.stop is None:
                    raise
                reason = self.stop() or "interrupted"
            ended = reason in ("deadline", "target", "exhausted")
        finally:
            # trials running at the experiment's own end are over; at an interruption, or when this raised,
            # they are not: a resumed run launches them again (from their last checkpoint)
            for trial in list(self.running.values()):
                trial.interrupted = not ended
                self.executor.terminate(trial)
                self._release(trial, TrialState.TERMINATED if ended else _stopped(trial))
        return self._result(reason)

    def _next_event(self) -> Report | Crash | None:
        """The executor's next event; with a `stop` to watch, it is asked at least every `STOP_POLL_S`."""
        if self.stop is None:
            return self.executor.next_event(self.deadline)
        until = self.clock.now() + STOP_POLL_S
        return self.executor.next_event(until if self.deadline is None else min(until, self.deadline))

    def _stopping(self) -> str | None:
        return self.stop() if self.stop is not None else None

    def _loop(self) -> str:
        self._fill()
        while self.running and self._time_to_target is None:
            stopped = self._stopping()
            if stopped is not None:
                self._drain()
                return stopped
            event = self._next_event()
            if event is None:
                if self.deadline is not None and self.clock.now() >= self.deadline:
                    return "deadline"
                if self.stop is not None:
                    continue
                raise SchedulerError("the executor returned no event while trials were running")
            self._on_event(event)
            if self._time_to_target is None:
                self._fill()
        if self._time_to_target is not None:
            return "target"
        stopped = self._stopping()
        if stopped is not None:
            return stopped
        if self.deadline is not None and self.clock.now() >= self.deadline:
            return "deadline"
        return "exhausted"

    def _on_event(self, event: Report | Crash, stopping: bool = False) -> None:
        if isinstance(event, Crash):
            self._fail(self.running[event.trial_id], event.message)
        else:
            self._on_report(event, stopping)

    def _drain(self) -> None:
        """The run is asked to stop: each running trial finishes the iteration it is in (its result is
        kept and heard as any other), then is suspended with a checkpoint, marked `interrupted`, unless its
        scheduler stops or pauses it or it completes; after `stop_grace_s`, the rest are stopped where they
        are (`run`) and go back to their last checkpoint when resumed."""
        limit = self.clock.now() + self.stop_grace_s
        while self.running and self.clock.now() < limit:
            event = self.executor.next_event(min(limit, self.clock.now() + STOP_POLL_S))
            if event is not None:
                self._on_event(event, stopping=True)

    def _fill(self) -> None:
        """Ask the scheduler to use free atoms until it declines (HyperSched Algorithm 1, line 7-9); the
        trials that were running when a resumed run ended go first, on the atoms they held."""
        def open_() -> bool:
            return (self.free_atoms > 0 and (self.deadline is None or self.clock.now() < self.deadline)
                    and self._stopping() is None)

        while self._relaunch and open_():
            trial_id, atoms = self._relaunch.pop(0)
            if self.trial_list[trial_id].state in (TrialState.PAUSED, TrialState.PENDING):
                self._launch(self.trial_list[trial_id], max(1, min(atoms, self.free_atoms)))
        while open_():
            start = self.scheduler.choose()
            if start is None:
                return
            trial = self._trial_to_start(start)
            if trial is None:
                return
            self._launch(trial, start.atoms)

    def _trial_to_start(self, start: Start) -> Trial | None:
        name = type(self.scheduler).__name__
        if not isinstance(start.atoms, int) or not 1 <= start.atoms <= self.free_atoms:
            raise SchedulerError(f"{name} asked for {start.atoms!r} atoms, but {self.free_atoms} are free")
        if start.trial_id is None:
            if self._requeued:  # a trial of a resumed run that starts again
                return self.trial_list[self._requeued.pop(0)]
            config = self.search_space.next_config()
            if config is None:
                return None
            trial = Trial(trial_id=len(self.trial_list), config=config, created_at=self.clock.now())
            self.trial_list.append(trial)
            return trial
        if not 0 <= start.trial_id < len(self.trial_list):
            raise SchedulerError(f"{name} asked to start trial {start.trial_id}, which does not exist")
        trial = self.trial_list[start.trial_id]
        if trial.state not in (TrialState.PAUSED, TrialState.PENDING):
            raise SchedulerError(f"{name} asked to start trial {trial.trial_id}, which is {trial.state.value}")
        return trial

    def _launch(self, trial: Trial, atoms: int) -> None:
        trial.state = TrialState.RUNNING
        trial.interrupted = False
        trial.atoms = atoms
        trial.launches += 1
        trial.iterations_since_launch = 0
        self.used_atoms += atoms
        self.running[trial.trial_id] = trial
        self.executor.launch(trial, atoms)
        self.scheduler.on_trial_start(trial)

    def _release(self, trial: Trial, state: TrialState) -> None:
        self.used_atoms -= trial.atoms
        trial.atoms = 0
        trial.state = state
        del self.running[trial.trial_id]
        if state in ENDED:
            trial.ended_at = self.clock.now()
            self.scheduler.on_trial_end(trial)

    def _fail(self, trial: Trial, message: str) -> None:
        trial.error = message
        self._failed[trial.trial_id] = message
        self.executor.terminate(trial)
        self._release(trial, TrialState.FAILED)
        if self.fail_fast:
            raise TrialFailedError(f"trial {trial.trial_id} ({trial.config}) failed: {message}")

    def _on_report(self, report: Report, stopping: bool = False) -> None:
        trial = self.running[report.trial_id]
        metric = report.metric
        if not isinstance(metric, (int, float)) or not math.isfinite(metric):
            self._fail(trial, f"reported metric {metric!r} at iteration {report.iteration}")
            return
        trial.metrics.append(float(metric))
        trial.iteration_s.append(report.iteration_s)
        trial.iteration_atoms.append(report.atoms)
        trial.reported_at.append(report.at)
        trial.train_s += report.iteration_s
        if report.checkpoint is not None:  # the iteration is durable
            trial.checkpoint = report.checkpoint
        trial.iterations_since_launch += 1
        if trial.iterations_since_launch == 1:  # the first result after a launch carries its start-up time
            trial.overheads_s.append(report.overhead_s)
            self.overheads.add(report.overhead_s)
        self._count(report)

        t0 = time.perf_counter()
        decision = self.scheduler.on_result(trial, report)
        atoms = self.scheduler.target_atoms(trial) if decision == Decision.CONTINUE else trial.atoms
        self._decision_s += time.perf_counter() - t0

        if trial.iteration >= self.max_iterations:
            if self.keep_checkpoints:
                trial.checkpoint = self.executor.suspend(trial)
            else:
                self.executor.terminate(trial)
            self._release(trial, TrialState.COMPLETED)
        elif decision == Decision.STOP:
            self.executor.terminate(trial)
            self._release(trial, TrialState.TERMINATED)
        elif decision == Decision.PAUSE:
            trial.checkpoint = self.executor.suspend(trial)
            self._release(trial, TrialState.PAUSED)
        elif decision == Decision.CONTINUE and stopping:  # the run stops: keep where the trial is
            trial.interrupted = True
            trial.checkpoint = self.executor.suspend(trial)
            self._release(trial, TrialState.PAUSED)
        elif decision == Decision.CONTINUE:
            self._continue(trial, atoms)
        else:
            raise SchedulerError(f"{type(self.scheduler).__name__} answered {decision!r}; "
                                 "expected Decision.CONTINUE, PAUSE or STOP")

    def _count(self, report: Report) -> None:
        """The best result, the time to target and the number of results."""
        metric = float(report.metric)
        if self._best is None or metric > self._best[0]:
            self._best = (metric, report.trial_id)
        if self.target is not None and self._time_to_target is None and metric >= self.target:
            self._time_to_target = report.at - self.started_at
        self._results += 1

    def _continue(self, trial: Trial, atoms: int) -> None:
        if not isinstance(atoms, int) or atoms < 1:
            raise SchedulerError(f"{type(self.scheduler).__name__} wants {atoms!r} atoms for trial "
                                 f"{trial.trial_id}; at least 1 is needed to continue")
        atoms = min(atoms, trial.atoms + self.free_atoms)
        if atoms == trial.atoms:
            self.executor.proceed(trial)
            return
        # HyperSched 4.3: checkpoint, stop, relaunch with the new allocation, restore
        trial.checkpoint = self.executor.suspend(trial)
        trial.resizes += 1
        self.used_atoms -= trial.atoms
        del self.running[trial.trial_id]
        self._launch(trial, atoms)

    def _result(self, reason: str) -> ExperimentResult:
        best_metric, best_id = self._best if self._best is not None else (-math.inf, None)
        return ExperimentResult(
            trials=list(self.trial_list), ended_at=self.clock.now() - self.started_at, end_reason=reason,
            best_trial_id=best_id, best_metric=best_metric, time_to_target=self._time_to_target,
            results=self._results, decision_s=self._decision_s, failed=dict(self._failed))


@dataclass(frozen=True)
class _History:
    """A resumed trial's recorded per-iteration history, shown up to an iteration while it is replayed."""

    metrics: list[float]
    iteration_s: list[float]
    iteration_atoms: list[int]
    reported_at: list[float]

    @classmethod
    def of(cls, trial: Trial) -> _History:
        return cls(list(trial.metrics), list(trial.iteration_s), list(trial.iteration_atoms), list(trial.reported_at))

    def show(self, trial: Trial, iterations: int | None) -> None:
        """`trial` as it stood after `iterations` (None: all of them)."""
        trial.metrics = self.metrics[:iterations]
        trial.iteration_s = self.iteration_s[:iterations]
        trial.iteration_atoms = self.iteration_atoms[:iterations]
        trial.reported_at = self.reported_at[:iterations]
        trial.train_s = float(sum(trial.iteration_s))


def _stopped(trial: Trial) -> TrialState:
    """Where a trial stopped by an interruption is: at its last checkpoint, or back to the start."""
    return TrialState.PAUSED if trial.checkpoint is not None else TrialState.PENDING


def _result_steps(resume: Resumed, trials: list[Trial]) -> list[ReplayStep]:
    """The steps of a record that kept only results: each result, each ended trial's end after its last."""
    last = {r.trial_id: r.iteration for r in resume.results}
    steps = []
    for r in resume.results:
        steps.append(ReplayStep("result", r.trial_id, r.at, atoms=r.atoms, report=r))
        trial = trials[r.trial_id]
        if trial.state in ENDED and r.iteration == last[r.trial_id]:
            steps.append(ReplayStep("end", r.trial_id, r.at, state=trial.state))
    steps += [ReplayStep("end", t.trial_id, 0.0, state=t.state) for t in trials
              if t.state in ENDED and t.trial_id not in last]
    return steps


class _AtResult:
    """The clock a replay shows: the arrival time of the result being replayed (it never waits)."""

    at = 0.0

    def now(self) -> float:
        return self.at

    def sleep_until(self, t: float) -> None:
        raise RuntimeError("a replay does not wait")


def run_experiment(scheduler: Scheduler, executor: Executor, search_space: SearchSpace, *,
                   total_atoms: int, max_iterations: int, deadline: float | None = None,
                   target: float | None = None, fail_fast: bool = False, resume: Resumed | None = None,
                   keep_checkpoints: bool = False, stop: Callable[[], str | None] | None = None,
                   stop_grace_s: float = STOP_GRACE_S) -> ExperimentResult:
    """Run one tuning experiment to its end (see the module docstring).

    `deadline` is relative to the experiment's start (the clock's time now,
    less ``resume.elapsed_s``); `target` ends the experiment at the first
    result that reaches it. `stop()`, asked between events, returns a reason
    (the experiment's `end_reason`) when the run must stop early: running
    trials finish their iteration and are suspended (`Experiment._drain`).
    """
    return Experiment(scheduler, executor, search_space, total_atoms=total_atoms, max_iterations=max_iterations,
                      deadline=deadline, target=target, fail_fast=fail_fast, resume=resume,
                      keep_checkpoints=keep_checkpoints, stop=stop, stop_grace_s=stop_grace_s).run()
