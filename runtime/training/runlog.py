"""The run log: one JSON object per line for every event of a run.

Events (``event`` key): ``start``, ``provision``, ``launch``, ``world_formed``,
``checkpoint``, ``throughput`` (a window of the progress monitor),
``preemption``, ``slowdown``, ``replan`` (``replan_kept``,
``replan_infeasible``), ``checkpoint_found``, ``segment_end``,
``terminate``, ``finish``, ``error``. Every line also has ``at`` (unix
seconds) and ``elapsed_s`` (since the run started). Lines are flushed as they
are written, so a crashed run's log is complete up to the crash and
``tail -f`` follows a live one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from thrifty.core.errors import ProblemError
from thrifty.core.validation import json_object

__all__ = ["RunLog", "read_run_log"]


def _plain(value: Any) -> Any:
    """A value `json` cannot write itself: a record (a pydantic dataclass or model) as its JSON object."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type) or isinstance(value, BaseModel):
        return json_object(value)
    raise TypeError(f"cannot write {type(value).__name__} to the run log")


class RunLog:
    def __init__(self, path: str | Path, start: float | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.start = time.time() if start is None else start
        self._file = open(self.path, "a", encoding="utf-8")
        self.events: list[dict[str, Any]] = []

    def write(self, event: str, at: float | None = None, **data: Any) -> dict[str, Any]:
        at = time.time() if at is None else at
        record = {"event": event, "at": at, "elapsed_s": at - self.start, **data}
        self._file.write(json.dumps(record, default=_plain) + "\n")
        self._file.flush()
        self.events.append(record)
        return record

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()

    def __enter__(self) -> "RunLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_run_log(path: str | Path) -> list[dict[str, Any]]:
    """Every event of a run log, in order; a malformed line names its number."""
    path = Path(path)
    out = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ProblemError(f"line {number} is not JSON: {e.msg}", source=str(path)) from None
    return out
