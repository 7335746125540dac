"""The experiment file of ``thrifty tune``: one JSON or YAML document that
says what to tune, how, and for which goal (issue "thrifty tune").

Fields (``thrifty schema experiment`` prints the JSON Schema):

- ``trainer``: ``MODULE:FUNCTION`` (or ``path/to/file.py:FUNCTION``, read
  from the experiment file's folder), the trials' job, written one of two ways
  (`thrifty.runtime.ddp.trainer.resolve_job` tells them apart): a loop
  function (the job contract of `thrifty.runtime.ddp.context`), called in
  every rank as ``train(ctx, **config)``, or a `TunableTrainer` factory
  called with the configuration; the configuration is a draw of the search
  space plus ``trainer_args``, as keyword arguments. A loop's trial:

  - trains on the global batch ``batch_size`` of its configuration (the
    search space's, or ``trainer_args``'), else the default of the loop's
    ``batch_size`` parameter (``ctx.global_batch``, the same on any number
    of ranks);
  - reports the experiment's ``metric`` under its own name at the end of
    each trial iteration (``ctx.report({"loss": ..., "val_loss": v})`` with
    ``"metric": "val_loss", "mode": "min"``; a callable
    ``ctx.report(lambda: {...})`` is called only there, so its evaluation
    costs nothing in between), combined over the ranks by batch share;
  - has one iteration (the schedulers' unit: HyperSched's and ASHA's rungs,
    POP's curve points) per epoch of the data it gives
    ``ctx.prepare_loader``, unless ``steps_per_iteration`` says how many
    batches;
  - checkpoints with ``ctx.report(..., checkpoint={...})`` to the run's
    ``storage``, and gets it back from ``ctx.restore()`` when a paused or
    resized trial resumes, on any machine and number of ranks;

  a `TunableTrainer` reports its own ``metric(model)``, a score (higher is
  better), with its own ``batch_size`` and ``steps_per_iteration``;
- ``search_space``: name -> a constant, or one domain:
  ``{"loguniform": [low, high]}``, ``{"uniform": [low, high]}``,
  ``{"randint": [low, high]}`` (both included) or ``{"choice": [v, ...]}``;
  drawn by random search with ``seed``, ``samples`` configurations in all;
- ``metric`` (its name, for the table and the results) and ``mode``
  (``max`` or ``min``: a loss is minimised; schedulers see ``-value``);
  ``metric_range`` (``[lower, upper]`` in the metric's own units, ``null``
  for an open side; default ``[0, 1]`` for ``max``, an accuracy, and
  ``[0, null]`` for ``min``, a loss): the range ``pop`` and ``earlyterm``
  forecast learning curves within;
- ``max_iterations`` (R: a trial that reaches it is complete);
  ``steps_per_iteration``: batches in one trial iteration (default: one
  epoch of the data, or a `TunableTrainer`'s own);
- ``scheduler``: a name, or an object with ``name`` and that scheduler's
  parameters: ``hypersched`` (HyperSched 4-5), ``asha`` (HyperSched 3.3),
  ``pop``, ``bandit``, ``earlyterm`` (HyperDrive 3, 5.3), ``fifo``, or
  ``plan`` (RubberBand: solve the stage plan that meets the deadline at the
  least cost, then carry it out stage by stage);
- the goal: ``deadline_s``, ``target`` (a metric value that ends the
  experiment when a trial reaches it) and/or ``budget_usd``;
- ``resources``: ``atoms`` (workers the trials share) and
  ``usd_per_atom_hour`` (what an atom costs, for the cost shown and a
  budget); for ``plan``, the planner's ``instance_type``, ``catalog``,
  ``max_instances``, ``model`` (a scaling profile of the trainer) and
  ``cloud`` latencies; on a cluster, ``instance_type`` and ``machines``;
  for both, ``market`` (``on_demand``, the default as in a training
  problem, or ``spot``): the market the machines are taken from, which
  prices them in the plan;
- ``cluster``: ``local`` (worker processes on this host, the default), or
  what ``thrifty run --cluster`` takes (``auto``, ``ray://HOST:PORT``, a
  cluster config YAML);
- ``storage``: where the trials checkpoint, a folder or
  ``s3://bucket/prefix`` (``thrifty tune --storage`` overrides it); the run
  keeps its trials under ``STORAGE/RUN/trial-N/checkpoint.pt`` (``RUN``:
  the results folder's name). Default: the results folder's ``trials/``.
  With S3, a trial paused on one machine resumes on another that shares no
  file system with it; each machine reaches S3 with its own AWS
  configuration (an instance profile, or its environment).

Every error names the JSON path of the bad field (`ProblemError`).
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from thrifty.core.errors import ProblemError
from thrifty.core.io import read_document
from thrifty.core.optional import absolute_spec, file_spec, import_file, import_named
from thrifty.core.validation import FieldPathError, json_path, validate_model
from thrifty.runtime.ddp.storage import parse_folder
from thrifty.runtime.ddp.trainer import is_loop_function, loop_batch_size
from thrifty.runtime.tuning.schedulers.forecasting import (MetricRange, in_range, range_or_default, score_range,
                                                          shown_range)
from thrifty.solver.problem import MAX_COST_USD, MAX_TIME_S

__all__ = ["ExperimentFile", "SCHEDULER_NAMES", "load_experiment", "parse_experiment", "experiment_json_schema",
           "build_search_space", "build_scheduler", "resolve_trainer", "check_storage"]

SCHEDULER_NAMES = ("hypersched", "asha", "pop", "bandit", "earlyterm", "fifo", "plan")
DOMAINS = ("loguniform", "uniform", "randint", "choice")
MAX_SAMPLES = 100_000
MAX_ITERATIONS = 1_000_000

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Seconds = Annotated[float, Field(gt=0, le=MAX_TIME_S, allow_inf_nan=False)]
MAX_SEED = 2**32 - 1  # numpy, torch and Python seed alike
MAX_THREADS = 1024
Eta = Annotated[float, Field(gt=1, le=64, allow_inf_nan=False, description="reduction factor, > 1")]


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HyperSchedSpec(_Spec):
    """HyperSched (4-5): ASHA rungs, speculative evaluation, deadline-aware entrance, reallocation."""
    name: Literal["hypersched"]
    min_iterations: PositiveInt = 1
    eta: Eta = 4.0
    scaling: Literal["LINEAR", "SQRT", "NONE"] = Field("SQRT", description="how a trial's speed grows with atoms")
    use_idle_atoms: bool = True


class ASHASpec(_Spec):
    """ASHA with pausing (HyperSched 3.3)."""
    name: Literal["asha"]
    min_iterations: PositiveInt = 1
    eta: Eta = 4.0
    atoms_per_trial: PositiveInt = 1


class POPSpec(_Spec):
    """POP (HyperDrive 3): needs a target (its own, or the experiment's)."""
    name: Literal["pop"]
    target: float | None = Field(None, allow_inf_nan=False, description="default: the experiment's target")
    boundary: PositiveInt = 4
    kill_threshold: float | None = Field(None, allow_inf_nan=False)
    atoms_per_trial: PositiveInt = 1
    learn_prior: bool = Field(True, description="forecast under a prior learned from the longer-running trials")
    resume: Literal["confidence", "fifo"] = Field(
        "confidence", description="which waits less: a suspended trial more confident than a new configuration "
                                  "can expect (confidence), or every new configuration first (fifo, HyperDrive's)")


class BanditSpec(_Spec):
    """TuPAQ's bandit (HyperDrive 5.3)."""
    name: Literal["bandit"]
    boundary: PositiveInt = 10
    epsilon: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.5
    atoms_per_trial: PositiveInt = 1


class EarlyTermSpec(_Spec):
    """Learning-curve early termination (Domhan et al., HyperDrive 5.3)."""
    name: Literal["earlyterm"]
    boundary: PositiveInt = 10
    delta: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)] = 0.05
    atoms_per_trial: PositiveInt = 1


