"""HyperSched and POP (and any thrifty scheduler) as Ray Tune trial schedulers (the `ray` extra).

`TuneScheduler` subclasses Ray Tune's `TrialScheduler` and runs one of our
schedulers (`thrifty.runtime.tuning.schedulers.base.Scheduler`) inside Ray Tune's trial
controller, so that Ray users get HyperSched (SoCC 2019) and POP (HyperDrive,
Middleware 2017) on a Ray cluster::

    from ray import tune
    from thrifty.runtime.tuning.schedulers.ray_tune import HyperSchedScheduler

    scheduler = HyperSchedScheduler(metric="accuracy", mode="max", total_atoms=8, max_iterations=100,
                                    deadline_s=600, min_iterations=1, eta=4, scaling="SQRT")
    tune.Tuner(tune.with_resources(train_fn, {"cpu": 1}), param_space=...,
               tune_config=tune.TuneConfig(scheduler=scheduler, num_samples=32, reuse_actors=False)).fit()

How Ray Tune's API maps onto ours (Ray 2.x, `ray.tune.schedulers.TrialScheduler`):

- ``on_trial_add``: a configuration from Ray's search algorithm is *held*
  (its status set to PAUSED before the controller files it), so that Ray does
  not start it by itself: our scheduler's ``choose()`` decides what starts, as
  the entrance policy needs (HyperSched 4.2). `has_more_configs()` is true
  while held configurations remain;
- ``choose_trial_to_run``: a trial our scheduler started and Ray has not
  taken up yet is returned again (Ray asks for idempotence); then a resize in
  progress (below); else ``choose()`` is asked, on the atoms not held by
  running trials: ``Start(None, a)`` launches the next held configuration,
  ``Start(id, a)`` resumes a paused trial from its checkpoint. Before a trial
  is returned its resources are set to ``a`` atoms (`resources_per_atom`
  times a, one bundle). When the deadline has passed, or nothing runs and the
  scheduler starts nothing more, the held and paused trials are stopped so
  that Ray's experiment ends (the loop's "deadline" and "exhausted" ends);
- ``on_trial_result``: becomes a `Report` (the metric, negated for
  ``mode="min"``; ``time_this_iter_s``; the atoms; the start-up overhead of
  the first result after a launch, measured as the time from the launch
  request to that result minus its iteration time) and ``on_result`` answers
  CONTINUE, PAUSE or STOP. After a CONTINUE, ``target_atoms`` may differ from
  the trial's atoms: the trial is paused (Ray checkpoints it) and relaunched
  with the new resources as soon as it has stopped (HyperSched 4.3; Ray's own
  ResourceChangingScheduler resizes the same way). A trial completes at
  `max_iterations`; a NaN or infinite metric fails it;
- ``on_trial_complete`` / ``on_trial_error`` / ``on_trial_remove``: the trial
  reaches its final state and our scheduler hears ``on_trial_end``.

Trainables must checkpoint at every reported result (``tune.report(...,
checkpoint=...)``) and resume from ``tune.get_checkpoint()``, as pausing in
Ray needs; resizing needs ``reuse_actors=False`` (Ray's default for function
trainables). A trainable reads its atoms from
``tune.get_context().get_trial_resources()``.

Deviations, stated: HyperSched's own implementation ran in a modified Ray
trial executor; here Ray's controller starts what the scheduler returns, one
trial per controller step, and a resized trial waits for Ray to grant its new
resources. The start-up overhead includes Ray's actor start and restore.
Ray's experiment checkpointing of scheduler state (``save``/``restore``) is
not supported.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any, cast

from thrifty.core.errors import ProblemError
from thrifty.core.optional import require
from thrifty.runtime.tuning.schedulers.base import Decision, ExperimentState, Scheduler, check_positive
from thrifty.runtime.tuning.clock import RealClock
from thrifty.runtime.tuning.executors.plan import record_result
from thrifty.runtime.tuning.schedulers.forecasting import score_range
from thrifty.runtime.tuning.schedulers.hypersched import HyperSched
from thrifty.runtime.tuning.loop import SchedulerError
from thrifty.runtime.tuning.schedulers.pop import POP
from thrifty.runtime.tuning.trial import ENDED, Report, Trial, TrialState

require("ray.tune", "ray")  # this module is the Ray integration: loaded only when asked for
from ray.tune.execution.placement_groups import PlacementGroupFactory  # noqa: E402
from ray.tune.experiment import Trial as RayTrial  # noqa: E402
from ray.tune.result import RESULT_DUPLICATE  # noqa: E402
from ray.tune.schedulers import TrialScheduler  # noqa: E402

__all__ = ["TuneScheduler", "HyperSchedScheduler", "POPScheduler"]


class _View(ExperimentState):
    """The `ExperimentView` our scheduler reads, kept from Ray's events;
    `held` counts configurations Ray added that have not started."""

    def __init__(self, total_atoms: int, max_iterations: int, deadline_s: float | None):
        clock = RealClock()
        super().__init__(clock, total_atoms, max_iterations, None if deadline_s is None else clock.now() + deadline_s)
        self.held = 0

    def has_more_configs(self) -> bool:
        return self.held > 0


class TuneScheduler(TrialScheduler):
    """Runs `scheduler` (one of ours) as a Ray Tune trial scheduler (see the module docstring).

    `total_atoms` is how many atoms the experiment may use (default: Ray's
    cluster resources divided by `resources_per_atom`); `max_iterations` is R;
    `deadline_s` counts from the first trial Ray adds.
    """

    _supports_buffered_results = False  # one decision per result

    def __init__(self, scheduler: Scheduler, *, metric: str | None = None, mode: str | None = None,
                 total_atoms: int | None = None, max_iterations: int, deadline_s: float | None = None,
                 resources_per_atom: Mapping[str, float] | None = None):
        super().__init__()
        if not isinstance(scheduler, Scheduler):
            raise ProblemError(f"`scheduler` is a {type(scheduler).__name__}, but must be a thrifty Scheduler",
                               path="scheduler")
        if mode not in (None, "min", "max"):
            raise ProblemError(f"`mode` is {mode!r}, but must be 'min' or 'max'", path="mode")
        if total_atoms is not None:
            check_positive("total_atoms", total_atoms, integer=True)
        check_positive("max_iterations", max_iterations, integer=True)
        if deadline_s is not None:
            check_positive("deadline_s", deadline_s)
        per_atom = dict(resources_per_atom or {"CPU": 1.0})
        if not per_atom or any(not (isinstance(v, (int, float)) and v > 0) for v in per_atom.values()):
            raise ProblemError(f"`resources_per_atom` is {per_atom!r}, but must map resource names to positive "
                               "amounts", path="resources_per_atom")
        self.scheduler = scheduler
        self._metric, self._mode = metric, mode
        self._total_atoms = total_atoms
        self.max_iterations = max_iterations
        self.deadline_s = deadline_s
        self.resources_per_atom = {k.upper() if k.lower() in ("cpu", "gpu") else k: float(v)
                                   for k, v in per_atom.items()}
        self._view: _View | None = None
        self._mirror: dict[str, Trial] = {}           # Ray trial id -> our trial
        self._ray: dict[int, RayTrial] = {}            # our trial id -> Ray trial
        self._held: deque[RayTrial] = deque()          # configurations not started yet
        self._staged: dict[int, float] = {}            # launched by us, not yet reporting: id -> time
        self._resizing: dict[int, int] = {}            # paused to be relaunched on these atoms
        self._over = False
        self.ended: str | None = None                  # "deadline" | "exhausted" once Ray is told to stop

    # --- Ray's search properties -----------------------------------------------------------
    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        if (self._metric and metric and metric != self._metric) or (self._mode and mode and mode != self._mode):
            return False
        self._metric = self._metric or metric
        self._mode = self._mode or mode
        return True

    @property
    def experiment(self) -> _View:
        if self._view is None:
            if not self._metric or self._mode not in ("min", "max"):
                raise ProblemError(f"{type(self).__name__} needs `metric` and `mode` ('min' or 'max'): pass them "
                                   "here or to tune.TuneConfig", path="metric")
            self._view = _View(self._total_atoms or self._cluster_atoms(), self.max_iterations, self.deadline_s)
            self.scheduler.bind(self._view)
        return self._view

    def _cluster_atoms(self) -> int:
        import ray

        available = ray.cluster_resources() if ray.is_initialized() else {}
        atoms = min(int(available.get(k, 0) // v) for k, v in self.resources_per_atom.items())
        if atoms < 1:
            raise ProblemError(f"the Ray cluster has no room for one atom of {self.resources_per_atom}; give "
                               "total_atoms", path="total_atoms")
        return atoms

    # --- trials come and go ------------------------------------------------------------------
    def on_trial_add(self, tune_controller: Any, trial: RayTrial) -> None:
        view = self.experiment
        if trial.status == RayTrial.PENDING:
            trial.set_status(RayTrial.PAUSED)  # held: Ray starts it only when choose() says so
            self._held.append(trial)
            view.held += 1

    def choose_trial_to_run(self, tune_controller: Any) -> RayTrial | None:
        view = self.experiment
        for tid in self._staged:
            if self._ray[tid].status == RayTrial.PAUSED:
                return self._ray[tid]  # chosen before and not taken up by Ray yet: the same answer
        if self._over or (view.deadline is not None and view.now() >= view.deadline):
            self._end(tune_controller, "deadline")
            return None
        for tid, atoms in list(self._resizing.items()):
            ray_trial = self._ray[tid]
            if ray_trial.status == RayTrial.PAUSED and not ray_trial.is_saving:
                del self._resizing[tid]
                return self._relaunch(view.trial_list[tid], ray_trial, atoms)
        start = self.scheduler.choose() if view.free_atoms > 0 else None
        if start is None:
            if not view.running and not self._staged and not self._resizing:
                self._end(tune_controller, "exhausted")
            return None
        name = type(self.scheduler).__name__
        if not isinstance(start.atoms, int) or not 1 <= start.atoms <= view.free_atoms:
            raise SchedulerError(f"{name} asked for {start.atoms!r} atoms, but {view.free_atoms} are free")
        if start.trial_id is None:
            while self._held and self._held[0].status != RayTrial.PAUSED:
                self._held.popleft()  # removed by Ray meanwhile
                view.held -= 1
            if not self._held:
                return None
            ray_trial = self._held.popleft()
            view.held -= 1
            trial = Trial(trial_id=len(view.trial_list), config=dict(ray_trial.config), created_at=view.now())
            view.trial_list.append(trial)
            self._mirror[ray_trial.trial_id] = trial
            self._ray[trial.trial_id] = ray_trial
        else:
            if start.trial_id not in self._ray or view.trial_list[start.trial_id].state != TrialState.PAUSED:
                raise SchedulerError(f"{name} asked to start trial {start.trial_id}, which is not paused")
            trial, ray_trial = view.trial_list[start.trial_id], self._ray[start.trial_id]
        trial.state = TrialState.RUNNING
        trial.atoms = start.atoms
        view.used_atoms += start.atoms
        view.running[trial.trial_id] = trial
        return self._relaunch(trial, ray_trial, start.atoms)

    def _relaunch(self, trial: Trial, ray_trial: RayTrial, atoms: int) -> RayTrial:
        """Launch (or relaunch after a pause or resize) on `atoms` atoms."""
        bundle = {k: v * atoms for k, v in self.resources_per_atom.items()}
        # Ray's Trial starts the attribute at None, so its inferred type is None; Tune sets it before a launch
        current = cast(PlacementGroupFactory, ray_trial.placement_group_factory)
        if current.required_resources != bundle:
            ray_trial.update_resources(PlacementGroupFactory([bundle]))
        trial.launches += 1
        trial.iterations_since_launch = 0
        self._staged[trial.trial_id] = self.experiment.now()
        self.scheduler.on_trial_start(trial)
        return ray_trial

    def _end(self, tune_controller: Any, reason: str) -> None:
        """Stop what waits (held and paused trials) so that Ray's experiment ends."""
        self._over = True
        self.ended = self.ended or reason
        waiting = [t for t in tune_controller.get_trials() if t.status == RayTrial.PAUSED and not t.is_saving]
        for ray_trial in waiting:
            tune_controller.stop_trial(ray_trial)

    def on_trial_result(self, tune_controller: Any, trial: RayTrial, result: dict) -> str:
        view = self.experiment
        mine = self._mirror.get(trial.trial_id)
        if mine is None or mine.state in ENDED:
            return TrialScheduler.STOP  # not one of ours, or already ended
        if mine.state == TrialState.PAUSED or mine.trial_id in self._resizing:
            return TrialScheduler.PAUSE
        if result.get(RESULT_DUPLICATE):
            return TrialScheduler.CONTINUE  # Ray repeats the last result when a trainable returns
        launched = self._staged.pop(mine.trial_id, None)
        value = result.get(self._metric)
        metric = math.nan if not isinstance(value, (int, float)) else float(value) * (1 if self._mode == "max" else -1)
        iteration_s = float(result.get("time_this_iter_s") or 0.0)
        overhead = 0.0
        if mine.iterations_since_launch == 0 and launched is not None:
            overhead = max(0.0, view.now() - launched - iteration_s)
        if not math.isfinite(metric):
            mine.error = f"reported {self._metric}={value!r} at iteration {mine.iteration + 1}"
            self._release(mine, TrialState.FAILED)
            return TrialScheduler.STOP
        report = Report(mine.trial_id, mine.iteration + 1, metric, iteration_s, mine.atoms, view.now(), overhead)
        record_result(mine, report)
        if mine.iterations_since_launch == 1:
            view.overheads.add(overhead)
        if view.deadline is not None and view.now() >= view.deadline:
            self._release(mine, TrialState.TERMINATED)
            return TrialScheduler.STOP
        decision = self.scheduler.on_result(mine, report)
        atoms = self.scheduler.target_atoms(mine) if decision == Decision.CONTINUE else mine.atoms
        if mine.iteration >= self.max_iterations:
            self._release(mine, TrialState.COMPLETED)
            return TrialScheduler.STOP
        if decision == Decision.STOP:
            self._release(mine, TrialState.TERMINATED)
            return TrialScheduler.STOP
        if decision == Decision.PAUSE:
            mine.checkpoint = "ray"
            self._release(mine, TrialState.PAUSED)
            return TrialScheduler.PAUSE
        if decision != Decision.CONTINUE:
            raise SchedulerError(f"{type(self.scheduler).__name__} answered {decision!r}")
        if not isinstance(atoms, int) or atoms < 1:
            raise SchedulerError(f"{type(self.scheduler).__name__} wants {atoms!r} atoms for trial {mine.trial_id}")
        atoms = min(atoms, mine.atoms + view.free_atoms)
        if atoms == mine.atoms:
            return TrialScheduler.CONTINUE
        # HyperSched 4.3: checkpoint, stop, relaunch with the new allocation, restore
        view.used_atoms += atoms - mine.atoms
        mine.atoms = atoms
        mine.resizes += 1
        mine.checkpoint = "ray"
        self._resizing[mine.trial_id] = atoms
        return TrialScheduler.PAUSE

    def _release(self, trial: Trial, state: TrialState) -> None:
        view = self.experiment
        if trial.state == TrialState.RUNNING:
            view.used_atoms -= trial.atoms
            view.running.pop(trial.trial_id, None)
        self._staged.pop(trial.trial_id, None)
        self._resizing.pop(trial.trial_id, None)
        trial.atoms = 0
        trial.state = state
        if state != TrialState.PAUSED:
            trial.ended_at = view.now()
            self.scheduler.on_trial_end(trial)

    def _finish(self, trial: RayTrial, state: TrialState, error: str | None = None) -> None:
        mine = self._mirror.get(trial.trial_id)
        if mine is None:
            if trial in self._held:
                self._held.remove(trial)
                self.experiment.held -= 1
            return
        if mine.state in (TrialState.RUNNING, TrialState.PAUSED):
            if error:
                mine.error = error
            self._release(mine, state)

    def on_trial_complete(self, tune_controller: Any, trial: RayTrial, result: dict) -> None:
        mine = self._mirror.get(trial.trial_id)
        done = mine is not None and mine.iteration >= self.max_iterations
        self._finish(trial, TrialState.COMPLETED if done else TrialState.TERMINATED)

    def on_trial_error(self, tune_controller: Any, trial: RayTrial) -> None:
        self._finish(trial, TrialState.FAILED, f"the trainable raised (Ray trial {trial.trial_id}; see its log)")

    def on_trial_remove(self, tune_controller: Any, trial: RayTrial) -> None:
        self._finish(trial, TrialState.TERMINATED)

    # --- what happened ----------------------------------------------------------------------------
    @property
    def trials(self) -> list[Trial]:
        """Our record of every trial the scheduler started (ids in start order)."""
        return [] if self._view is None else list(self._view.trial_list)

    def ray_trial_id(self, trial_id: int) -> str:
        return self._ray[trial_id].trial_id

    def debug_string(self) -> str:
        if self._view is None:
            return f"thrifty {self.scheduler.name}: waiting for trials"
        counts: dict[str, int] = {}
        for t in self._view.trial_list:
            counts[t.state.value] = counts.get(t.state.value, 0) + 1
        states = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        return (f"thrifty {self.scheduler.name}: {self._view.used_atoms}/{self._view.total_atoms} atoms in use, "
                f"{self._view.held} configurations waiting; trials: {states or 'none'}")

    def save(self, checkpoint_path: str) -> None:
        raise NotImplementedError("thrifty's Ray Tune schedulers do not checkpoint their state")

    def restore(self, checkpoint_path: str) -> None:
        raise NotImplementedError("thrifty's Ray Tune schedulers do not checkpoint their state")


