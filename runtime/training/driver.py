"""`train(plan, trainer)`: carry out a training plan, watch it, re-plan (Srifty 4.5, 5.4).

The driver gets the plan's machines from a provider (`LocalProvider` by
default), starts one world of workers on them (`launcher.Segment`), and polls:
worker reports, the provider's interruption notices, the fault injector and
the progress monitor. What it does on each event:

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
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, computed_field, field_serializer
from pydantic.dataclasses import dataclass as record_dataclass

from thrifty.datasets.catalog import Catalog, load_catalog
from thrifty.core.errors import ProblemError
from thrifty.core.validation import RECORD_CONFIG, json_object
from thrifty.runtime.events import Preemption
from thrifty.runtime.providers.base import CapacityError, Machine, Provider
from thrifty.runtime.training.errors import ReplanInfeasible, RunFinished, RunInterrupted, Terminated, TrainingError
from thrifty.runtime.training.faults import Fault, FaultInjector, SlowWorker, describe_fault
from thrifty.runtime.training.hooks import Hooks
from thrifty.runtime.ddp.job import JobSpec
from thrifty.runtime.training.launcher import WORKER_PRELOAD, RankSlot, Segment, SegmentPoll
from thrifty.runtime.training.monitor import (ProgressMonitor, ThroughputWindow, auto_window_s, prediction_off,
                                              spent_cost)
from thrifty.runtime.training.plans import plan_and_problem, within_capacity
from thrifty.runtime.training.preflight import RunInputs, check_run
from thrifty.runtime.training.replan import Key, Replan, Replanner
from thrifty.runtime.training.rundir import (CarriedOver, RunRecord, absolute_paths, carried_over, default_run_dir,
                                             finished_run, new_run_id, read_run_record, write_run_record)
from thrifty.runtime.training.runlog import RunLog, read_run_log
from thrifty.runtime.ddp.sharding import split_batch
from thrifty.runtime.ddp.trainer import trainer_spec
from thrifty.runtime.worlds import zygote
from thrifty.solver.plan import Plan
from thrifty.solver.problem import Problem, TrainingProblem

__all__ = ["RunConfig", "SegmentRecord", "RunResult", "ProgressSnapshot", "PredictionOff", "PreparedRun", "prepare_run",
           "train", "rank_slots",
           "resumed_prediction", "slowdown_hold_off_s", "profile_command"]


@dataclass(frozen=True)
class RunConfig:
    """How a run behaves. Times in seconds.

    `window_s` is Srifty's K and `window_bins` the bins its throughput
    standard deviation is taken over; None (the default) scales the window
    with the job (`monitor.auto_window_s`: a tenth of the time limit or of
    the predicted time, at most Srifty's 5 minutes), so that a short job
    shows its rate and re-plans on a persistent slowdown too. `replan_time_limit_s` is the
    solver's time limit on a re-plan (Srifty gives itself 1 s). `weighting`:
    ``batch`` (gradient reweighting by loss scaling, the default), ``hook``
    (the same as a DDP communication hook) or ``mean`` (plain DDP averaging,
    equal batches only); see `thrifty.runtime.ddp.reweight`.
    """

    checkpoint_every: int | None = 100
    checkpoint_every_s: float | None = 60.0
    checkpoint: str | None = None  # a path or s3://bucket/key every machine reaches; None: RUN_DIR/checkpoint.pt
    window_s: float | None = None
    window_bins: int = 10
    replan_on_slowdown: bool = True
    poll_s: float = 0.05
    world_timeout_s: float = 120.0
    stall_timeout_s: float = 600.0
    stop_timeout_s: float = 120.0
    collective_timeout_s: float = 600.0
    provision_timeout_s: float = 600.0
    threads: int = 1
    seed: int = 0
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    weighting: Literal["batch", "hook", "mean"] = "batch"
    solver_method: str = "auto"
    replan_time_limit_s: float | None = 1.0
    max_replans: int = 16
    log_every_s: float | None = None  # throughput log period; default window_s / window_bins

    def __post_init__(self) -> None:
        if self.window_s is not None and not self.window_s > 0:
            raise ProblemError(f"is {self.window_s}, but must be positive (or None: automatic)", path="window_s")
        for name in ("poll_s", "world_timeout_s", "stall_timeout_s", "stop_timeout_s",
                     "collective_timeout_s", "provision_timeout_s"):
            if not getattr(self, name) > 0:
                raise ProblemError(f"is {getattr(self, name)}, but must be positive", path=name)
        if self.window_bins < 2:
            raise ProblemError(f"is {self.window_bins}, but must be at least 2", path="window_bins")
        if self.threads < 1:
            raise ProblemError(f"is {self.threads}, but must be at least 1", path="threads")
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise ProblemError(f"is {self.checkpoint_every}, but must be at least 1", path="checkpoint_every")

    def window_for(self, plan: Plan, problem: TrainingProblem) -> float:
        """The monitor's window for `plan` of `problem`: `window_s`, or automatic."""
        if self.window_s is not None:
            return self.window_s
        p = plan.predicted
        return auto_window_s(problem.limits.time_s, p.total_s if p else None, p.iteration_s if p else None,
                             self.window_bins)


@record_dataclass(frozen=True, config=RECORD_CONFIG)
class SegmentRecord:
    """One world of workers: from which iteration, to where, and how it ended;
    the ``segment_end`` event of the run log, with the figures derived below
    (`thrifty.core.validation.json_object`)."""

    index: int
    config: str
    batches: tuple[int, ...]
    start_iteration: int
    reached_iteration: int  # the last iteration the workers reported
    committed_iteration: int  # the last checkpoint: where the next world starts
    ended: str  # "finished", "stopped", "killed", "lost"
    launch_s: float | None  # from asking for machines to the first iteration done
    checkpoint_s: tuple[float, ...]  # seconds per save
    throughput: float | None  # iterations per second in steady state, from the workers' clock
    predicted_iteration_s: float | None = None  # what the segment's plan predicted for one iteration

    @computed_field  # type: ignore[prop-decorator]
    @property
    def lost_iterations(self) -> int:
        return self.reached_iteration - self.committed_iteration

    @computed_field  # type: ignore[prop-decorator]
    @property
    def actual_iteration_s(self) -> float | None:
        """The steady-state iteration time the workers measured."""
        return 1.0 / self.throughput if self.throughput else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def prediction_ratio(self) -> float | None:
        """Measured over predicted iteration time (1.0: the prediction held)."""
        if self.actual_iteration_s is None or not self.predicted_iteration_s:
            return None
        return self.actual_iteration_s / self.predicted_iteration_s


@record_dataclass(frozen=True, config=RECORD_CONFIG)
class RunResult:
    """How a run ended. Its JSON (``thrifty run --json``,
    `thrifty.core.validation.json_object`) gives the configurations of its
    plans (``configs``), not the plans, and leaves the checkpoint out."""

    run_id: str
    run_dir: Path
    iterations: int
    total_iterations: int
    elapsed_s: float
    cost_usd: float
    time_limit_s: float | None
    cost_limit_usd: float | None
    plans: Annotated[tuple[Plan, ...], Field(exclude=True)]
    replans: tuple[Replan, ...]
    preemptions: tuple[Preemption, ...]
    segments: tuple[SegmentRecord, ...]
    # where the checkpoint is: a path, or s3://bucket/key; "" = run_dir/checkpoint.pt
    checkpoint: Annotated[str, Field(exclude=True)] = ""

    @field_serializer("run_dir")
    def _run_dir_text(self, run_dir: Path) -> str:
        return str(run_dir)

    @property
    def checkpoint_path(self) -> Path | str:
        """The checkpoint: a `Path` when it is on a file system, else its s3:// URL."""
        from thrifty.runtime.ddp import storage

        location = checkpoint_location(self.checkpoint or None, self.run_dir)
        return location if storage.is_remote(location) else Path(location)

    @property
    def log_path(self) -> Path:
        return self.run_dir / "run.jsonl"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def within_limits(self) -> bool:
        return ((self.time_limit_s is None or self.elapsed_s <= self.time_limit_s)
                and (self.cost_limit_usd is None or self.cost_usd <= self.cost_limit_usd))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def exceeded(self) -> list[str]:
        """What the run went past, in words (empty within its limits)."""
        out = []
        if self.time_limit_s is not None and self.elapsed_s > self.time_limit_s:
            out.append(f"time {self.elapsed_s:,.1f} s > limit {self.time_limit_s:g} s "
                       f"(+{self.elapsed_s - self.time_limit_s:,.1f} s)")
        if self.cost_limit_usd is not None and self.cost_usd > self.cost_limit_usd:
            out.append(f"cost ${self.cost_usd:,.4f} > budget ${self.cost_limit_usd:g} "
                       f"(+${self.cost_usd - self.cost_limit_usd:,.4f})")
        return out

    @computed_field  # type: ignore[prop-decorator]
    @property
    def configs(self) -> list[str]:
        """Each plan's configuration, in the order they ran."""
        return [p.config for p in self.plans]


@dataclass(frozen=True)
class ProgressSnapshot:
    """What `thrifty run`'s progress bar shows: predicted against actual."""

    state: str  # "launching", "training", "stopping"
    config: str
    iterations: int
    total_iterations: int
    elapsed_s: float
    spent_usd: float
    predicted_total_s: float | None  # when the current plan says the job ends (since the start)
    predicted_cost_usd: float | None
    projected_total_s: float | None  # when the measured throughput says it ends
    projected_cost_usd: float | None
    window: ThroughputWindow | None
    time_limit_s: float | None
    cost_limit_usd: float | None
    loss: float | None = None  # the training loss last reported (global-batch mean)
    metrics: Mapping[str, float] | None = None  # the trainer's own metrics last reported

    @property
    def eta_s(self) -> float | None:
        """Seconds left by the measured throughput."""
        return None if self.projected_total_s is None else max(0.0, self.projected_total_s - self.elapsed_s)


@record_dataclass(frozen=True, config=RECORD_CONFIG)
class PredictionOff:
    """Measured and predicted iteration time differ by more than
    `monitor.PREDICTION_OFF_FACTOR` over a steady window: the likely cause,
    and the command that profiles the trainer's model (said once a run)."""

    segment: int
    config: str
    measured_iteration_s: float
    predicted_iteration_s: float
    cause: str
    command: str

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ratio(self) -> float:
        return self.measured_iteration_s / self.predicted_iteration_s

    def __str__(self) -> str:
        return (f"iteration time {self.measured_iteration_s * 1e3:.1f} ms measured, "
                f"{self.predicted_iteration_s * 1e3:.1f} ms predicted ({self.ratio:.2f}x, segment {self.segment} "
                f"{self.config}): likely {self.cause}; profile the trainer's model with: {self.command}")


ZOO_TRAINER = "thrifty.runtime.training.examples:zoo"  # runs the zoo model its `model` argument names


def profile_command(spec: str, trainer_args: Mapping[str, Any], device: str, threads: int, colocated: int) -> str:
    """The ``thrifty profile`` command that measures what this trainer runs
    (`thrifty.runtime.commands.profile`): its workload factory and name for
    the zoo trainer, else a workload factory of the user's to write (a
    function returning the trainer's model, ``make_batch`` and ``loss_fn``);
    on CPU with `colocated` workers sharing the host, as the run has them."""
    import shlex

    factory, name = "MODULE:WORKLOAD", spec.rsplit(":", 1)[-1].replace("_", "-")
    if spec == ZOO_TRAINER:
        from thrifty.runtime.measure import FACTORIES

        name = str(trainer_args.get("model", "tiny-transformer"))
        if name in FACTORIES:
            factory = f"thrifty.runtime.measure.zoo:{FACTORIES[name].__name__}"
    words = ["thrifty", "profile", factory, "--out", f"{name}__{device}.json", "--name", name,
             "--threads", str(threads), "--device", device]
    if device == "cpu" and colocated > 1:
        words += ["--colocated", str(colocated)]
    text = shlex.join(words)
    if factory == "MODULE:WORKLOAD":
        text += f" (MODULE:WORKLOAD returns the model of {spec} with make_batch and loss_fn)"
    return text + ", then name that file as the problem's model"


def checkpoint_location(checkpoint: str | None, run_dir: Path) -> str:
    """Where a run's checkpoint lives: `checkpoint` (a path or s3://bucket/key), or in its run directory."""
    return checkpoint or str(run_dir / "checkpoint.pt")


MAX_HOLD_OFF_WINDOWS = 8
SAME_INTERRUPT_S = 1.0  # a second SIGINT sooner than this after the first is the same Ctrl-C


def slowdown_hold_off_s(window_s: float, fruitless_replans: int) -> float:
    """How long the monitor holds off after `fruitless_replans` slowdown
    re-plans in a row that changed nothing: one window after the first, then
    twice as long after each, at most `MAX_HOLD_OFF_WINDOWS` windows (a
    persistent slowdown with no better plan is then re-solved, and logged,
    a few times in a short job, not every window)."""
    return window_s * min(2 ** max(0, fruitless_replans - 1), MAX_HOLD_OFF_WINDOWS)


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


def prepare_run(plan: Plan | Problem | dict | str | Path | None = None,
                trainer: str | Callable[..., Any] | None = None, *,
                problem: TrainingProblem | dict | str | Path | None = None, config: RunConfig | None = None,
                faults: Iterable[Fault] = (), run_dir: str | Path | None = None,
                trainer_args: Mapping[str, Any] | None = None, resume: bool | str | Path = False,
                run_id: str | None = None, cluster: str | Path | None = None,
                options: Mapping[str, Any] | None = None) -> PreparedRun:
    """`train`'s arguments resolved, nothing checked past them and nothing
    started: a resumed run's record fills in what is not given (trainer and
    its arguments, settings, cluster, options, plan, problem) and its log
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
    plan_given = plan
    plan, problem = plan_and_problem(plan, problem, record, folder if resuming else None)
    finish = finished_run(events) if resuming else None
    if finish is not None and int(finish.get("iterations") or 0) >= problem.iterations:
        assert folder is not None  # resuming
        raise RunFinished(folder, finish)  # nothing to run, nothing to append (more iterations: it goes on)
    config = config or RunConfig()
    run_id = run_id or new_run_id()
    folder = folder if folder is not None else default_run_dir(run_id)
    carried = carried_over(events) if resuming else CarriedOver()
    inputs = RunInputs(plan, problem, trainer, dict(trainer_args or {}), checkpoint_location(config.checkpoint, folder),
                       "checkpoint" if config.checkpoint else "run_dir", resuming, tuple(faults), carried.seconds,
                       cluster, plan_source=str(plan_given) if isinstance(plan_given, (str, Path)) else None)
    return PreparedRun(inputs, config, run_id, folder, record, carried, dict(options or {}))


def train(plan: Plan | Problem | dict | str | Path | None = None, trainer: str | Callable[..., Any] | None = None,
          *, problem: TrainingProblem | dict | str | Path | None = None, provider: Provider | None = None,
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
    catalog = load_catalog(problem.catalog)
    own_provider = provider is None
    from thrifty.runtime.cluster.spec import cluster_kind, cluster_provider

    try:
        if provider is None and cluster_kind(cluster) != "config":  # a config's provider starts machines
            provider = cluster_provider(cluster, run_id, catalog, WORKER_PRELOAD, run_folder=folder)
        check_run(inputs, provider)  # every check --dry-run makes, all problems at once
        if provider is None:
            provider = cluster_provider(cluster, run_id, catalog, WORKER_PRELOAD, run_folder=folder)
        pool = getattr(provider, "pool_capacity", lambda: None)()
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


def _start_fork_server() -> None:
    """Start this process's worker fork server (`zygote`: it imports torch,
    seconds of CPU) and wait for it, before the run's clock starts. It is this
    host's thrifty process starting, not a machine booting: the machines of a
    Ray cluster have theirs running before a run, and a local machine's boot
    is what `LocalProvider.launch_delay_s` stands for. (Started in the
    background as machines were asked for, its import counted against the
    time limit, 3 to 8 s of the demo's 30 s on a busy 2-core host.) A fork
    server that does not start is reported by the launch that needs it."""
    try:
        zygote(WORKER_PRELOAD)
    except Exception:  # noqa: BLE001 - the world's launch starts it again and says why it cannot
        pass


class _Driver:
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
        self.replanner = Replanner(problem, method=config.solver_method, time_limit_s=config.replan_time_limit_s)
        limits = problem.limits
        self.window_s = config.window_for(plan, problem)
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
        self.fruitless_replans = 0  # slowdown re-plans in a row that changed nothing (kept or infeasible)
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

    def _give_back(self, machines: Sequence[Machine]) -> None:
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
        self._give_back([m for rest in pool.values() for m in rest])
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
                self._update(getattr(self.provider, "all_machines", lambda: [])())
            else:
                self._give_back(self._held())
        finally:
            self.log.close()

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
        self._announce(event)
        return self._commit(self._solve("capacity", plan, self.problem.iterations - self.done, event))

    def _announce(self, event: Preemption, **extra: Any) -> None:
        self.preemptions.append(event)
        self.replanner.deplete(event.key)
        self.log.write("preemption", **json_object(event), **extra)
        self.hooks.emit("preemption", event)

    def _solve(self, reason: str, plan: Plan, remaining: int, event: Preemption | None = None,
               event_at: float | None = None, gone: Iterable[str] = ()) -> Replan:
        """Re-solve for what is left; machines in `gone` are not survivors."""
        now = time.time()
        gone = set(gone)
        survivors: Counter[Key] = Counter((m.instance_type, m.market) for m in self._held() if m.id not in gone)
        return self.replanner.replan(
            reason, old_plan=plan, remaining_iterations=remaining, elapsed_s=now - self.start,
            spent_usd=self._spent(now), survivors=survivors, launch_s=self.launch_s,
            event_at=event_at if event_at is not None else (event.at if event is not None else now), event=event,
            best_effort=reason != "slowdown")  # machines lost: go on late rather than stop half done

    def _commit(self, replan: Replan) -> Plan:
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
                      machine_ids=tuple(s.machine_id for s in slots))
        watch = _SegmentWatch(self, plan, slots, index, acquire_at)
        self.monitor.reset(self.done)
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


class _SegmentWatch:
    """The driver's side of one segment: reacts to each poll."""

    def __init__(self, driver: _Driver, plan: Plan, slots: list[RankSlot], index: int, acquire_at: float):
        self.d, self.plan, self.slots, self.index, self.acquire_at = driver, plan, slots, index, acquire_at
        self.segment: Segment = None  # type: ignore[assignment]
        self.next_plan: Plan | None = None
        self.failure: BaseException | None = None
        self.handled: set[str] = set()  # machines already preempted
        self.kill_at: dict[str, float] = {}  # machine id -> when its warning runs out
        self.start = self.reached = driver.done
        self.first_progress_at: float | None = None
        self.last_throughput_log = 0.0
        self.timing: dict | None = None

    def machine_of(self, machine_id: str) -> Machine:
        return self.d.machines[machine_id]

    def follow(self) -> str:
        try:
            return self._follow()
        except KeyboardInterrupt:
            self._stop_on_interrupt()
            raise

    def _stop_on_interrupt(self) -> None:
        """Ctrl-C: ask the workers to checkpoint and stop, and wait for them up
        to the stop timeout; a second Ctrl-C stops waiting (the workers are
        then killed and the run resumes from its last checkpoint). A SIGINT
        within `SAME_INTERRUPT_S` of the first is the same one delivered twice
        (to the process and to its process group, as ``timeout`` does)."""
        seg, d = self.segment, self.d
        if seg is None:
            return
        first = time.monotonic()
        deadline = first + d.config.stop_timeout_s
        try:
            seg.request_stop()
        except Exception:  # noqa: BLE001 - a failure while stopping: the workers are killed on exit
            return
        while time.monotonic() < deadline:
            try:
                if self._stopped_after_interrupt(seg):
                    return
                time.sleep(d.config.poll_s)
            except KeyboardInterrupt:
                if time.monotonic() - first >= SAME_INTERRUPT_S:
                    return
            except Exception:  # noqa: BLE001 - a failure while stopping: the workers are killed on exit
                return

    def _stopped_after_interrupt(self, seg: Segment) -> bool:
        d = self.d
        poll = seg.poll()
        self._worker_events(poll)
        if poll.iteration is not None:
            self.reached = max(self.reached, poll.iteration)
            d.monitor.iterations = max(d.monitor.iterations, poll.iteration)
        return bool(poll.ended or poll.lost)

    def _follow(self) -> str:
        d, seg = self.d, self.segment
        while True:
            poll = seg.poll()
            now = time.time()
            self._worker_events(poll)
            if poll.metrics is not None:
                d.metrics = poll.metrics
                d.log.write("metrics", at=poll.metrics.get("at"), segment=self.index,
                            iteration=poll.metrics.get("iteration"), loss=poll.metrics.get("loss"),
                            metrics=poll.metrics.get("metrics", {}))
            if poll.iteration is not None and poll.iteration_at is not None:
                if self.first_progress_at is None and poll.iteration > d.done:
                    self.first_progress_at = poll.iteration_at
                    d.launch_s = max(d.launch_s, poll.iteration_at - self.acquire_at)
                self.reached = max(self.reached, poll.iteration)
                d.monitor.observe(poll.iteration_at, poll.iteration)
            if poll.lost:
                self._lost(poll.lost)
                return "lost"
            if poll.ended:
                return poll.ended
            ours = {s.machine_id for s in self.slots}
            notices = []
            for e in d.provider.poll_interruptions():
                if e.machine_id is None:  # a market gone (capacity): no new machines of it, none stops
                    d._announce(e, segment=self.index)
                elif e.machine_id in ours:
                    notices.append(e)
            for action in d.injector.due(now - d.start, 1 + max(s.machine_index for s in self.slots)):
                machine_id = next(s.machine_id for s in self.slots if s.machine_index == action.machine)
                if action.warning_s is None:
                    seg.kill(seg.ranks_of(machine_id), as_loss=True)
                else:
                    m = self.machine_of(machine_id)
                    notices.append(Preemption(m.instance_type, m.market, "injector", machine_id, action.warning_s,
                                              "fault injector: spot notice"))
            if notices:
                self._preempted(notices)
            for machine_id, deadline in list(self.kill_at.items()):
                if now >= deadline:  # the warning ran out: the machine goes, stopped or not
                    seg.kill(seg.ranks_of(machine_id), as_loss=True)
                    del self.kill_at[machine_id]
            if poll.formed and seg.stop_requested_at is None:
                self._check_progress(now)
            self._report(now, "stopping" if seg.stop_requested_at is not None else
                         "training" if poll.formed else "launching")
            time.sleep(d.config.poll_s)

    def _worker_events(self, poll: SegmentPoll) -> None:
        d = self.d
        for e in poll.events:
            kind = e["event"]
            if kind == "checkpoint":
                d.log.write("checkpoint", at=e["at"], segment=self.index, iteration=e["iteration"],
                            save_s=e["save_s"], bytes=e["bytes"])
            elif kind == "ready" and e["rank"] == 0:
                d.log.write("world_formed", at=e["at"], segment=self.index, start_iteration=e["start_iteration"],
                            rng=e["rng"], since_launch_s=e["at"] - self.acquire_at)
                if e["start_iteration"] != self.start:
                    self._found_checkpoint(e["start_iteration"])
            elif kind == "notice":
                self.reached = max(self.reached, e["iteration"])
                m = self.machine_of(e["machine_id"])
                self._preempted([Preemption(m.instance_type, m.market, "injector", m.id, e["time_left_s"],
                                            "fault injector: spot notice", at=e["at"])])
            elif kind in ("done", "stopped"):
                self.timing = e.get("timing")

    def _found_checkpoint(self, iteration: int) -> None:
        """The workers started from a later checkpoint than the driver knew of:
        the last world saved it and was killed before it could say so."""
        d = self.d
        if iteration < self.start or not d.segments:
            raise TrainingError(f"segment {self.index} started at iteration {iteration}, but the driver "
                                f"expected {self.start}")
        d.log.write("checkpoint_found", segment=self.index - 1, iteration=iteration, expected=self.start)
        d.segments[-1] = replace(d.segments[-1], committed_iteration=iteration)
        self.start = self.reached = d.done = iteration
        d.monitor.reset(iteration)

    def _preempted(self, events: Sequence[Preemption]) -> None:
        """Machines of this world are being taken away (or a market is gone):
        deplete, stop (gracefully while there is time left), re-plan."""
        fresh = [e for e in events if e.machine_id is None or e.machine_id not in self.handled]
        if not fresh:
            return
        d, seg = self.d, self.segment
        graceful = all(e.machine_id is not None and e.time_left_s is not None and e.time_left_s > 0 for e in fresh)
        self.handled.update(e.machine_id for e in fresh if e.machine_id is not None)
        # with time left the workers stop after their current iteration (at least `reached`: the plan
        # is for at most what is left); without, the run restarts from its last checkpoint
        restart = self.reached if graceful else (seg.last_checkpoint if seg.last_checkpoint is not None else self.start)
        for e in fresh:
            d._announce(e, segment=self.index, iteration=self.reached, plan_from_iteration=restart)
        if graceful:
            seg.request_stop()
            for e in fresh:
                assert e.machine_id is not None and e.time_left_s is not None  # what makes the stop graceful
                self.kill_at[e.machine_id] = e.at + e.time_left_s
        else:
            seg.kill()
        try:
            self.next_plan = d._commit(d._solve("preemption", self.plan, d.problem.iterations - restart, fresh[0],
                                                gone=self.handled))
        except ReplanInfeasible as e:
            self.failure = e
            seg.request_stop()

    def _lost(self, lost: list[tuple[int, int]]) -> None:
        """Workers gone without notice: their machines are lost."""
        self.segment.kill()
        events: dict[str, Preemption] = {}
        for rank, code in lost:
            slot = self.slots[rank]
            events.setdefault(slot.machine_id, Preemption(
                slot.instance_type, slot.market, "worker-exit", slot.machine_id, 0.0,
                f"rank {rank} exited with code {code} without notice"))
        self._preempted(list(events.values()))

    def _check_progress(self, now: float) -> None:
        d = self.d
        verdict = d.monitor.check(now, d.machines.values())
        if not d.prediction_said:
            self._check_prediction(verdict.window)
        if now - self.last_throughput_log >= d.throughput_log_s:
            self.last_throughput_log = now
            d.log.write("throughput", at=now, segment=self.index, **json_object(verdict))
        if not verdict.replan or not d.config.replan_on_slowdown:
            return
        d.monitor.hold_off(now, d.window_s)  # judge again only on a fresh window
        d.log.write("slowdown", at=now, segment=self.index, **json_object(verdict))
        d.hooks.emit("slowdown", verdict)
        try:
            replan = d._solve("slowdown", self.plan, d.problem.iterations - self.reached, event_at=now)
        except ReplanInfeasible as e:
            d.log.write("replan_infeasible", reason="slowdown", error=str(e))
            self._fruitless(now)
            return
        if replan.new_config == self.plan.config:  # the same machines: switching would only cost
            d.log.write("replan_kept", config=self.plan.config, latency_s=replan.latency_s)
            self._fruitless(now)
            return
        d.fruitless_replans = 0
        self.next_plan = d._commit(replan)
        self.segment.request_stop()

    def _check_prediction(self, window: ThroughputWindow | None) -> None:
        """Say once a run when the steady iteration time is off the plan's
        prediction by more than 1.5x, why that is likely, and how to profile
        the trainer (in the run log, and to the ``prediction_off`` hook)."""
        d, predicted = self.d, self.plan.predicted
        ratio = prediction_off(window, predicted.iteration_s if predicted else None)
        if ratio is None or predicted is None:
            return
        d.prediction_said = True
        slowed = [f for f in d.injector.faults if isinstance(f, SlowWorker) and f.from_iteration <= self.reached
                  and (f.until_iteration is None or f.until_iteration > self.start)]
        model = d.problem.model
        same_model = d.spec == ZOO_TRAINER and d.trainer_args.get("model", "tiny-transformer") == model
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        cpus = os.cpu_count() or 1
        busy = f"this host is busier than when the profile of '{model}' was measured" + (
            "" if load is None else f" (load average {load:.1f} on {cpus} CPUs)")
        bigger = f"the trainer's model is bigger than the problem's model '{model}', whose profile priced the plan"
        if slowed and ratio > 1:
            cause = "the injected fault " + ", ".join(describe_fault(f) for f in slowed)
        elif ratio < 1:
            cause = (f"the trainer's model is smaller than the problem's model '{model}', whose profile priced "
                     "the plan")
        elif same_model:  # the zoo trainer runs the very model the profile measured
            cause = busy
        elif load is not None and load > cpus:
            cause = f"{busy}, or {bigger}"
        else:
            cause = f"{bigger}, or {busy}"
        devices = {d.catalog.get(s.instance_type).device for s in self.slots}
        device = "cpu" if devices == {"cpu"} else "cuda"
        local = len(self.slots) if d.provider.local_workers else 1
        said = PredictionOff(self.index, self.plan.config, predicted.iteration_s * ratio, predicted.iteration_s,
                             cause, profile_command(d.spec, d.trainer_args, device, d.config.threads, local))
        d.log.write("prediction_off", **json_object(said))
        d.hooks.emit("prediction_off", said)

    def _fruitless(self, now: float) -> None:
        """A slowdown re-plan changed nothing: ask again later, and later still
        after each one that changes nothing."""
        d = self.d
        d.fruitless_replans += 1
        d.monitor.hold_off(now, slowdown_hold_off_s(d.window_s, d.fruitless_replans))

    def _report(self, now: float, state: str) -> None:
        self.d.report(now, state, self.plan)

    def finish(self, ended: str) -> Plan:
        d, seg = self.d, self.segment
        committed = seg.last_checkpoint if seg.last_checkpoint is not None else self.start
        throughput = None
        if self.timing and self.timing["seconds"] > 0:
            throughput = (self.timing["to_iteration"] - self.timing["from_iteration"]) / self.timing["seconds"]
        record = SegmentRecord(self.index, self.plan.config, tuple(s.batch for s in self.slots), self.start,
                               self.reached, committed, ended,
                               None if self.first_progress_at is None else self.first_progress_at - self.acquire_at,
                               tuple(c["save_s"] for c in seg.checkpoints), throughput,
                               self.plan.predicted.iteration_s if self.plan.predicted else None)
        d.segments.append(record)
        d.log.write("segment_end", **json_object(record))
        d.injector.reached(self.reached)
        d.done = committed
        d._give_back([d.machines[m] for m in self.handled if d.machines[m].terminated_at is None])
        if self.failure is not None:
            raise self.failure
        if ended == "finished":
            return self.plan
        if self.next_plan is None:  # stopped or killed without a new plan (stop timeout): same plan again
            return self.plan
        return self.next_plan
