"""The learned allreduce model of Srifty 4.2: XGBoost regressors on the bus
bandwidth measured by the grid probe (`thrifty.perfmodels.probe`).

Label: the per-transfer bus bandwidth ``busbw = 2 s (n - 1) / (n t)`` of each
probe row (``s`` buffer bytes, ``n`` world size, ``t`` the batch time of
``concurrent`` transfers started together).

Features (one row per query)::

    log2(buffer bytes), world size, instances, gpus per instance,
    concurrent transfers, rated network gbps,
    one-hot of the device, one-hot of the instance type

Two submodels (Srifty 4.2): ``small`` for ``s <= MTU`` and ``large`` for
``s > MTU`` (``MTU_BYTES`` = 9001, EC2 jumbo frames); one model over both
regimes predicts nonsense for small buffers.

Model selection (per submodel), by weighted MAPE on rows never trained on,
with whole *groups* ``(instance type, world size, instances, buffer bytes)``
held out (every repeat and concurrency level of a group together), so a
score measures prediction at a buffer size the booster has not seen for that
world size, not memory of a repeated cell:

1. test: a seeded draw of 20% of the groups (`holdout_fraction`) is set
   aside and used once, for the *held-out MAPE* reported;
2. selection: the other groups are split (seeded) into 5 folds; each grid
   point (max_depth, n_estimators, learning_rate, objective incl.
   ``reg:pseudohubererror``, target busbw / log busbw / log time) is trained
   on 4 folds and predicts the fifth, and the point with the lowest
   out-of-fold MAPE wins (one noisy validation split picked poorly on the
   probes of a shared 2-core host);
3. the winner is trained on all non-test rows and scored on test, then
   refitted on all rows: that booster is the one kept.

Only groups strictly inside the probed size range of their (type, world
size) are held out (test or fold): trees predict flat beyond the data, and
the model is meant to interpolate between probed sizes (the simulator's
layer sizes). The report also gives the MAPE of the same test predictions
against the median of each test cell (how well the typical value is
predicted, without the repeat-to-repeat noise) and a noise floor: rows of one cell
(type, world size, instances, buffer, concurrency) share every feature, so
any model predicts one value per cell; the floor is the test MAPE of the
best such value per cell, chosen with hindsight (Srifty 4.2: repeated
probes of one configuration disagree, so no model gets below it).

Stale probes can be decayed (Srifty 4.2, "Model Updating"): with a half-life
of ``h`` days a row ``a`` days older than the newest row weighs ``0.5**(a/h)``
in training and in the MAPE.

``b_cap`` (Srifty 4.3), per (type, world size, instances): the largest
aggregate bus bandwidth ``c * busbw`` over concurrency levels ``c`` and
buffer sizes above the MTU, taking the larger of what was observed (median
over repeats of a cell) and what the model predicts on the probed grid.

Between two probed buffer sizes the allreduce time is interpolated linearly
in log2(size) between the boosters' answers at the two (a deviation from
querying the trees directly: trees are constant between their split points,
so a size between two probes would get the time of one of them, up to 2x
off on a doubling grid). Outside the probed buffer sizes of a type the alpha-beta limits take over
(latency-bound below, bandwidth-bound above); world sizes outside the probed
ones are extrapolated flat by the trees, so probe the world sizes you plan
for.

Types without probes are answered by a fallback model (by default the
analytic ring `AnalyticAllreduce`) and `source` says ``"analytic"``.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from thrifty.datasets.catalog import InstanceType
from thrifty.datasets.errors import ProblemError
from thrifty.datasets.io import atomic_write_text, read_json
from thrifty.datasets.optional import require
from thrifty.perfmodels.bandwidth import MTU_BYTES, AnalyticAllreduce, BandwidthModel, bus_bandwidth_from_time

__all__ = [
    "MODEL_FORMAT",
    "MIN_BUS_BANDWIDTH",
    "PROBE_COLUMNS",
    "NUMERIC_FEATURES",
    "ProbeTable",
    "load_probes",
    "parse_probe_rows",
    "pool_repeats",
    "Hyperparams",
    "TARGETS",
    "DEFAULT_GRID",
    "MAPE_WEIGHTED_GRID",
    "SubmodelReport",
    "TypeCoverage",
    "LearnedAllreduce",
    "load_allreduce_model",
    "mape",
    "mape_floor",
    "decay_weights",
    "split_groups",
    "group_folds",
    "file_digest",
]

MODEL_FORMAT = "thrifty.allreduce_model/1"
MIN_BUS_BANDWIDTH = 1e3  # bytes/s: no prediction goes below this floor
SELECTION_FOLDS = 5
MIN_HOLDABLE_GROUPS = 4  # at least 1 test group and 3 groups to rotate through folds

# the probe CSV columns, in file order (thrifty.perfmodels.probe writes them;
# they live here so that reading probes needs nothing of the probe's machinery)
PROBE_COLUMNS: tuple[str, ...] = (
    "timestamp",
    "instance_type",
    "device",
    "backend",
    "rated_network_gbps",
    "gpus_per_instance",
    "instances",
    "world_size",
    "buffer_bytes",
    "concurrent",
    "repeat",
    "seconds",
    "busbw_bytes_per_s",
)

NUMERIC_FEATURES: tuple[str, ...] = (
    "log2_buffer_bytes",
    "world_size",
    "instances",
    "gpus_per_instance",
    "concurrent",
    "rated_network_gbps",
)

SUBMODELS: tuple[str, ...] = ("small", "large")
_BUSBW_RTOL = 1e-6  # busbw_bytes_per_s must agree with seconds this closely


# -- probe rows ----------------------------------------------------------------


@dataclass(frozen=True)
class ProbeTable:
    """Validated probe rows as columns (numpy arrays, one entry per row)."""

    timestamp: np.ndarray  # POSIX seconds, UTC
    instance_type: np.ndarray  # str
    device: np.ndarray  # str
    backend: np.ndarray  # str
    rated_network_gbps: np.ndarray
    gpus_per_instance: np.ndarray
    instances: np.ndarray
    world_size: np.ndarray
    buffer_bytes: np.ndarray
    concurrent: np.ndarray
    repeat: np.ndarray
    seconds: np.ndarray
    busbw: np.ndarray
    sources: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.seconds)

    def select(self, mask: np.ndarray) -> "ProbeTable":
        cols = {name: getattr(self, name)[mask] for name in _TABLE_COLUMNS}
        return ProbeTable(**cols, sources=self.sources)

    def age_days(self) -> np.ndarray:
        """Age of each row in days, relative to the newest row (not to the
        clock, so that refitting the same files gives the same model)."""
        if len(self) == 0:
            return np.zeros(0)
        return (self.timestamp.max() - self.timestamp) / 86400.0

    @staticmethod
    def concat(tables: Sequence["ProbeTable"]) -> "ProbeTable":
        cols = {name: np.concatenate([getattr(t, name) for t in tables]) for name in _TABLE_COLUMNS}
        return ProbeTable(**cols, sources=tuple(s for t in tables for s in t.sources))


_TABLE_COLUMNS = PROBE_COLUMNS[:-1] + ("busbw",)  # the table names busbw_bytes_per_s busbw


def load_probes(paths: str | Path | Iterable[str | Path]) -> ProbeTable:
    """Read and validate one or more probe CSV files.

    A missing column, an empty or non-numeric cell, NaN or infinity, zero or
    negative seconds, a non-integer count (world size, buffer bytes...) or a
    bus bandwidth that disagrees with the seconds raises `ProblemError` naming
    the file, the row (1 = first data row; the line number too) and the field.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    tables = [_read_probe_csv(Path(p)) for p in paths]
    if not tables:
        raise ProblemError("no probe files given")
    return ProbeTable.concat(tables)


