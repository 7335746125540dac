"""Problems thrifty solves, as frozen pydantic models loaded from JSON.

``kind: "training"`` (Srifty 4.4): choose machine types, counts and per-machine
batches for one synchronous data-parallel training job. ``kind: "tuning"``
(RubberBand): plan the per-stage allocation of a successive-halving or
Hyperband tuning job under a deadline (`TuningProblem`, at the end).

A training problem::

    {"kind": "training", "model": "resnet50", "global_batch": 1024, "iterations": 400,
     "objective": "min_cost", "limits": {"time_s": 500, "cost_usd": 1.3},
     "instances": [{"instance_type": "p3.8xlarge", "market": "spot", "quota": 2},
                   {"instance_type": "g3.8xlarge", "market": "on_demand", "quota": 8}]}

Optional keys: ``catalog`` (a catalog file; default the shipped AWS one),
``allreduce`` (a learned allreduce model file), ``overheads`` (``launch_s``:
seconds from asking for machines to the first iteration, charged in time and
in cost; ``min_billed_s``: the billing minimum per machine, 60 s on EC2),
``batch_sizes`` (which per-machine batches are allowed: ``"gpu_pow2"``, the
GPUs of a machine times a power of two, the default; ``"pow2"``, any power of
two; or an explicit list), ``respect_threshold`` (skip batches below the
latency-to-throughput transition, Srifty takeaway 4; default true), ``job``
(``package.module:function`` or ``path/to/train.py:function``: the job's own
profiles, measured by ``thrifty profile JOB`` and cached by its code and
arguments, price the instance types; `thrifty.perfmodels.job_profiles`;
``thrifty run`` runs it when no ``--job`` is given) with its ``job_args``
(JSON keyword arguments; ``model`` defaults to the job's name,
``package.module.function``, or for a file's job ``stem.function``).

Relative paths inside a problem file (``catalog``, ``allreduce``, ``model``
when it names a profile file, and the file of a ``job``) are read from the problem file's
folder, whatever the current folder; a problem built in Python (``solve(dict)``)
reads them from the current folder. A file that is not there is an error
naming the problem file and the field (``copy.json: catalog: file not found:
../catalog/aws-us-east-1.json``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from thrifty.core.errors import ProblemError
from thrifty.core.io import read_document
from thrifty.core.optional import absolute_spec, file_spec
from thrifty.core.validation import FieldPathError, short_value, validate_model
from thrifty.perfmodels.cluster import MAX_MACHINES

__all__ = [
    "Limits",
    "InstanceChoice",
    "Overheads",
    "TrainingProblem",
    "TuningProblem",
    "Problem",
    "load_problem",
    "parse_problem",
    "problem_json_schema",
    "simulation_work",
]

# -- ranges -----------------------------------------------------------------------------
# Every number a problem holds has a range that no real job reaches and that keeps
# every code path finite and fast: the batch DP holds arrays of global_batch + 1
# entries, the ILPs count in integer microseconds / milli-dollars (64-bit), and the
# tuning simulator holds samples x trials draws per stage. Each bound says why.

DAY_S = 86_400.0
MAX_GLOBAL_BATCH = 2**20          # 1M samples: 16x the largest published data-parallel batch (64K); the
                                  # batch DP and the explanation of an infeasible answer stay within seconds
MAX_ITERATIONS = 10**9            # 32 years at 1 s per iteration; N x iteration time fits the ILP's int64 us
MAX_QUOTA = MAX_MACHINES          # machines of one type in one market: above any cloud account's quota
MAX_INSTANCE_CHOICES = 256        # (type, market) pairs: every type of a large catalog, in both markets
MAX_BATCH_LIST = 64               # explicit per-machine batches: more than every power of two up to 2^24
MAX_DP_CELLS = 2**26              # global_batch x instance choices: the batch DP's arrays (64 MB of flags)
MAX_TIME_S = 1e9                  # 32 years: a time limit or deadline; integer ms / us stay in int64
MAX_COST_USD = 1e9                # $1 billion: above any training bill; the ILP's integer cost stays in int64
MAX_OVERHEAD_S = DAY_S            # a launch overhead or billing minimum of more than a day is not an overhead
MAX_LATENCY_S = DAY_S             # a scale-up, start-up or recovery latency (or its sd) of a day at most
MAX_PREEMPTIONS_PER_HOUR = 10.0   # one preemption every 6 minutes per instance; spot pools see < 1
MAX_USD_PER_GB = 10.0             # data ingress price: cloud egress/ingress is ~$0.01-0.2 per GB
MAX_DATASET_GB = 1e5              # 100 TB downloaded by every new instance
MAX_ITERATION_S = DAY_S           # one profiled iteration (or its sd) of a day at most
MAX_TRIALS = 100_000              # trials of one SHA job or stage (papers run 32-1,000)
MAX_ITERS = 10**9                 # iterations per trial (min_iters, max_iters, stage iters)
MAX_ETA = 100.0                   # keep 1 of 100 trials per stage; papers use 2-4
MAX_STAGES = 200                  # stages of the whole job (Hyperband's brackets concatenated)
MAX_INSTANCES = 4096              # instances held at once by a tuning job
MAX_GPUS_PER_TRIAL = 4096         # GPUs of one trial
MAX_SAMPLES = 10_000              # Monte Carlo samples of the tuning simulator (default 200)
MAX_SEED = 2**32 - 1              # numpy's seed range
MAX_TUNING_TYPES = 64             # instance types one tuning job may choose from
MAX_SIMULATION_WORK = 10**8       # samples x sum_k trials_k x ceil(sqrt(trials_k)): the simulator's work
MAX_NAME_CHARS = 1000             # names and file paths


def _whole_float_to_int(value: Any) -> Any:
    """``1e30`` in an integer field is the integer 10^30 (then out of range with a
    clear message), not 'unable to parse input string'."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def _valid_text(value: str) -> str:
    if "\x00" in value:
        raise ValueError("contains a NUL character")
    control = next((c for c in value if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0), None)
    if control is not None:  # printed, an escape sequence would drive the user's terminal
        raise ValueError(f"contains the control character U+{ord(control):04X}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("is not valid Unicode text (it holds a lone surrogate)") from None
    return value


def _int_range(low: int, high: int, why: str) -> tuple[Any, ...]:
    """A field's range as the metadata of ``Annotated[int, *_int_range(...)]``:
    unpacked into Annotated, the annotation stays a type that mypy reads."""
    # a count from 1 is "greater than 0", as the messages have always said
    bound = Field(gt=0, le=high) if low == 1 else Field(ge=low, le=high)
    return bound, Field(description=f"integer {low:,} to {high:,}: {why}"), BeforeValidator(_whole_float_to_int)


def _float_range(low: float, high: float, why: str, *, positive: bool = False) -> tuple[Any, ...]:
    """The metadata of ``Annotated[float, *_float_range(...)]``, as `_int_range`."""
    bound = Field(gt=low, le=high, allow_inf_nan=False) if positive else Field(ge=low, le=high, allow_inf_nan=False)
    rule = f"> {low:g}" if positive else f">= {low:g}"
    return bound, Field(description=f"finite number {rule} and <= {high:g}: {why}")


Text = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS), AfterValidator(_valid_text)]
OptionalText = Annotated[str, Field(max_length=MAX_NAME_CHARS), AfterValidator(_valid_text)]

