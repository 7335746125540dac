"""Plan executor: run a tuning plan from the planner stage by stage (RubberBand 4.2-4.4).

A tuning plan (`thrifty.solver.tuning_plan.TuningPlan`, or its JSON) gives
each stage of a successive-halving / Hyperband job its trials, iterations per
trial, instance type, instances and GPUs per trial. `PlanExecutor` carries it
out on any executor of the loop's interface (simulated, or real processes with
`WorldExecutor`) and any `Provider`:

1. *Trials.* A stage with more trials than the one before starts a new
   bracket: new configurations from the search space (the first stage too).
   Otherwise the stage keeps the best ``trials`` of the previous stage by
   their last metric (SHA's top 1/eta: the planner's stage sizes are
   ``floor(n / eta^k)``, `perfmodels.experiment`); the others are terminated.
2. *Scaling.* The provider's machines are scaled to the stage's instances as
   the planner's simulator assumes (`perfmodels.jobsim`): a new instance type
   replaces the fleet; fewer instances release the newest first; more
   instances are provisioned (blocking, with a timeout) before the stage
   trains.
3. *Placement.* Trials are placed with the placement controller
   (`thrifty.runtime.placement.place`, RubberBand 4.4) on the machines'
   GPUs (atoms), keeping the previous placement where it still holds; trials
   that do not fit queue and are placed as others finish (trial j after
   trial j - P, as the simulator's DAG chains them). Each placement is
   recorded and checked: no machine holds more atoms than it has.
4. *Training.* A trial launches on ``gpus_per_trial`` atoms, restoring its
   checkpoint; after ``iters_per_trial`` more iterations it is suspended with a
   checkpoint (the SHA barrier). A trial whose GPUs per trial changed between
   stages is thereby resized (checkpoint, relaunch on other atoms, restore). A
   trial that crashes or reports a non-finite metric fails; the stage goes on.
5. *Accounting.* Per stage: the actual duration (scale-up to the last trial's
   checkpoint) against the plan's ``end_s - start_s``; the actual cost from the
   machines' launch and termination times with per-second billing (the held
   machines' time within the stage, as the plan's per-stage cost counts it, or
   the busy GPU-seconds under per-function billing); in total, the billed cost
   of every machine with the minimum billed duration (`Machine.cost_usd`)
   against the plan's predicted cost and JCT.

`simulated_backend` gives the simulated side (with
`thrifty.runtime.providers.virtual.VirtualProvider`): machines on
the experiment's virtual clock whose SCALE and INIT latencies are drawn from
the problem's cloud variables, and trials whose iteration times are drawn
from the problem's scaling profile (`ProfileWorkload`), so a realistic plan
(32 trials of ResNet-101 on p3.8xlarge) runs in milliseconds.

6. *Stopping and resuming.* `stop()` (Ctrl-C, SIGTERM), asked between
   events, stops the run: no trial starts, each running trial finishes the
   iteration it is in and is suspended with a checkpoint, marked
   ``interrupted``, and the machines are released (`PlanResult.stopped`).
   A run that stopped, was killed or crashed goes on from its record
   (`resume`, a `Resumed` from `record.read_history`): RubberBand plans a
   job offline, before it runs, and its executor carries the plan out (4.3,
   5), so a resumed run *continues the recorded plan*, on the clock carried
   from the run (the deadline counts the time already spent; the machines
   the earlier sessions billed, recorded as ``provision`` and ``release``
   events, are counted in the cost). Stage by stage it takes the same
   trials the run took (a bracket's trials in the order they were drawn;
   the survivors ranked by their metric at the end of the previous stage),
   keeps every iteration they recorded (with durable iterations, each is
   checkpointed), trains only the trials that have not reached the stage's
   iterations (from their checkpoints) and skips a stage that has nothing
   left to train, so no finished stage or trial is redone. It does not
   re-solve the remaining stages for the time left: the paper's planner has
   no entry point for a job partly done, and a plan re-solved on a shorter
   deadline would change stages that the recorded trials already followed.

7. *Interruptions.* Between events the executor reads the provider's
   interruption feed (`Provider.interruptions`: spot notices, lost
   machines). A machine of the stage with a `Notice` takes no new trial;
   each trial on it is paused with a checkpoint at its next result and
   queued again, to go on from that checkpoint on the machines left; the
   machine is given back once nothing runs on it. A machine lost (a
   `MachineLost`, or a notice whose deadline passed with trials still on
   it) is given back at once and its trials fail, as a crash does; the
   stage goes on with the others. A stage left without machines to place
   its queued trials on asks the provider for replacements up to its
   instances. (`StageRecord.preempted` lists the machines taken away.)
   The feed is read when an event arrives, so a notice is acted on at the
   next result of any trial.

Deviations, stated: Hyperband brackets are told apart by stage sizes, as the
plan JSON does not mark them; instances that a stage does not use are
released at the stage's start, never in the middle of it.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from thrifty.datasets.catalog import Catalog, load_catalog
from thrifty.core.errors import ProblemError, ProviderError
from thrifty.core.validation import validate_model
from thrifty.runtime.placement import place
from thrifty.runtime.providers.base import Machine, Market, Provider
from thrifty.runtime.providers.interruptions import CapacityChange, Notice
from thrifty.runtime.tuning.clock import Clock, VirtualClock
from thrifty.runtime.providers.virtual import VirtualProvider
from thrifty.runtime.tuning.executors.sim import SimulatedExecutor, SyntheticWorkload, Workload
from thrifty.runtime.tuning.loop import STOP_POLL_S, Executor, Resumed
from thrifty.runtime.tuning.search_space import SearchSpace
from thrifty.runtime.tuning.trial import Crash, Report, Trial, TrialState

if TYPE_CHECKING:  # the solver takes longer to import than this package: it is imported when a plan is read
    from thrifty.solver.tuning_plan import TuningPlan, TuningStage

__all__ = ["PlanExecutor", "PlanResult", "StageRecord", "execute_plan", "ProfileWorkload",
           "SimulatedBackend", "simulated_backend", "runnable_plan", "stage_trials", "record_result",
           "recorded_cost_usd"]

MIN_FRACTION = 0.05  # truncation of a drawn iteration time, as the planner's simulator does


# --- the plan ----------------------------------------------------------------------------------

def runnable_plan(plan: TuningPlan | Mapping[str, Any], instance_type: str | None = None) -> TuningPlan:
    """`plan` (a `TuningPlan` or its JSON object) validated with the plan's
    model, so every error names the JSON path (``stages[1].trials``); a plan
    written by hand may give its stages alone (``kind`` and ``status`` then
    default to a feasible tuning plan). It must be feasible, with at least
    one stage; `instance_type` fills in the stages that name none."""
    from thrifty.solver.tuning_plan import TuningPlan

    if not isinstance(plan, TuningPlan):
        if not isinstance(plan, Mapping):
            raise ProblemError(f"the plan is a {type(plan).__name__}, but must be a TuningPlan or its JSON object")
        plan = validate_model(TuningPlan, {"kind": "tuning", "status": "feasible", **plan})
    if not plan.feasible:
        raise ProblemError(f"is '{plan.status}': an infeasible plan has nothing to run", path="status")
    if not plan.stages:
        raise ProblemError("must list at least one stage", path="stages")
    for k, stage in enumerate(plan.stages):
        if not (stage.instance_type or instance_type):
            raise ProblemError("names no instance type; give PlanExecutor(instance_type=...)",
                               path=f"stages[{k}].instance_type")
    return plan.with_changes(stages=[stage.with_changes(instance_type=stage.instance_type or instance_type)
                                     for stage in plan.stages])


def stage_trials(stages: Sequence[TuningStage]) -> list[bool]:
    """For each stage: does it start a bracket (new trials)? The first stage
    does, and so does any stage with more trials than the one before."""
    return [k == 0 or stages[k].trials > stages[k - 1].trials for k in range(len(stages))]


# --- records -----------------------------------------------------------------------------------

@dataclass
class StageRecord:
    """What one stage did, with the plan's prediction beside it. Times are
    clock times (seconds; virtual under simulation), costs USD."""

    index: int
    instance_type: str
    instances: int
    gpus_per_trial: int
    iters_per_trial: int
    new_bracket: bool
    trial_ids: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)        # previous-stage trials not kept
    resized: list[int] = field(default_factory=list)        # kept trials whose GPUs changed
    machines: list[str] = field(default_factory=list)
    provisioned: int = 0
    released: int = 0
    placements: list[dict[str, dict[str, int]]] = field(default_factory=list)
    queued: int = 0                                           # trials that waited for a slot
    busy_gpu_s: float = 0.0                                   # atoms x (start-up + training) of its trials
    started_at: float = 0.0
    scaled_at: float = 0.0
    ended_at: float = 0.0
    cost_usd: float = 0.0
    predicted_s: float | None = None
    predicted_cost_usd: float | None = None
    done_before: bool = False                                 # a resumed run found it trained already
    preempted: list[str] = field(default_factory=list)       # machines taken away during the stage (notice, loss)

    @property
    def actual_s(self) -> float:
        return self.ended_at - self.started_at

    @property
    def scale_up_s(self) -> float:
        return self.scaled_at - self.started_at


@dataclass
class PlanResult:
    stages: list[StageRecord]
    trials: list[Trial]
    machines: list[Machine]                 # every machine the run held, with its termination time
    jct_s: float
    cost_usd: float                          # billed: per second, with the minimum per machine
    predicted_jct_s: float | None
    predicted_cost_usd: float | None
    deadline_s: float | None
    best_trial_id: int | None
    failed: dict[int, str | None]           # each failed trial's `Trial.error`
    stopped: str | None = None              # why `stop()` stopped it before its end (resume goes on)

    @property
    def best_metric(self) -> float:
        return -math.inf if self.best_trial_id is None else self.trials[self.best_trial_id].last_metric

    @property
    def met_deadline(self) -> bool | None:
        return None if self.deadline_s is None else self.jct_s <= self.deadline_s

    def table(self) -> str:
        """Actual against predicted, one row per stage and a total."""
        rows = [f"{'stage':>5} {'trials':>6} {'type':>12} {'inst':>4} {'gpu/t':>5} {'iters':>5} "
                f"{'actual s':>9} {'plan s':>9} {'actual $':>9} {'plan $':>9}"]
        for s in self.stages:
            rows.append(f"{s.index:>5} {len(s.trial_ids):>6} {s.instance_type:>12} {s.instances:>4} "
                        f"{s.gpus_per_trial:>5} {s.iters_per_trial:>5} {s.actual_s:>9.1f} {_num(s.predicted_s, 1)} "
                        f"{s.cost_usd:>9.4f} {_num(s.predicted_cost_usd, 4)}")
        rows.append(f"{'total':>5} {len(self.trials):>6} {'':>12} {'':>4} {'':>5} {'':>5} {self.jct_s:>9.1f} "
                    f"{_num(self.predicted_jct_s, 1)} {self.cost_usd:>9.4f} {_num(self.predicted_cost_usd, 4)}")
        return "\n".join(rows)


def _num(value: float | None, digits: int) -> str:
    return f"{'-':>9}" if value is None else f"{value:>9.{digits}f}"


# --- the executor --------------------------------------------------------------------------------

class PlanExecutor:
    """Runs a tuning plan on `executor` (the loop's executor interface) with
    machines from `provider` (see the module docstring).

    `catalog` gives GPUs per instance (default: the provider's catalog, else
    the shipped one); `stage_hook(stage)` (a `TuningStage`) is called before
    each stage trains (the simulated backend uses it to time iterations on the
    stage's type). The plan is read with `runnable_plan`. `stop()` is asked
    between events and `resume` is a previous run of the same plan to go on
    from, whose earlier sessions billed `earlier_cost_usd` (see the module
    docstring, 6).
    """

    def __init__(self, plan: TuningPlan | Mapping[str, Any], executor: Executor, provider: Provider,
                 search_space: SearchSpace, *, market: Market = "on_demand", catalog: Catalog | None = None,
                 instance_type: str | None = None, min_billed_s: float = 60.0, provision_timeout_s: float = 600.0,
                 stage_hook: Callable[[TuningStage], None] | None = None, resume: Resumed | None = None,
                 stop: Callable[[], str | None] | None = None, earlier_cost_usd: float = 0.0):
        self.plan = runnable_plan(plan, instance_type)
        self.stages = self.plan.stages
        predicted = self.plan.predicted
        self.predicted_jct_s = predicted.jct_s if predicted is not None else None
        self.predicted_cost_usd = predicted.cost_usd if predicted is not None else None
        self.deadline_s = self.plan.deadline_s or None
        self.billing = self.plan.billing
        self.executor = executor
        self.clock: Clock = executor.clock
        self.provider = provider
        self.search_space = search_space
        self.market = market
        self.catalog = catalog or provider.catalog or load_catalog()
        self.min_billed_s = min_billed_s
        self.provision_timeout_s = provision_timeout_s
        self.stage_hook = stage_hook
        self.trials: list[Trial] = []
        self.records: list[StageRecord] = []
        self._held: list[Machine] = []       # in launch order
        self._released: list[Machine] = []
        self._billing_now: Callable[[], float] = provider.now
        self.stop = stop
        self.stopped: str | None = None
        self.earlier_cost_usd = earlier_cost_usd
        self._elapsed = resume.elapsed_s if resume is not None else 0.0
        self._resumed: list[Trial] = list(resume.trials) if resume is not None else []  # not yet in a stage
        self.trials = list(self._resumed)
        self._bracket_iters = 0   # iterations a trial of the current bracket has reached by the current stage
        self._note: Callable[[dict[str, Any]], None] | None = getattr(executor, "note", None)
        self._interruptions = provider.interruptions.reader()

    # --- the whole plan -----------------------------------------------------------------------
    def run(self) -> PlanResult:
        started = self.clock.now() - self._elapsed
        for trial in self._resumed:  # its times were relative to the experiment's start
            trial.created_at += started
            trial.reported_at = [started + at for at in trial.reported_at]
            trial.ended_at = None if trial.ended_at is None else trial.ended_at + started
        running: dict[int, Trial] = {}
        try:
            previous: list[Trial] = []
            for k, stage in enumerate(self.stages):
                previous = self._run_stage(k, stage, previous, running)
                if self.stopped is not None:
                    break
        finally:
            for trial in list(running.values()):  # stopped where they are: a resumed run goes on with them
                trial.interrupted = True
                self.executor.terminate(trial)
                trial.state = TrialState.PAUSED if trial.checkpoint is not None else TrialState.PENDING
            self._release(list(self._held))
        survivors = {t.trial_id for t in previous}
        for trial in self.trials:
            if trial.state == TrialState.PAUSED and self.stopped is None:
                trial.state = TrialState.COMPLETED if trial.trial_id in survivors else TrialState.TERMINATED
                trial.ended_at = trial.ended_at or self.clock.now()
        done = [t for t in self.trials if t.state != TrialState.FAILED and t.metrics]
        best = max(done, key=lambda t: (t.iteration, t.last_metric, -t.trial_id), default=None)
        machines = list(self._released)
        return PlanResult(self.records, list(self.trials), machines, self.clock.now() - started,
                          self.earlier_cost_usd + sum(m.cost_usd(min_billed_s=self.min_billed_s) for m in machines),
                          self.predicted_jct_s, self.predicted_cost_usd, self.deadline_s,
                          None if best is None else best.trial_id,
                          {t.trial_id: t.error for t in self.trials if t.state == TrialState.FAILED},
                          self.stopped)

    def _run_stage(self, k: int, stage: TuningStage, previous: list[Trial],
                   running: dict[int, Trial]) -> list[Trial]:
        new_bracket = stage_trials(self.stages)[k]
        instance_type = stage.instance_type
        assert instance_type is not None  # runnable_plan names every stage's type
        record = StageRecord(k, instance_type, stage.instances, stage.gpus_per_trial,
                             stage.iters_per_trial, new_bracket, started_at=self.clock.now())
        if stage.start_s is not None and stage.end_s is not None:
            record.predicted_s = stage.end_s - stage.start_s
        record.predicted_cost_usd = stage.cost_usd
        billing_start = self._billing_now()
        self.records.append(record)

        trials = self._stage_trials(stage, new_bracket, previous, record)
        if self.stop is not None and self.stopped is None:
            self.stopped = self.stop()
        if self.stopped is not None or all(t.iteration >= self._bracket_iters or t.state == TrialState.FAILED
                                           for t in trials):  # stopped, or trained before a resume
            record.done_before = self.stopped is None
            record.scaled_at = record.ended_at = self.clock.now()
            return [t for t in trials if t.state != TrialState.FAILED]
        before = {m.id for m in self._held}
        self._scale(instance_type, stage.instances, record)
        record.machines = [m.id for m in self._held]
        record.provisioned = len(set(record.machines) - before)
        record.scaled_at = self.clock.now()
        if self.stage_hook is not None:
            self.stage_hook(stage)
        gpus = self.catalog.get(instance_type).gpus
        nodes = {m.id: gpus for m in self._held}
        self._train(trials, stage, nodes, record, running)
        record.ended_at = self.clock.now()
        record.cost_usd = self._stage_cost(record, billing_start, self._billing_now())
        return [t for t in trials if t.state != TrialState.FAILED]

    def _stage_trials(self, stage: TuningStage, new_bracket: bool, previous: list[Trial],
                      record: StageRecord) -> list[Trial]:
        for trial in previous:
            if new_bracket:  # the last stage of a bracket: its survivors are done
                trial.state, trial.ended_at = TrialState.COMPLETED, self.clock.now()
        reached = self._bracket_iters  # the previous stage's iterations
        self._bracket_iters = stage.iters_per_trial + (0 if new_bracket else reached)
        if new_bracket:
            trials = []
            for _ in range(stage.trials):
                if self._resumed:  # the trials the resumed run drew, in the order it drew them
                    trials.append(self._resumed.pop(0))
                    continue
                config = self.search_space.next_config()
                if config is None:
                    break
                trial = Trial(trial_id=len(self.trials), config=config, created_at=self.clock.now())
                self.trials.append(trial)
                trials.append(trial)
            if not trials:
                raise ProblemError("the search space produced no configuration", path="search_space")
        else:  # by the metric at the previous stage's end (a resumed trial may have trained past it since)
            ranked = sorted(previous, key=lambda t: (-_metric_at(t, reached), t.trial_id))
            trials = ranked[: stage.trials]
            for trial in ranked[stage.trials:]:
                trial.state, trial.ended_at = TrialState.TERMINATED, self.clock.now()
                record.dropped.append(trial.trial_id)
            record.resized = [t.trial_id for t in trials if t.iteration_atoms and
                              t.iteration_atoms[-1] != stage.gpus_per_trial]
        record.trial_ids = [t.trial_id for t in trials]
        return trials

    # --- machines -----------------------------------------------------------------------------
    def _scale(self, instance_type: str, instances: int, record: StageRecord) -> None:
        if any(m.instance_type != instance_type for m in self._held):
            record.released += len(self._held)
            self._release(list(self._held))
        extra = len(self._held) - instances
        if extra > 0:  # the newest go first
            record.released += extra
            self._release(self._held[-extra:])
        missing = instances - len(self._held)
        if missing > 0:
            made = self.provider.provision(instance_type, missing, self.market, timeout_s=self.provision_timeout_s)
            if self._note is not None:
                self._note({"event": "provision", "machines": [m.id for m in made], "instance_type": instance_type,
                            "usd_per_hour": [m.price_per_hour for m in made]})
            if len(made) != missing:
                self._release(made)
                raise ProviderError(f"asked for {missing} {instance_type}, got {len(made)}")
            self._held.extend(made)

    def _release(self, machines: Sequence[Machine]) -> None:
        if not machines:
            return
        ids = {m.id for m in machines}
        ended = self.provider.terminate(machines)
        if self._note is not None:
            self._note({"event": "release", "machines": sorted(ids)})
        self._held = [m for m in self._held if m.id not in ids]
        self._released.extend(ended)

    def _stage_cost(self, record: StageRecord, start: float, end: float) -> float:
        if self.billing == "per_function":  # only the busy GPU-seconds of the stage's trials pay
            usd_per_hour = self.provider.price(record.instance_type, self.market)
            return record.busy_gpu_s * usd_per_hour / 3600.0 / self.catalog.get(record.instance_type).gpus
        cost = 0.0
        for m in itertools.chain(self._held, self._released):
            if m.id not in record.machines:
                continue
            stop = m.terminated_at if m.terminated_at is not None else end
            seconds = min(stop, end) - max(m.launched_at, start)
            cost += max(seconds, 0.0) * m.price_per_hour / 3600.0
        return cost

    # --- training within a stage -------------------------------------------------------------------
    def _train(self, trials: list[Trial], stage: TuningStage, nodes: dict[str, int], record: StageRecord,
               running: dict[int, Trial]) -> None:
        g, target = stage.gpus_per_trial, self._bracket_iters
        queue = [t for t in trials if t.iteration < target and t.state != TrialState.FAILED]
        placement: dict[str, dict[str, int]] = {}
        leaving: dict[str, tuple[float, str]] = {}  # machine -> (when it goes, on the provider's clock; why)
        full = False  # once a trial did not fit, the ones placed later had to wait
        while queue or running:
            if self.stop is not None and self.stopped is None:
                self.stopped = self.stop()
            if self.stopped is not None:  # no trial starts; the running ones finish their iteration
                queue.clear()
                if not running:
                    return
            self._interrupted(nodes, leaving, placement, running, record)
            while queue:  # place the next queued trial beside the running ones, if it fits
                name = str(queue[0].trial_id)
                attempt = place({**{str(tid): g for tid in running}, name: g}, placement, nodes)
                if attempt.unplaced and not running and len(self._held) < stage.instances:
                    new = self._replace_taken(stage.instances, record)  # machines were taken away
                    nodes.update({m.id: self.catalog.get(m.instance_type).gpus for m in new})
                    continue
                if attempt.unplaced:
                    if not running:
                        raise ProblemError(f"stage {record.index}: {len(nodes)} x {record.instance_type} cannot "
                                           f"hold one trial of {g} GPUs", path=f"stages[{record.index}]")
                    full = True
                    break
                placement = attempt.assignment
                _check_capacity(placement, nodes, record.index)
                record.placements.append({t: dict(where) for t, where in placement.items()})
                record.queued += int(full)
                self._launch(queue.pop(0), g, running, placement[name])
            event = self.executor.next_event(None if self.stop is None else self.clock.now() + STOP_POLL_S)
            if event is None:
                if self.stop is not None:
                    continue
                raise ProviderError(f"stage {record.index}: the executor returned no event while "
                                    f"{len(running)} trials run")
            trial = running[event.trial_id]
            if isinstance(event, Crash) or not math.isfinite(event.metric):
                reason = event.message if isinstance(event, Crash) else (
                    f"reported metric {event.metric!r} at iteration {event.iteration}")
                self.executor.terminate(trial)
                self._end(trial, TrialState.FAILED, running, placement)
                trial.error = reason
                continue
            record_result(trial, event)
            record.busy_gpu_s += (event.iteration_s + event.overhead_s) * event.atoms
            if trial.iteration >= target or self.stopped is not None:
                trial.interrupted = trial.iteration < target  # the run stops: it goes on from here
                trial.checkpoint = self.executor.suspend(trial)
                self._end(trial, TrialState.PAUSED, running, placement)
            elif leaving.keys() & placement[str(trial.trial_id)].keys():  # its machine is going: on elsewhere
                trial.checkpoint = self.executor.suspend(trial)
                self._end(trial, TrialState.PAUSED, running, placement)
                queue.insert(0, trial)
            else:
                self.executor.proceed(trial)

    def _replace_taken(self, instances: int, record: StageRecord) -> list[Machine]:
        """New machines for those taken away, up to the stage's `instances`."""
        before = {m.id for m in self._held}
        self._scale(record.instance_type, instances, record)
        new = [m for m in self._held if m.id not in before]
        record.machines += [m.id for m in new]
        record.provisioned += len(new)
        return new

    def _interrupted(self, nodes: dict[str, int], leaving: dict[str, tuple[float, str]],
                     placement: dict[str, dict[str, int]], running: dict[int, Trial], record: StageRecord) -> None:
        """What the interruption feed says of the stage's machines (module
        docstring, 7): a machine with a notice takes no new trial and is given
        back once its trials left it; a machine gone fails its trials."""
        now = self._billing_now()
        for event in self._interruptions.poll(set(nodes)):
            machine = event.machine_id
            if isinstance(event, CapacityChange) or machine is None or machine in leaving:
                continue  # a market without capacity: the plan's machines are asked for stage by stage
            record.preempted.append(machine)
            why = event.preemption.reason or event.preemption.source
            leaving[machine] = (event.deadline if isinstance(event, Notice) else now, why)
        for machine, (deadline, why) in list(leaving.items()):
            on_it = [running[int(name)] for name, where in placement.items() if machine in where]
            if deadline <= now:  # gone: what ran on it is lost
                for trial in on_it:
                    self.executor.terminate(trial)
                    self._end(trial, TrialState.FAILED, running, placement)
                    trial.error = f"machine {machine} was taken away ({why})"
                on_it = []
            if on_it:  # full with the trials it still runs: none is placed there
                nodes[machine] = sum(placement[str(t.trial_id)][machine] for t in on_it)
                continue
            del nodes[machine], leaving[machine]
            self._release([m for m in self._held if m.id == machine])

    def _launch(self, trial: Trial, atoms: int, running: dict[int, Trial], where: Mapping[str, int]) -> None:
        trial.state, trial.atoms, trial.interrupted = TrialState.RUNNING, atoms, False
        if trial.launches and trial.iteration_atoms and trial.iteration_atoms[-1] != atoms:
            trial.resizes += 1
        trial.launches += 1
        trial.iterations_since_launch = 0
        running[trial.trial_id] = trial
        self.executor.launch(trial, atoms, where)

    def _end(self, trial: Trial, state: TrialState, running: dict[int, Trial],
             placement: dict[str, dict[str, int]]) -> None:
        del running[trial.trial_id]
        placement.pop(str(trial.trial_id), None)
        trial.state, trial.atoms = state, 0
        if state == TrialState.FAILED:
            trial.ended_at = self.clock.now()


def _metric_at(trial: Trial, iteration: int) -> float:
    """The trial's metric after `iteration` iterations (its last one if it has fewer)."""
    return trial.metrics[iteration - 1] if 0 < iteration <= len(trial.metrics) else trial.last_metric


def recorded_cost_usd(events: Sequence[Mapping[str, Any]], min_billed_s: float = 60.0) -> float:
    """What the machines of a recorded plan run cost (its ``provision`` and
    ``release`` events; times on the experiment's clock): each billed per
    second with the minimum, until its release or, when the run ended without
    releasing it (killed), until the record's last event."""
    from thrifty.runtime.providers.base import billed_cost_usd

    last_t = max((float(e["t"]) for e in events if "t" in e), default=0.0)
    held: dict[str, tuple[float, float]] = {}   # machine -> (price per hour, provisioned at)
    cost = 0.0
    for e in events:
        if e.get("event") == "provision":
            for machine, price in zip(e.get("machines", []), e.get("usd_per_hour", [])):
                held[str(machine)] = (float(price), float(e["t"]))
        elif e.get("event") == "release":
            for machine in e.get("machines", []):
                if str(machine) in held:
                    price, since = held.pop(str(machine))
                    cost += billed_cost_usd(price, float(e["t"]) - since, min_billed_s)
    return cost + sum(billed_cost_usd(price, last_t - since, min_billed_s) for price, since in held.values())


def record_result(trial: Trial, report: Report) -> None:
    """One result into the trial's history, as the loop records it (for drivers
    other than the loop: the plan executor, the Ray Tune adapter)."""
    trial.metrics.append(float(report.metric))
    trial.iteration_s.append(report.iteration_s)
    trial.iteration_atoms.append(report.atoms)
    trial.reported_at.append(report.at)
    trial.train_s += report.iteration_s
    if report.checkpoint is not None:
        trial.checkpoint = report.checkpoint
    trial.iterations_since_launch += 1
    if trial.iterations_since_launch == 1:
        trial.overheads_s.append(report.overhead_s)


def _check_capacity(placement: Mapping[str, Mapping[str, int]], nodes: Mapping[str, int], stage: int) -> None:
    used: dict[str, int] = {}
    for where in placement.values():
        for node, gpus in where.items():
            used[node] = used.get(node, 0) + gpus
    over = [n for n, u in used.items() if n not in nodes or u > nodes[n]]
    if over:
        raise RuntimeError(f"stage {stage}: the placement overfills {', '.join(over)}")


def execute_plan(plan: TuningPlan | Mapping[str, Any], executor: Executor, provider: Provider,
                 search_space: SearchSpace, **options: Any) -> PlanResult:
    """Run `plan` to its end (see `PlanExecutor`)."""
    return PlanExecutor(plan, executor, provider, search_space, **options).run()


# --- the simulated backend ---------------------------------------------------------------------

class ProfileWorkload:
    """Iteration times drawn from scaling profiles (`perfmodels.scaling`), as
    the planner's simulator draws them: X ~ N(mean(g), sd(g)) on g atoms of the
    current instance type, truncated at 5% of the mean, one draw per trial and
    stage (a straggler stays slow for the whole stage, RubberBand 6.1.1);
    seeded. Metrics come from `metrics` (a workload such as
    `SyntheticWorkload`). `use(instance_type)` starts a stage on that type,
    which the plan executor does before each stage trains."""

    def __init__(self, profiles: Mapping[str, Any], metrics: Workload | None = None, seed: int = 0):
        if not profiles:
            raise ProblemError("no scaling profile to draw iteration times from", path="profiles")
        self.profiles = dict(profiles)
        self.metrics = metrics or SyntheticWorkload()
        self.instance_type = next(iter(self.profiles))
        self._rng = np.random.default_rng(seed)
        self._draws: dict[tuple[str, int], float] = {}  # (trial's configuration, atoms) -> z

    def use(self, instance_type: str) -> None:
        if instance_type not in self.profiles:
            raise ProblemError(f"no scaling profile for {instance_type}; have {', '.join(self.profiles)}",
                               path="instance_type")
        self.instance_type = instance_type
        self._draws.clear()

    def metric(self, config: dict[str, Any], iteration: int) -> float:
        return self.metrics.metric(config, iteration)

    def iteration_s(self, config: dict[str, Any], iteration: int, atoms: int) -> float:
        mean, sd = self.profiles[self.instance_type].iteration(atoms)
        key = (json.dumps(config, sort_keys=True, default=str), atoms)
        if key not in self._draws:
            self._draws[key] = float(self._rng.standard_normal())
        return max(mean + sd * self._draws[key], MIN_FRACTION * mean)


@dataclass
class SimulatedBackend:
    """A virtual clock, machines on it and trials simulated on it, for `PlanExecutor`."""

    clock: VirtualClock
    provider: VirtualProvider
    workload: ProfileWorkload
    executor: SimulatedExecutor
    min_billed_s: float

    def stage_hook(self, stage: TuningStage) -> None:
        instance_type = stage.instance_type
        assert instance_type is not None  # PlanExecutor runs plans whose every stage names its type
        self.workload.use(instance_type)
        self.executor.startup_s = self.workload.profiles[instance_type].startup_s

    def execute(self, plan: TuningPlan | Mapping[str, Any], search_space: SearchSpace, **options: Any) -> PlanResult:
        options.setdefault("min_billed_s", self.min_billed_s)
        return execute_plan(plan, self.executor, self.provider, search_space, stage_hook=self.stage_hook,
                            catalog=self.provider.catalog, **options)


def simulated_backend(problem: Any, *, seed: int = 0, metrics: Workload | None = None) -> SimulatedBackend:
    """The simulated side of a `TuningProblem` (or its JSON): its scaling
    profiles (with the problem's overrides), cloud latencies, catalog prices
    and billing minimum, all on one virtual clock. Each launch pays the stage's
    profile `startup_s`, as the planner charges it per trial and stage."""
    from thrifty.solver.problem import TuningProblem
    from thrifty.solver.solve import as_problem
    from thrifty.solver.tuning import TuningSpace

    problem = as_problem(problem) if not isinstance(problem, TuningProblem) else problem
    if not isinstance(problem, TuningProblem):
        raise ProblemError(f"is a {type(problem).__name__}, but the plan executor needs a tuning problem", path="kind")
    space = TuningSpace(problem)
    clock = VirtualClock()
    cloud = problem.cloud
    provider = VirtualProvider(problem.name or "simulated", clock, problem.catalog,
                               scale_latency_s=cloud.scale_latency_s, scale_latency_sd_s=cloud.scale_latency_sd_s,
                               init_latency_s=cloud.init_latency_s, init_latency_sd_s=cloud.init_latency_sd_s,
                               seed=seed)
    workload = ProfileWorkload(space.profiles, metrics, seed=seed)
    executor = SimulatedExecutor(workload, clock=clock)
    return SimulatedBackend(clock, provider, workload, executor, cloud.min_billed_s)
