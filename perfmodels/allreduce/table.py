"""Probe rows, the training data of the learned allreduce model (Srifty 4.2,
"Dataset"): their schema, reading and checking them, and pooling the repeats
of a cell.

`ProbeRow` is the schema of one row: its fields are the columns, in file
order (`PROBE_COLUMNS`, the CSV header), each with its type and range, and the
rules across columns (``instances`` at most ``world_size``;
``busbw_bytes_per_s`` the bus bandwidth ``2 s (n - 1) / (n t)`` of
``buffer_bytes``, ``world_size`` and ``seconds``). Rows come from a probe CSV
(`load_probes`: what ``thrifty probe-allreduce`` writes and ``thrifty
fit-allreduce`` reads, or a file made by another benchmark in the same
columns) or as mappings (`parse_probe_rows`: what `probe_allreduce` returns).
A CSV cell is text, read as the column's type (blanks around it ignored); a
column the schema does not name is ignored. Every error names the file, the
row (and the CSV line) and the column; ``thrifty schema probe-rows`` prints
the schema. A `ProbeTable` is the checked rows as numpy columns, the form the
fitting reads.

The schema lives here, beside the model, so that reading probes needs
nothing of the probe's machinery (torch)."""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import BeforeValidator, ConfigDict, Field, model_validator

from thrifty.core.errors import ProblemError
from thrifty.core.validation import FieldPathError, FileSchema, validate_model
from thrifty.perfmodels.bandwidth import bus_bandwidth_from_time

__all__ = ["PROBE_COLUMNS", "ProbeRow", "ProbeTable", "load_probes", "parse_probe_rows", "pool_repeats",
           "file_digest"]


_BUSBW_RTOL = 1e-6  # busbw_bytes_per_s must agree with seconds this closely


def _cell(what: str, integer: bool = False) -> BeforeValidator:
    """A cell as given: blanks around a CSV cell are not part of it, and an
    empty cell (or a missing one: a CSV row shorter than its header) is not
    a value of the column; nor is True a count (pydantic would read it as 1)."""

    def present(value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip()
        if value is None or value == "":
            raise FieldPathError((), f"is empty, but must be {what}")
        if integer and isinstance(value, bool):
            raise FieldPathError((), f"is {value!r}, but must be {what}")
        return value

    return BeforeValidator(present)


def _iso_time(value: Any) -> datetime:
    """An ISO 8601 time; one without a zone is UTC."""
    if isinstance(value, datetime):
        stamp = value
    else:
        text = "" if value is None else str(value).strip()
        try:
            stamp = datetime.fromisoformat(text)
        except ValueError:
            raise FieldPathError((), f"is {text!r}, but must be an ISO 8601 time (2025-01-31T12:00:00Z)") from None
    return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=timezone.utc)


# in each field these go after its Field(...): placed before, the JSON Schema would not show the bounds
NAME, INTEGER, NUMBER = _cell("a name"), _cell("an integer", integer=True), _cell("a number")


