"""One tuning job from one experiment file, end to end: ``thrifty tune`` and
``thrifty.runtime.tune`` (issue "thrifty tune").

`tune` reads the experiment (`experiment_file`), checks it and its trainer
before anything starts, shows the plan (``plan``: the RubberBand stage
plan solved for the deadline at the least cost, with its predicted time and
cost; the loop schedulers: their settings and the time and cost limit),
then runs it:

- the loop schedulers (HyperSched, ASHA, POP, Bandit, EarlyTerm, FIFO)
  through `run_experiment`, on the world executor (worker processes on this
  host) or, with a cluster, the Ray executor on provisioned machines;
- ``plan`` through `execute_plan`, which scales the provider's machines per
  stage.

Everything lands in the results folder as it happens (`record`): the
experiment, ``events.jsonl``, each trial's worker logs (``trials/``); at the
end ``summary.json`` (written atomically), the best configuration and its
checkpoint (``best/``) and a plot of the trial curves and the atoms over
time. The trials' checkpoints go to the run's storage (`trials_storage`):
``trials/`` too by default, or ``STORAGE/RUN/`` for the experiment's
``storage`` (``--storage``: a folder, or ``s3://bucket/prefix`` that every
machine reaches, so that a trial moves between machines that share no file
system). Every result also goes out as a metric (``metrics.jsonl``, and
TensorBoard or MLflow when asked: `thrifty.runtime.metrics`). Results go to
`out`, by default ``thrifty-runs/NAME-TIME``; ``options.json`` keeps what the
run was started with besides the experiment (the cluster, the plot, the
metrics sinks).

SIGINT and SIGTERM (`_Signals`) ask the loop to stop: running trials finish
their iteration and are checkpointed, the summary is written with
``end_reason`` ``interrupted`` or ``terminated`` (`STOPPED`) and
``finished: false``. A stopped, killed or crashed run goes on with
``resume=DIR``, with the cluster and plot it was started with unless given
again: finished trials are kept, the trials that were running go on first
from their last checkpoint, paused ones when their scheduler promotes them,
and the time already spent counts against the deadline; a ``plan`` run
goes on with the plan it ran (``plan.json``; `executor_plan`, 6). A run
whose driver fails writes its summary on the way out (``end_reason``
``crashed``, ``finished: false``, the error). A run that finished,
resumed, returns its summary's figures (`TuneResult.already_finished`)
without running or writing anything.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import shutil
import signal
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thrifty.core.errors import ProblemError, ThriftyError
from thrifty.core.io import atomic_write_text
from thrifty.core.validation import validate_model
from thrifty.core.optional import try_import
from thrifty.runtime.metrics import Metrics, check_kinds, look_at, open_metrics
from thrifty.runtime.runs import RUNS_FOLDER, newest_run as newest_folder
from thrifty.runtime.tuning.experiment_file import (ExperimentFile, PlanSpec, build_scheduler, build_search_space,
                                                    check_storage, load_experiment, parse_experiment,
                                                    resolve_trainer)
from thrifty.runtime.tuning.search_space import SearchSpace
from thrifty.runtime.tuning.record import EVENTS, EventLog, RecordingExecutor, read_events, read_history, \
    unheard_results
from thrifty.runtime.tuning.trial import Trial, TrialState

logger = logging.getLogger(__name__)

__all__ = ["tune", "TuneResult", "GoalInfeasible", "preview", "check_startable", "EXPERIMENT_COPY", "SUMMARY",
           "OPTIONS", "STOPPED", "finished_run", "stored_options", "newest_run", "trials_storage",
           "with_storage"]

EXPERIMENT_COPY = "experiment.json"
SUMMARY = "summary.json"
OPTIONS = "options.json"   # what the run was started with besides the experiment: cluster, plot
PLAN = "plan.json"         # the stage plan a `plan` run carries out (a resumed run goes on with it)
RUNS = Path(RUNS_FOLDER)  # where runs go by default (``thrifty-runs/NAME-TIME``)
# how a run that was stopped before its end ends, by signal (SIGINT: Ctrl-C; SIGTERM: a kill, a scheduler)
STOPPED = {"interrupted": signal.SIGINT, "terminated": signal.SIGTERM}
CRASHED = "crashed"  # the end_reason of a run whose driver failed (its summary is written on the way out)


class GoalInfeasible(ThriftyError):
    """The goal cannot be met (the planner proved it): exit code 3."""

    def __init__(self, message: str, plan: Any = None):
        super().__init__(message)
        self.plan = plan


@dataclass
class Preview:
    """What will run, before it runs."""

    scheduler: str
    settings: dict[str, Any]
    atoms: int
    time_limit_s: float | None
    predicted_s: float | None
    predicted_usd: float | None
    plan: Any = None          # the tuning plan (``plan``)
    where: str = "worker processes on this host"


@dataclass
class TuneResult:
    """What ``thrifty tune`` did; the same as ``DIR/summary.json``."""

    out: Path
    experiment: ExperimentFile
    preview: Preview
    end_reason: str = "dry-run"
    elapsed_s: float = 0.0
    cost_usd: float = 0.0
    best_trial_id: int | None = None
    best_config: dict[str, Any] | None = None
    best_metric: float | None = None
    best_checkpoint: str | None = None
    trials: list[Trial] = field(default_factory=list)
    plot: str | None = None
    results: int = 0
    already_finished: bool = False   # a resumed run that had finished: nothing ran (`finished_run`)
    error: str | None = None         # the driver's own failure (end_reason ``crashed``)
    notes: list[str] = field(default_factory=list)  # what a resume found (results recovered or redone)
    metrics: list[str] = field(default_factory=list)  # where to look at the results' metrics, one line a sink

    @property
    def stopped(self) -> bool:
        """Stopped before its end (Ctrl-C, SIGTERM): ``--resume`` goes on with it."""
        return self.end_reason in STOPPED

    @property
    def goal_met(self) -> bool:
        return self.end_reason != "dry-run" and not self.stopped and self.goal_missed is None

    @property
    def goal_missed(self) -> str | None:
        """Why the run did not meet its goal, or None: the target not reached, over the budget, or no
        result at all (a run that ended before any trial reported one found nothing)."""
        e = self.experiment
        if e.target is not None and (self.best_metric is None or e.score(self.best_metric) < e.score(e.target)):
            return "target not reached"
        if e.budget_usd is not None and self.cost_usd > e.budget_usd * 1.0001:
            return "over the budget"
        if self.best_metric is None and self.end_reason != "dry-run":
            return "no trial reported a result"
        return None

    def summary(self) -> dict[str, Any]:
        e = self.experiment
        counts: dict[str, int] = {}
        for t in self.trials:
            counts[t.state.value] = counts.get(t.state.value, 0) + 1
        return {
            "format": "thrifty.tune_summary/1", "name": e.name, "scheduler": e.scheduler.name,
            "metric": e.metric, "mode": e.mode, "end_reason": self.end_reason,
            "finished": not self.stopped and self.end_reason != CRASHED, "elapsed_s": self.elapsed_s,
            "cost_usd": self.cost_usd, "goal": {"deadline_s": e.deadline_s, "target": e.target,
                                                "budget_usd": e.budget_usd, "met": self.goal_met},
            "predicted": {"time_s": self.preview.predicted_s, "cost_usd": self.preview.predicted_usd},
            "best": {"trial": self.best_trial_id, "config": self.best_config, "metric": self.best_metric,
                     "checkpoint": self.best_checkpoint},
            "trials": counts, "results": self.results,
            "per_trial": [_trial_summary(t, e) for t in self.trials],
            **({"error": self.error} if self.error is not None else {}),
        }


def _trial_summary(trial: Trial, e: ExperimentFile) -> dict[str, Any]:
    best = max(trial.metrics) if trial.metrics else None
    return {"trial": trial.trial_id, "config": trial.config, "state": trial.state.value,
            "iterations": trial.iteration, "best": None if best is None else e.value(best),
            "last": e.value(trial.metrics[-1]) if trial.metrics else None, "launches": trial.launches,
            "resizes": trial.resizes, "train_s": trial.train_s, "error": trial.error}


# --- the plan before the run --------------------------------------------------------------------

def tuning_problem(e: ExperimentFile) -> dict[str, Any]:
    """The RubberBand problem of a ``plan`` experiment."""
    s = e.scheduler
    assert isinstance(s, PlanSpec)
    r = e.resources
    problem: dict[str, Any] = {"kind": "tuning", "model": r.model, "instance_type": r.instance_type,
                               "market": r.market, "deadline_s": e.deadline_s,
                               "experiment": {"algorithm": s.algorithm, "trials": e.samples,
                                              "min_iters": s.min_iterations, "max_iters": e.max_iterations,
                                              "eta": s.eta}}
    for key in ("catalog", "max_instances", "cloud"):
        if getattr(r, key) is not None:
            problem[key] = getattr(r, key)
    return problem


def _naming_file(err: ProblemError, source: str | Path | None, cluster_from_file: bool) -> ProblemError:
    """`err` naming the experiment's file `source` when it is about one of the
    file's fields (``cluster`` only when the file's is the one checked) and
    names no file yet, as the file's own schema errors do."""
    head = (err.path or "").split(".")[0].split("[")[0]
    if source is None or err.source is not None or head not in ExperimentFile.model_fields \
            or (head == "cluster" and not cluster_from_file):
        return err
    return ProblemError(err.message, path=err.path, source=str(source))


