"""Scaling and cloud profiles of a tuning job (RubberBand 4.1, "Modeling Variables").

`ScalingProfile`: the latency of one training iteration of one trial as a
function of the GPUs it gets, at a fixed batch (strong scaling), profiled at
powers of two and interpolated between them, with a standard deviation (the
source of stragglers), plus the trial's start-up latency (loading a
checkpoint, connecting workers). Between profiled points we interpolate the
*throughput* (1 / latency) linearly in the GPU count, and the sd linearly;
beyond the largest point the profile is not extrapolated (that allocation is
not offered). Files: ``datasets/profiles/scaling/<model>__<instance type>.json``
(format ``thrifty.scaling_profile/1``, schema `ScalingProfileFile`), derived by
``datasets/scripts/derive_scaling_profiles.py`` or measured by
``thrifty profile-scaling``::

    {"format": "thrifty.scaling_profile/1", "model": "resnet50", "instance_type": "p3.8xlarge",
     "batch": 512, "iteration": "one step of batch 512", "startup_s": 0.0,
     "provenance": {"kind": "derived", "script": "...", "inputs": [...]},
     "points": [{"gpus": 1, "iteration_s": 1.3555, "iteration_sd_s": 0.0339}, ...]}

The schema checks the file; a `ScalingProfile` is the checked curve in the
form the simulators read.

`CloudProfile`: the instance type (GPUs per instance, price per hour), the
billing model (``per_instance``: per second with a 60 s minimum;
``per_function``: only the busy GPU-seconds of TRAIN tasks), the provider's
scale (queuing) latency, the instance initialization latency, the data
ingress price per GB and the dataset size each new instance downloads, and
(beyond RubberBand) the spot market with a preemption rate per instance-hour.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import numpy as np
from pydantic import Field, model_validator

from thrifty.core.errors import ProblemError, closest_names
from thrifty.core.io import read_json
from thrifty.core.validation import FieldPathError, FileSchema, validate_model
from thrifty.perfmodels.profile import Provenance

__all__ = ["ScalingProfile", "ScalingPoint", "ScalingProfileFile", "CloudProfile", "parse_scaling_profile",
           "load_scaling_profile", "available_scaling_profiles", "SCALING_DIR", "SCALING_FORMAT"]

SCALING_FORMAT: Final = "thrifty.scaling_profile/1"
SCALING_DIR = Path(__file__).resolve().parent.parent / "datasets" / "profiles" / "scaling"
MAX_LATENCY_S = 86_400.0  # an iteration, its sd or a start-up of more than a day is not a profile of one trial

Seconds = Annotated[float, Field(ge=0, le=MAX_LATENCY_S, allow_inf_nan=False)]


class ScalingPoint(FileSchema):
    """One profiled GPU count: mean and sd of one iteration's latency."""

    gpus: Annotated[int, Field(gt=0)]
    iteration_s: Annotated[float, Field(gt=0, le=MAX_LATENCY_S, allow_inf_nan=False)]
    iteration_sd_s: Seconds = 0.0
    repeats: Annotated[int, Field(ge=1)] | None = None  # timed iterations behind a measured mean


class ScalingProfileFile(FileSchema):
    """A scaling profile file (format ``thrifty.scaling_profile/1``)."""

    format: Literal["thrifty.scaling_profile/1"]
    model: Annotated[str, Field(min_length=1)]
    instance_type: Annotated[str, Field(min_length=1)]
    batch: Annotated[int, Field(gt=0)] | None = None  # the trial's batch (strong scaling: fixed)
    iteration: str | None = None  # what one iteration is ("one epoch of CIFAR-10 at batch 1024")
    startup_s: Seconds = 0.0
    provenance: Provenance | None = None
    points: Annotated[list[ScalingPoint], Field(min_length=1)]

    @model_validator(mode="after")
    def _gpus_start_at_one_and_increase(self) -> "ScalingProfileFile":
        gpus = [p.gpus for p in self.points]
        if gpus[0] != 1:
            raise FieldPathError(("points", 0, "gpus"), f"is {gpus[0]}, but a profile must start at 1 GPU")
        for i in range(1, len(gpus)):
            if gpus[i] <= gpus[i - 1]:
                raise FieldPathError(("points", i, "gpus"), f"is {gpus[i]}, but GPU counts must increase "
                                                            f"(points[{i - 1}].gpus is {gpus[i - 1]})")
        return self


