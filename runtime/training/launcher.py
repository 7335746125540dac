"""One world of worker processes on this host, from start to end: a `Segment`.

A segment is a worker world (`thrifty.runtime.worlds.World`): the
driver hosts the rendezvous store (a ``TCPStore`` on an ephemeral port of
127.0.0.1, so no port can be raced for) and starts one worker process per rank
(forked by the fork server, which has torch imported; the one worker entry,
`thrifty.runtime.ddp.worker`, given the job as JSON) with the torchrun environment,
each rank's ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and ``GROUP_RANK`` from its
machine. The workers report through the world's one protocol; `Segment.poll`
looks at the world through the worlds' one watcher
(`thrifty.runtime.worlds.watch.Watch`), never blocking, and turns its events
and typed outcome into a `SegmentPoll`, or into an exception when waiting
longer would be a hang:

- the world does not form within ``world_timeout_s``: `WorldFormationError`;
- a worker raises: `WorkerFailed` with its message (traceback in its log);
- no progress for ``stall_timeout_s``: `StallError`;
- a stop that takes longer than ``stop_timeout_s``: the workers are killed
  and the segment ends ``killed`` (the run restarts from its last checkpoint).

A worker that exits with a non-zero code and no error report is *lost* (a
machine taken away without notice); the driver decides what that means.
Every process is killed and reaped when the segment closes, and each one dies
with the fork server, which dies with the driver (``PR_SET_PDEATHSIG`` on
Linux), so nothing outlives a run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from thrifty.core.errors import ProblemError
from thrifty.runtime.worlds import Launcher, World, WorldFailed
from thrifty.runtime.worlds.watch import Failed, Finished, Killed, Lost, ServerGone, Stalled, Watch
from thrifty.runtime.ddp.job import CLOCK, METRICS, STOP, JobSpec
from thrifty.runtime.ddp.worker import ENTRY, PRELOAD, job_argv
from thrifty.runtime.training.errors import StallError, TrainingError, WorkerFailed, WorldFormationError

__all__ = ["RankSlot", "SegmentPoll", "Segment", "LOCAL_HOSTS", "WORKER_PRELOAD"]

LOCAL_HOSTS = ("127.0.0.1", "localhost")
# imported by the fork server before it forks workers: the worker and what it loads at start
WORKER_PRELOAD = (*PRELOAD, "thrifty.runtime.training.examples")
ERROR_GRACE_S = 0.5  # after an error report, how long to look for a rank lost without one
EXIT_GRACE_S = 5.0  # after the workers said they are done, how long they may take to exit


@dataclass(frozen=True)
class RankSlot:
    """One worker process: its rank, the machine it runs on and its batch."""

    rank: int
    machine_id: str
    instance_type: str
    market: str
    host: str
    machine_index: int
    local_rank: int
    local_world_size: int
    batch: int


@dataclass
class SegmentPoll:
    iteration: int | None = None  # iterations done, from rank 0's last report
    iteration_at: float | None = None  # unix time of that report
    events: list[dict[str, Any]] = field(default_factory=list)  # new worker events
    clocks: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> its new cumulative clock marks
    formed: bool = False
    lost: list[tuple[int, int]] = field(default_factory=list)  # (rank, exit code) gone without a report
    ended: Literal["finished", "stopped", "killed"] | None = None


class Segment:
    """The processes of one world, watched by polling (never blocking)."""

    def __init__(self, job: JobSpec, slots: Sequence[RankSlot], folder: str | Path, index: int = 0, *,
                 world_timeout_s: float = 120.0, stall_timeout_s: float = 600.0, stop_timeout_s: float = 120.0,
                 env: dict[str, str] | None = None, launcher: Launcher | None = None):
        batches = job.batches or ()  # a training job always lists its local batches
        if len(slots) != len(batches):
            raise ProblemError(f"{len(slots)} rank slots for {len(batches)} local batches")
        remote = sorted({s.host for s in slots if s.host not in LOCAL_HOSTS})
        if remote and launcher is None:
            raise ProblemError(f"the local launcher starts workers on this host only, but machines run on "
                               f"{', '.join(remote)}: start the worker entry there with torchrun "
                               "(python -m thrifty.runtime.ddp.worker --help)")
        self.job, self.slots, self.index = job, list(slots), index
        self.folder = Path(folder)
        self.world_timeout_s, self.stall_timeout_s = world_timeout_s, stall_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.extra_env = dict(env or {})
        self.launcher = launcher
        self._world: World | None = None
        self._records: list[dict[str, Any]] = []  # read by `poll`, not yet taken (`take_records`)
        self._watch: Watch | None = None
        self.started_at: float | None = None
        self.formed_at: float | None = None
        self.stop_requested_at: float | None = None
        self.start_iteration: int | None = None
        self.last_checkpoint: int | None = None
        self.end_event: dict[str, Any] | None = None
        self.checkpoints: list[dict[str, Any]] = []
        self._joining: set[int] = set()
        self._ready: set[int] = set()
        self._end_seen_at: float | None = None
        self._closed = False

    # -- life cycle -----------------------------------------------------------------------
    def log_path(self, rank: int) -> Path:
        return self.folder / "logs" / f"segment{self.index}-rank{rank}.log"

    @property
    def procs(self) -> list[Any]:
        return self._world.procs if self._world is not None else []

    @property
    def world(self) -> World:
        if self._world is None:
            raise RuntimeError(f"segment {self.index} has not started")
        return self._world

    @property
    def watch(self) -> Watch:
        if self._watch is None:
            raise RuntimeError(f"segment {self.index} has not started")
        return self._watch

    def start(self) -> None:
        self.job.write(self.folder / f"job-segment{self.index}.json")  # the run folder's record of it

        def rank_env(rank: int) -> dict[str, str]:
            slot = self.slots[rank]
            return {"LOCAL_RANK": str(slot.local_rank), "LOCAL_WORLD_SIZE": str(slot.local_world_size),
                    "GROUP_RANK": str(slot.machine_index)}

        self._world = World(len(self.slots), ENTRY, job_argv(self.job), logs=self.log_path,
                           env=self.extra_env, rank_env=rank_env, backend="gloo", threads=self.job.threads,
                           timeout_s=max(self.world_timeout_s, self.job.timeout_s), preload=WORKER_PRELOAD,
                           launcher=self.launcher, where=f"segment {self.index}")
        # the stall clock runs from the start until the world forms (then it is the formation timeout)
        self._watch = Watch(self._world, error_grace_s=ERROR_GRACE_S, settle_timeout_s=self.world_timeout_s,
                            stall_timeout_s=self.world_timeout_s, progress_ranks=(0,),
                            ending_events=("error", "done", "stopped"), on_event=self._note)
        self.started_at = time.monotonic()
        try:
            self.world.start()
        except WorldFailed as e:
            self.close()
            raise TrainingError(str(e)) from e

    def request_stop(self) -> None:
        """Ask the workers to checkpoint after their current iteration and exit."""
        if self.stop_requested_at is None and not self._closed:
            self.world.command(STOP)
            self.stop_requested_at = time.monotonic()
            if len(self._ready) == len(self.slots):
                self.watch.stall_timeout_s = None  # the stop timeout holds from now on (the formation one too)

    def kill(self, ranks: Sequence[int] | None = None, as_loss: bool = False) -> None:
        """SIGKILL the given ranks (default: all) that still run. Ranks the
        driver kills are not reported as lost, unless `as_loss` (the fault
        injector taking a machine away, which must look like the real thing)."""
        if self._closed or self._watch is None:
            return
        self._watch.kill(ranks, as_loss)

    def close(self) -> None:
        """Kill whatever still runs, reap every process, stop the store."""
        if self._closed:
            return
        self.kill()
        if self._world is not None:
            self._world.close()
        self._closed = True

    def __enter__(self) -> "Segment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ranks_of(self, machine_id: str) -> list[int]:
        return [s.rank for s in self.slots if s.machine_id == machine_id]

    # -- watching -------------------------------------------------------------------------
    def _note(self, e: dict[str, Any]) -> None:
        """What the segment keeps of a worker's event."""
        kind = e.get("event")
        if kind == "joining":
            self._joining.add(e["rank"])
        elif kind == "ready":
            self._ready.add(e["rank"])
            self.start_iteration = e["start_iteration"]
            if len(self._ready) == len(self.slots):  # formed: the stall clock starts (none while stopping)
                self.watch.sign()
                self.watch.stall_timeout_s = self.stall_timeout_s if self.stop_requested_at is None else None
        elif kind == "checkpoint":
            self.last_checkpoint = e["iteration"]
            self.checkpoints.append(e)
            self.watch.sign()
        elif kind in ("done", "stopped"):
            self.end_event = e

    def poll(self) -> SegmentPoll:
        """What happened since the last poll; raises when waiting on would hang."""
        now = time.monotonic()
        look = self.watch.look()
        out = SegmentPoll(events=look.events, formed=len(self._ready) == len(self.slots))
        # records after the events: what rank 0 sent before posting its end is read with the end
        self._records += [r for batch in self.world.receive(METRICS) for r in batch]
        if self.job.clock_every_s is not None and out.formed:
            for rank in range(len(self.slots)):
                marks = self.world.latest(CLOCK.format(rank))
                if marks is not None:
                    out.clocks[rank] = marks
        progress = self.watch.progress.get(0)
        if progress is not None:
            out.iteration, out.iteration_at = progress
        if out.formed and self.formed_at is None:
            self.formed_at = now
        outcome = look.outcome
        if isinstance(outcome, Lost):
            out.lost = list(outcome.ranks)
            return out
        if isinstance(outcome, Killed):
            out.ended = "killed"
            return out
        if isinstance(outcome, Failed):
            self.close()
            raise WorkerFailed(f"rank {outcome.rank} failed: {outcome.reason} (log: {self.log_path(outcome.rank)})",
                               rank=outcome.rank, details=outcome.details)
        if self.watch.errors:
            return out  # an error is reported once every machine has answered since (the outcome `Failed`)
        if isinstance(outcome, Finished):
            if self.end_event is None:
                self.close()
                raise WorkerFailed(f"the workers of segment {self.index} exited without finishing or stopping; "
                                   f"logs: {self.log_path(0).parent}")
            out.ended = "finished" if self.end_event["event"] == "done" else "stopped"
            return out
        if isinstance(outcome, ServerGone):
            self.close()
            raise WorkerFailed("the worker fork server exited while workers ran; the last checkpoint is kept")
        if self.end_event is not None:  # the work is checkpointed: give the exits a grace, then end them
            self._end_seen_at = self._end_seen_at or now
            if now - self._end_seen_at > EXIT_GRACE_S:
                self.kill()
                out.ended = "finished" if self.end_event["event"] == "done" else "stopped"
                return out
        if isinstance(outcome, Stalled):
            self._stalled(out.formed)
        if self.stop_requested_at is not None and now - self.stop_requested_at > self.stop_timeout_s:
            self.kill()  # the run restarts from its last checkpoint
            out.ended = "killed"
        return out

    def take_records(self) -> list[dict[str, Any]]:
        """The loss and metrics records rank 0 sent ({iteration, at, loss,
        metrics}, in order) that polls read and nobody took yet: also those of
        a poll that raised (a worker failed), so a failed run keeps them."""
        records, self._records = self._records, []
        return records

    def _stalled(self, formed: bool) -> None:
        """The world did not form within the world timeout, or made no progress for the stall timeout."""
        if not formed:
            missing = sorted(set(range(len(self.slots))) - self._joining)
            why = (f"ranks {', '.join(map(str, missing))} never joined" if missing
                   else "every rank joined, but the process group did not form")
            self.close()
            raise WorldFormationError(f"the world of {len(self.slots)} workers did not form within "
                                      f"{self.world_timeout_s:g} s ({why}); logs: {self.log_path(0).parent}")
        progress = self.watch.progress.get(0)
        done = progress[0] if progress else self.start_iteration
        self.close()
        raise StallError(f"no progress for {self.stall_timeout_s:g} s (at iteration {done}); stopped the "
                         f"workers; the last checkpoint is kept; logs: {self.log_path(0).parent}")