class FIFOSpec(_Spec):
    """Every configuration in order, each to completion (HyperDrive's Default)."""
    name: Literal["fifo"]
    atoms_per_trial: PositiveInt = 1


class PlanSpec(_Spec):
    """RubberBand: a stage plan (SHA or Hyperband) solved for the deadline at the least cost."""
    name: Literal["plan"]
    algorithm: Literal["sha", "hyperband"] = "sha"
    min_iterations: PositiveInt = 1
    eta: Eta = 3.0
    time_limit_s: PositiveFloat | None = Field(None, description="the solver's time limit")


SchedulerSpec = Annotated[HyperSchedSpec | ASHASpec | POPSpec | BanditSpec | EarlyTermSpec | FIFOSpec | PlanSpec,
                          Field(discriminator="name")]


class Resources(_Spec):
    atoms: PositiveInt | None = Field(None, description="workers the trials share (default: 2 on this host)")
    usd_per_atom_hour: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        0.0, description="what one atom costs per hour (cost shown; needed by budget_usd)")
    instance_type: str | None = Field(None, description="plan, or a cluster: the machine type")
    market: Literal["on_demand", "spot"] = Field(
        "on_demand", description="plan, or a cluster: the machines' market (a cluster's nodes say theirs with "
                                 "the resource thrifty-market:spot; the plan prices them in it)")
    machines: PositiveInt | None = Field(None, description="on a cluster: machines to provision")
    catalog: str | None = Field(None, description="plan: an instance catalog file")
    max_instances: PositiveInt | None = Field(None, description="plan: at most this many machines")
    model: str | None = Field(None, description="plan: the trainer's scaling profile (a file) or a zoo model")
    cloud: dict[str, float] | None = Field(None, description="plan: scale_latency_s, init_latency_s")


