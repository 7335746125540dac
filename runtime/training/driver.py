"""`train(plan, trainer)`: carry out a training plan, watch it, re-plan (Srifty 4.5, 5.4).

The driver gets the plan's machines from a provider (`LocalProvider` by
default), starts one world of workers on them (`launcher.Segment`), and
watches it (`watch.SegmentWatch`): worker reports, the interruption feed
(`thrifty.runtime.providers.interruptions`: the provider's notices, the fault
injector's, notices passed on by workers, lost ranks) and the progress
monitor. What it does on each event (`replan.ReplanPolicy` says when to
re-plan, `replan.Replanner` re-solves):

- **preemption** (any source: a spot notice with time left, a worker gone
  without notice, a capacity failure at launch): mark the (instance type,
  market) depleted, re-solve for the remaining iterations, time and budget
  with the switching overhead (`replan.Replanner`), and switch: with time
  left the workers checkpoint and stop; without, they are killed and the run
  restarts from its last checkpoint. Surviving machines are kept when the new
  plan uses them; the others are given back.
- **slowdown**: the monitor says the limits will be missed with high
  certainty; re-solve with what is left and switch only if the answer is a
  different configuration. A re-plan that changes nothing (the same
  configuration, or none meets the limits) is asked for again only after a
  hold-off that doubles each time (`slowdown_hold_off_s`).
- **finished**: all iterations done and checkpointed; every machine is given
  back.

Each is logged to the run log (JSON lines) and announced to the hooks. Every
wait has a timeout (`RunConfig`); a failure stops every process, gives every
machine back and keeps the last good checkpoint.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thrifty.datasets.catalog import Catalog, load_catalog
from thrifty.core.errors import ProblemError
from thrifty.core.validation import json_object
from thrifty.runtime.events import Preemption
from thrifty.runtime.metrics import check_kinds, open_metrics
from thrifty.runtime.providers.base import CapacityError, Machine, Provider
from thrifty.perfmodels.calibration import Calibration
from thrifty.runtime.training.calibration import OnlineCalibrator
from thrifty.runtime.training.config import RunConfig
from thrifty.runtime.training.errors import RunFinished, RunInterrupted, Terminated, TrainingError
from thrifty.runtime.training.faults import Fault, FaultInjector, SlowWorker
from thrifty.runtime.training.hooks import Hooks
from thrifty.runtime.ddp.job import JobSpec
from thrifty.runtime.training.launcher import WORKER_PRELOAD, RankSlot, Segment
from thrifty.runtime.training.monitor import ProgressMonitor, ThroughputWindow, prediction_off, spent_cost
from thrifty.runtime.training.plans import PlanArgument, ProblemArgument, run_plan, within_capacity
from thrifty.runtime.training.prediction import ZOO_TRAINER, PredictionOff, prediction_off_cause, profile_command
from thrifty.runtime.training.preflight import RunInputs, check_run
from thrifty.runtime.training.records import ProgressSnapshot, RunResult, SegmentRecord, checkpoint_location
from thrifty.runtime.training.replan import Key, Replan, Replanner, ReplanPolicy
from thrifty.runtime.training.rundir import (CarriedOver, RunRecord, absolute_paths, carried_over, default_run_dir,
                                             finished_run, new_run_id, read_run_record, write_run_record)
from thrifty.runtime.training.runlog import RunLog, read_run_log
from thrifty.runtime.training.watch import SegmentWatch
from thrifty.runtime.ddp.sharding import split_batch
from thrifty.runtime.ddp.trainer import trainer_spec
from thrifty.runtime.worlds import zygote
from thrifty.solver.plan import Plan
from thrifty.solver.problem import TrainingProblem

__all__ = ["PreparedRun", "prepare_run", "train", "rank_slots", "resumed_prediction"]


def resumed_prediction(plan: Plan, remaining_iterations: int, launch_s: float, carried_s: float,
                       carried_usd: float) -> tuple[float | None, float | None]:
    """What `plan` predicts for a run resumed with `remaining_iterations` to
    go, as totals of the whole run (elapsed seconds, USD): what the earlier
    sessions spent, one launch and the remaining iterations at the plan's
    predicted iteration time, priced at the plan's predicted cost per second.
    (The plan's own totals are for the iterations it was solved for.)"""
    p = plan.predicted
    if p is None or not p.total_s > 0:
        return None, None
    seconds = launch_s + remaining_iterations * p.iteration_s
    return carried_s + seconds, carried_usd + p.cost_usd * seconds / p.total_s


def rank_slots(plan: Plan, machines: Sequence[Sequence[Machine]], catalog: Catalog) -> list[RankSlot]:
    """The workers of a plan: for each allocation (in order) and each of its
    machines, one worker per device, the machine's batch split over them."""
    slots: list[RankSlot] = []
    index = 0
    for alloc, group in zip(plan.allocation, machines):
        gpus = catalog.get(alloc.instance_type).gpus
        for machine in group:
            batches = split_batch(alloc.batch_per_instance, gpus)
            for local_rank, batch in enumerate(batches):
                slots.append(RankSlot(len(slots), machine.id, machine.instance_type, machine.market, machine.host,
                                      index, local_rank, gpus, batch))
            index += 1
    return slots


@dataclass(frozen=True)
class PreparedRun:
    """What a run is to start with, resolved from what was given and, for a
    resumed run, from its run record and log (`prepare_run`)."""

    inputs: RunInputs
    config: RunConfig
    run_id: str
    folder: Path
    record: RunRecord | None  # the resumed run's record
    carried: CarriedOver
    options: dict[str, Any]


def prepare_run(plan: PlanArgument = None, trainer: str | Callable[..., Any] | None = None, *,
                problem: ProblemArgument = None, config: RunConfig | None = None,
                faults: Iterable[Fault] = (), run_dir: str | Path | None = None,
                trainer_args: Mapping[str, Any] | None = None, resume: bool | str | Path = False,
                run_id: str | None = None, cluster: str | Path | None = None,
                options: Mapping[str, Any] | None = None) -> PreparedRun:
    """`train`'s arguments resolved, nothing checked past them and nothing
    started: a resumed run's record fills in what is not given (trainer and
    its arguments, settings, cluster, options, plan, problem), else the
    problem's ``job`` (with its ``job_args``) is the trainer, and its log
    says what its earlier sessions spent; `RunFinished` when it has finished
    (every iteration of the problem done: a problem with more goes on).
    ``thrifty run --dry-run`` checks what this returns with
    `preflight.check_run`, as `train` does."""
    folder = Path(resume) if isinstance(resume, (str, Path)) else (Path(run_dir) if run_dir is not None else None)
    resuming = bool(resume)
    if resuming and folder is None:
        raise ProblemError("resume=True needs run_dir (or give resume=RUN_DIR)", path="resume")
    record = read_run_record(folder) if resuming and folder is not None else None
    events = read_run_log(folder / "run.jsonl") if resuming and folder is not None and \
        (folder / "run.jsonl").exists() else []
    if record is not None:
        trainer = trainer if trainer is not None else record.trainer
        trainer_args = trainer_args if trainer_args is not None else record.trainer_args
        config = config if config is not None else RunConfig(**record.config)
        run_id = run_id or record.run_id
        cluster = cluster if cluster is not None else record.cluster
        options = {**record.options, **(options or {})}
    given = run_plan(plan, problem, record, folder if resuming else None)  # one type from here on
    if trainer is None and given.problem.job is not None:  # the job the problem names (and was priced by)
        trainer = given.problem.job
        trainer_args = trainer_args if trainer_args is not None else given.problem.job_args
    finish = finished_run(events) if resuming else None
    if finish is not None and int(finish.get("iterations") or 0) >= given.problem.iterations:
        assert folder is not None  # resuming
        raise RunFinished(folder, finish)  # nothing to run, nothing to append (more iterations: it goes on)
    config = config or RunConfig()
    run_id = run_id or new_run_id()
    folder = folder if folder is not None else default_run_dir(run_id)
    carried = carried_over(events) if resuming else CarriedOver()
    inputs = RunInputs(given.plan, given.problem, trainer, dict(trainer_args or {}),
                       checkpoint_location(config.checkpoint, folder), "checkpoint" if config.checkpoint else "run_dir",
                       resuming, tuple(faults), carried.seconds, cluster, plan_source=given.source)
    return PreparedRun(inputs, config, run_id, folder, record, carried, dict(options or {}))


def train(plan: PlanArgument = None, trainer: str | Callable[..., Any] | None = None,
          *, problem: ProblemArgument = None, provider: Provider | None = None,
          hooks: Hooks | None = None, config: RunConfig | None = None, faults: Iterable[Fault] = (),
          run_dir: str | Path | None = None, trainer_args: Mapping[str, Any] | None = None,
          resume: bool | str | Path = False, on_progress: Callable[[ProgressSnapshot], None] | None = None,
          run_id: str | None = None, cluster: str | Path | None = None,
          options: Mapping[str, Any] | None = None) -> RunResult:
    """Run a plan with `trainer` (``MODULE:FACTORY`` or an importable factory)
    until all the problem's iterations are done.

    Takes what ``thrifty run`` takes: a plan (a `Plan`, its dict or a JSON
    file) with its `problem`, or a training problem alone (a `Problem`, a
    dict, a JSON or YAML file) in place of the plan, solved first.

    `run_dir` holds the run record (``run.json``: plan, problem, trainer,
    settings), the checkpoint, the run log (``run.jsonl``) and the workers'
    logs (default ``./thrifty-runs/<run id>``). ``resume=RUN_DIR`` (or
    ``resume=True`` with `run_dir`) continues a run from its checkpoint: what
    is not given is read from its record, and the time and money its earlier
    sessions spent count against the limits. Without a `provider`, machines
    come from `cluster` (`thrifty.runtime.cluster.spec.cluster_provider`):
    ``None`` or ``"local"``, local worker slots priced from the problem's
    catalog; ``"auto"``, ``"HOST:PORT"`` or ``"ray://HOST:PORT"``, the nodes of
    a running Ray cluster; a cluster config file, machines its provider
    starts, which join a Ray cluster.

    Returns a `RunResult` (``within_limits`` False and ``exceeded`` saying
    what, when the run finished past its limits: ``thrifty run`` exits 4).
    Before anything starts or is written, `preflight.check_run` makes every
    check (the plan, the machines, the trainer, the checkpoint, the faults),
    the same that ``thrifty run --dry-run`` makes, and raises `RunProblems`
    (a `ProblemError`) listing all it found. `cluster` and `options` (what a
    command started the run with, e.g. ``{"plot": "run.png"}``) are kept in
    the run record, so a resume without them has them again.

    Raises `ProblemError` for bad input (before anything starts),
    `RunFinished` when the run to resume has already finished (nothing runs
    and nothing is appended), `ReplanInfeasible` when a preemption leaves no
    plan that meets the limits, `RunInterrupted` on Ctrl-C (and, from
    ``thrifty run``, SIGTERM), `TrainingError` subclasses for failures; the
    last checkpoint survives all of them.
    """
    prepared = prepare_run(plan, trainer, problem=problem, config=config, faults=faults, run_dir=run_dir,
                           trainer_args=trainer_args, resume=resume, run_id=run_id, cluster=cluster, options=options)
    inputs, config, run_id, folder = prepared.inputs, prepared.config, prepared.run_id, prepared.folder
    plan, problem, cluster = inputs.plan, inputs.problem, inputs.cluster
    check_kinds(config.metrics)  # a metrics sink whose package is missing is refused before anything starts
    catalog = load_catalog(problem.catalog)
    own_provider = provider is None
    from thrifty.runtime.cluster.spec import cluster_kind, cluster_provider

    try:
        if provider is None and cluster_kind(cluster) != "config":  # a config's provider starts machines
            provider = cluster_provider(cluster, run_id, catalog, WORKER_PRELOAD, run_folder=folder)
        check_run(inputs, provider)  # every check --dry-run makes, all problems at once
        if provider is None:
            provider = cluster_provider(cluster, run_id, catalog, WORKER_PRELOAD, run_folder=folder)
        pool = provider.pool_capacity()
        planned = problem if pool is None else within_capacity(problem, pool)  # a fixed pool: re-plans pick from it
    except BaseException:
        if own_provider and provider is not None:
            provider.close()
        raise
    assert inputs.trainer is not None  # check_run refuses a run without one
    spec = trainer_spec(inputs.trainer)
    folder.mkdir(parents=True, exist_ok=True)
    resumed = prepared.record
    record = RunRecord(run_id=run_id, plan=plan, problem=absolute_paths(problem.model_dump(mode="json")),
                       trainer=spec, trainer_args=dict(inputs.trainer_args), config=dataclasses.asdict(config),
                       first_plan=resumed.first_plan if resumed is not None else plan,
                       cluster=None if cluster is None else str(cluster), options=prepared.options)
    write_run_record(folder, record)
    if provider.local_workers:
        _start_fork_server()
    driver = _Driver(plan, planned, catalog, spec, dict(inputs.trainer_args), provider, hooks or Hooks(),
                     config, FaultInjector(inputs.faults), folder, run_id, on_progress, record, prepared.carried)
    try:
        return driver.run(inputs.resuming)
    finally:
        driver.release(close_provider=own_provider)


CLOCK_MIN_S = 0.1  # the workers publish their clock marks at most this often


def _carried_calibration(folder: Path) -> Calibration | None:
    """The corrected models a resumed run's earlier sessions ended with (its
    log's last ``calibration`` event), None when they measured nothing."""
    log = folder / "run.jsonl"
    if not log.exists():
        return None
    last = [e for e in read_run_log(log) if e["event"] == "calibration"]
    return Calibration.from_json(last[-1]["factors"]) if last else None


def _start_fork_server() -> None:
    """Start this process's worker fork server (`zygote`: it imports torch,
    seconds of CPU) and wait for it, before the run's clock starts. It is this
    host's thrifty process starting, not a machine booting: the machines of a
    Ray cluster have theirs running before a run, and a local machine's boot
    is what `LocalProvider.launch_delay_s` stands for. (Started in the
    background as machines were asked for, its import counted against the
    time limit, a large share of a short job's on a busy host.) A fork
    server that does not start is reported by the launch that needs it."""
    try:
        zygote(WORKER_PRELOAD)
    except Exception:  # noqa: BLE001 - the world's launch starts it again and says why it cannot
        pass


class _Driver:
    """One run's mechanics: its machines (acquire, give back, bill), its
    segments one after another, its log, record and hooks. Each segment is
    watched by a `watch.SegmentWatch`, which works on the run through the
    public part of this class (`watch.WatchedRun`)."""

    def __init__(self, plan: Plan, problem: TrainingProblem, catalog: Catalog, spec: str,
                 trainer_args: dict[str, Any], provider: Provider, hooks: Hooks, config: RunConfig,
                 injector: FaultInjector, folder: Path, run_id: str,
                 on_progress: Callable[[ProgressSnapshot], None] | None, record: RunRecord, carried: CarriedOver):
        self.plan, self.problem, self.catalog = plan, problem, catalog
        self.spec, self.trainer_args, self.provider, self.hooks = spec, trainer_args, provider, hooks
        self.config, self.injector, self.folder, self.run_id = config, injector, folder, run_id
        self.checkpoint = checkpoint_location(config.checkpoint, folder)
        self.on_progress, self.record = on_progress, record
        # a resumed run's clock goes on from what its earlier sessions spent (seconds, USD)
        self.carried_s, self.carried_usd = carried.seconds, carried.usd
        self.first_segment = carried.segments  # segments are numbered across the run's sessions
        self.start = time.time() - self.carried_s
        self.log = RunLog(folder / "run.jsonl", start=self.start)
        self.metrics_out = open_metrics(folder, config.metrics, name=run_id)  # every loss and metric reported
        self.replanner = Replanner(problem, method=config.solver_method, time_limit_s=config.replan_time_limit_s)
        limits = problem.limits
        self.window_s = config.window_for(plan, problem)
        # the models corrected by what the workers measure; every re-plan solves with them
        self.calibrator = OnlineCalibrator(lambda: self.replanner.space, catalog, self.window_s,
                                           _carried_calibration(folder) if carried.segments else None)
        self.replanner.corrections = self.calibrator
        self.throughput_log_s = config.log_every_s if config.log_every_s is not None else \
            self.window_s / config.window_bins
        self.monitor = ProgressMonitor(problem.iterations, limits.time_s, limits.cost_usd, self.start,
                                       self.window_s, config.window_bins, problem.overheads.min_billed_s,
                                       spent_before_usd=self.carried_usd)
        self.metrics: dict[str, Any] | None = None  # the last loss and metrics the workers reported
        self.machines: dict[str, Machine] = {}  # every machine of the run, by id (billing)
        self.plans: list[Plan] = [plan]
        self.replans: list[Replan] = []
        self.preemptions: list[Preemption] = []
        self.segments: list[SegmentRecord] = []  # this session's
        self.policy = ReplanPolicy(self.window_s, config.replan_on_slowdown)
        self.interruptions = provider.interruptions.reader()  # every source of notices and losses, merged
        self.prediction_said = False  # the iteration time was said to be off the prediction (once a run)
        self.done = 0
        self.launch_s = problem.overheads.launch_s
        # the current plan's own prediction, as elapsed time and cost of the whole run
        self.predicted_total_s = plan.predicted.total_s if plan.predicted else None
        self.predicted_cost_usd = plan.predicted.cost_usd if plan.predicted else None

    # -- machines ---------------------------------------------------------------------------
    def _update(self, machines: Iterable[Machine]) -> None:
        self.machines.update((m.id, m) for m in machines)

    def _held(self) -> list[Machine]:
        return [m for m in self.machines.values() if m.terminated_at is None]

    def give_back(self, machines: Sequence[Machine]) -> None:
        """Terminate machines the run no longer uses."""
        if machines:
            self._update(self.provider.terminate(machines))
            self.log.write("terminate", machines=[m.id for m in machines])

    def _spent(self, now: float | None = None) -> float:
        return self.carried_usd + spent_cost(self.machines.values(), time.time() if now is None else now,
                          self.problem.overheads.min_billed_s)

    def _acquire(self, plan: Plan) -> list[list[Machine]]:
        """The plan's machines: survivors first, then new ones; the rest given back."""
        pool: dict[tuple[str, str], list[Machine]] = {}
        for m in self._held():
            pool.setdefault((m.instance_type, m.market), []).append(m)
        groups: list[list[Machine]] = []
        for alloc in plan.allocation:
            key = (alloc.instance_type, alloc.market)
            have = pool.get(key, [])[: alloc.count]
            pool[key] = pool.get(key, [])[alloc.count:]
            groups.append(have)
        self.give_back([m for rest in pool.values() for m in rest])
        for alloc, group in zip(plan.allocation, groups):
            need = alloc.count - len(group)
            if need > 0:
                new = self.provider.provision(alloc.instance_type, need, alloc.market, self.config.provision_timeout_s)
                self._update(new)
                group.extend(new)
                self.log.write("provision", instance_type=alloc.instance_type, market=alloc.market,
                               machines=[m.id for m in new])
        return groups

    def release(self, close_provider: bool) -> None:
        try:
            if close_provider:
                self.provider.close()
                self._update(self.provider.all_machines())
            else:
                self.give_back(self._held())
        finally:
            self.log.close()
            self.metrics_out.close()

    # -- the run ----------------------------------------------------------------------------
    def run(self, resume: bool) -> RunResult:
        if resume:
            from thrifty.runtime.ddp.checkpoint import load_checkpoint

            state = load_checkpoint(self.checkpoint)
            assert state is not None  # train() refuses to resume a run without a checkpoint
            self.done = int(state["iteration"])
            self.predicted_total_s, self.predicted_cost_usd = resumed_prediction(
                self.plan, self.problem.iterations - self.done, self.problem.overheads.launch_s, self.carried_s,
                self.carried_usd)
        self.log.write("start", run_id=self.run_id, trainer=self.spec, trainer_args=self.trainer_args,
                       plan=self.plan.model_dump(), iterations=self.problem.iterations, start_iteration=self.done,
                       global_batch=self.problem.global_batch, limits=self.problem.limits.model_dump(),
                       config=self.config.__dict__, window_s=self.window_s, resumed=resume,
                       carried_s=self.carried_s, carried_usd=self.carried_usd,
                       predicted_total_s=self.predicted_total_s, predicted_cost_usd=self.predicted_cost_usd)
        plan = self.plan
        try:
            while self.done < self.problem.iterations:
                if len(self.replans) > self.config.max_replans:
                    raise TrainingError(f"re-planned {len(self.replans)} times, more than max_replans "
                                        f"{self.config.max_replans}; the last checkpoint is kept")
                acquire_at = time.time()
                self.monitor.reset(self.done)  # a new world is measured afresh
                self.report(acquire_at, "launching", plan)  # before machines that may take minutes to boot
                try:
                    groups = self._acquire(plan)
                except CapacityError as e:
                    plan = self._on_capacity(e, plan)
                    continue
                plan = self._run_segment(plan, groups, acquire_at)
        except KeyboardInterrupt as e:
            reached = max(self.done, self.monitor.iterations)
            self.log.write("interrupted", iteration=reached, checkpoint_iteration=self._last_checkpoint(),
                           spent_usd=self._spent())
            if isinstance(e, RunInterrupted):
                raise
            raise RunInterrupted("SIGTERM" if isinstance(e, Terminated) else "SIGINT", reached,
                                 self._last_checkpoint(), self.folder) from None
        except BaseException as e:
            self.log.write("error", error=f"{type(e).__name__}: {e}", iteration=max(self.done, self.monitor.iterations))
            if isinstance(e, TrainingError):
                e.run_dir, e.checkpoint_iteration = self.folder, self._last_checkpoint()
            raise
        now = time.time()
        result = RunResult(self.run_id, self.folder, self.done, self.problem.iterations, now - self.start,
                           self._spent(now), self.problem.limits.time_s, self.problem.limits.cost_usd,
                           tuple(self.plans), tuple(self.replans), tuple(self.preemptions), tuple(self.segments),
                           self.checkpoint)
        predicted = self.plan.predicted
        self.log.write("finish", at=now, iterations=self.done, cost_usd=result.cost_usd,
                       within_limits=result.within_limits, time_limit_s=result.time_limit_s,
                       cost_limit_usd=result.cost_limit_usd, configs=[p.config for p in self.plans],
                       predicted_total_s=predicted.total_s if predicted else None,
                       predicted_cost_usd=predicted.cost_usd if predicted else None)
        self.hooks.emit("finished", result)
        return result

    def report(self, now: float, state: str, plan: Plan) -> None:
        """Tell `on_progress` where the run is."""
        if self.on_progress is None:
            return
        verdict = self.monitor.check(now, self.machines.values())
        self.on_progress(ProgressSnapshot(
            state, plan.config, self.monitor.iterations, self.problem.iterations, now - self.start,
            verdict.spent_usd, self.predicted_total_s, self.predicted_cost_usd, verdict.projected_total_s,
            verdict.projected_cost_usd, verdict.window, self.problem.limits.time_s, self.problem.limits.cost_usd,
            None if self.metrics is None else self.metrics.get("loss"),
            None if self.metrics is None else self.metrics.get("metrics")))

    def _last_checkpoint(self) -> int:
        saved = [e["iteration"] for e in self.log.events if e["event"] == "checkpoint"]
        return max(saved, default=self.done)

    def _on_capacity(self, error: CapacityError, plan: Plan) -> Plan:
        event = error.as_preemption()
        self.announce(event)
        return self.commit(self.solve("capacity", plan, self.problem.iterations - self.done, event))

    def announce(self, event: Preemption, **extra: Any) -> None:
        """Record an interruption: deplete its market, log it, tell the hooks."""
        self.preemptions.append(event)
        self.replanner.deplete(event.key)
        self.log.write("preemption", **json_object(event), **extra)
        self.hooks.emit("preemption", event)

    def solve(self, reason: str, plan: Plan, remaining: int, event: Preemption | None = None,
               event_at: float | None = None, gone: Iterable[str] = ()) -> Replan:
        """Re-solve for what is left; machines in `gone` are not survivors."""
        now = time.time()
        gone = set(gone)
        survivors: Counter[Key] = Counter((m.instance_type, m.market) for m in self._held() if m.id not in gone)
        return self.replanner.replan(
            reason, old_plan=plan, remaining_iterations=remaining, elapsed_s=now - self.start,
            spent_usd=self._spent(now), survivors=survivors, launch_s=self.launch_s,
            event_at=event_at if event_at is not None else (event.at if event is not None else now), event=event,
            best_effort=self.policy.best_effort(reason))

    def forecast(self, remaining: int, now: float) -> tuple[TrainingProblem, list[dict[str, Any]]] | None:
        """Whether any plan meets what is left with the corrected models
        (`replan.Replanner.forecast`): None when one does, else the re-plan
        problem and the least changes of its limits."""
        survivors: Counter[Key] = Counter((m.instance_type, m.market) for m in self._held())
        return self.replanner.forecast(remaining_iterations=remaining, elapsed_s=now - self.start,
                                       spent_usd=self._spent(now), survivors=survivors, launch_s=self.launch_s)

    def commit(self, replan: Replan) -> Plan:
        """Make a re-plan the plan in force (logged, in the run record, told to the hooks)."""
        now = time.time()
        self.replans.append(replan)
        self.plans.append(replan.new_plan)
        predicted = replan.new_plan.predicted
        assert predicted is not None  # Replanner.replan returns feasible plans, which predict
        self.predicted_total_s = now - self.start + predicted.total_s
        self.predicted_cost_usd = self._spent(now) + predicted.cost_usd
        self.log.write("replan", **json_object(replan))
        self.record = self.record.model_copy(update={"plan": replan.new_plan})
        write_run_record(self.folder, self.record)  # a resume goes on with the plan in force
        self.hooks.emit("replanned", replan)
        return replan.new_plan

    def check_prediction(self, segment: int, plan: Plan, slots: Sequence[RankSlot], reached: int, start: int,
                         window: ThroughputWindow | None) -> None:
        """Say once a run when the steady iteration time of `segment` (which
        ran iterations `start` to `reached` of `plan` on `slots`) is off the
        plan's prediction by more than 1.5x, why that is likely, and how to
        profile the trainer (in the run log, and to the ``prediction_off``
        hook)."""
        predicted = plan.predicted
        ratio = None if self.prediction_said else prediction_off(window, predicted.iteration_s if predicted else None)
        if ratio is None or predicted is None:
            return
        self.prediction_said = True
        slowed = [f for f in self.injector.faults if isinstance(f, SlowWorker) and f.from_iteration <= reached
                  and (f.until_iteration is None or f.until_iteration > start)]
        model = self.problem.model
        same_model = self.spec == ZOO_TRAINER and self.trainer_args.get("model", "tiny-transformer") == model
        cause = prediction_off_cause(ratio, model, same_model, slowed)
        devices = {self.catalog.get(s.instance_type).device for s in slots}
        device = "cpu" if devices == {"cpu"} else "cuda"
        local = len(slots) if self.provider.local_workers else 1
        said = PredictionOff(segment, plan.config, predicted.iteration_s * ratio, predicted.iteration_s,
                             cause, profile_command(self.spec, self.trainer_args, device, self.config.threads, local))
        self.log.write("prediction_off", **json_object(said))
        self.hooks.emit("prediction_off", said)

    def _run_segment(self, plan: Plan, groups: list[list[Machine]], acquire_at: float) -> Plan:
        """Run one world until it finishes or stops; returns the plan to go on with."""
        index = self.first_segment + len(self.segments)
        slots = rank_slots(plan, groups, self.catalog)
        cfg = self.config
        backend = cfg.backend
        if backend == "auto":  # local pseudo machines are CPU workers even on a host with GPUs
            devices = {self.catalog.get(s.instance_type).device for s in slots}
            backend = "gloo" if devices == {"cpu"} else "auto"
        job = JobSpec(trainer=self.spec, trainer_args=self.trainer_args, global_batch=self.problem.global_batch,
                      iterations=self.problem.iterations, batches=tuple(s.batch for s in slots),
                      checkpoint_path=self.checkpoint, checkpoint_every=cfg.checkpoint_every,
                      checkpoint_every_s=cfg.checkpoint_every_s, seed=cfg.seed, threads=cfg.threads,
                      backend=backend, timeout_s=cfg.collective_timeout_s, weighting=cfg.weighting,
                      faults=self.injector.worker_faults(len(self.segments), slots, self.done),
                      machine_ids=tuple(s.machine_id for s in slots),
                      clock_every_s=max(CLOCK_MIN_S, self.window_s / cfg.window_bins))
        watch = SegmentWatch(self, plan, slots, index, acquire_at)
        self.monitor.reset(self.done)
        self.calibrator.segment_started()
        self.log.write("launch", segment=index, config=plan.config, world_size=len(slots),
                       batches=[s.batch for s in slots], start_iteration=self.done,
                       machines=[s.machine_id for s in slots])
        launcher = self.provider.world_launcher([s.machine_id for s in slots], WORKER_PRELOAD)
        with Segment(job, slots, self.folder, index, world_timeout_s=cfg.world_timeout_s,
                     stall_timeout_s=cfg.stall_timeout_s, stop_timeout_s=cfg.stop_timeout_s,
                     launcher=launcher) as segment:
            watch.segment = segment
            segment.start()
            ended = watch.follow()
        return watch.finish(ended)