def check_startable(e: ExperimentFile, cluster: str, source: str | Path | None = None) -> Preview:
    """Every check a run of `e` on `cluster` makes before it starts work, all
    of them, so that bad input fails before a results folder, a worker or a
    machine exists; ``--dry-run`` and `tune` both call this, so a dry run
    says no to every run that would be refused, and yes to no other.

    - the trainer imports and takes the trials' arguments (a loop function:
      and has a global batch for every trial: `resolve_trainer`), the search space
      and the scheduler build;
    - `cluster` names a cluster (a cluster config file loads);
    - the machines: on a cluster, ``resources.instance_type`` is given; the
      catalog loads, has that type, and a price for it in
      ``resources.market``; the atoms fit the machines' slots (one per
      device of the type, as the executor places ranks);
    - the plan (``plan``): solved (`preview`; `GoalInfeasible` when no stage
      plan meets the goal);
    - a running Ray cluster (``HOST:PORT``, ``auto``): its node table, read
      without joining it (`thrifty.runtime.cluster.connect.read_nodes`), has
      live nodes of the type and market for the machines the run provisions
      (``resources.machines``, or the plan's largest stage). A Ray Client
      address (``ray://``) is checked when the run joins it.

    Raises one `ProblemError` for one problem; for several, one whose
    message has a line for each. A problem with a field of the experiment
    names `source`, the experiment's file (``cluster`` only when `cluster` is
    the file's). Returns what will run (`preview`).
    """
    problems: list[ProblemError] = []

    def attempt(check: Callable[..., Any], *args: Any, path: str | None = None) -> Any:
        try:
            return check(*args)
        except ProblemError as err:
            problems.append(ProblemError(err.message, path=path, source=err.source) if path else err)
            return None

    attempt(resolve_trainer, e)
    attempt(build_search_space, e)
    if e.storage is not None:
        attempt(check_storage_reached, e.storage)
    plan = isinstance(e.scheduler, PlanSpec)
    if not plan:
        attempt(build_scheduler, e)
    kind = attempt(_cluster_kind, cluster)
    on_cluster = kind not in (None, "local")
    r = e.resources
    wanted: tuple[str, str, int] | None = None
    if on_cluster and not plan and r.instance_type is None:
        problems.append(ProblemError("is required on a cluster: the machine type to run trials on",
                                     path="resources.instance_type"))
    elif r.instance_type is not None and (on_cluster or plan):
        slots = attempt(_slots, e, r.instance_type)
        if on_cluster and not plan:
            wanted = (r.instance_type, r.market, r.machines or 1)
            if slots is not None and e.atoms > wanted[2] * slots:
                problems.append(ProblemError(
                    f"is {e.atoms}, more than the {wanted[2] * slots} slots of {wanted[2]} x {r.instance_type} "
                    f"({slots} per machine, one per device): raise resources.machines or lower the atoms",
                    path="resources.atoms"))
    nodes = attempt(_cluster_nodes, cluster) if kind == "ray" and not cluster.startswith("ray://") else None
    shown = None
    if not problems:
        try:
            shown = preview(e, cluster)
        except ProblemError as err:
            problems.append(err)
    if shown is not None and shown.plan is not None and on_cluster:
        stage = max(shown.plan.stages, key=lambda st: st.instances)
        wanted = (stage.instance_type, r.market, stage.instances)
    if nodes is not None and wanted is not None:
        from thrifty.runtime.cluster.provider import lacking, lacking_message

        shortfalls = lacking(nodes, [wanted])
        if shortfalls:
            what = "the plan's largest stage" if shown is not None and shown.plan is not None else "the experiment"
            other = "spot" if r.market == "on_demand" else "on_demand"
            hint = f" (resources.market {other} would take them)" if not lacking(nodes, [(*wanted[:1], other,
                                                                                        wanted[2])]) else ""
            problems.append(ProblemError(lacking_message(cluster, nodes, shortfalls, what) + hint, path="cluster"))
    problems = [_naming_file(p, source, cluster == e.cluster) for p in problems]
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise ProblemError(f"{len(problems)} problems; nothing was started:\n"
                           + "\n".join(f"  {p}" for p in problems))
    assert shown is not None  # no problem: the preview was made
    return shown


