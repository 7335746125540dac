"""The one rank loop: one rank of synchronous data-parallel training (Srifty
4.5), for a training job and for a tuning trial alike (`JobSpec` says which).

A rank joins its world (`thrifty.runtime.worlds`), builds the
trainer's model, optimizer and dataset, resumes from the job's checkpoint,
and trains iteration after iteration:

- each rank trains on its own local batch of the global batch
  (`thrifty.runtime.ddp.sharding`), its gradient weighted by its share
  before DDP's average (`thrifty.runtime.ddp.reweight`), so any world trains
  the model the single-process reference trains;
- one iteration is `steps_per_iteration` optimizer steps (a training job:
  one; a tuning trial: the trainer's, else one pass over the data);
- after each iteration the ranks agree, in one small all-reduce of flags, on
  whether to stop, to checkpoint now and to report next. Rank 0 sets the
  flags: from the starter's ``stop`` command, read without waiting, and the
  checkpoint and report clocks (a training job), or from the starter's
  decision for this iteration, awaited (a tuning trial: go, save or stop;
  HyperSched 4.3's pause and resize are a save). So every rank stops and
  checkpoints after the same iteration;
- rank 0 writes atomic checkpoints (model, optimizer, data position and every
  rank's random state) every `checkpoint_every` iterations or
  `checkpoint_every_s` seconds, when asked, and at the job's end; a job
  that evaluates (a tuning trial) writes an iteration's due checkpoint,
  holding the iteration's result, before it posts the result, so that a
  result its starter heard is never lost with the starter;
- about every `metrics_every_s` the ranks report the training loss (the
  global-batch mean) and the trainer's metrics, gathered on rank 0; a job
  that `evaluate`s has rank 0 compute the trainer's validation metric after
  every iteration (HyperDrive 4.2's iteration report).

A resumed world restores every rank's random state when it has the ranks of
the world that wrote the checkpoint, and otherwise (a re-plan or a resize)
seeds each rank from ``(seed, step, rank)``; a priming backward makes the
first resumed step sum gradients in the order the uninterrupted run would.

What a rank posts (the worlds' one protocol): ``joining``, ``ready``,
``checkpoint``, ``result`` (evaluated jobs), ``notice`` (injected spot
notices), ``done`` or ``stopped``; its progress (iterations done) and, from
rank 0, the latest loss and metrics (`METRICS`).

This module imports torch at the top: only worker processes import it.
"""

from __future__ import annotations

import functools
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from thrifty.core.errors import ProblemError
from thrifty.runtime.worlds import RankChannel, join_world, leave, resolve_backend
from thrifty.runtime.ddp.checkpoint import capture_rng, load_checkpoint, rank_seed, restore_rng, save_checkpoint, \
    seed_everything
from thrifty.runtime.ddp.job import CLOCK, DECISION, METRICS, STOP, JobSpec, WorkerFault
from thrifty.runtime.ddp.reweight import loss_scale, register_reweighting
from thrifty.runtime.ddp.sharding import ShardedStream, rank_offsets, split_batch
from thrifty.runtime.ddp.steps import GradClock, build_model, call_factory, combine_reports, fetch_batch, \
    prime_buckets, rank_report, scaled_loss, step_with_outputs
from thrifty.runtime.ddp.trainer import Trainer, TunableTrainer, load_trainer, load_tunable_trainer

__all__ = ["run_rank", "TIMING_WARMUP"]

TIMING_WARMUP = 3  # iterations left out of the throughput a finished world reports


@dataclass
class _Rank:
    """What one rank trains with, built once per world."""

    job: JobSpec
    channel: RankChannel
    trainer: Trainer
    metric: Callable[[Any], float] | None  # a tunable trainer's validation metric
    device: Any
    cuda: bool
    global_batch: int
    batches: list[int]
    ddp: Any
    optimizer: Any
    dataset: Any
    stream: ShardedStream
    loss_fn: Any
    loss_unscale: float
    steps: int             # optimizer steps per iteration
    iteration: int         # iterations done
    step: int              # optimizer steps done (the data stream's position)
    restore_s: float       # restoring the checkpoint (0 for a fresh start)
    rng: str               # "restored" or "seeded"
    clock: "_ClockMarks | None" = None  # this rank's clock marks, when the job asks for them


    @property
    def rank(self) -> int:
        return self.channel.rank

    @property
    def cuda_device(self) -> Any:
        return self.device if self.cuda else None


