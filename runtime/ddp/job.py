"""What one world of worker processes is asked to do: a `JobSpec`, as JSON.

The training driver writes one job file per launch (``thrifty run`` and
`train()`), and the tuning executor one job per trial launch; a user who
launches the worker entry with torchrun gives the same fields as flags. One
loop (`thrifty.runtime.ddp.loop.run_rank`) carries out every job. Rank,
world size and the rendezvous come from the torchrun-compatible environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``),
never from the job file, so one file serves every rank.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from thrifty.core.errors import ProblemError
from thrifty.core.io import atomic_write_text, read_json
from thrifty.runtime.ddp import storage

__all__ = ["WorkerFault", "JobSpec", "STOP", "METRICS", "DECISION"]

# the names a world's starter and its ranks share in the worlds' protocol (`thrifty.runtime.worlds`)
STOP = "stop"  # the starter's command: checkpoint and stop after the current iteration
METRICS = "metrics"  # rank 0 publishes the latest loss and metrics under this name
DECISION = "iteration-{}"  # the starter's decision after iteration n of an awaiting job: go | save | stop

WorkerFaultKind = Literal["kill", "notice", "slow", "delay_start", "hang"]


@dataclass(frozen=True)
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

    rank: int
    kind: WorkerFaultKind
    at_iteration: int = 0
    until_iteration: int | None = None
    seconds: float = 0.0

    def active(self, done: int) -> bool:
        """For ``slow``: does it slow the iteration after `done` are done?"""
        return done >= self.at_iteration and (self.until_iteration is None or done < self.until_iteration)


@dataclass(frozen=True, kw_only=True)
class JobSpec:
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
    has rank 0 `evaluate` the trainer's metric after every iteration, and
    `await_decision`: the world waits for the scheduler's go, save or stop
    after each iteration. `restore`: ``if-present`` resumes from the
    checkpoint when there is one, ``required`` fails without one, ``never``
    starts fresh.
    """

    trainer: str
    checkpoint_path: str
    global_batch: int | None = None
    iterations: int | None = None
    batches: tuple[int, ...] | None = None
    trainer_args: dict[str, Any] = field(default_factory=dict)
    steps_per_iteration: int | None = 1
    checkpoint_every: int | None = 100
    checkpoint_every_s: float | None = None
    restore: Literal["if-present", "required", "never"] = "if-present"
    evaluate: bool = False
    await_decision: bool = False
    seed: int = 0
    threads: int = 1
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    timeout_s: float = 600.0
    weighting: Literal["batch", "hook", "mean"] = "batch"
    faults: tuple[WorkerFault, ...] = ()
    machine_ids: tuple[str, ...] = ()
    metrics_every_s: float | None = 1.0  # how often the loss and metrics are reported; None: never

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        try:
            storage.parse(self.checkpoint_path)
        except ProblemError as e:
            raise ProblemError(e.message, path="checkpoint_path") from None
        if self.batches is not None:
            self._validate_batches(self.batches)
        elif self.global_batch is not None and self.global_batch < 1:
            raise ProblemError(f"is {self.global_batch}, but must be at least 1", path="global_batch")
        if self.iterations is not None and self.iterations < 1:
            raise ProblemError(f"is {self.iterations}, but must be at least 1", path="iterations")
        for name in ("steps_per_iteration", "checkpoint_every"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ProblemError(f"is {value}, but must be at least 1", path=name)
        if self.metrics_every_s is not None and not self.metrics_every_s > 0:
            raise ProblemError(f"is {self.metrics_every_s}, but must be positive (or None: no reports)",
                               path="metrics_every_s")
        for name, allowed in (("weighting", ("batch", "hook", "mean")), ("backend", ("auto", "gloo", "nccl")),
                              ("restore", ("if-present", "required", "never"))):
            if getattr(self, name) not in allowed:
                raise ProblemError(f"is '{getattr(self, name)}', but must be one of {', '.join(allowed)}",
                                   path=name)
        if self.iterations is None and not self.await_decision:
            raise ProblemError("is missing, but a job that does not await its starter's decisions needs one",
                               path="iterations")

    def _validate_batches(self, batches: tuple[int, ...]) -> None:
        if not batches or any(not isinstance(b, int) or b < 1 for b in batches):
            raise ProblemError(f"is {list(batches)}, but every local batch must be a positive integer",
                               path="batches")
        if sum(batches) != self.global_batch:
            raise ProblemError(f"sum to {sum(batches)}, but the global batch is {self.global_batch}",
                               path="batches")
        if self.weighting == "mean" and len(set(batches)) > 1:
            raise ProblemError(f"is 'mean' (plain DDP averaging), which is wrong for unequal local batches "
                               f"{list(batches)}; use 'batch' or 'hook'", path="weighting")
        if self.machine_ids and len(self.machine_ids) != len(batches):
            raise ProblemError(f"has {len(self.machine_ids)} entries for {len(batches)} ranks", path="machine_ids")

    def with_changes(self, **changes: Any) -> "JobSpec":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["batches"] = None if self.batches is None else list(self.batches)
        out["faults"] = [asdict(f) for f in self.faults]
        out["machine_ids"] = list(self.machine_ids)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str | None = None) -> "JobSpec":
        try:
            data = dict(data)
            if data.get("batches") is not None:
                data["batches"] = tuple(int(b) for b in data["batches"])
            data["faults"] = tuple(WorkerFault(**f) for f in data.get("faults", ()))
            data["machine_ids"] = tuple(data.get("machine_ids", ()))
            return cls(**data)
        except ProblemError as e:
            raise ProblemError(e.message, path=e.path, source=source) from None
        except (KeyError, TypeError, ValueError) as e:
            raise ProblemError(f"is not a valid job: {type(e).__name__}: {e}", source=source) from None

    def write(self, path: str | Path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def read(cls, path: str | Path) -> "JobSpec":
        return cls.from_dict(read_json(path), source=str(path))