def trials_storage(e: ExperimentFile, folder: Path) -> str | Path:
    """Where the run in results folder `folder` keeps its trials' checkpoints:
    ``STORAGE/RUN`` (``RUN``: the folder's name) for the experiment's
    ``storage``, else the folder's ``trials/``."""
    from thrifty.runtime.ddp import storage

    return storage.join(e.storage, folder.name) if e.storage is not None else folder / "trials"


def with_storage(e: ExperimentFile, storage: str | None, resume: str | Path | None = None) -> ExperimentFile:
    """`e` with its ``storage`` replaced by `storage` (``--storage``), which
    a resumed run (`resume`: its folder) may give again but not change: its
    trials' checkpoints are where its experiment copy says."""
    if storage is None:
        return e
    if resume is not None and storage != e.storage:
        raise ProblemError(f"is '{storage}', but the run in {resume} keeps its trials' checkpoints in "
                           f"'{e.storage or Path(resume) / 'trials'}': resume it without --storage", path="storage")
    check_storage(storage)
    return e.model_copy(update={"storage": storage})


def check_storage_reached(location: str) -> None:
    """An S3 storage's bucket exists and answers (a `ProviderError` naming
    the AWS error otherwise); a local folder is made when used."""
    from thrifty.runtime.ddp import storage

    check_storage(location)
    if storage.is_remote_folder(location):
        storage.exists(storage.join(location, ".thrifty-storage-check"))  # head_object, then head_bucket