class ExperimentFile(_Spec):
    """A tuning experiment (see the module docstring)."""
    name: Annotated[str, Field(min_length=1, max_length=100)] | None = Field(
        None, description="names the results folder: no path separators or control characters, no leading dot")
    trainer: str = Field(pattern=r"^(?:[A-Za-z_][\w.]*|.+\.py):[A-Za-z_]\w*$",
                         description="MODULE:FUNCTION or path/to/file.py:FUNCTION, a loop function "
                                     "(train(ctx, **config)) or a TunableTrainer factory")
    trainer_args: dict[str, Any] = Field(default_factory=dict, description="fixed keyword arguments")
    search_space: dict[str, Any] = Field(min_length=1)
    samples: Annotated[int, Field(gt=0, le=MAX_SAMPLES)]
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] = 0
    metric: str = "accuracy"
    mode: Literal["max", "min"] = "max"
    metric_range: Annotated[list[Annotated[float, Field(allow_inf_nan=False)] | None],
                            Field(min_length=2, max_length=2)] | None = Field(
        None, description="[lower, upper] of the metric, null for an open side (default [0, 1] for max, "
                          "[0, null] for min)")
    max_iterations: Annotated[int, Field(gt=0, le=MAX_ITERATIONS)]
    steps_per_iteration: Annotated[int, Field(gt=0, le=MAX_ITERATIONS)] | None = Field(
        None, description="batches in one trial iteration (default: one epoch of the data given to "
                          "ctx.prepare_loader, or a TunableTrainer's own)")
    scheduler: SchedulerSpec
    deadline_s: Seconds | None = None
    target: float | None = Field(None, allow_inf_nan=False)
    budget_usd: Annotated[float, Field(gt=0, le=MAX_COST_USD, allow_inf_nan=False)] | None = None
    resources: Resources = Field(default_factory=Resources)
    cluster: str = "local"
    storage: Annotated[str, Field(min_length=1)] | None = Field(
        None, description="where the trials checkpoint: a folder, or s3://bucket/prefix that every machine "
                          "reaches (default: the results folder's trials/)")
    threads: Annotated[int, Field(gt=0, le=MAX_THREADS)] = Field(1, description="torch threads per worker")
    iteration_timeout_s: Seconds = 600.0
    checkpoint_every: Annotated[int, Field(gt=0, le=MAX_ITERATIONS)] = Field(
        1, description="checkpoint each trial every this many iterations, before the result is recorded (1: "
                       "a killed run redoes no finished iteration; more: cheaper for big models, and a resumed "
                       "trial redoes up to this many less one)")

    @model_validator(mode="before")
    @classmethod
    def _scheduler_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("scheduler"), str):
            data = {**data, "scheduler": {"name": data["scheduler"]}}
        if isinstance(data, dict) and isinstance(data.get("scheduler"), dict):
            name = data["scheduler"].get("name")
            if name not in SCHEDULER_NAMES:
                raise FieldPathError(("scheduler", "name"), f"is {name!r}, but must be one of "
                                     f"{', '.join(SCHEDULER_NAMES)}")
        return data

    @model_validator(mode="after")
    def _rules(self) -> ExperimentFile:
        if self.name is not None:
            _check_name(self.name)
        if self.storage is not None:
            check_storage(self.storage)
        for name, value in self.search_space.items():
            _check_domain(name, value)
        lower, upper = self.metric_range or (None, None)
        if lower is not None and upper is not None and lower >= upper:
            raise FieldPathError(("metric_range",), f"is [{lower:g}, {upper:g}], but its lower side must be below "
                                 "its upper side")
        s = self.scheduler
        if isinstance(s, (HyperSchedSpec, ASHASpec, PlanSpec)) and s.min_iterations > self.max_iterations:
            raise FieldPathError(("scheduler", "min_iterations"),
                                 f"is {s.min_iterations}, more than max_iterations ({self.max_iterations})")
        if isinstance(s, HyperSchedSpec) and self.deadline_s is None and self.budget_usd is None:
            raise FieldPathError(("deadline_s",), "is required by hypersched (a deadline-aware scheduler), "
                                 "or give budget_usd")
        if isinstance(s, POPSpec) and s.target is None and self.target is None:
            raise FieldPathError(("target",), "is required by pop (it classifies trials by their chance to "
                                 "reach it); or give scheduler.target")
        own = range_or_default(self.metric_range, self.mode)
        # the range is known when given, or assumed by the schedulers that forecast within it
        known = self.metric_range is not None or isinstance(s, (POPSpec, EarlyTermSpec))
        for where, target in ((("target",), self.target), (("scheduler", "target"), getattr(s, "target", None))):
            if known and target is not None and not in_range(target, own):
                raise FieldPathError(where, f"is {target:g}, outside metric_range {shown_range(own)}: no trial "
                                     "could reach it (give the metric's range as metric_range)")
        both = sorted(set(self.trainer_args) & set(self.search_space))
        if both:
            raise FieldPathError(("trainer_args", both[0]), "is also in search_space: give each trainer argument "
                                 "once, fixed in trainer_args or searched in search_space")
        if isinstance(s, POPSpec) and self.deadline_s is None and self.budget_usd is None:
            raise FieldPathError(("deadline_s",), "is required by pop (T_max, the experiment's time)")
        if not isinstance(s, PlanSpec):
            for key in ("max_instances", "model", "cloud"):
                if getattr(self.resources, key) is not None:
                    raise FieldPathError(("resources", key), f"is read by the plan scheduler only (RubberBand's "
                                         f"planner), not by {s.name}; leave it out")
        if isinstance(s, PlanSpec):
            if self.deadline_s is None:
                raise FieldPathError(("deadline_s",), "is required by plan (the stage plan is solved for it)")
            for key in ("instance_type", "model"):
                if getattr(self.resources, key) is None:
                    raise FieldPathError(("resources", key), "is required by plan")
        per_trial = getattr(s, "atoms_per_trial", 1)
        if per_trial > self.atoms and not isinstance(s, PlanSpec):
            raise FieldPathError(("scheduler", "atoms_per_trial"),
                                 f"is {per_trial}, more than the {self.atoms} atoms of resources.atoms")
        if self.budget_usd is not None and self.resources.usd_per_atom_hour == 0 and not isinstance(s, PlanSpec):
            raise FieldPathError(("resources", "usd_per_atom_hour"),
                                 "is 0, but a budget_usd needs a price per atom-hour to turn into time")
        return self

    # --- derived -----------------------------------------------------------------------------
    @property
    def atoms(self) -> int:
        return self.resources.atoms or 2

    def score(self, value: float) -> float:
        """The metric as the schedulers see it (higher is better)."""
        return value if self.mode == "max" else -value

    @property
    def score_range(self) -> MetricRange:
        """`metric_range` as the schedulers see it (higher is better)."""
        return score_range(self.metric_range, self.mode)

    def value(self, score: float) -> float:
        """A score back in the metric's own units."""
        return score if self.mode == "max" else -score

    @property
    def time_limit_s(self) -> float | None:
        """The deadline, or the time the budget buys at the atoms' price, whichever is sooner."""
        limits = [] if self.deadline_s is None else [self.deadline_s]
        rate = self.resources.usd_per_atom_hour * self.atoms
        if self.budget_usd is not None and rate > 0 and not isinstance(self.scheduler, PlanSpec):
            limits.append(self.budget_usd / rate * 3600.0)
        return min(limits) if limits else None

    def usd(self, seconds: float) -> float:
        return self.resources.usd_per_atom_hour * self.atoms * seconds / 3600.0