def _read_probe_csv(path: Path) -> ProbeTable:
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise ProblemError("file not found", source=source) from e
    except OSError as e:
        raise ProblemError(f"cannot read file: {e.strerror}", source=source) from e
    reader = csv.DictReader(text.splitlines())
    header = reader.fieldnames or []
    missing = [c for c in PROBE_COLUMNS if c not in header]
    if missing:
        raise ProblemError(
            f"the column '{missing[0]}' is missing (required columns: {', '.join(PROBE_COLUMNS)})",
            path="header (line 1), field " + repr(missing[0]),
            source=source,
        )
    rows = []
    for row in reader:
        rows.append((f"row {len(rows) + 1} (line {reader.line_num})", row))
    if not rows:
        raise ProblemError("has a header but no probe rows", source=source)
    return _parse_rows(rows, source)


def pool_repeats(table: ProbeTable, weights: np.ndarray | None = None) -> tuple[ProbeTable, np.ndarray]:
    """One row per cell (every column but ``repeat``, ``seconds`` and the
    timestamp equal): the cell's *mean* time (weighted by `weights`, e.g.
    decay weights, when given), its busbw recomputed from that mean,
    ``repeat`` the number of rows pooled, the newest timestamp. Returns the
    pooled table and each pooled row's weight (the largest of its rows').

    The simulator predicts mean iteration times, so the allreduce model must
    predict mean transfer times. Fitting ``busbw`` row by row estimates
    ``E[s / t]``, which is not ``s / E[t]``: on a shared host where a small
    allreduce takes 0.2 ms or 4 ms depending on whether the peer must be woken,
    row-wise fits (and MAPE-based selection) land near the fast mode and
    under-predict the mean time by half.
    """
    keys = list(zip(table.instance_type, table.device, table.backend, table.rated_network_gbps,
                    table.gpus_per_instance, table.instances, table.world_size, table.buffer_bytes,
                    table.concurrent))
    cells: dict[tuple, list[int]] = {}
    for i, key in enumerate(keys):
        cells.setdefault(key, []).append(i)
    w = np.ones(len(table)) if weights is None else np.asarray(weights, dtype=float)
    first = np.array([rows[0] for rows in cells.values()], dtype=np.int64)
    cols = {name: getattr(table, name)[first] for name in _TABLE_COLUMNS}
    cols["seconds"] = np.array([np.average(table.seconds[rows], weights=w[rows]) for rows in cells.values()])
    cols["timestamp"] = np.array([table.timestamp[rows].max() for rows in cells.values()])
    cols["repeat"] = np.array([len(rows) for rows in cells.values()], dtype=np.int64)
    cols["busbw"] = bus_bandwidth_from_time(cols["buffer_bytes"].astype(float), cols["world_size"], cols["seconds"])
    pooled_weights = np.array([w[rows].max() for rows in cells.values()])
    return ProbeTable(**cols, sources=table.sources), pooled_weights


