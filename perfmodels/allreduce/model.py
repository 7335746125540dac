"""The learned allreduce model (Srifty 4.2): its features, its two
submodels, its predictions and its saved form (``thrifty.allreduce_model/1``).
The package docstring (`thrifty.perfmodels.allreduce`) describes the model;
`fitting` trains one, `table` reads the probe rows it is trained on.

The saved form is one JSON file, schema `AllreduceModelFile` (``thrifty
schema allreduce-model`` prints it)::

    {"format": "thrifty.allreduce_model/1", "mtu_bytes": 9001,
     "min_bus_bandwidth_bytes_per_s": 1000.0,
     "features": {"columns": [...], "numeric": [...], "devices": ["cpu"], "instance_types": ["local"]},
     "instance_types": {"local": {"device": "cpu", "world_sizes": [2, 3, 4], "buffer_bytes": [4, 8, ...], ...}},
     "caps": [{"instance_type": "local", "world_size": 2, "instances": 2, "b_cap_bytes_per_s": 2.06e9}, ...],
     "training": {"rows": 6000, "seed": 0, ...}, "provenance": {"kind": "derived", "script": "...", ...},
     "submodels": {"small": {"regime": "buffer_bytes <= 9001", "target": {"form": "log_time", ...},
                             "report": {..., "hyperparams": {...}}, "booster": {xgboost's JSON model}},
                   "large": {...}}}

The schema covers all of it but the boosters' insides (`TreeEnsemble` reads
those, and says what is wrong with one): every field's type and range, the feature
columns this thrifty encodes (``features.numeric``), probed buffer sizes and
world sizes increasing, every probed type and its device a feature column,
every cap of a probed type. ``training`` and ``provenance`` are records for
readers and may be left out, as may ``features.columns`` and
``min_bus_bandwidth_bytes_per_s``; ``mtu_bytes`` defaults to 9001. Loading
also checks that each booster reads as many features as the model has
columns. Predictions evaluate the boosters' trees in numpy
(`thrifty.perfmodels.allreduce.trees`), exactly as xgboost does, so loading
and querying a model never imports xgboost; only fitting one does. An error names the JSON path of the
bad field (``instance_types.local.buffer_bytes[3]``). The schema checks the
file; `LearnedAllreduce` is the checked model in the form the simulators and
the solver query: plain dataclasses and numpy, no pydantic on the prediction
path. `LearnedAllreduce.to_json` checks what it writes, so a model that would
not load is not saved.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, get_args

import numpy as np
from pydantic import AfterValidator, Field, model_validator

from thrifty.datasets.catalog import HOST_WORKER_TYPE, InstanceType
from thrifty.core.errors import ProblemError
from thrifty.core.io import atomic_write_text, read_json
from thrifty.core.optional import require
from thrifty.core.validation import FieldPathError, FileSchema, validate_model
from thrifty.perfmodels.allreduce.table import ProbeTable
from thrifty.perfmodels.allreduce.trees import TreeEnsemble, TreeModelError
from thrifty.perfmodels.bandwidth import MTU_BYTES, AnalyticAllreduce, BandwidthModel
from thrifty.perfmodels.provenance import FigureSource, display_path

__all__ = [
    "MODEL_FORMAT",
    "MIN_BUS_BANDWIDTH",
    "NUMERIC_FEATURES",
    "SUBMODELS",
    "TARGETS",
    "FeatureEncoding",
    "Hyperparams",
    "SubmodelReport",
    "TypeCoverage",
    "LearnedAllreduce",
    "load_allreduce_model",
    "AllreduceModelFile",
    "AllreduceProvenance",
    "FeaturesFile",
    "TypeCoverageFile",
    "CapFile",
    "TrainingFile",
    "ProbeInput",
    "SubmodelFile",
    "SubmodelsFile",
    "TargetFile",
    "SubmodelReportFile",
    "HyperparamsFile",
]

MODEL_FORMAT = "thrifty.allreduce_model/1"
MIN_BUS_BANDWIDTH = 1e3  # bytes/s: no prediction goes below this floor


NUMERIC_FEATURES: tuple[str, ...] = (
    "log2_buffer_bytes",
    "world_size",
    "instances",
    "gpus_per_instance",
    "concurrent",
    "rated_network_gbps",
)

SUBMODELS: tuple[str, ...] = ("small", "large")


# -- features --------------------------------------------------------------------


@dataclass(frozen=True)
class FeatureEncoding:
    """Column layout: `NUMERIC_FEATURES`, then one column per device, then
    one per instance type (one-hot, in the listed order)."""

    devices: tuple[str, ...]
    instance_types: tuple[str, ...]

    @property
    def names(self) -> list[str]:
        return (
            list(NUMERIC_FEATURES)
            + [f"device={d}" for d in self.devices]
            + [f"instance_type={t}" for t in self.instance_types]
        )

    def encode(
        self,
        buffer_bytes: np.ndarray,
        world_size: np.ndarray,
        instances: np.ndarray,
        gpus_per_instance: np.ndarray,
        concurrent: np.ndarray,
        rated_network_gbps: np.ndarray,
        device: np.ndarray,
        instance_type: np.ndarray,
    ) -> np.ndarray:
        n = len(buffer_bytes)
        X = np.zeros((n, len(NUMERIC_FEATURES) + len(self.devices) + len(self.instance_types)))
        X[:, 0] = np.log2(np.asarray(buffer_bytes, dtype=float))
        for j, col in enumerate((world_size, instances, gpus_per_instance, concurrent, rated_network_gbps), 1):
            X[:, j] = np.asarray(col, dtype=float)
        base = len(NUMERIC_FEATURES)
        for j, d in enumerate(self.devices):
            X[:, base + j] = np.asarray(device) == d
        base += len(self.devices)
        for j, t in enumerate(self.instance_types):
            X[:, base + j] = np.asarray(instance_type) == t
        return X

    def encode_table(self, table: ProbeTable) -> np.ndarray:
        return self.encode(
            table.buffer_bytes,
            table.world_size,
            table.instances,
            table.gpus_per_instance,
            table.concurrent,
            table.rated_network_gbps,
            table.device,
            table.instance_type,
        )


# -- hyperparameters and submodels -----------------------------------------------


Target = Literal["busbw", "log_busbw", "log_time"]
TARGETS: tuple[str, ...] = get_args(Target)


@dataclass(frozen=True)
class Hyperparams:
    """One point of the selection grid. `target` is what the booster fits:

    - ``"busbw"``: busbw divided by its training median;
    - ``"log_busbw"``: log(busbw), centered;
    - ``"log_time"``: log of the time ``t = 2 s (n - 1) / (n busbw)`` that the
      busbw stands for, centered. Trees are piecewise constant in log2(s):
      below the MTU the time barely moves with ``s`` while busbw grows in
      proportion to it, so this form interpolates between probed sizes far
      better there; above, busbw flattens and ``log_busbw`` wins.

    Every form is converted back to busbw; selection compares them by MAPE
    on busbw. `relative_weights` reweighs training rows (times their decay
    weight) so that each loss leans towards the MAPE (see
    `_relative_weights`): among repeats of one configuration, the slower
    ones count more, as MAPE counts them; on noisy probes this predicts a
    slower (more conservative) bandwidth than the median. Only
    `MAPE_WEIGHTED_GRID` tries it.
    """

    max_depth: int
    n_estimators: int
    learning_rate: float
    objective: str  # "reg:squarederror" | "reg:pseudohubererror" | ...
    target: str  # one of TARGETS
    relative_weights: bool = False

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ProblemError(f"target is '{self.target}', but must be one of {', '.join(TARGETS)}")


@dataclass(frozen=True)
class SubmodelReport:
    """How one submodel was chosen and how well it predicts held-out rows.
    MAPEs are fractions (0.1 = 10%)."""

    name: str
    regime: str
    rows: int
    groups: int
    train_rows: int
    test_rows: int
    folds: int
    hyperparams: Hyperparams
    cv_mape: float
    heldout_mape: float
    heldout_median_mape: float  # the same predictions against each held-out cell's median
    noise_floor_mape: float
    candidates: int


class _Trees(Protocol):
    """What a submodel predicts with: a `TreeEnsemble` (a loaded or fitted model), or, while fitting,
    an adapter of the xgboost booster being scored."""

    def predict(self, X: np.ndarray) -> np.ndarray: ...


@dataclass
class _Submodel:
    """One booster's trees and how their raw output maps back to bytes/s:
    ``busbw = raw * scale`` (target ``busbw``), ``exp(raw + offset)``
    (``log_busbw``) or ``2 s (n-1) / (n exp(raw + offset))`` (``log_time``)."""

    trees: _Trees
    target: str
    offset: float
    scale: float

    def predict(self, X: np.ndarray) -> np.ndarray:
        if len(X) == 0:
            return np.zeros(0)
        raw = np.asarray(self.trees.predict(X), dtype=float)
        return np.maximum(_from_target(self.target, raw, X, self.offset, self.scale), MIN_BUS_BANDWIDTH)


def _bytes_and_world(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.exp2(X[:, 0]), X[:, 1]  # columns: NUMERIC_FEATURES order


def _to_target(target: str, busbw: np.ndarray, X: np.ndarray) -> np.ndarray:
    if target == "busbw":
        return busbw
    if target == "log_busbw":
        return np.log(busbw)
    size, n = _bytes_and_world(X)
    return np.log(2.0 * size * (n - 1) / (n * busbw))


def _from_target(target: str, raw: np.ndarray, X: np.ndarray, offset: float, scale: float) -> np.ndarray:
    if target == "busbw":
        return raw * scale
    if target == "log_busbw":
        return np.exp(raw + offset)
    size, n = _bytes_and_world(X)
    return 2.0 * size * (n - 1) / (n * np.exp(raw + offset))


def _import_xgboost() -> Any:
    return require("xgboost", "all")


# -- the model -------------------------------------------------------------------


@dataclass(frozen=True)
class TypeCoverage:
    """What the training data says about one instance type. Queries for the
    type use its `device`, `gpus_per_instance` and `rated_network_gbps` as
    recorded by its newest probe."""

    name: str
    device: str
    gpus_per_instance: int
    rated_network_gbps: float
    world_sizes: tuple[int, ...]
    max_concurrent: int
    buffer_bytes: tuple[int, ...]
    rows: int
    first_probe: str
    last_probe: str


class LearnedAllreduce:
    """Bus-bandwidth model learned from probes (a `BandwidthModel`).

    Build one with `thrifty.perfmodels.allreduce.fitting.fit_allreduce(rows)`
    (fitting imports this module, never the other way) or `LearnedAllreduce.load(path)`.
    `fit_report` holds a `SubmodelReport` per submodel and `heldout_mape`
    the held-out MAPE of each.
    """

    def __init__(
        self,
        submodels: Mapping[str, _Submodel],
        encoding: FeatureEncoding,
        coverage: Mapping[str, TypeCoverage],
        caps: Mapping[tuple[str, int, int], float],
        fit_report: Mapping[str, SubmodelReport],
        training: Mapping[str, Any],
        provenance: Mapping[str, Any],
        fallback: BandwidthModel | None = None,
        mtu_bytes: int = MTU_BYTES,
    ):
        self._submodels = dict(submodels)
        self.encoding = encoding
        self.coverage = dict(coverage)
        self._caps = dict(caps)  # probed (type, world size, instances): saved
        self._cap_cache: dict[tuple[str, int, int], float] = {}  # others: predicted on demand
        self.fit_report = dict(fit_report)
        self.training = dict(training)
        self.provenance = dict(provenance)
        self.fallback: BandwidthModel = fallback if fallback is not None else AnalyticAllreduce()
        self.mtu_bytes = mtu_bytes
        self.path: str | None = None  # the file it was loaded from (`load`), for `provenance_of`
        self.named = False  # a problem named it: a type it lacks is a fallback (`provenance_of`)
        self._size_cache: dict[tuple[str, int, int, int, float], float] = {}
        self._array_cache: dict[tuple[Any, ...], np.ndarray] = {}

    # -- BandwidthModel ---------------------------------------------------------

    def covers(self, itype: InstanceType | str) -> bool:
        """Whether the training data has probes of this type (a host-worker
        type, such as the demo's ``local-a``, is answered by the probes of
        ``local``: the same worker processes of this host)."""
        return self._probed_name(itype) in self.coverage

    def _probed_name(self, itype: InstanceType | str) -> str:
        name = _name(itype)
        if name not in self.coverage and isinstance(itype, InstanceType) and itype.host_worker:
            return HOST_WORKER_TYPE
        return name

    def source(self, itype: InstanceType | str) -> str:
        if self.covers(itype):
            return "learned"
        return self.fallback.source(itype) if isinstance(itype, InstanceType) else "analytic"  # a name: no fields

    def provenance_of(self, itype: InstanceType) -> FigureSource:
        """Measured, for a type the probes cover (the model's file, the
        probes it was fitted on); else the fallback's answer, saying that
        this model has no probes of the type (unless the model is the shipped
        one of this host and another model with a basis answers: it was
        never meant for other types)."""
        if not self.covers(itype):
            answer = self.fallback.provenance_of(itype)
            if not self.named and answer.kind != "analytic":
                return answer
            what = self.path or "the learned allreduce model"
            why = f"{what} has no probes of {itype.name} (it has {', '.join(sorted(self.coverage)) or 'none'})"
            return answer.passed_on(why, named=self.named)
        probed = self._probed_name(itype)
        c = self.coverage[probed]
        inputs = [str(i.get("path")) for i in self.provenance.get("inputs") or [] if isinstance(i, dict)]
        note = (f"fitted on {c.rows} probe cells of {probed} (world sizes {', '.join(map(str, c.world_sizes))}, "
                f"{c.first_probe} to {c.last_probe})" + (f" in {', '.join(inputs)}" if inputs else ""))
        if probed != _name(itype):
            note += f"; {_name(itype)} runs worker processes of this host, as {probed} does"
        return FigureSource(kind="measured", model="learned allreduce model", file=self.path,
                            machine=self.provenance.get("machine"), script=self.provenance.get("script"),
                            date=self.provenance.get("date"), note=note)

    @property
    def heldout_mape(self) -> dict[str, float]:
        """Held-out (test) MAPE per submodel, as fractions."""
        return {name: r.heldout_mape for name, r in self.fit_report.items()}

    def bus_bandwidth(
        self,
        itype: InstanceType,
        sizes: np.ndarray,
        world_size: int,
        instances: int,
        concurrent: int = 1,
    ) -> np.ndarray:
        """Bus bandwidth (bytes/s) of each buffer size in `sizes`, for
        `concurrent` transfers started together (1: a lone transfer)."""
        if not self.covers(itype):
            return np.asarray(self.fallback.bus_bandwidth(itype, sizes, world_size, instances), dtype=float)
        s = np.asarray(sizes, dtype=float)
        concurrent = min(int(concurrent), self.concurrency_levels(itype))
        name = self._probed_name(itype)
        key = (name, int(world_size), int(instances), concurrent, s.shape, s.tobytes())
        hit = self._array_cache.get(key)
        if hit is not None:
            return hit.copy()
        if s.size and not (np.all(np.isfinite(s)) and s.min() > 0):
            raise ProblemError("buffer sizes must be positive finite numbers of bytes")
        out = self._predict_sizes(name, s.ravel(), int(world_size), int(instances), int(concurrent))
        out = out.reshape(s.shape)
        if len(self._array_cache) > 4096:
            self._array_cache.clear()
        self._array_cache[key] = out
        return out.copy()

    def concurrency_levels(self, itype: InstanceType) -> int:
        """The most concurrent transfers probed for `itype` (1 for types the
        fallback answers): `bus_bandwidth` answers ``concurrent`` up to it,
        and beyond it as at it."""
        if not self.covers(itype):
            levels = getattr(self.fallback, "concurrency_levels", None)
            return int(levels(itype)) if levels else 1
        return int(self.coverage[self._probed_name(itype)].max_concurrent)

    def bandwidth_cap(self, itype: InstanceType, world_size: int, instances: int) -> float:
        """``b_cap``: the largest aggregate bus bandwidth of concurrent
        transfers (Srifty 4.3); see the module docstring."""
        if not self.covers(itype):
            return float(self.fallback.bandwidth_cap(itype, world_size, instances))
        key = (self._probed_name(itype), int(world_size), int(instances))
        if key in self._caps:
            return self._caps[key]
        if key not in self._cap_cache:
            self._cap_cache[key] = self._predicted_cap(*key)
        return self._cap_cache[key]

    # -- prediction -------------------------------------------------------------

    def _predict_sizes(self, name: str, sizes: np.ndarray, n: int, inst: int, c: int) -> np.ndarray:
        distinct, inverse = np.unique(sizes, return_inverse=True)
        values = np.array([self._size_cache.get((name, n, inst, c, float(x)), np.nan) for x in distinct])
        todo = np.isnan(values)
        if todo.any():
            values[todo] = self._predict_raw(name, distinct[todo], n, inst, np.full(todo.sum(), c))
            if len(self._size_cache) > 200_000:
                self._size_cache.clear()
            for x, v in zip(distinct[todo], values[todo]):
                self._size_cache[(name, n, inst, c, float(x))] = float(v)
        return values[inverse]

    def _predict_raw(
        self, name: str, sizes: np.ndarray, n: int, inst: int, concurrent: np.ndarray
    ) -> np.ndarray:
        """Uncached prediction. At a probed buffer size: the booster. Between
        two probed sizes ``lo < s < hi``: the allreduce *time* interpolated
        linearly in ``log2(s)`` between the boosters' times at ``lo`` and
        ``hi``. Trees are piecewise constant in ``log2(s)`` with their splits
        at the probed sizes, so on their own they give every size between two
        probes the time of one of them: up to 2x too fast or too slow on a
        doubling grid (a 7.4 MB DDP bucket got the 4 MB time). Outside the
        probed sizes of the type the alpha-beta limits take over: below the
        smallest, the time stays that of the smallest (latency-bound, busbw
        grows with ``s``); above the largest, busbw stays that of the largest
        (bandwidth-bound)."""
        cov = self.coverage[name]
        grid = np.asarray(cov.buffer_bytes, dtype=float)
        inside = np.clip(sizes, grid[0], grid[-1])
        hi_index = np.minimum(np.searchsorted(grid, inside), len(grid) - 1)
        hi = grid[hi_index]
        between = hi != inside
        lo = np.where(between, grid[np.maximum(hi_index - 1, 0)], hi)
        out = self._booster_bandwidth(cov, name, hi, n, inst, concurrent)
        if between.any():
            s, a, b = inside[between], lo[between], hi[between]
            b_lo = self._booster_bandwidth(cov, name, a, n, inst, concurrent[between])
            # time ~ size / busbw; interpolate log(time) in log2(size)
            w = (np.log2(s) - np.log2(a)) / (np.log2(b) - np.log2(a))
            log_t = (1.0 - w) * np.log(a / b_lo) + w * np.log(b / out[between])
            out[between] = s / np.exp(log_t)
        below = sizes < grid[0]
        out[below] = np.maximum(out[below] * sizes[below] / grid[0], MIN_BUS_BANDWIDTH)
        return out

    def _booster_bandwidth(
        self, cov: "TypeCoverage", name: str, sizes: np.ndarray, n: int, inst: int, concurrent: np.ndarray
    ) -> np.ndarray:
        """The boosters' bus bandwidth at `sizes` (probed sizes of the type)."""
        m = len(sizes)
        X = self.encoding.encode(
            sizes,
            np.full(m, n),
            np.full(m, inst),
            np.full(m, cov.gpus_per_instance),
            concurrent,
            np.full(m, cov.rated_network_gbps),
            np.full(m, cov.device, dtype=object),
            np.full(m, name, dtype=object),
        )
        out = np.empty(m)
        small = sizes <= self.mtu_bytes
        out[small] = self._submodels["small"].predict(X[small])
        out[~small] = self._submodels["large"].predict(X[~small])
        return out

    def _cap_grid(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        cov = self.coverage[name]
        sizes = np.array([s for s in cov.buffer_bytes if s > self.mtu_bytes] or list(cov.buffer_bytes), float)
        levels = np.arange(1, cov.max_concurrent + 1)
        grid_s, grid_c = np.meshgrid(sizes, levels, indexing="ij")
        return grid_s.ravel(), grid_c.ravel()

    def _predicted_cap(self, name: str, n: int, inst: int) -> float:
        sizes, levels = self._cap_grid(name)
        return float(np.max(levels * self._predict_raw(name, sizes, n, inst, levels)))

    # -- save / load ------------------------------------------------------------

    def to_file(self) -> "AllreduceModelFile":
        """The saved form (format `MODEL_FORMAT`), checked against
        `AllreduceModelFile`: a model that would not load is not saved."""
        submodels: dict[str, dict[str, Any]] = {}
        for name in SUBMODELS:
            sub, report = self._submodels[name], self.fit_report[name]
            submodels[name] = {
                "regime": report.regime,
                "target": {"form": sub.target, "offset": sub.offset, "scale": sub.scale},
                "report": asdict(report),
                "booster": _document(sub.trees),
            }
        data = {
            "format": MODEL_FORMAT,
            "mtu_bytes": self.mtu_bytes,
            "min_bus_bandwidth_bytes_per_s": MIN_BUS_BANDWIDTH,
            "features": {
                "columns": self.encoding.names,
                "numeric": list(NUMERIC_FEATURES),
                "devices": list(self.encoding.devices),
                "instance_types": list(self.encoding.instance_types),
            },
            "instance_types": {name: {k: v for k, v in asdict(c).items() if k != "name"}
                               for name, c in sorted(self.coverage.items())},
            "caps": [
                {"instance_type": t, "world_size": n, "instances": i, "b_cap_bytes_per_s": v}
                for (t, n, i), v in sorted(self._caps.items())
                if t in self.coverage
            ],
            "training": self.training,
            "provenance": self.provenance,
            "submodels": submodels,
        }
        what = f"the allreduce model of {', '.join(sorted(self.coverage)) or 'no instance type'}"
        return validate_model(AllreduceModelFile, data, source=what, strict=False)  # built here: tuples

    def to_json(self) -> dict[str, Any]:
        """The saved form as JSON data; boosters in xgboost JSON."""
        return self.to_file().to_json()

    def save(self, path: str | Path) -> None:
        """Write the model as one JSON file, atomically. Metadata is indented
        for reading; each booster is written compactly on one line."""
        data = self.to_json()
        boosters = {name: data["submodels"][name].pop("booster") for name in SUBMODELS}
        for name in SUBMODELS:
            data["submodels"][name]["booster"] = f"@@booster:{name}@@"
        text = json.dumps(data, indent=1)
        for name in SUBMODELS:
            compact = json.dumps(boosters[name], separators=(",", ":"))
            text = text.replace(f'"@@booster:{name}@@"', compact, 1)
        atomic_write_text(path, text + "\n")

    @classmethod
    def from_file(
        cls, file: "AllreduceModelFile", source: str = "allreduce model", fallback: BandwidthModel | None = None
    ) -> "LearnedAllreduce":
        """The model of a checked file: its boosters read as numpy tree ensembles (`TreeEnsemble`, which
        predicts as xgboost does, without importing it); an error names ``submodels.<name>.booster``."""
        encoding = FeatureEncoding(tuple(file.features.devices), tuple(file.features.instance_types))
        submodels: dict[str, _Submodel] = {}
        reports: dict[str, SubmodelReport] = {}
        for name in SUBMODELS:
            entry: SubmodelFile = getattr(file.submodels, name)
            try:
                trees = TreeEnsemble.from_json(entry.booster)
            except TreeModelError as e:
                raise ProblemError(f"is not an xgboost tree model thrifty can evaluate: {e}",
                                   path=f"submodels.{name}.booster", source=source) from None
            if trees.num_features != len(encoding.names):
                raise ProblemError(f"reads {trees.num_features} features, but the model's features are "
                                   f"{len(encoding.names)} columns (features.numeric, devices and instance_types)",
                                   path=f"submodels.{name}.booster", source=source)
            submodels[name] = _Submodel(trees, entry.target.form, entry.target.offset, entry.target.scale)
            reports[name] = entry.report.submodel_report()
        return cls(
            submodels,
            encoding,
            {name: c.coverage(name) for name, c in file.instance_types.items()},
            {(c.instance_type, c.world_size, c.instances): c.b_cap_bytes_per_s for c in file.caps},
            reports,
            file.training.to_json(),
            file.provenance.to_json(),
            fallback=fallback,
            mtu_bytes=file.mtu_bytes,
        )

    @classmethod
    def from_json(
        cls, data: Any, source: str = "allreduce model", fallback: BandwidthModel | None = None
    ) -> "LearnedAllreduce":
        """A saved model (parsed JSON), checked against `AllreduceModelFile`;
        an error names the JSON path of the bad field."""
        return cls.from_file(validate_model(AllreduceModelFile, data, source=source), source, fallback)

    @classmethod
    def load(cls, path: str | Path, fallback: BandwidthModel | None = None) -> "LearnedAllreduce":
        """Load a model saved by `save`."""
        model = cls.from_json(read_json(path), source=str(path), fallback=fallback)
        model.path = display_path(path)
        return model


def load_allreduce_model(path: str | Path, fallback: BandwidthModel | None = None) -> LearnedAllreduce:
    """Load a saved `LearnedAllreduce` (format `MODEL_FORMAT`)."""
    return LearnedAllreduce.load(path, fallback=fallback)


# -- helpers ---------------------------------------------------------------------


def _document(trees: _Trees) -> dict[str, Any]:
    if not isinstance(trees, TreeEnsemble):
        raise TypeError("only a fitted or loaded model (its trees a TreeEnsemble) is saved")
    return dict(trees.document)


def _name(itype: InstanceType | str) -> str:
    return itype if isinstance(itype, str) else itype.name


# -- the file format ---------------------------------------------------------------


Name = Annotated[str, Field(min_length=1)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
PositiveFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFinite = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Mape = Annotated[float, Field(ge=0, allow_inf_nan=False, description="a fraction (0.1 = 10%)")]


def _iso_time(text: str) -> str:
    try:
        datetime.fromisoformat(text)
    except ValueError:
        raise FieldPathError((), f"is {text!r}, but must be an ISO 8601 time (2025-01-31T12:00:00Z)") from None
    return text


IsoTime = Annotated[str, AfterValidator(_iso_time)]


def _increasing(values: list[int], loc: tuple[Any, ...]) -> None:
    for i in range(1, len(values)):
        if values[i] <= values[i - 1]:
            raise FieldPathError((*loc, i), f"is {values[i]}, but must be larger than the one before ({values[i - 1]})")


class FeaturesFile(FileSchema):
    """The booster's input columns: `NUMERIC_FEATURES`, then one per device,
    then one per instance type (one-hot)."""

    columns: list[str] | None = None  # for readers: the names of all columns, in order
    numeric: list[str]
    devices: list[Name]
    instance_types: list[Name]

    @model_validator(mode="after")
    def _this_thriftys_columns(self) -> "FeaturesFile":
        if self.numeric != list(NUMERIC_FEATURES):
            raise FieldPathError(("numeric",), f"is {self.numeric}, but this thrifty uses {list(NUMERIC_FEATURES)}")
        names = FeatureEncoding(tuple(self.devices), tuple(self.instance_types)).names
        if self.columns is not None and self.columns != names:
            raise FieldPathError(("columns",), f"is {self.columns}, but numeric, devices and instance_types "
                                               f"give {names}")
        return self


class TypeCoverageFile(FileSchema):
    """What the probes of one instance type cover (`TypeCoverage`)."""

    device: Name
    gpus_per_instance: Annotated[int, Field(ge=1)]
    rated_network_gbps: NonNegativeFinite
    world_sizes: Annotated[list[Annotated[int, Field(ge=2)]], Field(min_length=1, description="probed, increasing")]
    max_concurrent: Annotated[int, Field(ge=1)]
    buffer_bytes: Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1, description="probed, increasing")]
    rows: Annotated[int, Field(ge=1)]
    first_probe: IsoTime
    last_probe: IsoTime

    @model_validator(mode="after")
    def _probed_sizes_increase(self) -> "TypeCoverageFile":
        _increasing(self.world_sizes, ("world_sizes",))
        _increasing(self.buffer_bytes, ("buffer_bytes",))
        return self

    def coverage(self, name: str) -> TypeCoverage:
        return TypeCoverage(
            name=name, device=self.device, gpus_per_instance=self.gpus_per_instance,
            rated_network_gbps=self.rated_network_gbps, world_sizes=tuple(self.world_sizes),
            max_concurrent=self.max_concurrent, buffer_bytes=tuple(self.buffer_bytes), rows=self.rows,
            first_probe=self.first_probe, last_probe=self.last_probe,
        )


