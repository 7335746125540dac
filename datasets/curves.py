"""Learning-curve traces: per-epoch validation accuracy and epoch wall time of
real training runs, for the trace-driven tuning simulator (HyperDrive 7.1:
recorded learning curves and iteration timings replayed under any policy).

The shipped traces live in ``datasets/curve_traces/<name>.json`` (format
``thrifty.curve_traces/1``), measured by ``datasets/scripts/make_curve_traces.py``;
``datasets/curve_traces/README.md`` says how and where.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from thrifty.core.errors import ProblemError, closest_names
from thrifty.core.io import read_json
from thrifty.datasets.paths import curve_trace_files

__all__ = ["Trace", "load_traces", "trace_names", "CURVE_TRACES_FORMAT"]

CURVE_TRACES_FORMAT = "thrifty.curve_traces/1"


@dataclass(frozen=True, eq=False)
class Trace:
    """One measured training run: its hyperparameters, the validation accuracy
    after each epoch 1..E (higher is better) and the wall seconds of each epoch."""

    config: dict[str, Any]
    accuracy: np.ndarray
    epoch_s: np.ndarray

    @property
    def epochs(self) -> int:
        return len(self.accuracy)


def trace_names() -> list[str]:
    """Names of the shipped trace sets."""
    return sorted(curve_trace_files())


def load_traces(name: str = "digits-mlp") -> list[Trace]:
    """The shipped, measured traces named `name` (fresh configs; arrays are read-only)."""
    files = curve_trace_files()
    if name not in files:
        close = closest_names(name, files)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ProblemError(f"no learning-curve traces named '{name}' (known: {', '.join(sorted(files))}){hint}")
    return [replace(t, config=dict(t.config)) for t in _load_file(files[name])]


@lru_cache(maxsize=8)
def _load_file(path: Path) -> tuple[Trace, ...]:
    doc = read_json(path)
    if not isinstance(doc, dict) or doc.get("format") != CURVE_TRACES_FORMAT:
        raise ProblemError(f"format must be '{CURVE_TRACES_FORMAT}'", path="format", source=str(path))
    raw = doc.get("traces")
    if not isinstance(raw, list) or not raw:
        raise ProblemError("must be a non-empty list", path="traces", source=str(path))
    return tuple(_parse_trace(item, f"traces[{i}]", str(path)) for i, item in enumerate(raw))


def _parse_trace(item: Any, where: str, source: str) -> Trace:
    if not isinstance(item, dict) or not isinstance(item.get("config"), dict):
        raise ProblemError("must be an object with a 'config' object", path=where, source=source)
    arrays = {}
    for key in ("accuracy", "epoch_s"):
        try:
            values = np.asarray(item.get(key), dtype=float)
        except (TypeError, ValueError) as e:
            raise ProblemError("must be a list of numbers", path=f"{where}.{key}", source=source) from e
        if values.ndim != 1 or values.size == 0 or not np.all(np.isfinite(values)):
            raise ProblemError("must be a non-empty list of finite numbers", path=f"{where}.{key}", source=source)
        values.flags.writeable = False
        arrays[key] = values
    if arrays["accuracy"].size != arrays["epoch_s"].size:
        raise ProblemError(
            f"has {arrays['epoch_s'].size} epoch times for {arrays['accuracy'].size} accuracies",
            path=f"{where}.epoch_s",
            source=source,
        )
    if np.any(arrays["epoch_s"] <= 0):
        raise ProblemError("epoch times must be positive", path=f"{where}.epoch_s", source=source)
    return Trace(config=dict(item["config"]), accuracy=arrays["accuracy"], epoch_s=arrays["epoch_s"])
