"""A job's own loop timed in real DDP worker processes on this host: what
``thrifty validate JOB`` and ``thrifty profile-scaling JOB`` measure when the
job is a loop function ``train(ctx, **args)`` or a `Trainer` factory (the
job contract, `thrifty.runtime.ddp.context`).

The ranks are the ranks ``thrifty run`` starts: a worker world
(`thrifty.runtime.worlds.World`, forked from the fork server), each rank
carrying out a `JobSpec` through the one rank loop
(`thrifty.runtime.ddp.loop.run_rank`): its `JobContext` with the given
per-rank batches, DDP with the batch-share reweighting, the user's loop (or
`trainer_loop`), the flag exchange and the progress reports of a training
job. Only its channel to this process is wrapped (`_TimingChannel`): the job
asks for the clock marks of online calibration
(`thrifty.runtime.ddp.clock`, ``clock_every_s``) at every iteration, and the
wrapper keeps each rank's marks in the rank instead of sending them, with the
time of each report. After the job's last iteration each rank posts them as
its result. Nothing else differs from a run: no metrics are recorded
(``metrics_every_s`` None) and the only checkpoint is the one a job writes at
its end, after the timed iterations, into a temporary folder of rank 0's
machine, which the rank removes (so a world on a cluster's machines, with a
`placement`, needs no storage they share).

Per rank and timed iteration, from the clock marks:

- ``iteration_s``: from the report that ended the previous iteration to the
  report that ended this one: the whole iteration of the user's loop, data
  loading, ``zero_grad()``, the report and the runtime's work at it
  included;
- ``forward_s``: the prepared model's forward passes (the loss is not in
  it: it is computed outside the model);
- ``compute_s``: from the first forward pass's start to the last gradient
  ready, less the forward passes: the loss and the backward pass;
- ``exchange_s``: from the last gradient ready to the optimizer step's
  start: DDP's allreduce not yet done when the backward pass ended (the
  exposed communication, with any wait for a slower rank), its copy back,
  and what the loop does in between (gradient clipping);
- ``backward_s``: ``compute_s + exchange_s``, as the truth loop's backward
  (`thrifty.runtime.measure.truth`) holds its exposed communication;
- ``step_s``: the rest of the iteration: the optimizer step, and everything
  outside the model's passes (data, ``zero_grad()``, a schedule, the
  report). This is how `thrifty.runtime.measure.job_profile` splits a
  job's iteration, so the prediction's step compares with it.

On CUDA the marks are the host's clock, read without synchronizing the GPU
(as a run's clock marks are): a part ends when the host got past it, so the
parts follow the GPU's work only where the loop waits for it; the whole
iteration, report to report, is the GPU's when the loop reads a result once
an iteration (``loss.item()``).

The clock marks count from the world's `TIMING_WARMUP`-th iteration, so at
least ``TIMING_WARMUP + 1`` iterations are untimed whatever the warm-up
asked; one more iteration than timed runs at the end, holding the job's
final checkpoint.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from thrifty.core.errors import ProblemError
from thrifty.runtime.ddp.job import CLOCK
from thrifty.runtime.worlds import Failed, Finished, Killed, Lost, RankChannel, ServerGone, Stalled, Watch, World, \
    WorldFailed, serve_rank

__all__ = ["JobRun", "measure_job", "measure_job_rounds", "job_scaling", "first_timed", "JOB_PARTS"]

_ENTRY = "thrifty.runtime.measure.job_truth:_rank"
_PRELOAD = ("thrifty.runtime.measure.job_truth", "thrifty.runtime.ddp.loop", "thrifty.runtime.ddp.context")
JOB_PARTS = ("iteration_s", "forward_s", "compute_s", "exchange_s", "step_s")
_POLL_S = 0.05
_EVERY_S = 1e-9  # the clock marks' publication period: every iteration


@dataclass(frozen=True)
class JobRun:
    """One world's timed iterations of a job, in seconds: per part of
    `JOB_PARTS` an array of shape (ranks, iterations) (module docstring);
    `started_at`: the unix time rank 0 began its first iteration;
    `launched_at`: when the world was started."""

    batches: tuple[int, ...]
    parts: dict[str, np.ndarray]
    started_at: float
    launched_at: float

    def slowest(self, part: str = "iteration_s") -> np.ndarray:
        """Per iteration, the largest time of `part` over the ranks."""
        return np.max(self.parts[part], axis=0)


def first_timed(warmup: int) -> int:
    """The number of untimed iterations before the timed ones: `warmup`, and
    at least one past the clock marks' own warm-up."""
    from thrifty.runtime.ddp.context import TIMING_WARMUP

    return max(warmup, TIMING_WARMUP + 1)


# --- one rank ------------------------------------------------------------------------------