class CapFile(FileSchema):
    """``b_cap`` of one probed (instance type, world size, instances) (Srifty 4.3)."""

    instance_type: Name
    world_size: Annotated[int, Field(ge=2)]
    instances: Annotated[int, Field(ge=1)]
    b_cap_bytes_per_s: PositiveFinite


class TrainingFile(FileSchema):
    """How the model was trained, for readers (`fit_allreduce` writes it)."""

    rows: Annotated[int, Field(ge=1, description="probe rows read")] | None = None
    pooled: str | None = None  # how repeats were pooled (null: fitted row by row)
    training_rows: Annotated[int, Field(ge=1, description="rows the boosters were fitted on")] | None = None
    seed: int | None = None
    half_life_days: PositiveFinite | None = None
    holdout: str | None = None
    grid_size: Annotated[int, Field(ge=1)] | None = None
    xgboost: str | None = None  # the version that fitted the boosters


class ProbeInput(FileSchema):
    """A probe file the model was fitted on, with its digest (`file_digest`)."""

    path: Name
    digest: Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]


class AllreduceProvenance(FileSchema):
    """Where a model came from (``thrifty fit-allreduce`` records its own
    command and the probes it read); empty for a model fitted in Python
    without one."""

    kind: Literal["measured", "published", "derived"] | None = None
    command: str | None = None
    machine: str | None = None
    source: str | None = None
    script: str | None = None
    inputs: list[ProbeInput] | None = None
    date: str | None = None
    notes: str | list[str] | None = None

    @model_validator(mode="after")
    def _says_where(self) -> "AllreduceProvenance":
        needed = {"measured": ("command", "machine"), "published": ("source",), "derived": ("script",)}
        for name in needed.get(self.kind or "", ()):
            if not getattr(self, name):
                raise FieldPathError((name,), f"is required: a {self.kind} model must say its {name}")
        return self