class HyperSchedScheduler(TuneScheduler):
    """`HyperSched` (deadline-aware ASHA with dynamic allocation) for Ray Tune.

    Keywords of `HyperSched` (min_iterations, eta, scaling, cooldown,
    overhead_s, ...) pass through; `deadline_s` is required."""

    def __init__(self, *, metric: str | None = None, mode: str | None = None, total_atoms: int | None = None,
                 max_iterations: int, deadline_s: float, resources_per_atom: Mapping[str, float] | None = None,
                 **hypersched: Any):
        super().__init__(HyperSched(max_iterations=max_iterations, **hypersched), metric=metric, mode=mode,
                         total_atoms=total_atoms, max_iterations=max_iterations, deadline_s=deadline_s,
                         resources_per_atom=resources_per_atom)


class POPScheduler(TuneScheduler):
    """`POP` (promising / opportunistic / poor, with learning-curve confidence) for Ray Tune.

    `target` is the metric to reach (in the metric's own units: for
    ``mode="min"`` a loss to get below); `metric_range` the metric's
    ``(lower, upper)`` in its own units, ``None`` for an open side (default
    ``(0, 1)`` for ``mode="max"``, an accuracy, ``(0, None)`` for
    ``mode="min"``, a loss); other keywords of `POP` (boundary,
    kill_threshold, max_time, ...) pass through."""

    def __init__(self, target: float, *, metric: str | None = None, mode: str | None = None,
                 total_atoms: int | None = None, max_iterations: int, deadline_s: float | None = None,
                 resources_per_atom: Mapping[str, float] | None = None,
                 metric_range: tuple[float | None, float | None] | None = None, **pop: Any):
        if mode not in ("min", "max"):
            raise ProblemError(f"`mode` is {mode!r}, but POPScheduler needs 'min' or 'max' to read `target`",
                               path="mode")
        pop["metric_range"] = score_range(metric_range, mode)
        if mode == "min":
            target = -target
            if pop.get("kill_threshold") is not None:
                pop["kill_threshold"] = -pop["kill_threshold"]
        super().__init__(POP(target, **pop), metric=metric, mode=mode, total_atoms=total_atoms,
                         max_iterations=max_iterations, deadline_s=deadline_s,
                         resources_per_atom=resources_per_atom)