@dataclass(frozen=True)
class ScalingProfile:
    """Iteration latency of one trial on g GPUs: mean `iteration_s[i]` and sd
    `iteration_sd_s[i]` at `gpus[i]` (increasing, from 1), as checked by
    `ScalingProfileFile`; built from a file by `parse_scaling_profile`."""

    model: str
    instance_type: str
    gpus: tuple[int, ...]
    iteration_s: tuple[float, ...]
    iteration_sd_s: tuple[float, ...]
    startup_s: float = 0.0
    batch: int | None = None
    source: str = ""
    provenance: dict[str, Any] = field(default_factory=dict, compare=False)  # the file's record ({}: none)
    # the interpolation tables of `iteration`, built once (it runs for every simulated trial)
    _gpus: np.ndarray = field(init=False, repr=False, compare=False)
    _rates: np.ndarray = field(init=False, repr=False, compare=False)
    _sds: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_gpus", np.asarray(self.gpus, float))
        object.__setattr__(self, "_rates", 1.0 / np.asarray(self.iteration_s, float))
        object.__setattr__(self, "_sds", np.asarray(self.iteration_sd_s, float))

    @classmethod
    def from_file(cls, file: ScalingProfileFile, source: str = "") -> "ScalingProfile":
        return cls(
            model=file.model, instance_type=file.instance_type,
            gpus=tuple(p.gpus for p in file.points),
            iteration_s=tuple(p.iteration_s for p in file.points),
            iteration_sd_s=tuple(p.iteration_sd_s for p in file.points),
            startup_s=file.startup_s, batch=file.batch, source=source,
            provenance=file.provenance.model_dump(exclude_none=True) if file.provenance is not None else {},
        )

    @property
    def max_gpus(self) -> int:
        return self.gpus[-1]

    def iteration(self, gpus: int) -> tuple[float, float]:
        """(mean, sd) of one iteration of a trial on `gpus` GPUs."""
        if gpus < 1 or gpus > self.max_gpus:
            raise ProblemError(f"{gpus} GPUs per trial is outside the profile of {self.model} "
                               f"(1..{self.max_gpus})")
        return 1.0 / float(np.interp(gpus, self._gpus, self._rates)), float(np.interp(gpus, self._gpus, self._sds))

    def scaled(self, base_iteration_s: float | None = None, sd_s: float | None = None) -> "ScalingProfile":
        """The same curve with 1-GPU latency `base_iteration_s` (every point scaled
        alike) and, if given, the same absolute sd `sd_s` at every point (RubberBand
        6.1.1 samples per-iteration latency from N(mu, sigma))."""
        t = np.asarray(self.iteration_s)
        sd = np.asarray(self.iteration_sd_s)
        if base_iteration_s is not None:
            f = base_iteration_s / t[0]
            t, sd = t * f, sd * f
        if sd_s is not None:
            sd = np.full_like(t, sd_s)
        return replace(self, iteration_s=tuple(map(float, t)), iteration_sd_s=tuple(map(float, sd)))


def available_scaling_profiles() -> list[str]:
    return sorted(p.stem for p in SCALING_DIR.glob("*.json"))


def parse_scaling_profile(data: Any, source: str) -> ScalingProfile:
    """Check scaling profile data (parsed JSON) against `ScalingProfileFile`;
    an error names the JSON path of the bad field."""
    return ScalingProfile.from_file(validate_model(ScalingProfileFile, data, source=source), source)


@lru_cache(maxsize=32)
def _load(path: str) -> ScalingProfile:
    return parse_scaling_profile(read_json(path), path)


def load_scaling_profile(model: str, instance_type: str) -> ScalingProfile:
    """The shipped profile of `model` on `instance_type`, or a profile file path."""
    if model.endswith(".json"):
        return _load(model)
    path = SCALING_DIR / f"{model}__{instance_type}.json"
    if not path.exists():
        names = available_scaling_profiles()
        close = closest_names(f"{model}__{instance_type}", names)
        raise ProblemError(f"no scaling profile for model '{model}' on {instance_type}; shipped: "
                           f"{', '.join(names)}" + (f" (closest: {', '.join(close)})" if close else ""),
                           path="model")
    return _load(str(path))


@dataclass(frozen=True)
class CloudProfile:
    """RubberBand 4.1 cloud variables for one instance type (prices in USD)."""

    instance_type: str
    gpus_per_instance: int
    usd_per_hour: float
    billing: str = "per_instance"       # or "per_function"
    min_billed_s: float = 60.0          # per-instance billing minimum per instance
    scale_latency_s: float = 0.0        # provider queuing delay of one SCALE request
    scale_latency_sd_s: float = 0.0
    init_latency_s: float = 0.0         # INIT_INSTANCE: install and join the cluster
    init_latency_sd_s: float = 0.0
    data_usd_per_gb: float = 0.0        # ingress price
    dataset_gb: float = 0.0             # downloaded once by every new instance
    market: str = "on_demand"
    preemptions_per_hour: float = 0.0   # spot: preemption rate per instance-hour
    recovery_s: float = 0.0             # extra latency to resume a preempted trial (beyond SCALE+INIT)

    @property
    def usd_per_second(self) -> float:
        return self.usd_per_hour / 3600.0

    @property
    def usd_per_gpu_second(self) -> float:
        return self.usd_per_hour / 3600.0 / self.gpus_per_instance

    @property
    def data_usd_per_instance(self) -> float:
        return self.data_usd_per_gb * self.dataset_gb