class _TimingChannel(RankChannel):
    """The rank's channel, keeping its clock marks and the time of each
    report in the rank (module docstring); its result, posted after the
    job's last iteration, is the marks of the timed iterations."""

    def __init__(self, channel: RankChannel, timed: tuple[int, int], last: int, folder: str):
        super().__init__(channel.store, channel.rank, channel.world_size, channel.timeout_s)
        self.timed, self.last, self.folder = timed, last, folder
        self.marks: dict[int, tuple[float, dict[str, float]]] = {}
        self.posted = False

    def publish(self, name: str, value: Any) -> None:
        if name != CLOCK.format(self.rank):
            super().publish(name, value)
            return
        iteration = int(value["iteration"])
        self.marks[iteration] = (time.perf_counter(), dict(value["sum"]))
        if iteration >= self.last and not self.posted:  # the last report: its checkpoint is written
            self.posted = True
            shutil.rmtree(self.folder, ignore_errors=True)
            self.finish(self._timed_parts())

    def _timed_parts(self) -> dict[str, list[float]]:
        begin, end = self.timed
        missing = [i for i in range(begin, end + 1) if i not in self.marks]
        if missing:
            raise ProblemError(f"the clock marks of iterations {missing[:5]} are missing: the job reported "
                               "fewer iterations than it drew")
        out: dict[str, list[float]] = {part: [] for part in JOB_PARTS}
        for i in range(begin + 1, end + 1):
            (t0, s0), (t1, s1) = self.marks[i - 1], self.marks[i]
            forward, compute = s1["forward"] - s0["forward"], s1["backward"] - s0["backward"]
            exchange = s1["exchange"] - s0["exchange"]
            whole = t1 - t0
            for part, v in zip(JOB_PARTS, (whole, forward, compute, exchange,
                                           max(0.0, whole - forward - compute - exchange))):
                out[part].append(v)
        return out


def _rank(argv: list[str]) -> None:
    """Entry point of one rank: the job, carried out by the rank loop."""
    settings = json.loads(argv[0])

    def body(channel: RankChannel) -> None:
        from thrifty.runtime.ddp.job import JobSpec
        from thrifty.runtime.ddp.loop import run_rank

        folder = tempfile.mkdtemp(prefix="thrifty-job-timing-")
        try:
            job = JobSpec.from_json(settings["job"]).with_changes(checkpoint_path=f"{folder}/checkpoint.pt")
            assert job.iterations is not None
            run_rank(job, _TimingChannel(channel, tuple(settings["timed"]), job.iterations, folder))
        finally:  # a rank that failed (one that finished leaves the process in run_rank)
            shutil.rmtree(folder, ignore_errors=True)

    serve_rank(body)


# --- the starter -------------------------------------------------------------------------------


def measure_job(spec: str, args: Mapping[str, Any], batches: Sequence[int], warmup: int, iterations: int, *,
                device: str = "cpu", threads: int = 1, timeout_s: float = 300.0,
                on_progress: Callable[[int], None] | None = None, launcher: Any = None,
                rank_env: Callable[[int], Mapping[str, str]] | None = None) -> JobRun:
    """The job `spec` (with `args`) run as ``len(batches)`` ranks, rank r on
    local batch ``batches[r]``: `first_timed(warmup)` untimed iterations,
    then `iterations` timed ones (module docstring). A loop that fails is a
    `ProblemError` naming the rank and its log; a world that dies or stalls
    for `timeout_s`, a `WorldFailed`."""
    from thrifty.runtime.ddp.job import JobSpec

    lead = first_timed(warmup)
    # the checkpoint's place is each rank's own (`_rank`): this one only passes the job's checks
    job = JobSpec(trainer=spec, trainer_args=dict(args), checkpoint_path="rank-temporary-folder/checkpoint.pt",
                  global_batch=sum(batches), batches=tuple(batches), iterations=lead + iterations + 1,
                  checkpoint_every=None, restore="never", threads=threads,
                  backend="nccl" if device == "cuda" else "gloo", timeout_s=float(timeout_s),
                  metrics_every_s=None, clock_every_s=_EVERY_S)
    settings = {"job": job.to_json(), "timed": [lead, lead + iterations]}
    world = World(len(batches), _ENTRY, [json.dumps(settings)], where=f"job '{spec}' on batches {list(batches)}",
                  backend=job.backend, threads=threads, timeout_s=timeout_s,
                  preload=(*_PRELOAD, spec.split(":")[0]), launcher=launcher, rank_env=rank_env)
    launched = time.time()
    results, started = _follow(world, timeout_s, on_progress)
    parts = {part: np.array([r[part] for r in results]) for part in JOB_PARTS}
    return JobRun(tuple(batches), parts, started if started is not None else launched, launched)