class ProbeRow(FileSchema):
    """One probe row (one repeat of one cell): ``concurrent`` allreduces of
    ``buffer_bytes`` each, started together on ``world_size`` workers, took
    ``seconds`` (the whole batch, the largest over ranks). The fields, in
    order, are the columns of a probe CSV."""

    # a column the schema does not name cannot be a misspelt one (every column is
    # required), so another benchmark's extra columns are ignored rather than refused
    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    timestamp: Annotated[datetime, Field(description="when the repeat finished: ISO 8601, UTC unless a zone is "
                                                     "given"), BeforeValidator(_iso_time)]
    instance_type: Annotated[str, Field(min_length=1, description="the catalog type the row describes"), NAME]
    device: Annotated[str, Field(min_length=1, description="its device key (cpu, V100...)"), NAME]
    backend: Annotated[str, Field(min_length=1, description="the collective backend (gloo, nccl)"), NAME]
    rated_network_gbps: Annotated[float, Field(ge=0, allow_inf_nan=False, description="the type's rated network, "
                                                                                      "Gbit/s"), NUMBER]
    gpus_per_instance: Annotated[int, Field(ge=1, description="workers per instance"), INTEGER]
    instances: Annotated[int, Field(ge=1, description="instances in the world, at most world_size"), INTEGER]
    world_size: Annotated[int, Field(ge=2, description="workers in the allreduce"), INTEGER]
    buffer_bytes: Annotated[int, Field(ge=1, description="bytes of each allreduced buffer"), INTEGER]
    concurrent: Annotated[int, Field(ge=1, description="allreduces started together"), INTEGER]
    repeat: Annotated[int, Field(ge=0, description="the repeat's number within its cell"), INTEGER]
    seconds: Annotated[float, Field(gt=0, allow_inf_nan=False, description="wall time of the whole batch of "
                                                                           "concurrent allreduces"), NUMBER]
    busbw_bytes_per_s: Annotated[float, Field(gt=0, allow_inf_nan=False, description="bus bandwidth of each transfer: "
                                              "2 buffer_bytes (n - 1) / (n seconds)"), NUMBER]

    @model_validator(mode="after")
    def _consistent(self) -> "ProbeRow":
        if self.instances > self.world_size:
            raise FieldPathError(("instances",), f"is {self.instances}, larger than world_size {self.world_size}")
        expected = float(bus_bandwidth_from_time(self.buffer_bytes, self.world_size, self.seconds))
        if abs(self.busbw_bytes_per_s - expected) > _BUSBW_RTOL * expected:
            raise FieldPathError(("busbw_bytes_per_s",), f"is {self.busbw_bytes_per_s!r}, but 2 s (n-1) / (n t) from "
                                                         f"buffer_bytes, world_size and seconds gives {expected!r}")
        return self


# the probe CSV columns, in file order (thrifty.runtime.measure.probe writes them)
PROBE_COLUMNS: tuple[str, ...] = tuple(ProbeRow.model_fields)


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
    rows: list[tuple[str, Mapping[str, Any]]] = []
    for row in reader:
        rows.append((f"row {len(rows) + 1} (line {reader.line_num})", row))
    if not rows:
        raise ProblemError("has a header but no probe rows", source=source)
    return _table(rows, source)


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
    """Check probe rows given as mappings (e.g. what `probe_allreduce`
    returns) against `ProbeRow`, as `load_probes` checks a file's."""
    numbered = [(f"row {i}", row) for i, row in enumerate(rows, start=1)]
    if not numbered:
        raise ProblemError("no probe rows given", source=source)
    return _table(numbered, source)


def _at(where: str) -> Callable[[tuple[Any, ...]], str]:
    """Names a field of the row `where` by its column: ``row 3 (line 4), field 'seconds'``."""
    return lambda loc: f"{where}, field {str(loc[0])!r}" if loc else where


def _table(rows: Sequence[tuple[str, Mapping[str, Any]]], source: str) -> ProbeTable:
    """The rows, each checked against `ProbeRow`, as columns."""
    checked = [validate_model(ProbeRow, row, source=source, path_of=_at(where), strict=False) for where, row in rows]
    text = ("instance_type", "device", "backend")
    return ProbeTable(
        timestamp=np.array([r.timestamp.timestamp() for r in checked], dtype=float),
        **{name: np.array([getattr(r, name) for r in checked], dtype=object) for name in text},
        rated_network_gbps=np.array([r.rated_network_gbps for r in checked], dtype=float),
        **{name: np.array([getattr(r, name) for r in checked], dtype=np.int64)
           for name in ("gpus_per_instance", "instances", "world_size", "buffer_bytes", "concurrent", "repeat")},
        seconds=np.array([r.seconds for r in checked], dtype=float),
        busbw=np.array([r.busbw_bytes_per_s for r in checked], dtype=float),
        sources=(source,),
    )


def file_digest(path: str | Path) -> str:
    """``sha256:<hex>`` of a file, for provenance."""
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()