def parse_probe_rows(rows: Iterable[Mapping[str, Any]], source: str = "probe rows") -> ProbeTable:
    """Validate probe rows given as mappings (e.g. what `probe_allreduce`
    returns) with the same rules as `load_probes`."""
    numbered = [(f"row {i}", row) for i, row in enumerate(rows, start=1)]
    if not numbered:
        raise ProblemError("no probe rows given", source=source)
    for where, row in numbered:
        for c in PROBE_COLUMNS:
            if c not in row:
                raise ProblemError(f"the column '{c}' is missing", path=f"{where}, field '{c}'", source=source)
    return _parse_rows(numbered, source)


def _parse_rows(rows: list[tuple[str, Mapping[str, Any]]], source: str) -> ProbeTable:
    cols: dict[str, list[Any]] = {name: [] for name in _TABLE_COLUMNS}
    for where, row in rows:
        parsed = _parse_row(row, where, source)
        for name in _TABLE_COLUMNS:
            cols[name].append(parsed[name])
    out = {}
    for name, values in cols.items():
        if name in ("instance_type", "device", "backend"):
            out[name] = np.array(values, dtype=object)
        elif name in ("timestamp", "rated_network_gbps", "seconds", "busbw"):
            out[name] = np.array(values, dtype=float)
        else:
            out[name] = np.array(values, dtype=np.int64)
    return ProbeTable(**out, sources=(source,))


def _parse_row(row: Mapping[str, Any], where: str, source: str) -> dict[str, Any]:
    def fail(field_name: str, message: str) -> ProblemError:
        return ProblemError(message, path=f"{where}, field '{field_name}'", source=source)

    out: dict[str, Any] = {}
    out["timestamp"] = _timestamp(row["timestamp"], fail)
    for name in ("instance_type", "device", "backend"):
        text = "" if row[name] is None else str(row[name]).strip()
        if not text:
            raise fail(name, "is empty, but must be a name")
        out[name] = text
    out["rated_network_gbps"] = _number(row, "rated_network_gbps", fail, minimum=0.0, strict=False)
    out["gpus_per_instance"] = _integer(row, "gpus_per_instance", fail, minimum=1)
    out["world_size"] = _integer(row, "world_size", fail, minimum=2)
    out["instances"] = _integer(row, "instances", fail, minimum=1)
    if out["instances"] > out["world_size"]:
        raise fail("instances", f"is {out['instances']}, larger than world_size {out['world_size']}")
    out["buffer_bytes"] = _integer(row, "buffer_bytes", fail, minimum=1)
    out["concurrent"] = _integer(row, "concurrent", fail, minimum=1)
    out["repeat"] = _integer(row, "repeat", fail, minimum=0)
    out["seconds"] = _number(row, "seconds", fail, minimum=0.0, strict=True)
    busbw = _number(row, "busbw_bytes_per_s", fail, minimum=0.0, strict=True)
    expected = float(bus_bandwidth_from_time(out["buffer_bytes"], out["world_size"], out["seconds"]))
    if abs(busbw - expected) > _BUSBW_RTOL * expected:
        raise fail(
            "busbw_bytes_per_s",
            f"is {busbw!r}, but 2 s (n-1) / (n t) from buffer_bytes, world_size and seconds gives {expected!r}",
        )
    out["busbw"] = busbw
    return out


def _raw_text(row: Mapping[str, Any], name: str) -> Any:
    value = row[name]
    return value.strip() if isinstance(value, str) else value