def check_storage(location: str) -> None:
    """A `FieldPathError` at ``storage`` unless `location` is a folder or an
    ``s3://bucket/prefix`` URL (`thrifty.runtime.ddp.storage.parse_folder`)."""
    try:
        parse_folder(location)
    except ProblemError as e:
        raise FieldPathError(("storage",), e.message) from None


def _check_name(name: str) -> None:
    """The experiment's name becomes its results folder's (``thrifty-runs/NAME-TIME``): a plain name."""
    try:
        name.encode("utf-8")
        plain = name.isprintable() and not name.startswith(".") and not any(c in name for c in "/\\")
    except UnicodeEncodeError:  # a lone surrogate (JSON "\ud800") names no file
        plain = False
    if not plain:
        raise FieldPathError(("name",), f"is {name!r}, but names the results folder: use no '/', '\\', control "
                             "or unprintable characters, and do not start with '.'")


def _check_domain(name: str, value: Any) -> None:
    if not isinstance(value, dict):
        return  # a constant
    if len(value) != 1 or next(iter(value)) not in DOMAINS:
        raise FieldPathError(("search_space", name), f"is {value!r}, but a domain is one of "
                             + ", ".join(f'{{"{d}": [...]}}' for d in DOMAINS) + ", or a constant")
    kind, args = next(iter(value.items()))
    where = ("search_space", name, kind)
    if not isinstance(args, list) or not args:
        raise FieldPathError(where, f"is {args!r}, but must be a non-empty list")
    if kind == "choice":
        return
    numbers = all(isinstance(a, (int, float)) and not isinstance(a, bool) and math.isfinite(a) for a in args)
    if len(args) != 2 or not numbers:
        raise FieldPathError(where, f"is {args!r}, but must be [low, high], two finite numbers")
    low, high = args
    if low > high:
        raise FieldPathError(where, f"is {args!r}: low is more than high")
    if kind == "loguniform" and low <= 0:
        raise FieldPathError(where, f"is {args!r}, but a log-uniform range must be above 0")
    if kind == "randint" and not (float(low).is_integer() and float(high).is_integer()):
        raise FieldPathError(where, f"is {args!r}, but must be two integers")


