"""Scaling and cloud profiles of a tuning job (RubberBand 4.1, "Modeling Variables").

`ScalingProfile`: the latency of one training iteration of one trial as a
function of the GPUs it gets, at a fixed batch (strong scaling), profiled at
powers of two and interpolated between them, with a standard deviation (the
source of stragglers), plus the trial's start-up latency (loading a
checkpoint, connecting workers). Between profiled points we interpolate the
*throughput* (1 / latency) linearly in the GPU count, and the sd linearly;
beyond the largest point the profile is not extrapolated (that allocation is
not offered). Files: ``datasets/profiles/scaling/<model>__<instance type>.json``
(format ``thrifty.scaling_profile/1``), derived by
``datasets/scripts/derive_scaling_profiles.py``.

`CloudProfile`: the instance type (GPUs per instance, price per hour), the
billing model (``per_instance``: per second with a 60 s minimum;
``per_function``: only the busy GPU-seconds of TRAIN tasks), the provider's
scale (queuing) latency, the instance initialization latency, the data
ingress price per GB and the dataset size each new instance downloads, and
(beyond RubberBand) the spot market with a preemption rate per instance-hour.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from thrifty.datasets.errors import ProblemError, closest_names
from thrifty.datasets.io import read_json

__all__ = ["ScalingProfile", "CloudProfile", "load_scaling_profile", "available_scaling_profiles",
           "SCALING_DIR", "SCALING_FORMAT"]

SCALING_FORMAT = "thrifty.scaling_profile/1"
SCALING_DIR = Path(__file__).resolve().parent.parent / "datasets" / "profiles" / "scaling"


@dataclass(frozen=True)
class ScalingProfile:
    """Iteration latency of one trial on g GPUs: mean `iteration_s[i]` and sd
    `iteration_sd_s[i]` at `gpus[i]` (increasing powers of two, from 1)."""

    model: str
    instance_type: str
    gpus: tuple[int, ...]
    iteration_s: tuple[float, ...]
    iteration_sd_s: tuple[float, ...]
    startup_s: float = 0.0
    batch: int | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if not self.gpus or self.gpus[0] != 1:
            raise ProblemError("must start at 1 GPU", path="points[0].gpus", source=self.source or None)
        for i, (g, t, sd) in enumerate(zip(self.gpus, self.iteration_s, self.iteration_sd_s)):
            if i and g <= self.gpus[i - 1]:
                raise ProblemError("GPU counts must increase", path=f"points[{i}].gpus", source=self.source or None)
            if not t > 0:
                raise ProblemError(f"is {t}, but must be positive", path=f"points[{i}].iteration_s",
                                   source=self.source or None)
            if sd < 0:
                raise ProblemError(f"is {sd}, but must be >= 0", path=f"points[{i}].iteration_sd_s",
                                   source=self.source or None)

    @property
    def max_gpus(self) -> int:
        return self.gpus[-1]

    def iteration(self, gpus: int) -> tuple[float, float]:
        """(mean, sd) of one iteration of a trial on `gpus` GPUs."""
        if gpus < 1 or gpus > self.max_gpus:
            raise ProblemError(f"{gpus} GPUs per trial is outside the profile of {self.model} "
                               f"(1..{self.max_gpus})")
        xs = np.asarray(self.gpus, float)
        rate = float(np.interp(gpus, xs, 1.0 / np.asarray(self.iteration_s)))
        sd = float(np.interp(gpus, xs, np.asarray(self.iteration_sd_s)))
        return 1.0 / rate, sd

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
    if not isinstance(data, dict) or data.get("format") != SCALING_FORMAT:
        raise ProblemError(f"is not a scaling profile (format must be {SCALING_FORMAT!r})", source=source)
    try:
        points = data["points"]
        return ScalingProfile(
            model=str(data["model"]), instance_type=str(data["instance_type"]),
            gpus=tuple(int(p["gpus"]) for p in points),
            iteration_s=tuple(float(p["iteration_s"]) for p in points),
            iteration_sd_s=tuple(float(p.get("iteration_sd_s", 0.0)) for p in points),
            startup_s=float(data.get("startup_s", 0.0)), batch=data.get("batch"), source=source,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ProblemError(f"is malformed: {e!r}", source=source) from None


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
