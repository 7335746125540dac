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
latency-to-throughput transition, Srifty takeaway 4; default true).

Relative paths inside a problem file are resolved against the file's folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from thrifty.datasets.errors import ProblemError
from thrifty.datasets.io import read_json
from thrifty.datasets.validation import FieldPathError, validate_model

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
]

PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
PositiveInt = Annotated[int, Field(gt=0)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Limits(_Frozen):
    """Hard limits on the whole job: wall time in seconds and cost in USD."""

    time_s: PositiveFloat | None = None
    cost_usd: PositiveFloat | None = None


class InstanceChoice(_Frozen):
    """One machine type in one market, with at most `quota` machines."""

    instance_type: Annotated[str, Field(min_length=1)]
    market: Literal["on_demand", "spot"] = "on_demand"
    quota: PositiveInt

    @property
    def label(self) -> str:
        return f"{self.instance_type} ({self.market.replace('_', '-')})"


class Overheads(_Frozen):
    launch_s: NonNegativeFloat = 0.0
    min_billed_s: NonNegativeFloat = 60.0


class TrainingProblem(_Frozen):
    kind: Literal["training"]
    model: Annotated[str, Field(min_length=1)]
    global_batch: PositiveInt
    iterations: PositiveInt
    objective: Literal["min_cost", "min_time"] = "min_cost"
    limits: Limits = Limits()
    instances: Annotated[list[InstanceChoice], Field(min_length=1)]
    catalog: str | None = None
    allreduce: str | None = None
    overheads: Overheads = Overheads()
    batch_sizes: Literal["gpu_pow2", "pow2"] | Annotated[list[PositiveInt], Field(min_length=1)] = "gpu_pow2"
    respect_threshold: bool = True
    name: str | None = None

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
        return self


def _resolve_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    out = dict(data)
    for key in ("catalog", "allreduce", "model"):
        value = out.get(key)
        if isinstance(value, str) and (value.endswith(".json") or "/" in value):
            candidate = (base / value) if not Path(value).is_absolute() else Path(value)
            if candidate.exists() or key != "model":
                out[key] = str(candidate)
    return out


def parse_problem(data: Any, source: str | None = None, base: Path | None = None) -> Problem:
    """Validate problem data; every error names the JSON path of the bad field."""
    if not isinstance(data, dict):
        raise ProblemError(f"a problem must be a JSON object, not {type(data).__name__}", source=source)
    kind = data.get("kind")
    if kind is None:
        raise ProblemError("is required: 'training' or 'tuning'", path="kind", source=source)
    if kind not in ("training", "tuning"):
        raise ProblemError(f"is '{kind}', but must be 'training' or 'tuning'", path="kind", source=source)
    if base is not None:
        data = _resolve_paths(data, base)
    return validate_model(TrainingProblem if kind == "training" else TuningProblem, data, source=source)


def load_problem(path: str | Path) -> Problem:
    path = Path(path)
    return parse_problem(read_json(path), source=str(path), base=path.parent)


def problem_json_schema(kind: str = "training") -> dict[str, Any]:
    if kind not in ("training", "tuning"):
        raise ProblemError(f"kind is '{kind}', but must be 'training' or 'tuning'")
    return (TrainingProblem if kind == "training" else TuningProblem).model_json_schema()


# -- kind "tuning" (RubberBand) -------------------------------------------------------

class Experiment(_Frozen):
    """SHA(n, r, R, eta) or Hyperband(r, R, eta) (RubberBand 3.1)."""

    algorithm: Literal["sha", "hyperband"] = "sha"
    trials: PositiveInt | None = None
    min_iters: PositiveInt
    max_iters: PositiveInt
    eta: Annotated[float, Field(allow_inf_nan=False)] = 2.0

    @model_validator(mode="after")
    def _check(self) -> "Experiment":
        if self.min_iters > self.max_iters:
            raise FieldPathError(("min_iters",), f"{self.min_iters} is larger than max_iters {self.max_iters}")
        if not self.eta > 1:
            raise FieldPathError(("eta",), f"is {self.eta:g}, but must be greater than 1")
        if self.algorithm == "sha" and self.trials is None:
            raise FieldPathError(("trials",), "is required for algorithm 'sha'")
        return self


class StageSpec(_Frozen):
    trials: PositiveInt
    iters: PositiveInt


class Cloud(_Frozen):
    """RubberBand 4.1 cloud variables (latencies in seconds, prices in USD)."""

    scale_latency_s: NonNegativeFloat = 0.0
    scale_latency_sd_s: NonNegativeFloat = 0.0
    init_latency_s: NonNegativeFloat = 0.0
    init_latency_sd_s: NonNegativeFloat = 0.0
    data_usd_per_gb: NonNegativeFloat = 0.0
    dataset_gb: NonNegativeFloat = 0.0
    min_billed_s: NonNegativeFloat = 60.0
    preemptions_per_hour: NonNegativeFloat = 0.0
    recovery_s: NonNegativeFloat = 0.0


class ProfileOverride(_Frozen):
    """Rescale the shipped scaling curve: 1-GPU iteration latency and an absolute sd."""

    base_iteration_s: PositiveFloat | None = None
    iteration_sd_s: NonNegativeFloat | None = None


class TuningProblem(_Frozen):
    """Plan an SHA / Hyperband tuning job at least cost under a deadline (RubberBand).

    ``{"kind": "tuning", "experiment": {"algorithm": "sha", "trials": 32, "min_iters": 1,
    "max_iters": 50, "eta": 3}, "model": "resnet101", "instance_type": "p3.8xlarge",
    "deadline_s": 1200, "billing": "per_instance", "cloud": {"scale_latency_s": 15,
    "init_latency_s": 15}}``; ``stages: [{trials, iters}]`` may replace
    ``experiment``; ``instance_type`` may be a list (one type chosen per stage).
    """

    kind: Literal["tuning"]
    experiment: Experiment | None = None
    stages: Annotated[list[StageSpec], Field(min_length=1)] | None = None
    model: Annotated[str, Field(min_length=1)]
    instance_type: Annotated[str, Field(min_length=1)] | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    deadline_s: PositiveFloat
    deadline_on: Literal["mean", "p95"] = "mean"
    billing: Literal["per_instance", "per_function"] = "per_instance"
    market: Literal["on_demand", "spot"] = "on_demand"
    cloud: Cloud = Cloud()
    profile: ProfileOverride = ProfileOverride()
    max_instances: PositiveInt = 256
    max_gpus_per_trial: PositiveInt | None = None
    samples: Annotated[int, Field(ge=1, le=10_000)] = 200
    seed: int = 0
    catalog: str | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _one_job(self) -> "TuningProblem":
        if (self.experiment is None) == (self.stages is None):
            raise FieldPathError(("experiment",), "give exactly one of 'experiment' and 'stages'")
        if isinstance(self.instance_type, list) and len(set(self.instance_type)) != len(self.instance_type):
            raise FieldPathError(("instance_type",), "lists an instance type twice")
        return self

    @property
    def instance_types(self) -> list[str]:
        return [self.instance_type] if isinstance(self.instance_type, str) else list(self.instance_type)


Problem = TrainingProblem | TuningProblem