def _cluster_kind(cluster: str) -> str:
    from thrifty.runtime.cluster.spec import cluster_kind

    kind = cluster_kind(cluster)
    if kind == "config":
        from thrifty.runtime.providers.config import load_cluster_config

        load_cluster_config(cluster)
    return kind


def _slots(e: ExperimentFile, instance_type: str) -> int:
    """Ranks one machine of `instance_type` holds (its devices, at least 1); `ProblemError` when the
    experiment's catalog does not load, lacks the type, or prices it in no market the file names."""
    from thrifty.datasets.catalog import load_catalog

    try:
        catalog = load_catalog(e.resources.catalog)
    except ProblemError as err:
        raise ProblemError(err.message, path="resources.catalog", source=err.source) from None
    try:
        machine = catalog.get(instance_type)
    except ProblemError as err:
        raise ProblemError(err.message, path="resources.instance_type") from None
    try:
        machine.price(e.resources.market)
    except ProblemError as err:
        raise ProblemError(err.message, path="resources.market") from None
    return max(1, machine.gpus)


def _cluster_nodes(cluster: str) -> list[dict[str, Any]]:
    """The live nodes of the running Ray cluster `cluster`, read without joining it."""
    from thrifty.runtime.cluster.connect import read_nodes
    from thrifty.runtime.cluster.provider import live_nodes

    return live_nodes(read_nodes(cluster))


def preview(e: ExperimentFile, cluster: str | None = None) -> Preview:
    """The plan or the scheduler's settings, with the predicted time and cost."""
    cluster = cluster or e.cluster
    where = "worker processes on this host" if cluster == "local" else f"the cluster {cluster}"
    settings = e.scheduler.model_dump(exclude={"name"})
    if isinstance(e.scheduler, PlanSpec):
        from thrifty.solver.problem import parse_problem
        from thrifty.solver.solve import solve_tuning

        from thrifty.solver.problem import TuningProblem

        try:
            problem = parse_problem(tuning_problem(e))
        except ProblemError as err:  # its fields come from the experiment's resources
            raise ProblemError(err.message, path=_resource_path(err.path)) from None
        assert isinstance(problem, TuningProblem)
        plan = solve_tuning(problem, time_limit_s=e.scheduler.time_limit_s)
        if not plan.feasible:
            why = plan.infeasibility
            reason = f": {why.conflict_reasons[0]}" if why is not None and why.conflict_reasons else ""
            raise GoalInfeasible(f"no stage plan meets the deadline of {e.deadline_s:g} s{reason}", plan)
        predicted = plan.predicted
        cost = predicted.cost_usd if predicted is not None else None
        if e.budget_usd is not None and cost is not None and cost > e.budget_usd:
            raise GoalInfeasible(f"the cheapest plan that meets the deadline costs ${cost:.4f}, "
                                 f"more than the budget of ${e.budget_usd:g}", plan)
        return Preview("plan", settings, 0, e.deadline_s, predicted.jct_s if predicted is not None else None,
                       cost, plan, where)
    limit = e.time_limit_s
    return Preview(e.scheduler.name, settings, e.atoms, limit, limit,
                   None if limit is None else e.usd(limit), None, where)


# problem fields that come from elsewhere in the experiment file
_PROBLEM_FIELDS = {"experiment": "scheduler", "model": "resources.model", "instance_type": "resources.instance_type",
                   "market": "resources.market",
                   "catalog": "resources.catalog", "max_instances": "resources.max_instances",
                   "cloud": "resources.cloud", "deadline_s": "deadline_s"}


def _resource_path(path: str | None) -> str:
    """The experiment file's path of a field of the RubberBand problem built from it."""
    head = (path or "").split(".")[0].split("[")[0]
    if head not in _PROBLEM_FIELDS:
        return f"resources ({path})" if path else "resources"
    return _PROBLEM_FIELDS[head] + (path or "")[len(head):]


# --- the run -------------------------------------------------------------------------------------

def _experiment(experiment: ExperimentFile | Mapping[str, Any] | str | Path) -> ExperimentFile:
    if isinstance(experiment, ExperimentFile):
        return experiment
    if isinstance(experiment, Mapping):
        return parse_experiment(dict(experiment))
    return load_experiment(experiment)


