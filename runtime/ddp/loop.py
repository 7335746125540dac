"""The one rank loop: one rank of synchronous data-parallel training (Srifty
4.5), for a training job and for a tuning trial alike (`JobSpec` says which).

A rank joins its world (`thrifty.runtime.worlds`), resolves the job's code
(`thrifty.runtime.ddp.trainer.resolve_job`), builds its `JobContext`
(`thrifty.runtime.ddp.context`: the contract, the iteration boundary, the
checkpoints, the starter's commands) and calls the job's loop function once:
the user's own, or `trainer_loop`, which runs the four-factory `Trainer` (the
short form) through the same context:

- each rank trains on its own local batch of the global batch
  (`thrifty.runtime.ddp.sharding`), its gradient weighted by its share
  before DDP's average (`thrifty.runtime.ddp.reweight`), so any world trains
  the model the single-process reference trains;
- one iteration is `steps_per_iteration` optimizer steps (a training job:
  one; a tuning trial: the experiment's, else the trainer's, else one pass
  over the data the job gives ``ctx.prepare_loader``);
- at a report, about every 0.4 s and at least every 16 reports (every
  iteration in a tuning trial), the ranks agree, in one small all-reduce of
  flags that overlaps the next iteration (a tuning trial's does not), on
  whether to stop, to checkpoint now and to record metrics next. Rank 0 sets
  the flags: from the starter's ``stop`` command, read without waiting, and the
  checkpoint and metrics clocks (a training job), or from the starter's
  decision for this iteration, awaited (a tuning trial: go, save or stop;
  HyperSched 4.3's pause and resize are a save). So every rank stops and
  checkpoints after the same iteration;
- rank 0 writes atomic checkpoints (the loop's state, the data position and
  every rank's random state); a job that evaluates (a tuning trial) writes an
  iteration's due checkpoint, holding the iteration's result, before it posts
  the result, so that a result its starter heard is never lost with the
  starter.

A resumed world restores every rank's random state when it has the ranks of
the world that wrote the checkpoint, and otherwise (a re-plan or a resize)
seeds each rank from ``(seed, step, rank)``; the `Trainer` short form primes
DDP's buckets so the first resumed step sums gradients in the order the
uninterrupted run would.

What a rank posts (the worlds' one protocol): ``joining``, ``ready``,
``checkpoint``, ``result`` (evaluated jobs), ``notice`` (injected spot
notices), ``done`` or ``stopped``; its progress (iterations done) and, from
rank 0, every loss and metrics record (`METRICS`), sent before its end.

This module imports torch at the top: only worker processes import it.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from thrifty.core.errors import ProblemError, ThriftyError
from thrifty.runtime.ddp.context import TIMING_WARMUP, TRIAL_METRIC, JobContext, StopJob, metric_sinks
from thrifty.runtime.ddp.job import JobSpec
from thrifty.runtime.ddp.sharding import split_batch
from thrifty.runtime.ddp.steps import build_model, call_factory, prime_buckets, rank_report, scaled_loss, \
    step_with_outputs
from thrifty.runtime.ddp.trainer import Trainer, TunableTrainer, loop_batch_size, resolve_job
from thrifty.runtime.worlds import RankChannel, join_world, leave, resolve_backend

__all__ = ["run_rank", "trainer_loop", "TIMING_WARMUP"]


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
    code = resolve_job(job.trainer, job.trainer_args, tunable=job.evaluate or job.global_batch is None)
    tuning = code.trainer if isinstance(code.trainer, TunableTrainer) else None
    global_batch = job.global_batch
    if global_batch is None:  # a tuning trial's: the TunableTrainer's batch_size, or the loop's (configured)
        global_batch = tuning.batch_size if tuning is not None else \
            loop_batch_size(code.spec, code.loop, code.args) if code.loop is not None else None
    if global_batch is None:
        raise ProblemError(f"job '{job.trainer}' needs a global batch", path="global_batch")
    # a trial's metric: a loop reports the experiment's by name, in its mode; a TunableTrainer its own score
    trial_metric = (job.metric or TRIAL_METRIC, -1.0 if job.mode == "min" else 1.0) if code.loop is not None \
        else (TRIAL_METRIC, 1.0)
    batches = list(job.batches) if job.batches is not None else split_batch(global_batch, channel.world_size)
    if channel.world_size != len(batches):
        raise ProblemError(f"lists {len(batches)} local batches, but the world has {channel.world_size} ranks",
                           path="batches")
    sinks = metric_sinks(job, channel) if channel.rank == 0 else []
    ctx = JobContext(job, channel, device, backend == "nccl", global_batch, batches, faults, sinks,
                     check_finite=code.loop is not None, trial_metric=trial_metric)
    try:
        if code.loop is not None:
            returned = _call_loop(code.loop, ctx, code.spec, code.args)
        else:
            assert code.trainer is not None  # resolve_job gives one or the other
            trainer_loop(ctx, code.trainer, tuning)
            returned = None
        ended = ctx.finish(returned)
    except StopJob:
        ended = "stopped"
    if channel.rank == 0:
        channel.post(ended, iteration=ctx.iteration, timing=ctx.timing())
    dist.barrier()
    leave()  # every rank is past its last collective: go without tearing DDP and gloo down


def _call_loop(loop: Callable[..., Any], ctx: JobContext, spec: str, args: Mapping[str, Any]) -> Any:
    """The user's loop function; an exception of its own becomes one line naming the job."""
    try:
        return loop(ctx, **args)
    except (StopJob, ThriftyError):
        raise
    except Exception as e:
        raise ProblemError(f"job '{spec}' (rank {ctx.rank}) raised {type(e).__name__}: {e}") from e


