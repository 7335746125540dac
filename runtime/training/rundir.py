"""A run's directory: what a run needs to be resumed with nothing but its path.

::

    RUN_DIR/
      run.json         the run record: plan (the current one), problem, trainer, trainer args,
                       run settings; written atomically at the start and after each re-plan
      run.jsonl        the run log, one JSON object per line (`runlog`), appended by every session
      checkpoint.pt    the last checkpoint (atomic; elsewhere with RunConfig.checkpoint, e.g. on S3)
      job-segment*.json, logs/   what each world of workers was asked to do, and its output

The default directory of a new run is ``./thrifty-runs/RUN_ID`` (under the
working directory, like ``lightning_logs/`` or ``mlruns/``; ``thrifty-runs/``
is in the repository's ``.gitignore``). ``thrifty run --resume RUN_DIR`` (or
``train(resume=RUN_DIR)``) reads the record and continues from the checkpoint;
`carried_over` reads from the log what the earlier sessions already spent, so
the limits count the whole run, and how many worlds they ran, so a resumed
session numbers its segments (and their job files and logs) after theirs.
Files follow the umask, as any file the user creates (`thrifty.core.io`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from thrifty.core.errors import ProblemError
from thrifty.core.io import read_json, write_json
from thrifty.core.validation import validate_model
from thrifty.runtime.runs import RUNS_FOLDER, newest_run
from thrifty.solver.plan import Plan

__all__ = ["RUN_RECORD_FORMAT", "RUNS_FOLDER", "RunRecord", "new_run_id", "default_run_dir", "write_run_record",
           "read_run_record", "CarriedOver", "carried_over", "absolute_paths", "finished_run", "newest_run_dir"]

RUN_RECORD_FORMAT: Final = "thrifty.run/1"
RECORD_NAME = "run.json"


def new_run_id() -> str:
    """A run id that sorts by start time: ``20250102-153000-1a2b``."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


def default_run_dir(run_id: str) -> Path:
    return Path.cwd() / RUNS_FOLDER / run_id


class RunRecord(BaseModel):
    """What `train` was asked to run: ``run.json``, whose keys are this
    model's fields in order (``format`` first), the plans with the plan
    file's keys (`thrifty.solver.plan.Plan`). Keys it does not know are
    passed over (``extra="ignore"``), as they were before it was a model, so
    a record another version wrote still resumes."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    format: Literal["thrifty.run/1"] = RUN_RECORD_FORMAT
    run_id: str
    plan: Plan  # the current plan (the last re-plan's), docs/architecture.md's plan keys
    problem: dict[str, Any]  # with absolute file paths, so a resume works from any folder
    trainer: str
    trainer_args: dict[str, Any]
    config: dict[str, Any]  # RunConfig fields as given (window_s None: automatic)
    first_plan: Plan | None = None
    cluster: str | None = None  # where the machines come from (train's `cluster`; None: local)
    options: dict[str, Any] = Field(default_factory=dict)  # what the command was given besides (e.g. plot)


def absolute_paths(problem: dict[str, Any]) -> dict[str, Any]:
    """The problem's file references (catalog, allreduce model, model
    profile) made absolute where they name existing files."""
    out = dict(problem)
    for key in ("catalog", "allreduce", "model"):
        value = out.get(key)
        if isinstance(value, str) and Path(value).exists():
            out[key] = str(Path(value).resolve())
    return out


def write_run_record(folder: str | Path, record: RunRecord) -> None:
    write_json(Path(folder) / RECORD_NAME, record.model_dump())


def read_run_record(folder: str | Path) -> RunRecord | None:
    """The record in `folder`; None when there is none (a run directory
    written before records existed, or not a run directory). A bad field is
    a `ProblemError` naming its JSON path in the file (``plan.allocation[0].count``)."""
    path = Path(folder) / RECORD_NAME
    if not path.exists():
        return None
    data = read_json(path)
    if not isinstance(data, dict) or data.get("format") != RUN_RECORD_FORMAT:
        raise ProblemError(f"is not a thrifty run record (format must be {RUN_RECORD_FORMAT!r})", source=str(path))
    return validate_model(RunRecord, data, source=str(path))


@dataclass(frozen=True)
class CarriedOver:
    """What the earlier sessions of a run left to the next one."""

    seconds: float = 0.0  # the run's clock
    usd: float = 0.0  # its spending
    segments: int = 0  # worlds of workers launched: the next one's index


def _current_run(events: Sequence[dict[str, Any]]) -> Sequence[dict[str, Any]]:
    """The events of the log's last run: from its last ``start`` that is not a resume."""
    first = 0
    for i, e in enumerate(events):
        if e.get("event") == "start" and not e.get("resumed"):
            first = i  # a new run in the same folder: what came before is another run's
    return events[first:]


def finished_run(events: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``finish`` event that ended the run log's last session (every
    iteration it was asked for done); None when the last session did not
    finish (interrupted, failed, killed): there is something to resume."""
    sessions = [e for e in _current_run(events) if e.get("event") in ("start", "finish")]
    return sessions[-1] if sessions and sessions[-1]["event"] == "finish" else None


def newest_run_dir(base: str | Path | None = None) -> Path:
    """The run under ``./thrifty-runs/`` (or `base`) that was active last
    (its run log, or record, written last): the one ``--resume`` without a
    folder goes on with. `ProblemError` when there is none."""
    root = Path(base) if base is not None else Path.cwd() / RUNS_FOLDER
    newest = newest_run(root, RECORD_NAME, ("run.jsonl",))
    if newest is None:
        raise ProblemError(f"there is no run to resume in {root}; give its folder: --resume DIR", path="resume")
    return newest


def carried_over(events: Sequence[dict[str, Any]]) -> CarriedOver:
    """What the sessions of the current run have spent so far, from its run
    log: the run's clock and its spending are totals in every line
    (``elapsed_s``; ``spent_usd``, ``cost_usd`` of ``finish``, ``carried_usd``
    of ``start``), so the largest since the run's first ``start`` is the
    answer, as of the log's last line (a session killed outright loses what
    it spent after that, at most a throughput-log period)."""
    seconds = usd = 0.0
    segments = 0
    for e in _current_run(events):
        seconds = max(seconds, float(e.get("elapsed_s") or 0.0))
        for key in ("spent_usd", "carried_usd") + (("cost_usd",) if e.get("event") == "finish" else ()):
            value = e.get(key)
            if isinstance(value, (int, float)):
                usd = max(usd, float(value))
        if e.get("event") == "launch" and isinstance(e.get("segment"), int):
            segments = max(segments, e["segment"] + 1)
    return CarriedOver(seconds, usd, segments)
