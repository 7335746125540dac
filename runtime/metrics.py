"""Metrics out: every metric a training run or a tuning run reports, written
where people read metrics, as it arrives.

One small interface, `MetricsSink` (`write(step, metrics, tags)`, `close()`),
and three sinks:

- `JsonlSink`, always: ``metrics.jsonl`` in the run folder, one JSON object a
  line (``{"step", "at", "metrics", "tags"}``; a non-finite value is
  ``null``), appended and flushed as written, so a resumed run continues
  the file and a killed one keeps every line before the kill (`last_step`:
  the greatest step without tags in it, which a training run's driver does
  not write again);
- `TensorBoardSink` (``tensorboard``: the ``tensorboard`` extra): event files
  under ``RUN/tensorboard/``, one TensorBoard run per tag set (a tuning
  trial is ``trial-3``), written with TensorBoard's own event writer (no
  torch in the driver): ``tensorboard --logdir RUN/tensorboard``;
- `MlflowSink` (``mlflow``: the ``mlflow`` extra): MLflow's file store under
  ``RUN/mlruns`` (no tracking server), one experiment per run folder and one
  MLflow run per tag set, tagged with its tags: ``mlflow ui
  --backend-store-uri file://RUN/mlruns`` (MLflow 3 keeps the file store
  in maintenance and wants ``MLFLOW_ALLOW_FILE_STORE=true`` to use it,
  which this sink sets unless the environment says otherwise).

``thrifty run`` and ``thrifty tune`` take ``--metrics tensorboard,mlflow``
(`parse_kinds`); the JSONL sink is always on. `open_metrics` opens the
chosen sinks (a `MissingDependencyError` naming the extra for one whose
package is not installed, before anything is written) as one `Metrics`
fan-out, whose `where` says where to look. Metric names keep what MLflow
allows (letters, digits, ``_ - . / :`` and spaces; anything else becomes
``_``). This module imports neither TensorBoard nor MLflow until a sink of
theirs is opened.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from thrifty.core.errors import ProblemError
from thrifty.core.io import JsonLinesLog
from thrifty.core.optional import require

__all__ = ["MetricsSink", "JsonlSink", "TensorBoardSink", "MlflowSink", "Metrics", "KINDS", "OPTIONAL_KINDS",
           "parse_kinds", "check_kinds", "open_metrics", "look_at", "METRICS_FILE"]

METRICS_FILE = "metrics.jsonl"
OPTIONAL_KINDS = ("tensorboard", "mlflow")  # what --metrics may name (the JSONL file is always written)
KINDS = ("jsonl", *OPTIONAL_KINDS)
_NAME = re.compile(r"[^\w\-./: ]")


class MetricsSink(Protocol):
    """Where reported metrics go: `write` one step's metrics (name -> value)
    with `tags` (what they belong to, such as ``{"trial": "3"}``), `close`
    at the end."""

    def write(self, step: int, metrics: Mapping[str, float], tags: Mapping[str, str] | None = None) -> None: ...

    def close(self) -> None: ...

    def where(self) -> str: ...


def parse_kinds(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """The optional sinks `value` names (``"tensorboard,mlflow"``, or a list),
    in `OPTIONAL_KINDS`'s order; ``jsonl`` may be named (it is always on).
    A `ProblemError` at ``metrics`` for any other name."""
    if value is None:
        return ()
    names = [n.strip() for n in (value.split(",") if isinstance(value, str) else value)]
    for name in names:
        if name not in KINDS:
            raise ProblemError(f"names '{name}', but the metrics sinks are {', '.join(KINDS)} "
                               "(jsonl is always written)", path="metrics")
    return tuple(k for k in OPTIONAL_KINDS if k in names)


def _values(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numeric metrics, by their cleaned names (a flag or a string is left out)."""
    out = {}
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out[_NAME.sub("_", str(name))] = float(value)
    return out


def _run_name(tags: Mapping[str, str] | None) -> str:
    """The TensorBoard or MLflow run of a tag set: ``trial-3``; ``run`` without tags."""
    if not tags:
        return "run"
    return "_".join(f"{_NAME.sub('_', str(k))}-{_NAME.sub('_', str(v))}" for k, v in sorted(tags.items()))


