"""What one world of worker processes is asked to do: a `JobSpec`, as JSON.

The training driver (``thrifty run`` and `train()`) makes one job per
launch, and the tuning executor one per trial launch; both give it to their
ranks one way: as JSON on the command line of the one worker entry
(`thrifty.runtime.ddp.worker`, ``--job JSON``). The driver also keeps each
job in its run folder, which a user may hand to the entry under torchrun
(``--job @FILE``), or give the same fields as flags. One
loop (`thrifty.runtime.ddp.loop.run_rank`) carries out every job. Rank,
world size and the rendezvous come from the torchrun-compatible environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``),
never from the job file, so one file serves every rank.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
from pydantic.dataclasses import dataclass

from thrifty.core.errors import ProblemError, in_file
from thrifty.core.io import atomic_write_text, read_json
from thrifty.core.validation import FieldPathError, problem_of
from thrifty.runtime.ddp import storage

__all__ = ["WorkerFault", "JobSpec", "STOP", "METRICS", "DECISION", "CLOCK", "TRIAL_METRIC"]

# the names a world's starter and its ranks share in the worlds' protocol (`thrifty.runtime.worlds`)
STOP = "stop"  # the starter's command: checkpoint and stop after the current iteration
METRICS = "metrics"  # rank 0 sends every batch of loss and metrics records under this name (`RankChannel.send`)
CLOCK = "clock/{}"  # rank r publishes its cumulative clock marks under CLOCK.format(r)
DECISION = "iteration-{}"  # the starter's decision after iteration n of an awaiting job: go | save | stop
TRIAL_METRIC = "metric"  # a tuning trial's metric: a TunableTrainer's, and a loop's unless the job names another

WorkerFaultKind = Literal["kill", "notice", "slow", "delay_start", "hang"]
# strict scalars (a flag is not a number, nor a number a flag, nor "8" a number); the containers are not
# strict, so a JSON list is a tuple
_Int = Annotated[int, pydantic.Strict()]
_Count = Annotated[int, pydantic.Strict(), pydantic.Field(ge=1)]
_Seconds = Annotated[float, pydantic.Strict(), pydantic.Field(gt=0, allow_inf_nan=False)]
_Flag = Annotated[bool, pydantic.Strict()]
_Text = Annotated[str, pydantic.Strict()]


@dataclass(frozen=True, config=pydantic.ConfigDict(extra="forbid"))
class WorkerFault:
    """A fault one rank injects into itself (`thrifty.runtime.training.faults`
    turns the public fault descriptions into these).

    ``kill``: SIGKILL itself once `at_iteration` iterations are done (a
    preemption without notice). ``notice``: post a spot-interruption notice
    with `seconds` left at that point and go on. ``slow``: sleep `seconds`
    more in each iteration from `at_iteration` until `until_iteration`
    (None: to the end). ``delay_start``: sleep `seconds` before joining the
    world. ``hang``: stop making progress at `at_iteration`.
    """

    rank: Annotated[int, pydantic.Strict(), pydantic.Field(ge=0)]
    kind: WorkerFaultKind
    at_iteration: Annotated[int, pydantic.Strict(), pydantic.Field(ge=0)] = 0
    until_iteration: _Int | None = None
    seconds: Annotated[float, pydantic.Strict(), pydantic.Field(ge=0, allow_inf_nan=False)] = 0.0

    def active(self, done: int) -> bool:
        """For ``slow``: does it slow the iteration after `done` are done?"""
        return done >= self.at_iteration and (self.until_iteration is None or done < self.until_iteration)


class JobSpec(pydantic.BaseModel):
    """One world's job: train `trainer` (called with `trainer_args`) from
    its checkpoint at `checkpoint_path` (a path, or an ``s3://bucket/key``
    URL that every machine reaches: `thrifty.runtime.ddp.storage`) for
    `iterations` iterations of `steps_per_iteration` optimizer steps each,
    rank r on local batch `batches[r]` of the global `global_batch`.

    A training job (`thrifty.runtime.training`) gives every number: one step
    per iteration, a fixed end, periodic checkpoints, and the starter's
    ``stop`` command read without waiting. A tuning trial
    (`thrifty.runtime.tuning.executors.worlds`) leaves the batch to the
    trainer (`global_batch` None: its ``batch_size``, split evenly), the
    iteration to the trainer (`steps_per_iteration` None: its own, else one
    pass over the dataset), the end to the scheduler (`iterations` None),
    has the ranks `evaluate` the trial's metric after every iteration, and
    `await_decision`: the world waits for the scheduler's go, save or stop
    after each iteration. A trial whose job is a loop function reports the
    metric named `metric` (the experiment's, e.g. ``val_loss``; None: the
    name ``metric``) and the scheduler sees it as a score by `mode`
    (``min``: its negation); a `TunableTrainer`'s metric is its own, higher
    is better. A loop's trial has its global batch (`global_batch`, else
    `thrifty.runtime.ddp.trainer.loop_batch_size`) and, with
    `steps_per_iteration` None, one iteration per epoch of the data it gives
    ``ctx.prepare_loader``. `restore`: ``if-present`` resumes from the
    checkpoint when there is one, ``required`` fails without one, ``never``
    starts fresh.

    A pydantic model, frozen, strict in its scalars (a flag is not a number,
    nor a number a flag) and closed (an unknown key is an error): every way of making one
    (keywords, `from_json`, `read`) raises a `ProblemError` naming the JSON
    path of the first bad field.
    """

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    trainer: _Text
    checkpoint_path: _Text
    global_batch: _Count | None = None
    iterations: _Count | None = None
    batches: Annotated[tuple[_Count, ...], pydantic.Field(min_length=1)] | None = None
    trainer_args: dict[str, Any] = pydantic.Field(default_factory=dict)
    steps_per_iteration: _Count | None = 1
    checkpoint_every: _Count | None = 100
    checkpoint_every_s: _Seconds | None = None
    restore: Literal["if-present", "required", "never"] = "if-present"
    evaluate: _Flag = False
    metric: _Text | None = None  # a loop's trial metric (reported under this name); None: "metric"
    mode: Literal["max", "min"] = "max"  # a loop's trial metric: max, or min (the scheduler sees -value)
    await_decision: _Flag = False
    seed: _Int = 0
    threads: _Count = 1
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    timeout_s: _Seconds = 600.0
    weighting: Literal["batch", "hook", "mean"] = "batch"
    faults: tuple[WorkerFault, ...] = ()
    machine_ids: tuple[_Text, ...] = ()
    metrics_every_s: _Seconds | None = 1.0  # how often the loss and metrics are reported; None: never
    # how often each rank publishes its clock marks (forward, backward, exchange, step; `CLOCK`); None: never
    clock_every_s: _Seconds | None = None

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except pydantic.ValidationError as e:
            raise problem_of(e) from None

    @pydantic.field_validator("checkpoint_path")
    @classmethod
    def _location(cls, value: str) -> str:
        try:
            storage.parse(value)
        except ProblemError as e:
            raise FieldPathError((), e.message) from None
        return value

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> "JobSpec":
        batches = self.batches
        if batches is not None:
            if sum(batches) != self.global_batch:
                raise FieldPathError(("batches",), f"sum to {sum(batches)}, but the global batch is "
                                                   f"{self.global_batch}")
            if self.weighting == "mean" and len(set(batches)) > 1:
                raise FieldPathError(("weighting",), f"is 'mean' (plain DDP averaging), which is wrong for "
                                                     f"unequal local batches {list(batches)}; use 'batch' or 'hook'")
            if self.machine_ids and len(self.machine_ids) != len(batches):
                raise FieldPathError(("machine_ids",), f"has {len(self.machine_ids)} entries for "
                                                       f"{len(batches)} ranks")
        if self.iterations is None and not self.await_decision:
            raise FieldPathError(("iterations",), "is missing, but a job that does not await its starter's "
                                                  "decisions needs one")
        return self

    def with_changes(self, **changes: Any) -> "JobSpec":
        """This job with `changes`, validated again."""
        return JobSpec(**{**{name: getattr(self, name) for name in type(self).model_fields}, **changes})

    def to_json(self) -> str:
        """The job as JSON text (what `from_json` reads)."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes, source: str | None = None) -> "JobSpec":
        """The job that JSON `text` describes; a `ProblemError` naming the bad field (and `source`)."""
        return cls.from_data(_loads(text, source), source)

    @classmethod
    def from_data(cls, data: Any, source: str | None = None) -> "JobSpec":
        """The job that JSON-shaped `data` describes; a `ProblemError` naming the bad field (and `source`)."""
        if not isinstance(data, dict):
            raise ProblemError(f"is {type(data).__name__}, but a job must be a JSON object", source=source)
        with in_file(source) if source else contextlib.nullcontext():
            return cls(**data)

    def write(self, path: str | Path) -> None:
        atomic_write_text(path, self.model_dump_json(indent=1) + "\n")

    @classmethod
    def read(cls, path: str | Path) -> "JobSpec":
        return cls.from_data(read_json(path), source=str(path))


def _loads(text: str | bytes, source: str | None) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        raise ProblemError(f"is not valid JSON: {e}", source=source) from None