def _results_folder(e: ExperimentFile, out: str | Path | None, resume: str | Path | None) -> Path:
    if resume is not None:
        folder = Path(resume)
        if not (folder / EXPERIMENT_COPY).is_file():
            raise ProblemError(f"'{folder}' is not the results folder of a tuning run (no {EXPERIMENT_COPY})",
                               path="resume")
        return folder
    if out is not None:
        folder = Path(out)
        if (folder / EVENTS).exists():
            raise ProblemError(f"'{folder}' holds a tuning run already; resume it with --resume {folder}, "
                               "or choose another --out", path="out")
        return folder
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return RUNS / f"{e.name or 'experiment'}-{stamp}"


def newest_run(root: str | Path = RUNS) -> Path | None:
    """The tuning run (a folder with an experiment copy) under `root` whose record changed last, or None."""
    return newest_folder(root, EXPERIMENT_COPY, (EVENTS, SUMMARY))


def finished_run(folder: str | Path) -> dict[str, Any] | None:
    """The summary of the run in `folder` if it ran to its end (resuming it would do nothing), else None."""
    path = Path(folder) / SUMMARY
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict):
        return None
    finished = summary.get("finished")
    return summary if (finished if isinstance(finished, bool) else summary.get("end_reason") not in STOPPED) else None


