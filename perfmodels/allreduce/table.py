"""Probe rows, the training data of the learned allreduce model (Srifty 4.2,
"Dataset"): the CSV columns the grid probe writes
(`thrifty.perfmodels.measure.probe`), reading and checking them (every error
names the file, row and column), and pooling the repeats of a cell.

The columns live here, beside the model, so that reading probes needs
nothing of the probe's machinery (torch)."""

from __future__ import annotations

import csv
import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from thrifty.datasets.errors import ProblemError
from thrifty.perfmodels.bandwidth import bus_bandwidth_from_time

__all__ = ["PROBE_COLUMNS", "ProbeTable", "load_probes", "parse_probe_rows", "pool_repeats", "file_digest"]


# the probe CSV columns, in file order (thrifty.perfmodels.measure.probe writes them;
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


_BUSBW_RTOL = 1e-6  # busbw_bytes_per_s must agree with seconds this closely


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
    allreduce is fast or many times slower depending on whether the peer must
    be woken (a bimodal time), row-wise fits (and MAPE-based selection) land
    near the fast mode and under-predict the mean time.
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


def file_digest(path: str | Path) -> str:
    """``sha256:<hex>`` of a file, for provenance."""
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()