class HyperparamsFile(FileSchema):
    """The chosen point of the selection grid (`Hyperparams`)."""

    max_depth: Annotated[int, Field(ge=0)]
    n_estimators: Annotated[int, Field(ge=1)]
    learning_rate: PositiveFinite
    objective: Name
    target: Target
    relative_weights: bool = False

    def hyperparams(self) -> Hyperparams:
        return Hyperparams(self.max_depth, self.n_estimators, self.learning_rate, self.objective, self.target,
                           self.relative_weights)


class SubmodelReportFile(FileSchema):
    """How a submodel was chosen and how well it predicts held-out rows (`SubmodelReport`)."""

    name: Name
    regime: str
    rows: Annotated[int, Field(ge=1)]
    groups: Annotated[int, Field(ge=1)]
    train_rows: Annotated[int, Field(ge=0)]
    test_rows: Annotated[int, Field(ge=0)]
    folds: Annotated[int, Field(ge=0)]
    hyperparams: HyperparamsFile
    cv_mape: Mape
    heldout_mape: Mape
    heldout_median_mape: Mape
    noise_floor_mape: Mape
    candidates: Annotated[int, Field(ge=1)]

    def submodel_report(self) -> SubmodelReport:
        return SubmodelReport(
            name=self.name, regime=self.regime, rows=self.rows, groups=self.groups, train_rows=self.train_rows,
            test_rows=self.test_rows, folds=self.folds, hyperparams=self.hyperparams.hyperparams(),
            cv_mape=self.cv_mape, heldout_mape=self.heldout_mape, heldout_median_mape=self.heldout_median_mape,
            noise_floor_mape=self.noise_floor_mape, candidates=self.candidates,
        )