def stored_options(folder: str | Path) -> dict[str, Any]:
    """What the run in `folder` was started with besides its experiment (``cluster``, ``plot``, ``metrics``)."""
    try:
        options = json.loads((Path(folder) / OPTIONS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in options.items() if k in ("cluster", "plot", "metrics") and isinstance(v, str)} \
        if isinstance(options, dict) else {}


def tune(experiment: ExperimentFile | Mapping[str, Any] | str | Path | None = None, *,
         out: str | Path | None = None, resume: str | Path | None = None, cluster: str | None = None,
         storage: str | None = None, dry_run: bool = False, plot: str | Path | None = None,
         metrics: str | Iterable[str] | None = None,
         on_start: Callable[[Preview, RecordingExecutor], None] | None = None,
         on_event: Callable[[dict[str, Any]], None] | None = None,
         on_stop: Callable[[str], None] | None = None, source: str | Path | None = None) -> TuneResult:
    """Run a tuning experiment (a file, a dict or an `ExperimentFile`) to its
    end and keep its results in `out` (see the module docstring).

    `resume`: the results folder of a killed run to go on from (its own
    experiment is used when `experiment` is None). `cluster` overrides the
    file's, `storage` its ``storage`` (a resumed run keeps its own: it may
    be given again, not changed). `plot`: where the plot goes (default
    ``DIR/tuning.png``). `metrics`: the optional metrics sinks
    (``tensorboard``, ``mlflow``: `thrifty.runtime.metrics`) besides
    ``DIR/metrics.jsonl``, where every result goes as it is recorded (the
    trial's metric, its iteration time and overhead, tagged with the
    trial); a resumed run keeps the ones it was started with.
    `on_start(preview, executor)` is called once the executor exists (the
    command line starts its live table there), `on_event(event)` after each
    recorded event, `on_stop(reason)` once when SIGINT or SIGTERM asks the
    run to stop (it then ends with that `end_reason`; see `_Signals`).
    `source`: the experiment's file, which problems with its fields name
    (default: `experiment` when it is a path, else the resumed run's copy).
    Raises `ProblemError` (bad input), `GoalInfeasible` (the planner proved
    the goal cannot be met).
    """
    if experiment is None:
        if resume is None:
            raise ProblemError("give an experiment, or resume= a results folder", path="experiment")
        experiment = Path(resume) / EXPERIMENT_COPY
    e = with_storage(_experiment(experiment), storage, resume)
    kept = stored_options(resume) if resume is not None else {}
    cluster = cluster or kept.get("cluster") or e.cluster
    plot = plot if plot is not None else kept.get("plot")
    started_with = kept.get("metrics", "")
    kinds = check_kinds(metrics if metrics is not None else [k for k in started_with.split(",") if k])
    if resume is not None:
        summary = finished_run(_results_folder(e, out, resume))
        if summary is not None:
            return _finished(Path(resume), e, summary)
    if source is None and isinstance(experiment, (str, Path)):
        source = experiment
    shown = check_startable(e, cluster, source)
    folder = _results_folder(e, out, resume)
    if cluster != "local":
        e = e.model_copy(update={"cluster": cluster})
    if resume is not None and (folder / PLAN).is_file():  # a plan run goes on with the plan it ran
        from thrifty.solver.tuning_plan import TuningPlan

        shown.plan = validate_model(TuningPlan, json.loads((folder / PLAN).read_text(encoding="utf-8")),
                                    source=str(folder / PLAN))
    result = TuneResult(folder, e, shown)
    if dry_run:
        return result

    folder.mkdir(parents=True, exist_ok=True)
    if resume is None:
        atomic_write_text(folder / EXPERIMENT_COPY, json.dumps(e.model_dump(mode="json"), indent=1) + "\n")
        if shown.plan is not None:
            atomic_write_text(folder / PLAN, shown.plan.to_json() + "\n")
    options = {"cluster": cluster, "plot": None if plot is None else str(Path(plot).resolve()),
               "metrics": ",".join(kinds)}
    atomic_write_text(folder / OPTIONS, json.dumps({k: v for k, v in options.items() if v}, indent=1) + "\n")
    log = EventLog(folder / EVENTS)
    sinks = open_metrics(folder, kinds, name=folder.name)
    result.metrics = look_at(folder, ("jsonl", *kinds))
    history = _history(e, folder, log, result.notes, sinks) if resume is not None and (folder / EVENTS).exists() \
        else None
    signals = _Signals()
    recorder: RecordingExecutor | None = None
    try:
        with signals, _backend(e, folder, cluster) as (executor, provider):
            clock = executor.clock
            t0 = clock.now() - (history.elapsed_s if history is not None else 0.0)
            recorder = RecordingExecutor(executor, log, t0=t0, value=e.value,
                                         on_event=_with_metrics(sinks, e.metric, on_event))
            if on_start is not None:
                on_start(shown, recorder)
            try:
                _run(e, recorder, provider, shown, history, result, signals.stop(on_stop))
            except KeyboardInterrupt:  # a second signal, or one the plan executor cannot wait out
                result.end_reason = signals.reason() or "interrupted"
                _recorded_trials(result, recorder)
            except Exception as err:  # the driver's own failure: what it has is saved, then it goes on up
                result.elapsed_s = clock.now() - t0
                _crashed(result, recorder, err)
                raise
            result.elapsed_s = clock.now() - t0
    finally:
        log.close()
        sinks.close()
    _finish(result, plot)
    return result


def _with_metrics(sinks: Metrics, metric: str, on_event: Callable[[dict[str, Any]], None] | None
                  ) -> Callable[[dict[str, Any]], None]:
    """`on_event`, after each result has gone to `sinks` as step = its iteration: the trial's `metric` (in its
    own units, as recorded), its iteration time and overhead, tagged with the trial."""
    def both(event: dict[str, Any]) -> None:
        if event.get("event") == "result":
            _result_out(sinks, metric, event)
        if on_event is not None:
            on_event(event)

    return both


def _result_out(sinks: Metrics, metric: str, event: Mapping[str, Any]) -> None:
    """A recorded result to `sinks`."""
    sinks.write(int(event["iteration"]), {metric: event["metric"], "iteration_s": event["iteration_s"],
                                          "overhead_s": event["overhead_s"]}, {"trial": str(event["trial"])})


def _history(e: ExperimentFile, folder: Path, log: EventLog, notes: list[str], sinks: Metrics) -> Any:
    """The recorded run in `folder` to go on from: first the results its trials checkpointed but the killed
    driver never heard (appended to the log, `unheard_results`, and sent to `sinks`), then `read_history`;
    `notes` say what was recovered, and which results are trained again (newer than their trial's last
    checkpoint)."""
    from thrifty.runtime.tuning.executors.worlds import checkpointed_result

    events = read_events(folder / EVENTS)
    trials = trials_storage(e, folder)
    for line in unheard_results(events, lambda tid, after: checkpointed_result(trials, tid, after), e.value):
        log.write(line)
        _result_out(sinks, e.metric, line)
        events.append(line)
        notes.append(f"trial {line['trial']}: iteration {line['iteration']}'s result was checkpointed but not "
                     "recorded when the run ended; recovered from its checkpoint")
    history = read_history(events, e.max_iterations, e.score)
    for tid, (first, last) in sorted(history.dropped.items()):
        its = f"iteration {first}" if first == last else f"iterations {first}-{last}"
        notes.append(f"trial {tid}: {its} had no checkpoint when the run ended (checkpoint_every is "
                     f"{e.checkpoint_every}); trained again")
    return history


def _recorded_trials(result: TuneResult, recorder: RecordingExecutor | None) -> None:
    """The trials as the recorder saw them (the loop did not return its own)."""
    if recorder is not None and not result.trials:
        result.trials = [recorder.trials[tid] for tid in sorted(recorder.trials)]
        result.results = sum(t.iteration for t in result.trials)


def _crashed(result: TuneResult, recorder: RecordingExecutor | None, err: BaseException) -> None:
    """The summary of a run whose driver failed (``finished: false``, end_reason ``crashed``, the error),
    from what the recorder saw; written on the way out of the failure, so it never raises itself (a summary
    that cannot be written is left out: the event log has everything a resume needs)."""
    try:
        result.end_reason, result.error = CRASHED, f"{type(err).__name__}: {err}"
        _recorded_trials(result, recorder)
        _finish(result, None, draw=False)
    except Exception as failure:  # noqa: BLE001 - the hook must not hide the crash it reports
        logger.warning("no summary.json for the crashed run: %s: %s", type(failure).__name__, failure)


def _finished(folder: Path, e: ExperimentFile, summary: dict[str, Any]) -> TuneResult:
    """A resumed run that had run to its end: what its summary says; nothing runs, nothing is written."""
    best: dict[str, Any] = summary["best"] if isinstance(summary.get("best"), dict) else {}
    result = TuneResult(folder, e, Preview(e.scheduler.name, {}, e.atoms, e.time_limit_s, None, None),
                        end_reason=str(summary.get("end_reason")), elapsed_s=float(summary.get("elapsed_s") or 0.0),
                        cost_usd=float(summary.get("cost_usd") or 0.0), best_trial_id=best.get("trial"),
                        best_config=best.get("config"), best_metric=best.get("metric"),
                        best_checkpoint=best.get("checkpoint"), results=int(summary.get("results") or 0),
                        already_finished=True)
    plot = folder / "tuning.png"
    result.plot = str(plot) if plot.is_file() else None
    return result


class _Signals:
    """SIGINT (Ctrl-C) and SIGTERM while a run runs (in the main thread): the first asks the loop to stop
    (`reason`: ``interrupted`` or ``terminated``; running trials finish their iteration and are suspended),
    a second stops at once (KeyboardInterrupt; the trials go back to their last checkpoint). Without
    `graceful`, the first stops at once. A signal ignored when the run started stays ignored. The previous
    handlers come back on exit."""

    def __init__(self, graceful: bool = True):
        self.graceful = graceful
        self._reason: str | None = None
        self._previous: dict[int, Any] = {}

    def reason(self) -> str | None:
        return self._reason

    def stop(self, on_stop: Callable[[str], None] | None) -> Callable[[], str | None]:
        """The loop's `stop`: the reason once a signal came, told to `on_stop` once (from the loop, not from
        the signal handler, so that it may print)."""
        told: list[str] = []

        def stop() -> str | None:
            if self._reason is not None and not told:
                told.append(self._reason)
                if on_stop is not None:
                    on_stop(self._reason)
            return self._reason

        return stop

    def _handle(self, signum: int, frame: Any) -> None:
        first = self._reason is None
        if first:
            self._reason = next(name for name, sig in STOPPED.items() if sig == signum)
        if not (first and self.graceful):
            raise KeyboardInterrupt

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOPPED.values():
                # a signal the run was started ignoring (a background job's Ctrl-C) stays ignored, as Python
                # leaves it and as `thrifty run` does
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)