def _follow(world: World, timeout_s: float,
            on_progress: Callable[[int], None] | None) -> tuple[list[Any], float | None]:
    """Watch `world` to its end: every rank's result and when rank 0 began."""
    started: list[float] = []

    def on_event(event: dict[str, Any]) -> None:
        if event["event"] == "ready" and event["rank"] == 0:
            started.append(float(event["at"]))
        if event["event"] in ("ready", "finished"):
            watch.sign()

    world.start()
    watch = Watch(world, error_grace_s=1.0, stall_timeout_s=timeout_s, progress_ranks=[0], on_event=on_event)
    done = -1
    try:
        while True:
            look = watch.look()
            count = watch.progress.get(0, (0, 0.0))[0]
            if on_progress is not None and count != done:
                done = count
                on_progress(count)
            outcome = look.outcome
            if isinstance(outcome, Finished):
                missing = [r for r in range(world.size) if r not in outcome.results]
                if missing:
                    raise WorldFailed(f"{world.where}: ranks {missing} exited without their timings "
                                      f"(log: {world.log_path(missing[0])})")
                return [outcome.results[r] for r in range(world.size)], (started[0] if started else None)
            if isinstance(outcome, Failed):
                reason = outcome.reason.removeprefix("ProblemError: ")
                raise ProblemError(f"rank {outcome.rank} failed: {reason} (log: {world.log_path(outcome.rank)})")
            if isinstance(outcome, Lost):
                rank, code = outcome.ranks[0]
                raise WorldFailed(f"{world.where}: rank {rank} died (exit code {code}; log: {world.log_path(rank)})")
            if isinstance(outcome, Stalled):
                raise WorldFailed(f"{world.where}: no progress for {timeout_s:g} s; stopped the workers "
                                  f"(logs: {world.log_path(0).parent})")
            if isinstance(outcome, (ServerGone, Killed)):
                raise WorldFailed(f"{world.where}: the worker fork server exited while workers ran")
            time.sleep(_POLL_S)
    finally:
        world.close(grace_s=10.0 if len(watch.results) == world.size else 0.0)


# --- what the commands measure ------------------------------------------------------------------


def _truth_run(run: JobRun) -> Any:
    """The run as the truth loop's figures (`thrifty.runtime.measure.truth.TruthRun`), its backward
    pass and exchange kept apart beside their sum."""
    from thrifty.runtime.measure.truth import TruthRun

    p = run.parts
    return TruthRun(run.batches, p["iteration_s"], p["forward_s"], p["compute_s"] + p["exchange_s"], p["step_s"],
                    compute_s=p["compute_s"], exchange_s=p["exchange_s"])


def measure_job_rounds(spec: str, args: Mapping[str, Any], configs: Sequence[Sequence[int]], warmup: int,
                       iterations: int, rounds: int, *, device: str = "cpu", threads: int = 1,
                       on_run: Callable[[int, int, Any], None] | None = None) -> list[list[Any]]:
    """``thrifty validate JOB``: every configuration (per-rank batches) run
    `rounds` times, interleaved (`thrifty.runtime.measure.truth.interleaved`),
    each run retried after a world that died; per configuration, its runs as
    `TruthRun`s in round order (`summarize` takes them)."""
    from thrifty.runtime.measure.truth import STALL_TIMEOUT_S, interleaved, retried

    def run(k: int) -> Any:
        return retried(lambda: _truth_run(measure_job(spec, args, configs[k], warmup, iterations, device=device,
                                                      threads=threads, timeout_s=STALL_TIMEOUT_S)),
                       f"job '{spec}' on {tuple(configs[k])}")

    return interleaved(len(configs), rounds, run, on_run)


def job_scaling(spec: str, args: Mapping[str, Any], sizes: Sequence[int], batch: int, *, iterations: int,
                warmup: int, device: str, threads: int, timeout_s: float,
                on_progress: Callable[[int, int, str], None] | None = None,
                placement: Any = None) -> tuple[list[list[float]], float]:
    """``thrifty profile-scaling JOB``: the job at each world size in
    `sizes`, the global `batch` split evenly; per size its iteration times
    (per iteration the slowest rank's whole iteration), and the start-up of
    the smallest world (from its start to rank 0 beginning its first
    iteration). `placement` (`thrifty.runtime.measure.Placement`) puts each
    world on a cluster's machines; default: processes of this host."""
    lead = first_timed(warmup)
    per_world = lead + iterations + 1
    total = per_world * len(sizes)
    times, startup_s = [], 0.0
    for index, size in enumerate(sizes):
        def progress(done: int, offset: int = index * per_world, size: int = size) -> None:
            if on_progress is not None:
                on_progress(offset + done, total, f"{size} worker{'s' if size > 1 else ''}")

        launcher, rank_env = placement(size) if placement is not None else (None, None)
        run = measure_job(spec, args, [batch // size] * size, warmup, iterations, device=device, threads=threads,
                          timeout_s=timeout_s, on_progress=progress, launcher=launcher, rank_env=rank_env)
        if index == 0:
            startup_s = max(0.0, run.started_at - run.launched_at)
        times.append([float(t) for t in run.slowest()])
    return times, startup_s
