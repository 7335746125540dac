"""What a training run reports: each world of workers it ran
(`SegmentRecord`), the run as a whole (`RunResult`), where it is for a
progress bar (`ProgressSnapshot`), and where its checkpoint lives. (The run
record, ``run.json``, is `rundir.RunRecord`; the run log is `runlog`.)"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, SerializerFunctionWrapHandler, computed_field, field_serializer, model_serializer
from pydantic.dataclasses import dataclass as record_dataclass

from thrifty.core.validation import RECORD_CONFIG, without_unset
from pathlib import Path

from thrifty.runtime.events import Preemption
from thrifty.runtime.training.monitor import ThroughputWindow
from thrifty.runtime.training.replan import Replan
from thrifty.solver.plan import Plan

__all__ = ["SegmentRecord", "RunResult", "ProgressSnapshot", "checkpoint_location"]


@record_dataclass(frozen=True, config=RECORD_CONFIG)
class SegmentRecord:
    """One world of workers: from which iteration, to where, and how it ended;
    the ``segment_end`` event of the run log, with the figures derived below
    (`thrifty.core.validation.json_object`)."""

    index: int
    config: str
    batches: tuple[int, ...]
    start_iteration: int
    reached_iteration: int  # the last iteration the workers reported
    committed_iteration: int  # the last checkpoint: where the next world starts
    ended: str  # "finished", "stopped", "killed", "lost"
    launch_s: float | None  # from asking for machines to the first iteration done
    checkpoint_s: tuple[float, ...]  # seconds per save
    throughput: float | None  # iterations per second in steady state, from the workers' clock
    predicted_iteration_s: float | None = None  # what the segment's plan predicted for one iteration
    # what the models corrected online predicted for it when the segment ended (None: nothing measured yet)
    corrected_iteration_s: float | None = None

    @model_serializer(mode="wrap")
    def _corrected_when_known(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``corrected_iteration_s`` is written only when the models were corrected."""
        return without_unset(handler(self), "corrected_iteration_s")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def lost_iterations(self) -> int:
        return self.reached_iteration - self.committed_iteration

    @computed_field  # type: ignore[prop-decorator]
    @property
    def actual_iteration_s(self) -> float | None:
        """The steady-state iteration time the workers measured."""
        return 1.0 / self.throughput if self.throughput else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def prediction_ratio(self) -> float | None:
        """Measured over predicted iteration time (1.0: the prediction held)."""
        if self.actual_iteration_s is None or not self.predicted_iteration_s:
            return None
        return self.actual_iteration_s / self.predicted_iteration_s

@record_dataclass(frozen=True, config=RECORD_CONFIG)
class RunResult:
    """How a run ended. Its JSON (``thrifty run --json``,
    `thrifty.core.validation.json_object`) gives the configurations of its
    plans (``configs``), not the plans, and leaves the checkpoint out."""

    run_id: str
    run_dir: Path
    iterations: int
    total_iterations: int
    elapsed_s: float
    cost_usd: float
    time_limit_s: float | None
    cost_limit_usd: float | None
    plans: Annotated[tuple[Plan, ...], Field(exclude=True)]
    replans: tuple[Replan, ...]
    preemptions: tuple[Preemption, ...]
    segments: tuple[SegmentRecord, ...]
    # where the checkpoint is: a path, or s3://bucket/key; "" = run_dir/checkpoint.pt
    checkpoint: Annotated[str, Field(exclude=True)] = ""

    @field_serializer("run_dir")
    def _run_dir_text(self, run_dir: Path) -> str:
        return str(run_dir)

    @property
    def checkpoint_path(self) -> Path | str:
        """The checkpoint: a `Path` when it is on a file system, else its s3:// URL."""
        from thrifty.runtime.ddp import storage

        location = checkpoint_location(self.checkpoint or None, self.run_dir)
        return location if storage.is_remote(location) else Path(location)

    @property
    def log_path(self) -> Path:
        return self.run_dir / "run.jsonl"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def within_limits(self) -> bool:
        return ((self.time_limit_s is None or self.elapsed_s <= self.time_limit_s)
                and (self.cost_limit_usd is None or self.cost_usd <= self.cost_limit_usd))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def exceeded(self) -> list[str]:
        """What the run went past, in words (empty within its limits)."""
        out = []
        if self.time_limit_s is not None and self.elapsed_s > self.time_limit_s:
            out.append(f"time {self.elapsed_s:,.1f} s > limit {self.time_limit_s:g} s "
                       f"(+{self.elapsed_s - self.time_limit_s:,.1f} s)")
        if self.cost_limit_usd is not None and self.cost_usd > self.cost_limit_usd:
            out.append(f"cost ${self.cost_usd:,.4f} > budget ${self.cost_limit_usd:g} "
                       f"(+${self.cost_usd - self.cost_limit_usd:,.4f})")
        return out

    @computed_field  # type: ignore[prop-decorator]
    @property
    def configs(self) -> list[str]:
        """Each plan's configuration, in the order they ran."""
        return [p.config for p in self.plans]

@dataclass(frozen=True)
class ProgressSnapshot:
    """What `thrifty run`'s progress bar shows: predicted against actual."""

    state: str  # "launching", "training", "stopping"
    config: str
    iterations: int
    total_iterations: int
    elapsed_s: float
    spent_usd: float
    predicted_total_s: float | None  # when the current plan says the job ends (since the start)
    predicted_cost_usd: float | None
    projected_total_s: float | None  # when the measured throughput says it ends
    projected_cost_usd: float | None
    window: ThroughputWindow | None
    time_limit_s: float | None
    cost_limit_usd: float | None
    loss: float | None = None  # the training loss last reported (global-batch mean)
    metrics: Mapping[str, float] | None = None  # the trainer's own metrics last reported

    @property
    def eta_s(self) -> float | None:
        """Seconds left by the measured throughput."""
        return None if self.projected_total_s is None else max(0.0, self.projected_total_s - self.elapsed_s)


def checkpoint_location(checkpoint: str | None, run_dir: Path) -> str:
    """Where a run's checkpoint lives: `checkpoint` (a path or s3://bucket/key), or in its run directory."""
    return checkpoint or str(run_dir / "checkpoint.pt")