class _backend:
    """The executor (and the provider, for a plan or a cluster); closes both."""

    def __init__(self, e: ExperimentFile, folder: Path, cluster: str):
        self.e, self.folder, self.cluster = e, folder, cluster
        self.executor: Any = None
        self.provider: Any = None

    def __enter__(self) -> tuple[Any, Any]:
        from thrifty.runtime.tuning.executors.worlds import RANK_PRELOAD, WorldExecutor

        e = self.e
        options: dict[str, Any] = {"threads": e.threads, "iteration_timeout_s": e.iteration_timeout_s, "seed": e.seed,
                                   "checkpoint_every": e.checkpoint_every,
                                   "storage": trials_storage(e, self.folder), "metric": e.metric, "mode": e.mode,
                                   "steps_per_iteration": e.steps_per_iteration}
        if self.cluster == "local":
            if isinstance(e.scheduler, PlanSpec):
                from thrifty.runtime.providers.local import LocalProvider

                self.provider = LocalProvider(f"tune-{self.folder.name}", catalog=e.resources.catalog)
            self.executor = WorldExecutor(e.trainer, self.folder / "trials", **options)
            return self.executor, self.provider
        from thrifty.datasets.catalog import load_catalog
        from thrifty.runtime.cluster.spec import cluster_provider

        catalog = load_catalog(e.resources.catalog) if e.resources.catalog else load_catalog()
        self.provider = cluster_provider(self.cluster, f"tune-{self.folder.name}", catalog, RANK_PRELOAD,
                                         run_folder=self.folder)
        self.executor = WorldExecutor(e.trainer, self.folder / "trials", provider=self.provider, **options)
        if not isinstance(e.scheduler, PlanSpec):
            if e.resources.instance_type is None:
                raise ProblemError("is required on a cluster: the machine type to run trials on",
                                   path="resources.instance_type")
            self.provider.provision(e.resources.instance_type, e.resources.machines or 1, e.resources.market)
        return self.executor, self.provider

    def __exit__(self, *exc: object) -> None:
        try:
            if self.executor is not None:
                self.executor.close()
        finally:
            if self.provider is not None:
                self.provider.close()