def _number(row: Mapping[str, Any], name: str, fail: Any, minimum: float, strict: bool) -> float:
    value = _raw_text(row, name)
    if value is None or value == "":
        raise fail(name, "is empty, but must be a number")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise fail(name, f"is {value!r}, but must be a number") from None
    if not math.isfinite(x):
        raise fail(name, f"is {value!r}, but must be a finite number")
    if (strict and x <= minimum) or (not strict and x < minimum):
        rule = f"greater than {minimum:g}" if strict else f"at least {minimum:g}"
        raise fail(name, f"is {value!r}, but must be {rule}")
    return x


def _integer(row: Mapping[str, Any], name: str, fail: Any, minimum: int) -> int:
    value = _raw_text(row, name)
    if value is None or value == "":
        raise fail(name, "is empty, but must be an integer")
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise fail(name, f"is {value!r}, but must be an integer")
    try:
        x = int(value)
    except (TypeError, ValueError):
        raise fail(name, f"is {value!r}, but must be an integer") from None
    if x < minimum:
        raise fail(name, f"is {x}, but must be at least {minimum}")
    return x


def _timestamp(value: Any, fail: Any) -> float:
    text = "" if value is None else str(value).strip()
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise fail("timestamp", f"is {text!r}, but must be an ISO 8601 time (2025-01-31T12:00:00Z)") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


# -- small pure helpers ----------------------------------------------------------


def mape(predicted: np.ndarray, actual: np.ndarray, weights: np.ndarray | None = None) -> float:
    """(Weighted) mean absolute percentage error, as a fraction (0.1 = 10%)."""
    predicted, actual = np.asarray(predicted, float), np.asarray(actual, float)
    errors = np.abs(predicted - actual) / np.abs(actual)
    if weights is None:
        return float(errors.mean())
    return float(np.average(errors, weights=weights))


def decay_weights(age_days: np.ndarray, half_life_days: float | None) -> np.ndarray:
    """Sample weights ``0.5 ** (age / half_life)`` (all ones without a half-life)."""
    age_days = np.asarray(age_days, dtype=float)
    if half_life_days is None:
        return np.ones_like(age_days)
    if not half_life_days > 0:
        raise ProblemError(f"half_life_days is {half_life_days}, but must be positive")
    return np.power(0.5, age_days / half_life_days)