# kept for other modules that build these models in code
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
PositiveInt = Annotated[int, Field(gt=0)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class Limits(_Frozen):
    """Hard limits on the whole job: wall time in seconds and cost in USD."""

    time_s: Annotated[float, *_float_range(0, MAX_TIME_S, "wall time of the whole job in seconds (32 years at most)",
                                           positive=True)] | None = None
    cost_usd: Annotated[float, *_float_range(0, MAX_COST_USD, "cost of the whole job in USD ($1 billion at most)",
                                             positive=True)] | None = None


class InstanceChoice(_Frozen):
    """One machine type in one market, with at most `quota` machines."""

    instance_type: Text
    market: Literal["on_demand", "spot"] = "on_demand"
    quota: Annotated[int, *_int_range(1, MAX_QUOTA,
                                      "machines of this type in this market (above any account's quota)")]

    @property
    def label(self) -> str:
        return f"{self.instance_type} ({self.market.replace('_', '-')})"


class Overheads(_Frozen):
    launch_s: Annotated[float, *_float_range(0, MAX_OVERHEAD_S,
                                             "seconds from asking for machines to the first iteration")] = 0.0
    min_billed_s: Annotated[float, *_float_range(0, MAX_OVERHEAD_S,
                                                 "billing minimum per machine in seconds (60 on EC2)")] = 60.0


BatchList = Annotated[
    list[Annotated[int, *_int_range(1, MAX_GLOBAL_BATCH, "a per-machine batch")]],
    Field(min_length=1, max_length=MAX_BATCH_LIST),
]


class TrainingProblem(_Frozen):
    kind: Literal["training"]
    model: Text
    # the job (``package.module:function``) whose own profiles price the instance types
    # (`thrifty.perfmodels.job_profiles`); `model` then defaults to the job's name
    job: Annotated[Text, Field(pattern=r"^(?:[A-Za-z_][\w.]*|.+\.py):[A-Za-z_][\w.]*$",
                               description="package.module:function or path/to/file.py:function")] | None = None
    job_args: dict[str, Any] = Field(default_factory=dict)
    global_batch: Annotated[int, *_int_range(1, MAX_GLOBAL_BATCH, "samples per iteration over all machines "
                                             "(16x the largest published data-parallel batch)")]
    iterations: Annotated[int, *_int_range(1, MAX_ITERATIONS, "training iterations (32 years at 1 s each)")]
    objective: Literal["min_cost", "min_time"] = "min_cost"
    limits: Limits = Limits()
    instances: Annotated[list[InstanceChoice], Field(
        min_length=1, max_length=MAX_INSTANCE_CHOICES,
        description=f"1 to {MAX_INSTANCE_CHOICES} distinct (instance_type, market) choices; "
                    f"global_batch x their number is at most {MAX_DP_CELLS:,} (the batch search's arrays)")]
    catalog: OptionalText | None = None
    allreduce: OptionalText | None = None
    overheads: Overheads = Overheads()
    batch_sizes: Literal["gpu_pow2", "pow2"] | BatchList = "gpu_pow2"
    respect_threshold: bool = True
    name: OptionalText | None = None

    @model_validator(mode="before")
    @classmethod
    def _model_of_job(cls, data: Any) -> Any:
        if isinstance(data, dict) and "model" not in data and isinstance(data.get("job"), str):
            in_file = file_spec(data["job"])  # a file's job: the file's stem and the function
            name = f"{Path(in_file[0]).stem}.{in_file[1]}" if in_file else data["job"].replace(":", ".")
            return {**data, "model": name}  # (a colon would read as an emoji code)
        return data

    @model_validator(mode="after")
    def _job_args_without_job(self) -> "TrainingProblem":
        if self.job_args and self.job is None:
            raise FieldPathError(("job_args",), "are the arguments of a job: name the job too (\"job\")")
        return self

    @model_validator(mode="after")
    def _distinct_choices(self) -> "TrainingProblem":
        seen: dict[tuple[str, str], int] = {}
        for i, choice in enumerate(self.instances):
            key = (choice.instance_type, choice.market)
            if key in seen:
                raise FieldPathError(
                    ("instances", i),
                    f"{choice.label} is listed twice (also instances[{seen[key]}]); give one quota per "
                    "instance type and market",
                )
            seen[key] = i
        cells = self.global_batch * len(self.instances)
        if cells > MAX_DP_CELLS:
            raise FieldPathError(
                ("global_batch",),
                f"{self.global_batch:,} with {len(self.instances)} instance choices is "
                f"{cells:,} cells of batch search, more than {MAX_DP_CELLS:,}; use a smaller global "
                "batch or fewer instance choices",
            )
        return self


# the fields of a problem that name a file; `model` names a file only when it ends in .json (else a profile's
# model name) or a file of that name exists
FILE_FIELDS = ("catalog", "allreduce", "model")


def _names_file(key: str, value: str, base: Path | None) -> bool:
    if key != "model" or value.endswith(".json"):
        return True
    try:
        return ((base or Path()) / value).is_file()
    except (OSError, ValueError):  # a name the OS refuses to look at (too long, a NUL byte) names no file
        return False


def _resolve_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """`data` with each relative file field read from the folder `base` (the problem file's), and a `job`
    in a file (``train.py:train``) with its path made absolute from there."""
    out = dict(data)
    for key in FILE_FIELDS:
        value = out.get(key)
        if isinstance(value, str) and value and "\x00" not in value and _names_file(key, value, base):
            out[key] = str(base / value)  # an absolute value stays itself
    job = out.get("job")
    if isinstance(job, str) and "\x00" not in job and file_spec(job) is not None:
        out["job"] = absolute_spec(job, base)
    return out


def _check_files(problem: Problem, source: str | None) -> None:
    """Every file a problem names exists: else the error names the problem file and the field (a copied
    problem file whose relative ``catalog`` no longer leads anywhere)."""
    for key in FILE_FIELDS:
        value = getattr(problem, key, None)
        if isinstance(value, str) and _names_file(key, value, None):
            try:
                found = Path(value).exists()
            except (OSError, ValueError):  # a name the OS refuses to look at
                found = False
            if not found:
                raise ProblemError(f"file not found: {value}", path=key, source=source)
    in_file = file_spec(problem.job) if isinstance(problem, TrainingProblem) and problem.job is not None else None
    if in_file is not None and not Path(in_file[0]).is_file():
        raise ProblemError(f"file not found: {in_file[0]}", path="job", source=source)


def parse_problem(data: Any, source: str | None = None, base: Path | None = None) -> Problem:
    """Validate problem data; every error names the JSON path of the bad field.

    `base`: the folder relative file fields (`FILE_FIELDS`) are read from, the problem file's; without one
    (a problem built in Python), the current folder. A named file that does not exist is an error naming
    the field."""
    if not isinstance(data, dict):
        raise ProblemError(f"a problem must be a JSON object, not {type(data).__name__}", source=source)
    kind = data.get("kind")
    if kind is None:
        raise ProblemError("is required: 'training' or 'tuning'", path="kind", source=source)
    if kind not in ("training", "tuning"):
        raise ProblemError(f"is {short_value(kind)}, but must be 'training' or 'tuning'", path="kind", source=source)
    if base is not None:
        data = _resolve_paths(data, base)
    problem: Problem
    if kind == "training":
        problem = validate_model(TrainingProblem, data, source=source)
    else:
        problem = validate_model(TuningProblem, data, source=source)
    _check_files(problem, source)
    return problem


def load_problem(path: str | Path) -> Problem:
    """Load a problem file: JSON, or YAML for ``.yaml``/``.yml`` (`read_document`); its relative file fields
    are read from the problem file's folder, whatever the current folder."""
    path = Path(path)
    return parse_problem(read_document(path), source=str(path), base=path.parent)


def problem_json_schema(kind: str = "training") -> dict[str, Any]:
    if kind not in ("training", "tuning"):
        raise ProblemError(f"kind is '{kind}', but must be 'training' or 'tuning'")
    return (TrainingProblem if kind == "training" else TuningProblem).model_json_schema()


# -- kind "tuning" (RubberBand) -------------------------------------------------------

class Experiment(_Frozen):
    """SHA(n, r, R, eta) or Hyperband(r, R, eta) (RubberBand 3.1)."""

    algorithm: Literal["sha", "hyperband"] = "sha"
    trials: Annotated[int, *_int_range(1, MAX_TRIALS, "trials SHA starts (papers run 32 to 1,000)")] | None = None
    min_iters: Annotated[int, *_int_range(1, MAX_ITERS, "iterations of a trial in the first stage (r)")]
    max_iters: Annotated[int, *_int_range(1, MAX_ITERS, "iterations of a trial that reaches the end (R)")]
    eta: Annotated[float, Field(allow_inf_nan=False, le=MAX_ETA,
                                description=f"greater than 1 and <= {MAX_ETA:g}: 1/eta of the trials "
                                            "go on to the next stage (papers use 2 to 4)")] = 2.0

    @model_validator(mode="after")
    def _check(self) -> "Experiment":
        if self.min_iters > self.max_iters:
            raise FieldPathError(("min_iters",), f"{self.min_iters} is larger than max_iters {self.max_iters}")
        if not self.eta > 1:
            raise FieldPathError(("eta",), f"is {self.eta:g}, but must be greater than 1")
        if self.algorithm == "sha" and self.trials is None:
            raise FieldPathError(("trials",), "is required for algorithm 'sha'")
        if self.algorithm == "hyperband" and self.trials is not None:
            raise FieldPathError(("trials",), "is not used by algorithm 'hyperband' (its brackets set the trials "
                                 "from min_iters, max_iters and eta); leave it out")
        return self


class StageSpec(_Frozen):
    trials: Annotated[int, *_int_range(1, MAX_TRIALS, "trials of this stage")]
    iters: Annotated[int, *_int_range(1, MAX_ITERS, "iterations of each trial in this stage")]


def _latency_range(why: str) -> tuple[Any, ...]:
    return _float_range(0, MAX_LATENCY_S, f"{why} in seconds (a day at most)")


class Cloud(_Frozen):
    """RubberBand 4.1 cloud variables (latencies in seconds, prices in USD)."""

    scale_latency_s: Annotated[float, *_latency_range("provider queuing delay of one scale-up")] = 0.0
    scale_latency_sd_s: Annotated[float, *_latency_range("its standard deviation")] = 0.0
    init_latency_s: Annotated[float, *_latency_range("start-up of a new instance")] = 0.0
    init_latency_sd_s: Annotated[float, *_latency_range("its standard deviation")] = 0.0
    data_usd_per_gb: Annotated[float, *_float_range(0, MAX_USD_PER_GB, "data ingress price in USD per GB")] = 0.0
    dataset_gb: Annotated[float, *_float_range(0, MAX_DATASET_GB,
                                               "GB every new instance downloads (100 TB at most)")] = 0.0
    min_billed_s: Annotated[float, *_float_range(0, MAX_OVERHEAD_S, "billing minimum per instance in seconds")] = 60.0
    preemptions_per_hour: Annotated[float, *_float_range(
        0, MAX_PREEMPTIONS_PER_HOUR, "spot preemptions per instance-hour (one per 6 minutes at most)")] = 0.0
    recovery_s: Annotated[float, *_latency_range("extra latency to resume a preempted trial")] = 0.0


class ProfileOverride(_Frozen):
    """Rescale the shipped scaling curve: 1-GPU iteration latency and an absolute sd."""

    base_iteration_s: Annotated[float, *_float_range(0, MAX_ITERATION_S, "1-GPU iteration latency in seconds",
                                                     positive=True)] | None = None
    iteration_sd_s: Annotated[float, *_float_range(0, MAX_ITERATION_S,
                                                   "sd of one iteration in seconds")] | None = None


class TuningProblem(_Frozen):
    """Plan an SHA / Hyperband tuning job at least cost under a deadline (RubberBand).

    ``{"kind": "tuning", "experiment": {"algorithm": "sha", "trials": 32, "min_iters": 1,
    "max_iters": 50, "eta": 3}, "model": "resnet101", "instance_type": "p3.8xlarge",
    "deadline_s": 1200, "billing": "per_instance", "cloud": {"scale_latency_s": 15,
    "init_latency_s": 15}}``; ``stages: [{trials, iters}]`` may replace
    ``experiment``; ``instance_type`` may be a list (one type chosen per stage).

    The job's size is checked across fields: at most `MAX_STAGES` stages, and
    ``samples x sum_k trials_k x ceil(sqrt(trials_k))`` (the simulator's work:
    every allocation considered for a stage simulates each trial in each
    sample, and a stage of n trials has about 2 sqrt(n) distinct parallelisms)
    at most `MAX_SIMULATION_WORK`.
    """

    kind: Literal["tuning"]
    experiment: Experiment | None = None
    stages: Annotated[list[StageSpec], Field(min_length=1, max_length=MAX_STAGES)] | None = None
    model: Text
    instance_type: Text | Annotated[list[Text], Field(min_length=1, max_length=MAX_TUNING_TYPES)]
    deadline_s: Annotated[float, *_float_range(0, MAX_TIME_S, "the job's deadline in seconds (32 years at most)",
                                               positive=True)]
    deadline_on: Literal["mean", "p95"] = "mean"
    billing: Literal["per_instance", "per_function"] = "per_instance"
    market: Literal["on_demand", "spot"] = "on_demand"
    cloud: Cloud = Cloud()
    profile: ProfileOverride = ProfileOverride()
    max_instances: Annotated[int, *_int_range(1, MAX_INSTANCES, "instances held at once")] = 256
    max_gpus_per_trial: Annotated[int, *_int_range(1, MAX_GPUS_PER_TRIAL, "GPUs of one trial")] | None = None
    samples: Annotated[int, *_int_range(1, MAX_SAMPLES, "Monte Carlo samples of the job simulator")] = 200
    seed: Annotated[int, *_int_range(0, MAX_SEED, "seed of the simulator's random numbers")] = 0
    catalog: OptionalText | None = None
    name: OptionalText | None = None

    @model_validator(mode="after")
    def _one_job(self) -> "TuningProblem":
        if (self.experiment is None) == (self.stages is None):
            raise FieldPathError(("experiment",), "give exactly one of 'experiment' and 'stages'")
        if isinstance(self.instance_type, list) and len(set(self.instance_type)) != len(self.instance_type):
            raise FieldPathError(("instance_type",), "lists an instance type twice")
        for i, (before, stage) in enumerate(zip(self.stages or [], (self.stages or [])[1:]), start=1):
            if stage.trials > before.trials:
                raise FieldPathError(("stages", i, "trials"), f"is {stage.trials}, more than the {before.trials} "
                                     f"of stages[{i - 1}]: a stage runs the trials the one before it promotes")
        _check_job_size(self)
        return self

    @property
    def instance_types(self) -> list[str]:
        return [self.instance_type] if isinstance(self.instance_type, str) else list(self.instance_type)


def _sha_stage_count(n: int, r: int, R: int, eta: float, cap: int) -> int:
    """Stages of SHA(n, r, R, eta) by `thrifty.perfmodels.experiment.sha_stages`'s
    rule, counted up to `cap` + 1 only (eta close to 1 makes that loop long)."""
    done = k = 0
    while k <= cap:
        if math.floor(n / eta**k + 1e-9) < 1 or done >= R:
            break
        done += min(int(round(r * eta**k)), R - done)
        k += 1
    return k


def _job_stages(problem: TuningProblem) -> tuple[tuple[int, int], ...]:
    """(trials, iters) per stage, refusing jobs of more than `MAX_STAGES` stages
    before they are built."""
    from thrifty.perfmodels.experiment import hyperband_spec, sha_spec

    if problem.stages is not None:
        return tuple((s.trials, s.iters) for s in problem.stages)
    e = problem.experiment
    assert e is not None  # _one_job: a problem gives exactly one of experiment and stages
    if e.algorithm == "hyperband":
        brackets = int(math.floor(math.log(e.max_iters / e.min_iters, e.eta) + 1e-9)) + 1
        if brackets > MAX_STAGES:
            raise FieldPathError(("experiment", "eta"), (
                f"Hyperband(r={e.min_iters}, R={e.max_iters}, eta={e.eta:g}) has {brackets} brackets, "
                f"so more than {MAX_STAGES} stages; use a larger eta or min_iters"))
        spec = hyperband_spec(e.min_iters, e.max_iters, e.eta)
    else:
        assert e.trials is not None  # Experiment._check: SHA's trials are required
        if _sha_stage_count(e.trials, e.min_iters, e.max_iters, e.eta, MAX_STAGES) > MAX_STAGES:
            raise FieldPathError(("experiment", "eta"), (
                f"SHA(n={e.trials}, r={e.min_iters}, R={e.max_iters}, eta={e.eta:g}) has more than "
                f"{MAX_STAGES} stages; use a larger eta or fewer trials"))
        spec = sha_spec(e.trials, e.min_iters, e.max_iters, e.eta)
    return tuple((s.trials, s.iters) for s in spec.stages)


def simulation_work(samples: int, trials: tuple[int, ...]) -> int:
    """``samples x sum_k trials_k x ceil(sqrt(trials_k))``: trial-samples the job
    simulator draws for the allocations of every stage (see `TuningProblem`)."""
    return samples * sum(n * math.isqrt(n - 1) + n for n in trials)


def _check_job_size(problem: TuningProblem) -> None:
    stages = _job_stages(problem)
    where = ("stages",) if problem.stages is not None else ("experiment",)
    if len(stages) > MAX_STAGES:
        raise FieldPathError(where, f"the job has {len(stages)} stages, but at most {MAX_STAGES} are allowed")
    work = simulation_work(problem.samples, tuple(n for n, _ in stages))
    if work > MAX_SIMULATION_WORK:
        total = sum(n for n, _ in stages)
        fits = max(1, problem.samples * MAX_SIMULATION_WORK // work)
        raise FieldPathError(where, (
            f"the job has {total:,} trials over {len(stages)} stages; with {problem.samples} samples its "
            f"simulation work (samples x trials x sqrt(trials) per stage) is {work:,}, more than "
            f"{MAX_SIMULATION_WORK:,}; use fewer trials, or samples <= {fits}"))


Problem = TrainingProblem | TuningProblem