class TargetFile(FileSchema):
    """How the booster's raw output maps back to bytes/s (`_Submodel`)."""

    form: Target
    offset: Finite
    scale: PositiveFinite


class SubmodelFile(FileSchema):
    """One submodel: its regime, target, report and booster."""

    regime: str
    target: TargetFile
    report: SubmodelReportFile
    booster: Annotated[dict[str, Any], Field(description="xgboost's JSON model document (Booster.save_raw('json'))")]


class SubmodelsFile(FileSchema):
    """The two submodels (Srifty 4.2): ``small`` for buffers up to ``mtu_bytes``, ``large`` above."""

    small: SubmodelFile
    large: SubmodelFile


class AllreduceModelFile(FileSchema):
    """A learned allreduce model file (format ``thrifty.allreduce_model/1``)."""

    format: Literal["thrifty.allreduce_model/1"]
    mtu_bytes: Annotated[int, Field(ge=1)] = MTU_BYTES
    min_bus_bandwidth_bytes_per_s: PositiveFinite | None = None  # for readers: the floor of every prediction
    features: FeaturesFile
    instance_types: dict[Name, TypeCoverageFile]
    caps: list[CapFile]
    training: TrainingFile = Field(default_factory=TrainingFile)
    provenance: AllreduceProvenance = Field(default_factory=AllreduceProvenance)
    submodels: SubmodelsFile

    @model_validator(mode="after")
    def _probed_types_are_features(self) -> "AllreduceModelFile":
        types, devices = self.features.instance_types, self.features.devices
        for name, c in self.instance_types.items():
            if name not in types:
                raise FieldPathError(("instance_types", name), f"is not one of features.instance_types {types}: "
                                                                "a probed type must have its feature column")
            if c.device not in devices:
                raise FieldPathError(("instance_types", name, "device"),
                                     f"is {c.device!r}, but must be one of features.devices {devices}")
        for i, cap in enumerate(self.caps):
            if cap.instance_type not in self.instance_types:
                raise FieldPathError(("caps", i, "instance_type"), f"is {cap.instance_type!r}, but must be a probed "
                                                                   f"type (a key of instance_types)")
        return self