def _path_of(loc: tuple[Any, ...]) -> str:
    """A JSON path without the scheduler's union tag (``scheduler.asha.eta`` -> ``scheduler.eta``)."""
    if len(loc) >= 2 and loc[0] == "scheduler" and loc[1] in SCHEDULER_NAMES:
        loc = loc[:1] + loc[2:]
    return json_path(loc)


def parse_experiment(data: Any, source: str | None = None, base: Path | None = None) -> ExperimentFile:
    """Validate an experiment (a dict); `base` resolves relative file paths in `resources`."""
    if not isinstance(data, dict):
        raise ProblemError(f"an experiment must be a JSON object, not {type(data).__name__}", source=source)
    experiment = validate_model(ExperimentFile, data, source=source, path_of=_path_of)
    if base is not None:
        updates = {}
        for key in ("catalog", "model"):
            value = getattr(experiment.resources, key)
            if value is not None and ("/" in value or value.endswith(".json")) and not Path(value).is_absolute():
                if (base / value).exists():
                    updates[key] = str(base / value)
        if updates:
            experiment = experiment.model_copy(update={"resources": experiment.resources.model_copy(update=updates)})
        if file_spec(experiment.trainer) is not None:  # a trainer's file, read from the experiment's folder
            experiment = experiment.model_copy(update={"trainer": absolute_spec(experiment.trainer, base)})
    return experiment