def trainer_loop(ctx: JobContext, trainer: Trainer, tuning: TunableTrainer | None = None) -> None:
    """The four-factory `Trainer` as a loop function: the model (restored),
    DDP, the optimizer (restored), the dataset, then `steps` optimizer steps
    per iteration, each iteration reported with the loss and the trainer's
    metrics (computed only when recorded) and, in a tuning trial, rank 0's
    validation metric. It scales its loss by the batch share instead of the
    hook when the job's weighting is ``batch`` (the default) and the local
    batches differ (with equal ones DDP's own average is the weighting: the
    factor would be 1)."""
    job, spec = ctx.job, ctx.job.trainer
    model = build_model(trainer, spec, ctx.device)
    state = ctx.restore()
    if state is not None:
        model.load_state_dict(state["model"])
    scale = job.weighting == "batch" and len(set(ctx.batches)) > 1
    ddp = ctx.prepare_model(model, scale_loss=scale)
    loss_fn, loss_unscale = trainer.loss, 1.0
    if scale:
        loss_fn, loss_unscale = functools.partial(scaled_loss, trainer.loss, ctx.loss_scale), 1.0 / ctx.loss_scale
    optimizer = call_factory(spec, "optimizer", trainer.optimizer, ddp.parameters())
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
    dataset = call_factory(spec, "dataset", trainer.dataset)
    ctx.steps_per_iteration = job.steps_per_iteration or (tuning.steps_per_iteration if tuning is not None else None) \
        or math.ceil(len(dataset) / ctx.global_batch)
    cuda_device = ctx.device if ctx.device.type == "cuda" else None
    checkpoint = {"model": model, "optimizer": optimizer}
    primed = False
    for batch in ctx.prepare_loader(dataset):
        inputs, targets = batch[0], batch[1]
        if not primed:  # the same gradient buckets in every world (`prime_buckets`)
            prime_buckets(ddp, loss_fn, inputs, targets, cuda_device)
            primed = True
        loss, outputs = step_with_outputs(ddp, optimizer, loss_fn, inputs, targets)
        if ctx.step % ctx.steps_per_iteration:
            continue

        def metrics(loss: Any = loss, outputs: Any = outputs, targets: Any = targets) -> dict[str, float]:
            values: dict[str, float] = {}
            if job.metrics_every_s is not None:
                got, values = rank_report(trainer, spec, loss, loss_unscale, outputs, targets)
                values = {"loss": got, **values}
            if tuning is not None and ctx.rank == 0:
                values[TRIAL_METRIC] = _metric(ddp.module, tuning.metric)
            return values

        ctx.report(metrics, checkpoint=checkpoint)
        del loss, outputs


def _metric(model: Any, metric: Callable[[Any], float]) -> float:
    """A tunable trainer's validation metric on the unwrapped model, in eval mode without gradients."""
    model.eval()
    with torch.no_grad():
        value = float(metric(model))
    model.train()
    return value