def run_rank(job: JobSpec, channel: RankChannel) -> None:
    """Carry out `job` as this rank, from its checkpoint (if any) until its
    last iteration or the starter's stop; then end the process (exit code 0)."""
    torch.set_num_threads(job.threads)
    faults = [f for f in job.faults if f.rank == channel.rank]
    for f in faults:
        if f.kind == "delay_start":
            time.sleep(f.seconds)
    backend = resolve_backend(job.backend)
    channel.post("joining")
    device = join_world(channel, backend, job.timeout_s)
    me = _build(job, channel, device, backend == "nccl")
    if job.iterations is None or me.iteration < job.iterations:
        prime_buckets(me.ddp, me.loss_fn, *fetch_batch(me.dataset, me.stream.indices(me.step), device),
                      me.cuda_device)
    channel.post("ready", start_iteration=me.iteration, rng=me.rng, world_size=channel.world_size,
                 batch=me.batches[me.rank])
    timing = _train(me, faults)
    if me.rank == 0:
        finished = job.iterations is not None and me.iteration >= job.iterations
        channel.post("done" if finished else "stopped", iteration=me.iteration, timing=timing)
    dist.barrier()
    leave()  # every rank is past its last collective: go without tearing DDP and gloo down


def _build(job: JobSpec, channel: RankChannel, device: Any, cuda: bool) -> _Rank:
    """Trainer, model, checkpoint, DDP, weighting, optimizer and data stream of this rank."""
    rank, world_size = channel.rank, channel.world_size
    tunable = job.evaluate or job.global_batch is None
    trainer = load_tunable_trainer(job.trainer, job.trainer_args) if tunable \
        else load_trainer(job.trainer, job.trainer_args)
    tuning = trainer if isinstance(trainer, TunableTrainer) else None
    global_batch = job.global_batch if job.global_batch is not None or tuning is None else tuning.batch_size
    assert global_batch is not None  # a job without a global batch has a tunable trainer
    batches = list(job.batches) if job.batches is not None else split_batch(global_batch, world_size)
    if world_size != len(batches):
        raise ProblemError(f"lists {len(batches)} local batches, but the world has {world_size} ranks",
                           path="batches")
    seed_everything(job.seed)
    model = build_model(trainer, job.trainer, device)
    restore_started = time.perf_counter()
    state = _load_state(job, global_batch)
    if state is not None:
        model.load_state_dict(state["model"])
    ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    loss_fn, loss_unscale = trainer.loss, 1.0
    if job.weighting == "batch":  # Srifty 4.5: weight this rank's gradient by b_r * W / B before the average
        scale = loss_scale(batches[rank], global_batch, world_size)
        loss_fn, loss_unscale = functools.partial(scaled_loss, trainer.loss, scale), 1.0 / scale
    elif job.weighting == "hook":
        register_reweighting(ddp, batches[rank], global_batch)
    optimizer = call_factory(job.trainer, "optimizer", trainer.optimizer, ddp.parameters())
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
    restore_s = time.perf_counter() - restore_started if state is not None else 0.0
    dataset = call_factory(job.trainer, "dataset", trainer.dataset)
    steps = job.steps_per_iteration or (tuning.steps_per_iteration if tuning is not None else None) \
        or math.ceil(len(dataset) / global_batch)
    stream = ShardedStream(len(dataset), global_batch, rank_offsets(batches)[rank], batches[rank], job.seed)
    iteration = int(state["iteration"]) if state is not None else 0
    step = int(state.get("step", iteration * steps)) if state is not None else 0
    saved_rng = state.get("rng") if state is not None else None
    if saved_rng is not None and saved_rng["batches"] == batches:
        restore_rng(saved_rng["states"][rank], device if cuda else None)
        rng = "restored"
    else:  # a fresh run, or a new world after a re-plan or a resize: a deterministic per-rank seed
        seed_everything(rank_seed(job.seed, step, rank))
        rng = "seeded"
    metric = tuning.metric if tuning is not None else None
    clock = _ClockMarks(GradClock(model), job.clock_every_s) if job.clock_every_s is not None else None
    return _Rank(job, channel, trainer, metric, device, cuda, global_batch, batches, ddp, optimizer, dataset, stream,
                 loss_fn, loss_unscale, steps, iteration, step, restore_s, rng, clock)