class _Drawn(SearchSpace):
    """The file's random search with its fixed trainer arguments, past the
    `drawn` configurations a resumed run already has (the same seed gives the
    same draws)."""

    def __init__(self, e: ExperimentFile, drawn: int):
        self._space = build_search_space(e)
        self._args = dict(e.trainer_args)
        for _ in range(drawn):
            self._space.next_config()

    def has_more(self) -> bool:
        return self._space.has_more()

    def next_config(self) -> dict[str, Any] | None:
        config = self._space.next_config()
        return None if config is None else {**self._args, **config}


def _run(e: ExperimentFile, executor: RecordingExecutor, provider: Any, shown: Preview, history: Any,
         result: TuneResult, stop: Callable[[], str | None]) -> None:
    space = _Drawn(e, len(history.trials) if history is not None else 0)
    if isinstance(e.scheduler, PlanSpec):
        from thrifty.runtime.tuning.executors.plan import execute_plan

        from thrifty.runtime.tuning.executors.plan import recorded_cost_usd

        earlier = recorded_cost_usd(read_events(result.out / EVENTS)) if history is not None else 0.0
        plan_result = execute_plan(shown.plan, executor, provider, space, resume=history, stop=stop,
                                   earlier_cost_usd=earlier, market=e.resources.market)
        result.trials = plan_result.trials
        result.results = sum(t.iteration for t in result.trials)
        if plan_result.stopped is not None:
            result.end_reason = plan_result.stopped
        else:
            result.end_reason = "plan" if plan_result.met_deadline else "plan (past the deadline)"
        result.cost_usd = plan_result.cost_usd
        result.best_trial_id = plan_result.best_trial_id
        return
    from thrifty.runtime.tuning.loop import run_experiment

    target = None if e.target is None else e.score(e.target)
    outcome = run_experiment(build_scheduler(e), executor, space,
                             total_atoms=e.atoms, max_iterations=e.max_iterations, deadline=e.time_limit_s,
                             target=target, resume=history, keep_checkpoints=True, stop=stop)
    result.trials = outcome.trials
    result.end_reason = outcome.end_reason
    result.results = outcome.results
    result.best_trial_id = outcome.best_trial_id


def _finish(result: TuneResult, plot: str | Path | None, draw: bool = True) -> None:
    """Best configuration and checkpoint, summary, plot (unless not `draw`)."""
    e, folder = result.experiment, result.out
    if result.cost_usd == 0.0 and not isinstance(e.scheduler, PlanSpec):
        result.cost_usd = e.usd(result.elapsed_s)
    done = [t for t in result.trials if t.metrics]
    if result.best_trial_id is None and done:
        result.best_trial_id = max(done, key=lambda t: (max(t.metrics), -t.trial_id)).trial_id
    if result.best_trial_id is not None:
        best = next(t for t in result.trials if t.trial_id == result.best_trial_id)
        result.best_config = best.config
        result.best_metric = e.value(max(best.metrics)) if best.metrics else None
        (folder / "best").mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / "best" / "config.json", json.dumps(best.config, indent=1) + "\n")
        source = best.checkpoint.get("path") if isinstance(best.checkpoint, dict) else None
        if source and not best.checkpoint.get("error") and _copy_checkpoint(source, folder / "best" / "checkpoint.pt"):
            result.best_checkpoint = str(folder / "best" / "checkpoint.pt")
    path = Path(plot) if plot is not None else folder / "tuning.png"
    if draw and try_import("matplotlib") is None:  # part of the install; a stripped one still gets its results
        result.plot = None
    elif draw:
        from thrifty.runtime.tuning.run_plot import plot_tuning_run

        plot_tuning_run(read_events(folder / EVENTS), e, path)
        result.plot = str(path)
    atomic_write_text(folder / SUMMARY, json.dumps(json_safe(result.summary()), indent=1, allow_nan=False,
                                                   default=str) + "\n")


def _copy_checkpoint(source: str, target: Path) -> bool:
    """Copy the checkpoint at `source` (a path, or an ``s3://`` URL of the
    run's storage) to the local file `target`, atomically; False when there
    is none (or the storage cannot be read: said in the log)."""
    from thrifty.runtime.ddp import storage

    if not storage.is_remote(source):
        if not Path(source).is_file():
            return False
        shutil.copyfile(source, target.with_suffix(".tmp"))
        target.with_suffix(".tmp").replace(target)
        return True
    try:
        data = storage.read_bytes(source)
    except ThriftyError as err:
        logger.warning("the best trial's checkpoint was not copied to %s: %s", target, err)
        return False
    if data is None:
        return False
    storage.write_bytes_atomic(target, data)
    return True


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float (a diverged trial's NaN metric)
    as None, so the summary is strict JSON; an enum as its value."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, TrialState):
        return value.value
    return value
