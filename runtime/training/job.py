"""What one world of worker processes is asked to do: a `JobSpec`, as JSON.

The driver writes one job file per launch (``thrifty run`` and `train()`); a
user who launches the worker entry with torchrun gives the same fields as
flags. Rank, world size and the rendezvous come from the torchrun-compatible
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``), never from the job file, so one file serves every rank.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from thrifty.datasets.errors import ProblemError
from thrifty.datasets.io import atomic_write_text, read_json

__all__ = ["WorkerFault", "JobSpec"]

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


@dataclass(frozen=True)
class JobSpec:
    trainer: str
    global_batch: int
    iterations: int
    batches: tuple[int, ...]
    checkpoint_path: str
    trainer_args: dict[str, Any] = field(default_factory=dict)
    checkpoint_every: int | None = 100
    checkpoint_every_s: float | None = None
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
        if not self.batches or any(not isinstance(b, int) or b < 1 for b in self.batches):
            raise ProblemError(f"is {list(self.batches)}, but every local batch must be a positive integer",
                               path="batches")
        if sum(self.batches) != self.global_batch:
            raise ProblemError(f"sum to {sum(self.batches)}, but the global batch is {self.global_batch}",
                               path="batches")
        if self.iterations < 1:
            raise ProblemError(f"is {self.iterations}, but must be at least 1", path="iterations")
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise ProblemError(f"is {self.checkpoint_every}, but must be at least 1", path="checkpoint_every")
        if self.metrics_every_s is not None and not self.metrics_every_s > 0:
            raise ProblemError(f"is {self.metrics_every_s}, but must be positive (or None: no reports)",
                               path="metrics_every_s")
        if self.weighting not in ("batch", "hook", "mean"):
            raise ProblemError(f"is '{self.weighting}', but must be 'batch', 'hook' or 'mean'", path="weighting")
        if self.weighting == "mean" and len(set(self.batches)) > 1:
            raise ProblemError(f"is 'mean' (plain DDP averaging), which is wrong for unequal local batches "
                               f"{list(self.batches)}; use 'batch' or 'hook'", path="weighting")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ProblemError(f"is '{self.backend}', but must be 'auto', 'gloo' or 'nccl'", path="backend")
        if self.machine_ids and len(self.machine_ids) != len(self.batches):
            raise ProblemError(f"has {len(self.machine_ids)} entries for {len(self.batches)} ranks", path="machine_ids")

    def with_changes(self, **changes: Any) -> "JobSpec":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["batches"] = list(self.batches)
        out["faults"] = [asdict(f) for f in self.faults]
        out["machine_ids"] = list(self.machine_ids)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str | None = None) -> "JobSpec":
        try:
            data = dict(data)
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