class _ClockMarks:
    """This rank's clock marks of the iterations after the timing warm-up:
    the count, sums and sums of squares of each component (forward,
    backward, exchange, step: `GradClock.components`), cumulative, published
    every `every_s` seconds (`CLOCK`) so that the starter can take any window
    as the difference of two readings."""

    PARTS = ("forward", "backward", "exchange", "step")

    def __init__(self, grads: GradClock, every_s: float):
        self.grads, self.every_s = grads, every_s
        self.count = 0
        self.sums = [0.0] * 4
        self.squares = [0.0] * 4
        self.published_at = time.monotonic()
        self.on = False  # past the warm-up

    def add(self, marks: list[float], steps: int) -> None:
        """One iteration's marks (`steps` optimizer steps of five readings each)."""
        if not self.on:
            return
        parts = [0.0] * 4
        for k in range(steps):
            for j, v in enumerate(self.grads.components(marks[5 * k: 5 * k + 5])):
                parts[j] += v
        self.count += 1
        for j, v in enumerate(parts):
            self.sums[j] += v
            self.squares[j] += v * v

    def publish(self, channel: RankChannel, iteration: int, force: bool = False) -> None:
        now = time.monotonic()
        if not self.on or not self.count or (not force and now - self.published_at < self.every_s):
            return
        self.published_at = now
        channel.publish(CLOCK.format(channel.rank), {
            "iteration": iteration, "at": time.time(), "count": self.count,
            "sum": dict(zip(self.PARTS, self.sums)), "sumsq": dict(zip(self.PARTS, self.squares))})


def _load_state(job: JobSpec, global_batch: int) -> dict[str, Any] | None:
    """The job's checkpoint, checked against the job (None: start fresh)."""
    if job.restore == "never":
        return None
    where = job.checkpoint_path
    state = load_checkpoint(where)
    if state is None:
        if job.restore == "required":
            raise ProblemError("the checkpoint to resume from is missing", source=where)
        return None
    if state.get("global_batch", global_batch) != global_batch:
        raise ProblemError(f"was written with global batch {state['global_batch']}, but this job's is "
                           f"{global_batch}", source=where)
    if state["trainer"] != job.trainer or state.get("trainer_args", {}) != job.trainer_args:
        raise ProblemError(f"was written by trainer '{state['trainer']}' {state.get('trainer_args', {})}, "
                           f"not '{job.trainer}' {job.trainer_args}", source=where)
    if job.iterations is not None and state["iteration"] > job.iterations:
        raise ProblemError(f"is at iteration {state['iteration']}, past this job's {job.iterations}", source=where)
    return state


def _train(me: _Rank, faults: list[WorkerFault]) -> dict[str, Any] | None:
    """Iterations until the job's end or the starter's stop; the throughput
    timing of the iterations after the first `TIMING_WARMUP`."""
    job, channel = me.job, me.channel
    # flags, agreed on by every rank after each iteration: [stop, checkpoint now, report next]
    flags = torch.zeros(3, dtype=torch.int64, device=me.device)
    start = me.iteration
    last_checkpoint_at = last_report_at = time.monotonic()
    timing_from: tuple[int, float] | None = None
    report_next = job.metrics_every_s is not None  # the first iteration of a world reports
    first = True
    while job.iterations is None or me.iteration < job.iterations:
        _fire_faults(me, faults)
        started_at, t0 = time.time(), time.perf_counter()
        loss, outputs, targets = _iteration(me, faults)
        me.iteration += 1
        if report_next or (job.metrics_every_s is not None and me.iteration == job.iterations):
            _report(me, loss, outputs, targets)
            last_report_at = time.monotonic()
        del loss, outputs
        due = job.checkpoint_every is not None and me.iteration % job.checkpoint_every == 0
        saved = False
        if job.evaluate:  # a trial's result is posted once its iteration is durable (checkpointed, when due)
            metric = _metric(me) if me.rank == 0 else math.nan
            if due:
                _checkpoint(me, {"metric": metric, "iteration_s": time.perf_counter() - t0})
                saved = True
            if me.rank == 0:
                _evaluate(me, metric, started_at, t0, first, saved)
        first = False
        if me.iteration == start + TIMING_WARMUP:
            timing_from = (me.iteration, time.perf_counter())
            if me.clock is not None:
                me.clock.on = True
        flags.zero_()
        if me.rank == 0:
            stop, save = _decide(me, last_checkpoint_at)
            flags[0], flags[1] = int(stop), int(save)
            flags[2] = int(job.metrics_every_s is not None and time.monotonic() - last_report_at >= job.metrics_every_s)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        stopped, report_next = bool(flags[0].item()), bool(flags[2].item())
        if (bool(flags[1].item()) or due or me.iteration == job.iterations) and not saved:
            _checkpoint(me)
            last_checkpoint_at = time.monotonic()
        if me.rank == 0:
            channel.progress(me.iteration)
        if me.clock is not None:
            me.clock.publish(channel, me.iteration, force=stopped or me.iteration == job.iterations)
        if stopped:
            break
    if timing_from is None or me.iteration <= timing_from[0]:
        return None
    return {"from_iteration": timing_from[0], "to_iteration": me.iteration,
            "seconds": time.perf_counter() - timing_from[1]}