def split_groups(
    keys: np.ndarray, seed: int, fraction: float = 0.2, holdable: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Masks (fit, test) that keep each distinct key on one side: a seeded
    draw of ``fraction`` of all distinct keys (at least one), among those
    whose rows are `holdable` (default: all), goes to test."""
    keys = np.asarray(keys)
    holdable = np.ones(len(keys), dtype=bool) if holdable is None else np.asarray(holdable, dtype=bool)
    if not 0 < fraction < 0.5:
        raise ProblemError(f"holdout fraction is {fraction}, but must be between 0 and 0.5")
    distinct = np.unique(keys)
    candidates = np.unique(keys[holdable])
    if len(candidates) < MIN_HOLDABLE_GROUPS:
        raise ProblemError(
            f"only {len(candidates)} (type, world size, buffer) groups lie inside the probed size range "
            f"(of {len(distinct)} in all); need at least {MIN_HOLDABLE_GROUPS} to hold some out for "
            "model selection and test: probe more buffer sizes"
        )
    n_test = min(max(1, int(round(fraction * len(distinct)))), len(candidates) // 3)
    chosen = np.random.default_rng(seed).choice(candidates, size=n_test, replace=False)
    test = np.isin(keys, chosen)
    return ~test, test


def group_folds(keys: np.ndarray, eligible: np.ndarray, folds: int, seed: int) -> list[np.ndarray]:
    """`folds` disjoint masks over the distinct keys of the `eligible` rows
    (a seeded shuffle dealt round-robin); each mask is one validation fold."""
    keys = np.asarray(keys)
    candidates = np.unique(keys[np.asarray(eligible, dtype=bool)])
    order = np.random.default_rng(seed).permutation(len(candidates))
    parts = [candidates[order[i::folds]] for i in range(min(folds, len(candidates)))]
    return [np.isin(keys, part) for part in parts]


def _interior_sizes(table: "ProbeTable") -> np.ndarray:
    """Rows whose buffer size is neither the smallest nor the largest probed
    for their (type, world size) in `table`: held-out groups are drawn from
    these, so the held-out MAPE measures interpolation between probed sizes
    (trees predict flat outside the probed range)."""
    out = np.zeros(len(table), dtype=bool)
    for t in np.unique(table.instance_type):
        for n in np.unique(table.world_size):
            mask = (table.instance_type == t) & (table.world_size == n)
            if mask.any():
                sizes = table.buffer_bytes[mask]
                out[mask] = (sizes > sizes.min()) & (sizes < sizes.max())
    return out


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


TARGETS: tuple[str, ...] = ("busbw", "log_busbw", "log_time")


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


def _grid(relative_weights: tuple[bool, ...]) -> tuple[Hyperparams, ...]:
    return tuple(
        Hyperparams(depth, rounds, rate, objective, target, relative)
        for depth, (rounds, rate), objective, target, relative in itertools.product(
            (3, 6),
            ((100, 0.2), (300, 0.05)),
            ("reg:squarederror", "reg:pseudohubererror", "reg:absoluteerror"),
            TARGETS,
            relative_weights,
        )
    )


DEFAULT_GRID: tuple[Hyperparams, ...] = _grid((False,))
# DEFAULT_GRID plus the same points with MAPE-leaning weights. Not the default:
# on noisy probes MAPE rewards predicting the slowest repeats of a cell (on the
# shipped local probes, several small-buffer cells came out 3-12x below their
# medians for an 11-13 point lower held-out MAPE): a pessimistic simulator.
MAPE_WEIGHTED_GRID: tuple[Hyperparams, ...] = _grid((False, True))


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


@dataclass
class _Submodel:
    """One booster and how its raw output maps back to bytes/s:
    ``busbw = raw * scale`` (target ``busbw``), ``exp(raw + offset)``
    (``log_busbw``) or ``2 s (n-1) / (n exp(raw + offset))`` (``log_time``)."""

    booster: Any
    target: str
    offset: float
    scale: float

    def predict(self, X: np.ndarray) -> np.ndarray:
        if len(X) == 0:
            return np.zeros(0)
        raw = np.asarray(self.booster.inplace_predict(X), dtype=float)
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


def _train(
    X: np.ndarray, y: np.ndarray, w: np.ndarray, params: Hyperparams, seed: int, nthread: int
) -> _Submodel:
    xgb = _import_xgboost()
    # center (log forms) or scale (linear form) the label so that one
    # pseudo-Huber slope and one base score suit every data set
    target = _to_target(params.target, y, X)
    if params.target == "busbw":
        offset, scale = 0.0, float(np.median(target))
        label, base_score = target / scale, 1.0
    else:
        offset, scale = float(np.median(target)), 1.0
        label, base_score = target - offset, 0.0
    if params.relative_weights:
        w = w * _relative_weights(params.target, X, y)
    dtrain = xgb.DMatrix(X, label=label, weight=w, nthread=nthread)
    booster = xgb.train(
        {
            "objective": params.objective,
            "max_depth": params.max_depth,
            "eta": params.learning_rate,
            "base_score": base_score,
            "nthread": nthread,
            "seed": seed,
            "tree_method": "hist",
            "verbosity": 0,
        },
        dtrain,
        num_boost_round=params.n_estimators,
    )
    return _Submodel(booster, params.target, offset, scale)


def _relative_weights(target: str, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Weights that make each loss lean towards the MAPE, mean 1.

    With the linear target, ``1 / y``: absolute error times ``1 / y`` is the
    MAPE. Log targets already measure errors relative to ``y`` across
    sizes, so only the spread *within* a cell (rows with equal features,
    i.e. repeats) is reweighted: ``median_cell(y) / y``; a plain ``1 / y``
    would starve the large buffers of weight."""
    if target == "busbw":
        r = 1.0 / y
    else:
        _, cell = np.unique(X, axis=0, return_inverse=True)
        cell = cell.ravel()
        medians = np.array([np.median(y[cell == c]) for c in range(cell.max() + 1)])
        r = medians[cell] / y
    return r / r.mean()


def _cell_medians(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each row, the median of `values` over the rows with its key."""
    out = np.empty(len(values))
    for key in np.unique(keys):
        mask = keys == key
        out[mask] = np.median(values[mask])
    return out


def mape_floor(keys: np.ndarray, values: np.ndarray, weights: np.ndarray) -> float:
    """The least MAPE any per-key constant can reach on `values`: in each
    key the constant minimizing ``sum w |c - y| / y`` is the median of ``y``
    weighted by ``w / y``."""
    best = np.empty(len(values))
    for key in np.unique(keys):
        mask = keys == key
        best[mask] = _weighted_median(values[mask], weights[mask] / values[mask])
    return mape(best, values, weights)


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cumulative, 0.5 * cumulative[-1])])


def _group_keys(table: ProbeTable, with_concurrency: bool = False) -> np.ndarray:
    parts = [table.instance_type, table.world_size, table.instances, table.buffer_bytes]
    if with_concurrency:
        parts.append(table.concurrent)
    return np.array(["|".join(str(p[i]) for p in parts) for i in range(len(table))], dtype=object).astype(str)


def _fit_submodel(
    name: str,
    regime: str,
    table: ProbeTable,
    X: np.ndarray,
    weights: np.ndarray,
    grid: Sequence[Hyperparams],
    seed: int,
    holdout_fraction: float,
    nthread: int,
) -> tuple[_Submodel, SubmodelReport]:
    """Select hyperparameters by grouped cross-validation, score the winner
    on the held-out test groups, refit it on everything (module docstring)."""
    if not grid:
        raise ProblemError("the hyperparameter grid is empty")
    y = table.busbw
    groups = _group_keys(table)
    interior = _interior_sizes(table)
    try:
        fit, test = split_groups(groups, seed, holdout_fraction, interior)
    except ProblemError as e:
        raise ProblemError(f"the {name} submodel ({regime}): {e.message}") from None
    folds = group_folds(groups, fit & interior, SELECTION_FOLDS, seed)
    scored = [(_cv_mape(X, y, weights, fit, folds, params, seed, nthread), i) for i, params in enumerate(grid)]
    cv_mape, best = min(scored)
    params = grid[best]
    chosen = _train(X[fit], y[fit], weights[fit], params, seed, nthread)
    predicted = chosen.predict(X[test])
    heldout = mape(predicted, y[test], weights[test])
    cells = _group_keys(table, with_concurrency=True)
    heldout_medians = mape(predicted, _cell_medians(cells[test], y[test]), weights[test])
    floor = mape_floor(cells[test], y[test], weights[test])
    final = _train(X, y, weights, params, seed, nthread)
    report = SubmodelReport(
        name=name,
        regime=regime,
        rows=len(table),
        groups=len(np.unique(groups)),
        train_rows=int(fit.sum()),
        test_rows=int(test.sum()),
        folds=len(folds),
        hyperparams=params,
        cv_mape=cv_mape,
        heldout_mape=heldout,
        heldout_median_mape=heldout_medians,
        noise_floor_mape=floor,
        candidates=len(grid),
    )
    return final, report


def _cv_mape(
    X: np.ndarray,
    y: np.ndarray,
    w: np.ndarray,
    fit: np.ndarray,
    folds: list[np.ndarray],
    params: Hyperparams,
    seed: int,
    nthread: int,
) -> float:
    """Out-of-fold MAPE of `params`: each fold predicted by a booster trained
    on the other rows of `fit` (never on test rows)."""
    predicted = np.full(len(y), np.nan)
    for fold in folds:
        train = fit & ~fold
        predicted[fold] = _train(X[train], y[train], w[train], params, seed, nthread).predict(X[fold])
    scored = ~np.isnan(predicted)
    return mape(predicted[scored], y[scored], w[scored])


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

    Build one with `LearnedAllreduce.fit(rows)` or `LearnedAllreduce.load(path)`.
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
        self._size_cache: dict[tuple[str, int, int, int, float], float] = {}
        self._array_cache: dict[tuple[Any, ...], np.ndarray] = {}

    # -- BandwidthModel ---------------------------------------------------------

    def covers(self, itype: InstanceType | str) -> bool:
        """Whether the training data has probes of this type."""
        return _name(itype) in self.coverage

    def source(self, itype: InstanceType | str) -> str:
        return "learned" if self.covers(itype) else "analytic"

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
        key = (itype.name, int(world_size), int(instances), concurrent, s.shape, s.tobytes())
        hit = self._array_cache.get(key)
        if hit is not None:
            return hit.copy()
        if s.size and not (np.all(np.isfinite(s)) and s.min() > 0):
            raise ProblemError("buffer sizes must be positive finite numbers of bytes")
        out = self._predict_sizes(itype.name, s.ravel(), int(world_size), int(instances), int(concurrent))
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
        return int(self.coverage[_name(itype)].max_concurrent)

    def bandwidth_cap(self, itype: InstanceType, world_size: int, instances: int) -> float:
        """``b_cap``: the largest aggregate bus bandwidth of concurrent
        transfers (Srifty 4.3); see the module docstring."""
        if not self.covers(itype):
            return float(self.fallback.bandwidth_cap(itype, world_size, instances))
        key = (itype.name, int(world_size), int(instances))
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

    # -- fitting ----------------------------------------------------------------

    @classmethod
    def fit(
        cls,
        rows: ProbeTable | Iterable[Mapping[str, Any]],
        *,
        half_life_days: float | None = None,
        seed: int = 0,
        grid: Sequence[Hyperparams] = DEFAULT_GRID,
        holdout_fraction: float = 0.2,
        nthread: int = 1,
        fallback: BandwidthModel | None = None,
        provenance: Mapping[str, Any] | None = None,
        mtu_bytes: int = MTU_BYTES,
        pool: bool = True,
    ) -> "LearnedAllreduce":
        """Fit both submodels on probe rows (a `ProbeTable` from `load_probes`,
        or row mappings as `probe_allreduce` returns them).

        With `pool` (the default) the repeats of each cell are first pooled
        into the busbw of their mean time (`pool_repeats`): the model predicts
        mean transfer times, which is what the simulator adds up. ``pool=False``
        fits the rows one by one, as Srifty 4.2 does.

        Raises `ProblemError` when a regime (at or below / above the MTU) has
        no rows or too few distinct groups to hold some out."""
        table = rows if isinstance(rows, ProbeTable) else parse_probe_rows(rows)
        raw = table
        weights = decay_weights(table.age_days(), half_life_days)
        if pool:
            table, weights = pool_repeats(table, weights)
        encoding = FeatureEncoding(
            devices=tuple(sorted(set(table.device))), instance_types=tuple(sorted(set(table.instance_type)))
        )
        X = encoding.encode_table(table)
        submodels, reports = {}, {}
        regimes = {
            "small": (table.buffer_bytes <= mtu_bytes, f"buffer_bytes <= {mtu_bytes}"),
            "large": (table.buffer_bytes > mtu_bytes, f"buffer_bytes > {mtu_bytes}"),
        }
        for name, (mask, regime) in regimes.items():
            if not mask.any():
                raise ProblemError(
                    f"the probes have no rows with {regime}: the {name} submodel needs some "
                    "(probe sizes from 4 bytes to well above the MTU)"
                )
            submodels[name], reports[name] = _fit_submodel(
                name, regime, table.select(mask), X[mask], weights[mask], grid, seed, holdout_fraction, nthread
            )
        training = {
            "rows": len(raw),
            "pooled": "one row per cell: the busbw of the mean time over its repeats" if pool else None,
            "training_rows": len(table),
            "seed": seed,
            "half_life_days": half_life_days,
            "holdout": (
                f"whole (instance_type, world_size, instances, buffer_bytes) groups strictly inside the "
                f"probed size range: a seeded draw (seed {seed}) of {holdout_fraction:.0%} of the groups is "
                f"the test set (held-out MAPE); hyperparameters chosen by {SELECTION_FOLDS}-fold grouped "
                "cross-validation on the rest; the final booster is refitted on all rows"
            ),
            "grid_size": len(grid),
            "xgboost": _import_xgboost().__version__,
        }
        model = cls(
            submodels,
            encoding,
            _coverage(table),
            {},
            reports,
            training,
            dict(provenance or {}),
            fallback=fallback,
            mtu_bytes=mtu_bytes,
        )
        model._caps = _fitted_caps(model, table)
        return model

    # -- save / load ------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The saved form (format `MODEL_FORMAT`); boosters in xgboost JSON."""
        caps = [
            {"instance_type": t, "world_size": n, "instances": i, "b_cap_bytes_per_s": v}
            for (t, n, i), v in sorted(self._caps.items())
            if t in self.coverage
        ]
        submodels = {}
        for name in SUBMODELS:
            sub, report = self._submodels[name], self.fit_report[name]
            submodels[name] = {
                "regime": report.regime,
                "target": {"form": sub.target, "offset": sub.offset, "scale": sub.scale},
                "report": _report_json(report),
                "booster": json.loads(bytes(sub.booster.save_raw("json"))),
            }
        return {
            "format": MODEL_FORMAT,
            "mtu_bytes": self.mtu_bytes,
            "min_bus_bandwidth_bytes_per_s": MIN_BUS_BANDWIDTH,
            "features": {
                "columns": self.encoding.names,
                "numeric": list(NUMERIC_FEATURES),
                "devices": list(self.encoding.devices),
                "instance_types": list(self.encoding.instance_types),
            },
            "instance_types": {name: _coverage_json(c) for name, c in sorted(self.coverage.items())},
            "caps": caps,
            "training": self.training,
            "provenance": self.provenance,
            "submodels": submodels,
        }

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
    def from_json(
        cls, data: Any, source: str = "allreduce model", fallback: BandwidthModel | None = None
    ) -> "LearnedAllreduce":
        if not isinstance(data, dict) or data.get("format") != MODEL_FORMAT:
            raise ProblemError(f"is not a thrifty allreduce model (format must be {MODEL_FORMAT!r})", source=source)
        xgb = _import_xgboost()
        try:
            features = data["features"]
            encoding = FeatureEncoding(tuple(features["devices"]), tuple(features["instance_types"]))
            if list(features["numeric"]) != list(NUMERIC_FEATURES):
                raise ProblemError(
                    f"features.numeric is {features['numeric']}, but this thrifty uses {list(NUMERIC_FEATURES)}",
                    source=source,
                )
            coverage = {name: _coverage_from_json(name, c) for name, c in data["instance_types"].items()}
            caps = {
                (c["instance_type"], int(c["world_size"]), int(c["instances"])): float(c["b_cap_bytes_per_s"])
                for c in data["caps"]
            }
            submodels, reports = {}, {}
            for name in SUBMODELS:
                entry = data["submodels"][name]
                booster = xgb.Booster()
                booster.load_model(bytearray(json.dumps(entry["booster"]).encode("utf-8")))
                target = entry["target"]
                if target["form"] not in TARGETS:
                    raise ValueError(f"submodels.{name}.target.form {target['form']!r} is not one of {TARGETS}")
                submodels[name] = _Submodel(booster, target["form"], float(target["offset"]), float(target["scale"]))
                reports[name] = _report_from_json(entry["report"])
        except ProblemError:
            raise
        except xgb.core.XGBoostError as e:
            raise ProblemError(f"has a booster xgboost cannot load: {e}", source=source) from None
        except KeyError as e:
            raise ProblemError(f"is missing the field {e.args[0]!r}", source=source) from None
        except (TypeError, ValueError, AttributeError) as e:
            raise ProblemError(f"has a malformed field: {e}", source=source) from None
        return cls(
            submodels,
            encoding,
            coverage,
            caps,
            reports,
            data.get("training", {}),
            data.get("provenance", {}),
            fallback=fallback,
            mtu_bytes=int(data.get("mtu_bytes", MTU_BYTES)),
        )

    @classmethod
    def load(cls, path: str | Path, fallback: BandwidthModel | None = None) -> "LearnedAllreduce":
        """Load a model saved by `save`."""
        return cls.from_json(read_json(path), source=str(path), fallback=fallback)


def load_allreduce_model(path: str | Path, fallback: BandwidthModel | None = None) -> LearnedAllreduce:
    """Load a saved `LearnedAllreduce` (format `MODEL_FORMAT`)."""
    return LearnedAllreduce.load(path, fallback=fallback)


# -- helpers of fit / save -------------------------------------------------------


def _name(itype: InstanceType | str) -> str:
    return itype if isinstance(itype, str) else itype.name


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, tz=timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _coverage(table: ProbeTable) -> dict[str, TypeCoverage]:
    out = {}
    for name in sorted(set(table.instance_type)):
        rows = table.select(table.instance_type == name)
        newest = int(np.argmax(rows.timestamp))
        out[name] = TypeCoverage(
            name=name,
            device=str(rows.device[newest]),
            gpus_per_instance=int(rows.gpus_per_instance[newest]),
            rated_network_gbps=float(rows.rated_network_gbps[newest]),
            world_sizes=tuple(int(n) for n in np.unique(rows.world_size)),
            max_concurrent=int(rows.concurrent.max()),
            buffer_bytes=tuple(int(s) for s in np.unique(rows.buffer_bytes)),
            rows=len(rows),
            first_probe=_iso(rows.timestamp.min()),
            last_probe=_iso(rows.timestamp.max()),
        )
    return out


def _fitted_caps(model: LearnedAllreduce, table: ProbeTable) -> dict[tuple[str, int, int], float]:
    """``b_cap`` for every probed (type, world size, instances): the larger of
    the observed and the predicted largest aggregate ``c * busbw`` above the MTU."""
    caps = {}
    keys = sorted({(str(t), int(n), int(i)) for t, n, i in zip(table.instance_type, table.world_size, table.instances)})
    for name, n, inst in keys:
        mask = (table.instance_type == name) & (table.world_size == n) & (table.instances == inst)
        large = mask & (table.buffer_bytes > model.mtu_bytes)
        rows = table.select(large if large.any() else mask)
        aggregate = rows.concurrent * rows.busbw
        cells = _group_keys(rows, with_concurrency=True)
        observed = max(float(np.median(aggregate[cells == c])) for c in np.unique(cells))
        caps[(name, n, inst)] = max(observed, model._predicted_cap(name, n, inst))
    return caps


def _report_json(r: SubmodelReport) -> dict[str, Any]:
    out = asdict(r)
    out["hyperparams"] = asdict(r.hyperparams)
    return out


def _report_from_json(data: Mapping[str, Any]) -> SubmodelReport:
    fields = dict(data)
    fields["hyperparams"] = Hyperparams(**fields["hyperparams"])
    return SubmodelReport(**fields)


def _coverage_json(c: TypeCoverage) -> dict[str, Any]:
    out = asdict(c)
    del out["name"]
    out["world_sizes"] = list(c.world_sizes)
    out["buffer_bytes"] = list(c.buffer_bytes)
    return out


def _coverage_from_json(name: str, data: Mapping[str, Any]) -> TypeCoverage:
    return TypeCoverage(
        name=name,
        device=str(data["device"]),
        gpus_per_instance=int(data["gpus_per_instance"]),
        rated_network_gbps=float(data["rated_network_gbps"]),
        world_sizes=tuple(int(n) for n in data["world_sizes"]),
        max_concurrent=int(data["max_concurrent"]),
        buffer_bytes=tuple(int(s) for s in data["buffer_bytes"]),
        rows=int(data["rows"]),
        first_probe=str(data["first_probe"]),
        last_probe=str(data["last_probe"]),
    )


def file_digest(path: str | Path) -> str:
    """``sha256:<hex>`` of a file, for provenance."""
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()
