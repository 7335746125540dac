"""Compute-latency model of one model on one device (Srifty 4.1).

Srifty models latency against local batch size as linear, ``t(B) = a B + b``,
with different slopes over different batch ranges (a piecewise-linear model),
recorded separately for the forward and the backward pass, together with the
standard deviation of per-iteration latency, the largest batch that fits in
memory (``memcap``) and the batch where training turns from latency-bound to
throughput-bound (Srifty takeaway 4: the smallest useful batch, the
optimizer's ``threshold``).

What this module computes:

- `fit_piecewise_linear(x, y)`: a *continuous* piecewise-linear function whose
  breakpoints are found from the data. For every set of up to `max_breaks`
  breakpoints placed at interior data batches it solves a weighted least
  squares in the hinge basis ``1, x, max(0, x - k_1), ...`` (weights ``1/y``,
  so errors count relatively: latencies span orders of magnitude), and keeps
  the set with the lowest Bayesian information criterion (a breakpoint costs
  two parameters: its place and its slope change).
- `ComputeModel`: forward and backward fits, the coefficient of variation of
  each as a function of log2(batch) (interpolated between profiled batches),
  ``max_batch``, ``step_s`` (per-iteration constant), the per-layer gradient
  sizes and ready fractions, and the threshold batch: the smallest batch whose
  throughput ``B / t(B)`` reaches `threshold_fraction` (default one half) of the
  best throughput up to ``max_batch``. For a single segment ``t = a B + b`` that
  is exactly ``B = b / a``, where the per-sample cost equals the fixed cost:
  the latency-to-throughput transition.

Saved as JSON (``thrifty.compute_model/1``, schema `ComputeModelFile`) with
the fitted segments, so a model can be loaded without refitting;
`load_compute_model` also accepts a profile file and fits it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from thrifty.core.io import memo_by_file, read_json, write_json
from thrifty.core.validation import FieldPathError, FileSchema, validate_model
from thrifty.perfmodels.profile import (
    ComputeProfile,
    LayerGrad,
    NonNegativeSeconds,
    PositiveSeconds,
    Provenance,
    parse_profile,
)

__all__ = [
    "PiecewiseLinear",
    "fit_piecewise_linear",
    "ComputeModel",
    "load_compute_model",
    "PiecewiseLinearFile",
    "ComputeModelFile",
    "MODEL_FORMAT",
]

MODEL_FORMAT = "thrifty.compute_model/1"

Finite = Annotated[float, Field(allow_inf_nan=False)]
PositiveFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFinite = Annotated[float, Field(ge=0, allow_inf_nan=False)]


def _increasing(values: list[float], loc: tuple[Any, ...]) -> None:
    for i in range(1, len(values)):
        if values[i] <= values[i - 1]:
            raise FieldPathError((*loc, i), f"is {values[i]:g}, but must be larger than the one before "
                                            f"({values[i - 1]:g})")


def _same_length(values: list[Any], loc: tuple[Any, ...], like: str, n: int) -> None:
    if len(values) != n:
        raise FieldPathError(loc, f"has {len(values)} entries, but must have one per entry of {like} ({n})")


# -- the file format ------------------------------------------------------------


class PiecewiseLinearFile(FileSchema):
    """A fitted `PiecewiseLinear` as saved: knots increasing, one slope change each."""

    intercept: Finite
    slope: Finite
    knots: list[Finite] = []
    slope_changes: list[Finite] = []

    @model_validator(mode="after")
    def _one_change_per_knot(self) -> "PiecewiseLinearFile":
        _increasing(self.knots, ("knots",))
        _same_length(self.slope_changes, ("slope_changes",), "knots", len(self.knots))
        return self


class CvTable(FileSchema):
    """Coefficient of variation (sd / mean) of each pass at the profiled batches."""

    batches: Annotated[list[PositiveFinite], Field(min_length=1)]
    forward: list[NonNegativeFinite]
    backward: list[NonNegativeFinite]

    @model_validator(mode="after")
    def _one_per_batch(self) -> "CvTable":
        _increasing(self.batches, ("batches",))
        for name in ("forward", "backward"):
            _same_length(getattr(self, name), (name,), "cv.batches", len(self.batches))
        return self


class ProfiledTable(FileSchema):
    """Mean measured latency of each pass at the profiled batches (``cv.batches``)."""

    forward_s: list[PositiveSeconds]
    backward_s: list[PositiveSeconds]


class ColocatedModelFile(FileSchema):
    """The model measured with `workers` processes sharing `host_cores` cores (0: unknown)."""

    workers: Annotated[int, Field(ge=2)]
    host_cores: Annotated[int, Field(ge=0)] | None = 0
    model: "ComputeModelFile"


class ComputeModelFile(FileSchema):
    """A fitted compute model file (format ``thrifty.compute_model/1``)."""

    format: Literal["thrifty.compute_model/1"]
    model: Annotated[str, Field(min_length=1)]
    device: Annotated[str, Field(min_length=1)]
    forward: PiecewiseLinearFile
    backward: PiecewiseLinearFile
    cv: CvTable
    profiled: ProfiledTable
    max_batch: Annotated[int, Field(gt=0)]
    step_s: NonNegativeSeconds
    threshold_fraction: Annotated[float, Field(gt=0, le=1)] = 0.5
    threshold_batch: Annotated[int, Field(gt=0)] | None = None  # for readers; recomputed on load
    layers: Annotated[list[LayerGrad], Field(min_length=1)]
    provenance: Provenance
    buffer_bytes: Annotated[int, Field(ge=0)] = 0
    ddp_overhead_s: NonNegativeSeconds = 0.0
    colocated: ColocatedModelFile | None = None

    @model_validator(mode="after")
    def _profiled_at_the_cv_batches(self) -> "ComputeModelFile":
        for name in ("forward_s", "backward_s"):
            _same_length(getattr(self.profiled, name), ("profiled", name), "cv.batches", len(self.cv.batches))
        return self


ColocatedModelFile.model_rebuild()  # its `model` is a ComputeModelFile, defined after it


@dataclass(frozen=True)
class PiecewiseLinear:
    """A continuous piecewise-linear function ``f(x) = b + a x + sum_j c_j max(0, x - k_j)``.

    Beyond the data it extends its first and last segments.
    """

    intercept: float
    slope: float
    knots: tuple[float, ...] = ()
    slope_changes: tuple[float, ...] = ()

    def __call__(self, x: np.ndarray | float) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        y = self.intercept + self.slope * x
        for k, c in zip(self.knots, self.slope_changes):
            y = y + c * np.maximum(0.0, x - k)
        return y

    @property
    def segments(self) -> list[tuple[float, float, float, float]]:
        """``(start, end, slope, intercept)`` of each segment (end of the last is inf)."""
        out = []
        edges = [-math.inf, *self.knots, math.inf]
        slope, intercept = self.slope, self.intercept
        for j in range(len(edges) - 1):
            if j > 0:
                c, k = self.slope_changes[j - 1], self.knots[j - 1]
                slope, intercept = slope + c, intercept - c * k
            out.append((edges[j], edges[j + 1], slope, intercept))
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "intercept": self.intercept,
            "slope": self.slope,
            "knots": list(self.knots),
            "slope_changes": list(self.slope_changes),
        }

    @classmethod
    def from_file(cls, file: PiecewiseLinearFile) -> "PiecewiseLinear":
        return cls(file.intercept, file.slope, tuple(file.knots), tuple(file.slope_changes))

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str | None = None) -> "PiecewiseLinear":
        return cls.from_file(validate_model(PiecewiseLinearFile, data, source=source))


def _hinge_design(x: np.ndarray, knots: tuple[float, ...]) -> np.ndarray:
    cols = [np.ones_like(x), x] + [np.maximum(0.0, x - k) for k in knots]
    return np.column_stack(cols)


def fit_piecewise_linear(
    x: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None, max_breaks: int = 3
) -> PiecewiseLinear:
    """Fit a continuous piecewise-linear function with breakpoints found from the data.

    `x` need not be unique (repeats are fine); candidate breakpoints are the
    distinct interior x values, each segment spanning at least two distinct x.
    Relative least squares (residual / y) unless `weights` are given; the
    number of breakpoints is chosen by BIC.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or len(x) < 2:
        raise ValueError("x and y must be 1-d arrays of equal length >= 2")
    w = (1.0 / np.abs(y)) if weights is None else np.asarray(weights, dtype=float)
    ordered = np.sort(x)
    distinct = ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]  # np.unique, without numpy.ma
    candidates = distinct[1:-1]
    n = len(x)
    best: tuple[float, PiecewiseLinear] | None = None
    for n_breaks in range(0, max_breaks + 1):
        if n_breaks > len(candidates) or len(distinct) < 2 * n_breaks + 2:
            break
        for knots in itertools.combinations(candidates, n_breaks):
            if not _segments_have_points(distinct, knots):
                continue
            design = _hinge_design(x, knots)
            coef, *_ = np.linalg.lstsq(design * w[:, None], y * w, rcond=None)
            rss = float(np.sum(((design @ coef - y) * w) ** 2))
            params = 2 + 2 * n_breaks
            bic = n * math.log(max(rss / n, 1e-300)) + params * math.log(n)
            if best is None or bic < best[0] - 1e-9:
                best = (
                    bic,
                    PiecewiseLinear(
                        float(coef[0]), float(coef[1]), tuple(float(k) for k in knots),
                        tuple(float(c) for c in coef[2:]),
                    ),
                )
    assert best is not None  # n >= 2 distinct points always admits one segment
    return best[1]