class JsonlSink:
    """``metrics.jsonl``: one flushed JSON line per write, appended (see the module docstring)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        # the greatest step written without tags: by an earlier session of the run (read once), then by this one
        self.last_step = _last_step(self.path)
        self._log = JsonLinesLog(self.path)

    def write(self, step: int, metrics: Mapping[str, float], tags: Mapping[str, str] | None = None) -> None:
        values = {k: (v if math.isfinite(v) else None) for k, v in _values(metrics).items()}
        self._log.write({"step": int(step), "at": time.time(), "metrics": values, "tags": dict(tags or {})})
        if not tags:
            self.last_step = max(int(step), self.last_step if self.last_step is not None else int(step))

    def close(self) -> None:
        self._log.close()

    def where(self) -> str:
        return look_at(self.path.parent, ("jsonl",))[0]


def _last_step(path: Path) -> int | None:
    """The greatest step of the lines without tags in the metrics file
    `path` (None without one); a line cut short by a kill is skipped."""
    last = None
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict) and not entry.get("tags") and isinstance(entry.get("step"), int):
                    last = entry["step"] if last is None else max(last, entry["step"])
    except FileNotFoundError:
        return None
    return last


class TensorBoardSink:
    """TensorBoard event files under `folder`, one subfolder per tag set."""

    def __init__(self, folder: str | Path):
        require("tensorboard", "tensorboard")
        self.folder = Path(folder)
        self._writers: dict[str, Any] = {}

    def _writer(self, tags: Mapping[str, str] | None) -> Any:
        name = _run_name(tags) if tags else ""
        writer = self._writers.get(name)
        if writer is None:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            path = self.folder / name if name else self.folder
            path.mkdir(parents=True, exist_ok=True)
            writer = self._writers[name] = EventFileWriter(str(path), flush_secs=5)
        return writer

    def write(self, step: int, metrics: Mapping[str, float], tags: Mapping[str, str] | None = None) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=k, simple_value=v) for k, v in _values(metrics).items() if math.isfinite(v)]
        if values:
            self._writer(tags).add_event(Event(wall_time=time.time(), step=int(step), summary=Summary(value=values)))

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def where(self) -> str:
        return look_at(self.folder.parent, ("tensorboard",))[0]


class MlflowSink:
    """MLflow's file store under `folder`: experiment `experiment`, one MLflow run per tag set."""

    def __init__(self, folder: str | Path, experiment: str):
        mlflow = require("mlflow", "mlflow")
        # MLflow 3 keeps its file store in maintenance and refuses it unless this opt-in is set
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.folder = Path(folder).resolve()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.uri = self.folder.as_uri()
        self._client = mlflow.tracking.MlflowClient(tracking_uri=self.uri)
        found = self._client.get_experiment_by_name(experiment)
        self._experiment = found.experiment_id if found is not None else self._client.create_experiment(experiment)
        self._runs: dict[str, str] = {}

    def _run(self, tags: Mapping[str, str] | None) -> str:
        name = _run_name(tags)
        run_id = self._runs.get(name)
        if run_id is None:
            found = self._client.search_runs([self._experiment], filter_string=f"tags.`mlflow.runName` = '{name}'",
                                             max_results=1)
            if found:  # a resumed run goes on with its MLflow runs
                run_id = found[0].info.run_id
                self._client.update_run(run_id, status="RUNNING")
            else:
                run_id = self._client.create_run(self._experiment, run_name=name,
                                                 tags={f"thrifty.{k}": str(v) for k, v in (tags or {}).items()}
                                                 ).info.run_id
            self._runs[name] = run_id
        return run_id

    def write(self, step: int, metrics: Mapping[str, float], tags: Mapping[str, str] | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        values = [Metric(k, v, now, int(step)) for k, v in _values(metrics).items() if math.isfinite(v)]
        if values:
            self._client.log_batch(self._run(tags), metrics=values)

    def close(self) -> None:
        for run_id in self._runs.values():
            self._client.set_terminated(run_id)
        self._runs.clear()

    def where(self) -> str:
        return look_at(self.folder.parent, ("mlflow",))[0]


class Metrics:
    """The sinks of one run, written and closed together (`open_metrics`)."""

    def __init__(self, sinks: list[MetricsSink]):
        self.sinks = sinks

    @property
    def last_step(self) -> int | None:
        """The greatest step written without tags to ``metrics.jsonl``, by
        this session or an earlier one of the run (None before any): a
        training run's driver writes no step at or below it again."""
        return next((s.last_step for s in self.sinks if isinstance(s, JsonlSink)), None)

    def write(self, step: int, metrics: Mapping[str, float], tags: Mapping[str, str] | None = None) -> None:
        for sink in self.sinks:
            sink.write(step, metrics, tags)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()

    def where(self) -> list[str]:
        """Where to look, one line a sink."""
        return [sink.where() for sink in self.sinks]


def open_metrics(folder: str | Path, kinds: Iterable[str] = (), name: str | None = None) -> Metrics:
    """The run folder `folder`'s sinks: ``metrics.jsonl`` and the optional
    `kinds` (`parse_kinds`); `name` is the MLflow experiment (default: the
    folder's name). Every optional sink is checked (imported) before the
    JSONL file is opened."""
    folder = Path(folder)
    chosen = parse_kinds(list(kinds))
    optional: list[MetricsSink] = []
    for kind in chosen:
        if kind == "tensorboard":
            optional.append(TensorBoardSink(folder / "tensorboard"))
        else:
            optional.append(MlflowSink(folder / "mlruns", name or folder.resolve().name))
    return Metrics([JsonlSink(folder / METRICS_FILE), *optional])


def look_at(folder: str | Path, kinds: Iterable[str] = ("jsonl",)) -> list[str]:
    """Where to look at the metrics of the run folder `folder` in each of
    `kinds` (``jsonl`` and the optional sinks), one line each."""
    folder = Path(folder)
    lines = {"jsonl": f"metrics: {folder / METRICS_FILE}",
             "tensorboard": f"TensorBoard: tensorboard --logdir {folder / 'tensorboard'}",
             "mlflow": f"MLflow: mlflow ui --backend-store-uri {(folder / 'mlruns').resolve().as_uri()}"}
    return [lines[k] for k in KINDS if k in kinds]


def check_kinds(kinds: Iterable[str]) -> tuple[str, ...]:
    """`parse_kinds`, and each optional sink's package importable (a
    `MissingDependencyError` naming its extra otherwise): what a run checks
    before it starts."""
    chosen = parse_kinds(list(kinds))
    for kind in chosen:
        require(kind, kind)
    return chosen