def load_experiment(path: str | Path) -> ExperimentFile:
    """An experiment file, JSON or YAML (``.yaml``/``.yml``)."""
    path = Path(path)
    return parse_experiment(read_document(path), source=str(path), base=path.parent)


def experiment_json_schema() -> dict[str, Any]:
    return ExperimentFile.model_json_schema()


def build_search_space(experiment: ExperimentFile):
    """Random search over the file's domains, `samples` draws, seeded."""
    from thrifty.runtime.tuning.search_space import Choice, IntUniform, LogUniform, RandomSearch, Uniform

    domains: dict[str, Any] = {}
    for name, value in experiment.search_space.items():
        if not isinstance(value, dict):
            domains[name] = value
            continue
        kind, args = next(iter(value.items()))
        domains[name] = {"loguniform": lambda a: LogUniform(float(a[0]), float(a[1])),
                         "uniform": lambda a: Uniform(float(a[0]), float(a[1])),
                         "randint": lambda a: IntUniform(int(a[0]), int(a[1])),
                         "choice": lambda a: Choice(a)}[kind](args)
    return RandomSearch(domains, seed=experiment.seed, max_configs=experiment.samples)


def build_scheduler(experiment: ExperimentFile):
    """The loop scheduler the file names (not ``plan``, which `execute_plan` carries out)."""
    from thrifty.runtime.tuning import ASHA, FIFO, POP, Bandit, EarlyTerm, HyperSched

    s = experiment.scheduler
    R = experiment.max_iterations
    try:
        if isinstance(s, HyperSchedSpec):
            return HyperSched(min_iterations=s.min_iterations, eta=s.eta, max_iterations=R, scaling=s.scaling,
                              use_idle_atoms=s.use_idle_atoms)
        if isinstance(s, ASHASpec):
            return ASHA(min_iterations=s.min_iterations, eta=s.eta, max_iterations=R,
                        atoms_per_trial=s.atoms_per_trial)
        if isinstance(s, POPSpec):
            target = s.target if s.target is not None else experiment.target
            assert target is not None  # the file's rules require one
            kill = None if s.kill_threshold is None else experiment.score(s.kill_threshold)
            return POP(experiment.score(target), boundary=s.boundary, kill_threshold=kill,
                       atoms_per_trial=s.atoms_per_trial, learn_prior=s.learn_prior,
                       metric_range=experiment.score_range, resume=s.resume)
        if isinstance(s, BanditSpec):
            return Bandit(boundary=s.boundary, epsilon=s.epsilon, atoms_per_trial=s.atoms_per_trial,
                          lower=experiment.score_range[0])
        if isinstance(s, EarlyTermSpec):
            return EarlyTerm(boundary=s.boundary, delta=s.delta, atoms_per_trial=s.atoms_per_trial,
                             metric_range=experiment.score_range)
        if isinstance(s, FIFOSpec):
            return FIFO(atoms_per_trial=s.atoms_per_trial)
    except ProblemError as e:
        raise ProblemError(e.message, path=f"scheduler.{e.path}" if e.path else "scheduler") from None
    raise ProblemError(f"'{s.name}' is carried out by the plan executor, not the loop", path="scheduler.name")