def _segments_have_points(distinct: np.ndarray, knots: tuple[float, ...]) -> bool:
    """Every segment between consecutive knots (knots included) spans two distinct x."""
    edges = [distinct[0], *knots, distinct[-1]]
    for lo, hi in zip(edges, edges[1:]):
        if np.count_nonzero((distinct >= lo) & (distinct <= hi)) < 2:
            return False
    return True


@dataclass(frozen=True)
class ComputeModel:
    """Fitted compute latency of `model` on `device` (Srifty 4.1)."""

    model: str
    device: str
    forward: PiecewiseLinear
    backward: PiecewiseLinear
    cv_batches: tuple[float, ...]  # profiled batches, ascending
    cv_forward: tuple[float, ...]  # sd / mean at those batches
    cv_backward: tuple[float, ...]
    profiled_forward_s: tuple[float, ...]  # mean measured latency at cv_batches
    profiled_backward_s: tuple[float, ...]
    max_batch: int
    step_s: float
    layer_names: tuple[str, ...]
    grad_bytes: tuple[int, ...]
    ready_frac: tuple[float, ...]
    provenance: dict[str, Any] = field(default_factory=dict)
    threshold_fraction: float = 0.5
    min_latency_s: float = 1e-6
    buffer_bytes: int = 0
    ddp_overhead_s: float = 0.0
    # the same model measured with `colocated_workers` processes sharing the host's cores
    colocated: "ComputeModel | None" = None
    colocated_workers: int = 0
    host_cores: int = 0  # the host's logical CPUs where the co-located points were measured (0: unknown)
    # `threshold_within`'s answers: a solve asks it of every machine choice of each space it derives
    _thresholds: dict[int, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    # -- construction -------------------------------------------------------
    @classmethod
    def from_profile(cls, profile: ComputeProfile, threshold_fraction: float = 0.5) -> "ComputeModel":
        colocated = None
        if profile.colocated is not None:
            shared = profile.model_copy(update={
                "points": profile.colocated.points, "step_s": profile.colocated.step_s, "colocated": None})
            colocated = cls.from_profile(shared, threshold_fraction)
        pts = sorted(profile.points, key=lambda p: p.batch)
        xb = np.array([p.batch for p in pts], dtype=float)
        fw = np.array([p.forward_s for p in pts])
        bw = np.array([p.backward_s for p in pts])
        batches = sorted({p.batch for p in pts})
        cv_f, cv_b, mean_f, mean_b = [], [], [], []
        for b in batches:
            same = [p for p in pts if p.batch == b]
            cv_f.append(float(np.mean([p.forward_sd_s / p.forward_s for p in same])))
            cv_b.append(float(np.mean([p.backward_sd_s / p.backward_s for p in same])))
            mean_f.append(float(np.mean([p.forward_s for p in same])))
            mean_b.append(float(np.mean([p.backward_s for p in same])))
        layers = sorted(profile.layers, key=lambda layer: layer.ready_frac)
        return cls(
            model=profile.model,
            device=profile.device,
            forward=fit_piecewise_linear(xb, fw),
            backward=fit_piecewise_linear(xb, bw),
            cv_batches=tuple(float(b) for b in batches),
            cv_forward=tuple(cv_f),
            cv_backward=tuple(cv_b),
            profiled_forward_s=tuple(mean_f),
            profiled_backward_s=tuple(mean_b),
            max_batch=profile.max_batch,
            step_s=profile.step_s,
            layer_names=tuple(layer.name for layer in layers),
            grad_bytes=tuple(layer.grad_bytes for layer in layers),
            ready_frac=tuple(layer.ready_frac for layer in layers),
            provenance=profile.provenance.model_dump(exclude_none=True),
            threshold_fraction=threshold_fraction,
            buffer_bytes=profile.buffer_bytes,
            ddp_overhead_s=profile.ddp_overhead_s,
            colocated=colocated,
            colocated_workers=profile.colocated.workers if profile.colocated is not None else 0,
            host_cores=(profile.colocated.host_cores or 0) if profile.colocated is not None else 0,
        )

    # -- predictions --------------------------------------------------------
    def forward_s(self, batch: np.ndarray | float) -> np.ndarray:
        return np.maximum(self.forward(batch), self.min_latency_s)

    def backward_s(self, batch: np.ndarray | float) -> np.ndarray:
        return np.maximum(self.backward(batch), self.min_latency_s)

    def _cv(self, table: tuple[float, ...], batch: np.ndarray | float) -> np.ndarray:
        return np.interp(np.log2(np.maximum(np.asarray(batch, dtype=float), 1.0)),
                         np.log2(self.cv_batches), table)

    def forward_sd_s(self, batch: np.ndarray | float) -> np.ndarray:
        return self._cv(self.cv_forward, batch) * self.forward_s(batch)

    def backward_sd_s(self, batch: np.ndarray | float) -> np.ndarray:
        return self._cv(self.cv_backward, batch) * self.backward_s(batch)

    def compute_s(self, batch: np.ndarray | float) -> np.ndarray:
        """Mean forward + backward latency (no step, no communication)."""
        return self.forward_s(batch) + self.backward_s(batch)

    @property
    def total_grad_bytes(self) -> int:
        return int(sum(self.grad_bytes))

    @property
    def threshold_batch(self) -> int:
        """Smallest batch reaching `threshold_fraction` of the best throughput (takeaway 4)."""
        return self.threshold_within(self.max_batch)

    def threshold_within(self, largest: int) -> int:
        """Smallest batch reaching `threshold_fraction` of the best throughput over
        batches ``1..largest`` (a problem whose global batch is small relative to the
        memory cap cannot use the cap's throughput, so its useful range ends earlier)."""
        largest = max(1, min(int(largest), self.max_batch))
        known = self._thresholds.get(largest)
        if known is None:
            known = self._thresholds[largest] = self._threshold_within(largest)
        return known

    def _threshold_within(self, largest: int) -> int:
        grid = np.unique(np.concatenate([
            np.arange(1, min(largest, 4096) + 1, dtype=float),
            np.geomspace(1, largest, 256).round(),
            [float(largest)],
        ]))
        throughput = grid / (self.compute_s(grid) + self.step_s)
        ok = throughput >= self.threshold_fraction * throughput.max()
        return int(grid[np.argmax(ok)])

    # -- persistence --------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The saved form, checked against `ComputeModelFile` (a model that would not load is not saved)."""
        data = {
            "format": MODEL_FORMAT,
            "model": self.model,
            "device": self.device,
            "forward": self.forward.to_json(),
            "backward": self.backward.to_json(),
            "cv": {"batches": list(self.cv_batches), "forward": list(self.cv_forward),
                   "backward": list(self.cv_backward)},
            "profiled": {"forward_s": list(self.profiled_forward_s),
                         "backward_s": list(self.profiled_backward_s)},
            "max_batch": self.max_batch,
            "step_s": self.step_s,
            "threshold_fraction": self.threshold_fraction,
            "threshold_batch": self.threshold_batch,
            "layers": [{"name": n, "grad_bytes": g, "ready_frac": r}
                       for n, g, r in zip(self.layer_names, self.grad_bytes, self.ready_frac)],
            "provenance": self.provenance,
            "buffer_bytes": self.buffer_bytes,
            "ddp_overhead_s": self.ddp_overhead_s,
            "colocated": (None if self.colocated is None else
                          {"workers": self.colocated_workers, "host_cores": self.host_cores,
                           "model": self.colocated.to_json()}),
        }
        return validate_model(ComputeModelFile, data, source=f"the compute model of {self.model} on {self.device}",
                              strict=False).to_json()  # built here, not read

    def save(self, path: str | Path) -> None:
        write_json(path, self.to_json())

    @classmethod
    def from_file(cls, file: ComputeModelFile) -> "ComputeModel":
        colocated = file.colocated
        return cls(
            model=file.model,
            device=file.device,
            forward=PiecewiseLinear.from_file(file.forward),
            backward=PiecewiseLinear.from_file(file.backward),
            cv_batches=tuple(file.cv.batches),
            cv_forward=tuple(file.cv.forward),
            cv_backward=tuple(file.cv.backward),
            profiled_forward_s=tuple(file.profiled.forward_s),
            profiled_backward_s=tuple(file.profiled.backward_s),
            max_batch=file.max_batch,
            step_s=file.step_s,
            layer_names=tuple(layer.name for layer in file.layers),
            grad_bytes=tuple(layer.grad_bytes for layer in file.layers),
            ready_frac=tuple(layer.ready_frac for layer in file.layers),
            provenance=file.provenance.model_dump(exclude_none=True),
            threshold_fraction=file.threshold_fraction,
            buffer_bytes=file.buffer_bytes,
            ddp_overhead_s=file.ddp_overhead_s,
            colocated=None if colocated is None else cls.from_file(colocated.model),
            colocated_workers=0 if colocated is None else colocated.workers,
            host_cores=0 if colocated is None else colocated.host_cores or 0,
        )

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str | None = None) -> "ComputeModel":
        """A saved model (parsed JSON), checked against `ComputeModelFile`; errors name the JSON path."""
        return cls.from_file(validate_model(ComputeModelFile, data, source=source))


def load_compute_model(path: str | Path, threshold_fraction: float = 0.5) -> ComputeModel:
    """Load a fitted compute model, or a compute profile (fitted on load),
    read and fitted once while the file is unchanged (`memo_by_file`)."""
    def build() -> ComputeModel:
        data = read_json(path)
        if isinstance(data, dict) and data.get("format") == MODEL_FORMAT:
            return ComputeModel.from_json(data, source=str(path))
        return ComputeModel.from_profile(parse_profile(data, source=str(path)), threshold_fraction)

    return memo_by_file("compute model", path, build, threshold_fraction)