def _iteration(me: _Rank, faults: list[WorkerFault]) -> tuple[Any, Any, Any]:
    """`me.steps` optimizer steps; the last step's loss, outputs and targets."""
    slow = sum(f.seconds for f in faults if f.kind == "slow" and f.active(me.iteration))
    if slow > 0:
        time.sleep(slow)
    loss = outputs = targets = None
    marks: list[float] | None = [] if me.clock is not None else None
    for _ in range(me.steps):
        inputs, targets = fetch_batch(me.dataset, me.stream.indices(me.step), me.device)
        loss, outputs = step_with_outputs(me.ddp, me.optimizer, me.loss_fn, inputs, targets, marks)
        me.step += 1
    if me.clock is not None and marks is not None:
        me.clock.add(marks, me.steps)
    return loss, outputs, targets


def _decide(me: _Rank, last_checkpoint_at: float) -> tuple[bool, bool]:
    """Rank 0: (stop after this iteration, checkpoint now). An awaiting job
    waits for the starter's decision for this iteration (go, save: checkpoint
    and stop, anything else: stop); any other job stops, with a checkpoint,
    when the starter has asked, and checkpoints when its clock says so."""
    job = me.job
    if job.await_decision:
        decision = me.channel.wait_command(DECISION.format(me.iteration), job.timeout_s)
        return decision != "go", decision == "save"
    stop = me.channel.command(STOP) is not None
    timed = job.checkpoint_every_s is not None and time.monotonic() - last_checkpoint_at >= job.checkpoint_every_s
    return stop, stop or timed


def _metric(me: _Rank) -> float:
    """Rank 0: the trainer's validation metric on the unwrapped model."""
    model = me.ddp.module
    model.eval()
    with torch.no_grad():
        metric = float(me.metric(model)) if me.metric is not None else math.nan
    model.train()
    return metric


def _evaluate(me: _Rank, metric: float, started_at: float, t0: float, first: bool, saved: bool) -> None:
    """Rank 0: the iteration's result, posted with its time (checkpoint
    included), whether it is `checkpointed` (then the checkpoint holds it),
    and, after a launch's first iteration, when it started and what the
    restore cost."""
    extra = {"started_at": started_at, "restore_s": me.restore_s} if first else {}
    me.channel.post("result", iteration=me.iteration, metric=metric, iteration_s=time.perf_counter() - t0,
                    checkpointed=saved, **extra)


def _report(me: _Rank, loss: Any, outputs: Any, targets: Any) -> None:
    """The loss and the trainer's metrics, combined over the ranks on rank 0 and published."""
    mine = rank_report(me.trainer, me.job.trainer, loss, me.loss_unscale, outputs, targets)
    gathered: list[Any] | None = [None] * me.channel.world_size if me.rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if gathered is not None:
        me.channel.publish(METRICS, {"at": time.time(), "iteration": me.iteration,
                                     **combine_reports(gathered, me.batches)})


def _checkpoint(me: _Rank, result: dict[str, float] | None = None) -> None:
    """Every rank's random state to rank 0, which writes the checkpoint
    atomically; with the iteration's `result` (metric, time) when it is
    written before the result is posted, so that a starter killed in between
    finds the result in the checkpoint."""
    job = me.job
    states: list[Any] = [None] * me.channel.world_size
    dist.all_gather_object(states, capture_rng(me.cuda_device))
    if me.rank != 0:
        return
    seconds, size = save_checkpoint(job.checkpoint_path, {
        "iteration": me.iteration, "step": me.step, "samples_seen": me.step * me.global_batch,
        "global_batch": me.global_batch, "trainer": job.trainer, "trainer_args": job.trainer_args,
        "seed": job.seed, "model": me.ddp.module.state_dict(), "optimizer": me.optimizer.state_dict(),
        "rng": {"batches": me.batches, "states": states}, "saved_at": time.time(),
        **({"result": result} if result is not None else {}),
    })
    me.channel.post("checkpoint", iteration=me.iteration, save_s=seconds, bytes=size)


def _fire_faults(me: _Rank, faults: list[WorkerFault]) -> None:
    """The injected faults due before this iteration (tests and demos)."""
    for fault in faults:
        if fault.at_iteration != me.iteration:
            continue
        if fault.kind == "kill":
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)  # a preemption without notice
        elif fault.kind == "notice":
            machine = me.job.machine_ids[fault.rank] if me.job.machine_ids else None
            me.channel.post("notice", machine_id=machine, time_left_s=fault.seconds, iteration=fault.at_iteration)
        elif fault.kind == "hang":
            time.sleep(10 * me.job.timeout_s)