def resolve_trainer(experiment: ExperimentFile) -> None:
    """Import the trainer now, so a typo fails before anything starts: it
    takes the trials' arguments, and a loop function has a global batch for
    every trial (`_check_loop_batch`)."""
    in_file = file_spec(experiment.trainer)
    module_name, attr = in_file if in_file is not None else experiment.trainer.split(":")
    try:
        module = (import_file if in_file is not None else import_named)(module_name, f"'{experiment.trainer}'")
    except ProblemError as e:
        raise ProblemError(e.message, path="trainer") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ProblemError(f"'{experiment.trainer}': module '{module_name}' has no function '{attr}'",
                           path="trainer")
    loop = is_loop_function(factory, {**experiment.trainer_args, **experiment.search_space})
    _check_arguments(experiment, factory, loop)
    if loop:
        _check_loop_batch(experiment, factory)


def _check_arguments(experiment: ExperimentFile, factory: Any, loop: bool = False) -> None:
    """Every trial calls the factory (a `loop` function: after the context) with `trainer_args` and a
    configuration of `search_space`: each of their names must be a parameter it takes (unless it takes
    ``**kwargs``), and each parameter it needs must be one."""
    try:
        parameters = list(inspect.signature(factory).parameters.values())[1 if loop else 0:]
    except (TypeError, ValueError):  # no signature to read (a builtin): the first trial tells
        return
    given = {**{k: ("trainer_args", k) for k in experiment.trainer_args},
             **{k: ("search_space", k) for k in experiment.search_space}}
    named = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    takes = ", ".join(sorted(named)) or "none"
    if not any(p.kind == p.VAR_KEYWORD for p in parameters):
        for name, where in given.items():
            if name not in named:
                raise ProblemError(f"the trainer '{experiment.trainer}' takes no argument {name!r} (it takes "
                                   f"{takes})", path=json_path(where))
    for p in parameters:
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in given:
            raise ProblemError(f"the trainer '{experiment.trainer}' needs the argument {p.name!r}: give it in "
                               "trainer_args or search_space", path="trainer")


def _check_loop_batch(experiment: ExperimentFile, loop: Any) -> None:
    """A loop function's trials need a global batch (`loop_batch_size`): the
    search space's ``batch_size`` must draw positive integers only, a fixed
    one be one, and without either the loop's ``batch_size`` parameter must
    default to one (else the error is the ``trainer``'s, and says which
    parameter was taken for the context: a factory's required argument
    that nobody gives reads as a loop's). A `ProblemError` at the field's
    JSON path otherwise."""
    spec = experiment.trainer
    domain = experiment.search_space.get("batch_size")
    if isinstance(domain, dict):
        kind, args = next(iter(domain.items()))
        where = json_path(("search_space", "batch_size", kind))
        counts = all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in args) if kind == "choice" \
            else kind == "randint" and args[0] >= 1  # randint draws integers from low to high
        if not counts:
            raise ProblemError(f"is {args!r}, but a trial's global batch (the loop function '{spec}' trains on "
                               "batch_size) must be a positive integer: use randint or choice of positive integers",
                               path=where)
        return
    for where, args in (("search_space", experiment.search_space), ("trainer_args", experiment.trainer_args)):
        if "batch_size" in args:
            try:
                loop_batch_size(spec, loop, args)
            except ProblemError as e:
                raise ProblemError(e.message, path=json_path((where, "batch_size"))) from None
            return
    try:
        loop_batch_size(spec, loop, {})
    except ProblemError as e:
        first = next(iter(inspect.signature(loop).parameters))
        raise ProblemError(f"{e.message} (the trainer is taken as a loop function: its first parameter {first!r}, "
                           "which neither trainer_args nor search_space gives, takes the job's context)",
                           path="trainer") from None

