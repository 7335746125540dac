"""The job contract: a loop function, run once per rank with a `JobContext`.

A job is the user's own training code, named ``MODULE:FUNCTION``
(``thrifty run --trainer mypkg.jobs:train``) and called in every rank as
``train(ctx, **args)`` (`args`: the job's JSON keyword arguments, such as
``--trainer-args``). The context gives the loop what the plan decided and
takes back what the runtime needs to stop, checkpoint, re-plan and resume it::

    def train(ctx, lr=0.1):
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, lr, total_steps=ctx.iterations)
        state = ctx.restore()                      # None on a fresh start
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            schedule.load_state_dict(state["schedule"])
        model = ctx.prepare_model(model)           # DDP with batch-share reweighting
        for inputs, targets in ctx.prepare_loader(dataset):   # this rank's share, to the job's end
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs), targets)    # a batch mean
            loss.backward()
            optimizer.step()
            schedule.step()
            ctx.report({"loss": loss.item()},
                       checkpoint={"model": model, "optimizer": optimizer, "schedule": schedule})

- `JobContext.local_batch` is this rank's batch in the plan (`batches`,
  `global_batch`, `rank`, `world_size`, `device` beside it), `iterations`
  the job's end (None in a tuning trial, whose scheduler ends it) and
  `iteration` the iterations done, the data position.
- `JobContext.prepare_model` wraps the model in DDP with Srifty 4.5's
  gradient reweighting as a communication hook (`thrifty.runtime.ddp.reweight`):
  rank r's gradient bucket is weighted ``b_r / B`` and the buckets summed, so
  with unequal local batches the update is the single-device update on the
  global batch, whatever the loss, as long as it is a batch mean; with equal
  batches DDP's own average is that weighting, and no hook is installed.
- `JobContext.prepare_loader` takes a map-style dataset or a ``DataLoader``
  (whose dataset, ``collate_fn``, workers and their options it keeps, and
  whose batch size and sampler it replaces) and iterates this rank's share of
  each global batch (`thrifty.runtime.ddp.sharding`: the same global batches in
  the same order whatever the machines) from the data position to the job's
  end, on the context's device. Its `RankLoader.epoch_end` says when the batch
  just drawn ends an epoch (``len(data) / global batch`` batches, rounded
  up: where a loop evaluates, and where a tuning trial's iteration ends).
- The loop trains on each batch as it comes, in one forward pass or in
  micro-batches (gradient accumulation, ``no_sync`` on all but the last, each
  micro-batch's mean loss weighted by its share of the local batch): the
  training forward passes of the prepared model between two draws from the
  loader must add up to the local batch (or each hold all of it), checked
  after each of a world's first 32 draws and after every 16th.
- `JobContext.report` is the iteration boundary. Its metrics (numbers, batch
  means on this rank's batch) are combined over the ranks by batch share and
  written to the job's metric sinks (`MetricsSink`, `metric_sinks`) about
  every ``metrics_every_s``, in batches, and before each checkpoint, a stop
  and the job's end (a world that is lost loses no record up to its
  checkpoint); its `checkpoint` is the loop's state, a mapping of names to
  objects with ``state_dict()`` (model, optimizer, schedule, scaler) or plain
  values, which the runtime keeps a reference to and writes to the job's
  storage (a path or ``s3://``; `thrifty.runtime.ddp.storage`) when a
  checkpoint is due: every ``checkpoint_every`` iterations, on its clock,
  before a stop and at the job's end. Every rank must report at the same
  iterations: at a report about every 0.4 s, and at least every as many
  reports as the world has made, up to 128 (every report in a tuning
  trial), the ranks start an exchange of flags,
  one small all-reduce, and act on it at the next report (a tuning trial's
  at once), so that no rank waits for the others at a report; a stop the
  starter asked for lands at the report after the first exchange after
  rank 0 saw it (rank 0 watches for it in a thread of its own, so no
  exchange waits for the starter's store).
- `JobContext.restore` is the state of the latest checkpoint (the loop's
  mapping, each object's ``state_dict()``) when the job resumes or a re-plan
  relaunched it, else None; the data position, the learning-rate schedule and
  the optimizer continue from it, and each rank's random state is restored
  (same world) or reseeded from ``(seed, step, rank)`` (a new world).
- When the runtime stops the job (a re-plan, a spot notice, an interruption,
  a scheduler's pause) `report` checkpoints and then raises `StopJob`, a
  ``BaseException`` that a loop's ``except Exception`` does not catch; the
  runtime ends the rank. The loop need not handle it.
- In a tuning trial (``thrifty tune``, whose ``trainer`` may be a loop
  function) the loop is called with the trial's configuration as keyword
  arguments. Its `global_batch` is the configuration's ``batch_size``, else
  the default of the loop's ``batch_size`` parameter, on any number of ranks.
  One trial iteration, the scheduler's unit (HyperSched's and ASHA's rungs,
  POP's curve points), is one epoch of the data the loop first gives
  `prepare_loader` (`RankLoader.batches_per_epoch`), unless the experiment
  sets ``steps_per_iteration``. At each iteration's end `report` must carry
  the experiment's ``metric`` by its name (``{"val_loss": v}`` for
  ``"metric": "val_loss"``); metrics given as a callable are computed there
  only, on every rank (so an evaluation may use collectives), and the ranks'
  values are combined by batch share; the scheduler reads the result (its
  negation for ``"mode": "min"``). A pause, or a resize, is a checkpoint and
  a `StopJob`; the resumed trial, on any machine and number of ranks, gets
  its state from `restore` and goes on from its data position.

A bad job gets one line naming the job (and, from the driver, the rank's
log), and loses nothing already checkpointed: a loop that raises, that never
calls `prepare_model`, that reports a non-finite metric, that never reports
(or draws many batches between reports), that returns before the job's end,
or whose training forward passes between two draws add up to another batch
size than the plan's (at a checked draw: within 16 draws).

The four-factory `Trainer` is the short form of a job: the runtime runs it as
a loop function of its own (`thrifty.runtime.ddp.loop.trainer_loop`), which
also uses what a loop function cannot: it scales its known loss instead of
the hook (``scale_loss``), reports lazily (a callable), and primes DDP's
buckets so a resumed world sums bit for bit as the uninterrupted one.

This module imports torch at the top: only worker processes import it.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from thrifty.core.errors import ProblemError
from thrifty.runtime.ddp.checkpoint import capture_rng, load_checkpoint, rank_seed, restore_rng, save_checkpoint, \
    seed_everything
from thrifty.runtime.ddp.clock import ClockMarks
from thrifty.runtime.ddp.job import DECISION, METRICS, STOP, TRIAL_METRIC, JobSpec, WorkerFault
from thrifty.runtime.ddp.reweight import data_parallel, loss_scale, register_reweighting
from thrifty.runtime.ddp.sharding import ShardedStream, rank_offsets
from thrifty.runtime.worlds import CommandWatch, RankChannel

__all__ = ["JobContext", "StopJob", "MetricsSink", "ChannelSink", "metric_sinks", "RankLoader", "combine_metrics",
           "combine_records",
           "TRIAL_METRIC", "TIMING_WARMUP", "RUNTIME_KEYS"]

TIMING_WARMUP = 3  # iterations left out of the throughput a finished world reports
# what a checkpoint holds beside the loop's state: a loop's state may not use these names
RUNTIME_KEYS = frozenset({"format", "iteration", "step", "samples_seen", "global_batch", "trainer", "trainer_args",
                          "seed", "rng", "saved_at", "result", "state_keys"})
# the ranks exchange flags about this often (every report in a job that awaits decisions). Each exchange is an
# all-reduce on the process group the gradients use: at 0.05 s, a 37 ms small-cnn iteration exchanged at every
# report and the loop path ran 2.0 to 5.2% behind plain DDP on a 2-rank CPU world here; at 0.4 s (every 8th
# report) -0.3 to 2.4% (3 interleaved pairs of 9 rounds); a stop lands about 0.4 s plus an iteration later
_EXCHANGE_S = 0.4
# and at least every this many reports, and every as many as the world has made so far (the gap doubles from 1
# up to this): the gap is agreed on at the pace of the iterations before it, so these bound a stop's delay in
# iterations when they slow down at once (a straggler, a spot notice's last iterations): at most the world's age
# when it was agreed, so a young world (just launched or re-planned, when the starter most often stops it) stops
# within a few iterations, and an old one within 128 + 1. Only iterations under 3 ms (0.4 s / 128) exchange at
# this bound. An exchange is not free on short iterations: the reports that start it and act on it, and the
# iteration whose gradients it overlaps, took 300 to 440 us more than the others of a 0.7 ms tiny-mlp iteration
# on 2 ranks of this 2-core host (medians of 12,000 iterations by position); with a fixed bound of 16 the loop
# path ran 7.1 to 7.2% behind plain DDP there, with 128 2.4 to 4.4% (two pairs of runs, 12 x 2,000 iterations)
_MAX_GAP = 128
_PROGRESS_S = 0.05  # rank 0 writes its progress to the starter's store about this often (at exchanges)
_FLAGS_MAX = dist.AllreduceOptions()  # the exchange's all-reduce (`JobContext._reduce`)
_FLAGS_MAX.reduceOp = dist.ReduceOp(dist.ReduceOp.MAX)
_UNREPORTED_ITERATIONS = 100  # a loop may draw at most max(this, checkpoint_every) iterations between reports
# the training forwards after a draw are checked against the plan's batch (`JobContext._check_trained`) for a
# world's first this many draws, then for one draw in `_CHECK_EVERY` (the draws of steps that are multiples of
# it): a loop that trains on other batches than the plan's is so stopped at once, or within 16 draws of starting
# to. Not every draw: the prepared model then goes through a forward of the context's (`_checked_forward`), and
# that and the draw's check took 7 to 8 us of a 0.65 ms tiny-mlp iteration on 2 ranks of this 2-core host (about
# 1.1%; the loop path's cost over plain DDP fell from 19-21 to 12-13 us, interleaved medians of 6,000 iterations)
_CHECK_FIRST = 32
_CHECK_EVERY = 16


class StopJob(BaseException):
    """The runtime stops the job at this iteration boundary (after
    checkpointing it): a re-plan, a spot notice, an interruption or a
    scheduler's pause. Raised by `JobContext.report`; the runtime catches it."""


class MetricsSink(Protocol):
    """Where the combined metrics go, on rank 0: `write` gets records
    ``{"at": unix time, "iteration": n, "loss": float | None, "metrics":
    {name: float}}``, in iteration order, in batches about every
    ``metrics_every_s`` (every reported iteration, combined over the ranks by
    batch share)."""

    def write(self, records: Sequence[Mapping[str, Any]]) -> None: ...


class ChannelSink:
    """The starter's view: every batch of records, sent under `METRICS`
    (`RankChannel.send`), which the driver writes to the run's metrics
    (metrics.jsonl, TensorBoard, MLflow) and shows the last of."""

    def __init__(self, channel: RankChannel):
        self.channel = channel

    def write(self, records: Sequence[Mapping[str, Any]]) -> None:
        if records:  # written at once (JSON): the records need no copy, only to be dicts
            self.channel.send(METRICS, [r if type(r) is dict else dict(r) for r in records])


def metric_sinks(job: JobSpec, channel: RankChannel) -> list[MetricsSink]:
    """The sinks of a job's metrics on rank 0: the starter's channel, and the
    ones the job's settings ask for (this is where file sinks plug in)."""
    return [ChannelSink(channel)]


def combine_metrics(per_rank: Sequence[Mapping[str, float]], batches: Sequence[int]) -> dict[str, float]:
    """The ranks' batch means as global-batch means: each weighted by its
    rank's batch share (a name that only some ranks report, over those)."""
    names = sorted({name for values in per_rank for name in values})
    out = {}
    for name in names:
        pairs = [(b, values[name]) for b, values in zip(batches, per_rank) if name in values]
        out[name] = sum(b * v for b, v in pairs) / sum(b for b, _ in pairs)
    return out


def combine_records(per_rank: Sequence[Sequence[tuple[int, Mapping[str, float]]]],
                    batches: Sequence[int]) -> list[tuple[int, dict[str, float]]]:
    """The ranks' buffered records ``(iteration, values)`` as one record
    per iteration, in iteration order: each rank's values of an iteration
    merged (a later report's win), then combined over the ranks by batch
    share (`combine_metrics`). The usual buffers (each iteration once, the
    same iterations and names on every rank) take a short path, a tenth of
    the cost: a 1 s buffer of a fast loop holds a thousand records or more."""
    first = per_rank[0]
    iterations = [iteration for iteration, _ in first]
    usual = all(a < b for a, b in zip(iterations, iterations[1:])) and \
        all([iteration for iteration, _ in other] == iterations for other in per_rank[1:])
    if usual and len(per_rank) == 1:
        return [(iteration, dict(values)) for iteration, values in first]
    out = []
    if usual:
        total = sum(batches)
        for k, (iteration, values) in enumerate(first):
            names = values.keys()
            each = [buffered[k][1] for buffered in per_rank]
            if all(other.keys() == names for other in each):
                out.append((iteration, {name: sum([b * v[name] for b, v in zip(batches, each)]) / total
                                        for name in names}))
            else:
                out.append((iteration, combine_metrics(each, batches)))
        return out
    by_rank: list[dict[int, dict[str, float]]] = []  # iteration -> values (merged; a later report's win)
    for buffered in per_rank:
        merged: dict[int, dict[str, float]] = {}
        for iteration, values in buffered:
            merged.setdefault(iteration, {}).update(values)
        by_rank.append(merged)
    for iteration in sorted({i for buffered in by_rank for i in buffered}):
        out.append((iteration, combine_metrics([buffered.get(iteration, {}) for buffered in by_rank], batches)))
    return out


Metrics = Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None


class JobContext:
    """One rank's side of the job contract (module docstring). Built by the
    rank loop (`thrifty.runtime.ddp.loop.run_rank`) after the rank joined its
    world and before the job's code runs."""

    def __init__(self, job: JobSpec, channel: RankChannel, device: Any, cuda: bool, global_batch: int,
                 batches: Sequence[int], faults: Sequence[WorkerFault] = (), sinks: Sequence[MetricsSink] = (),
                 check_finite: bool = True, trial_metric: tuple[str, float] = (TRIAL_METRIC, 1.0)):
        self.job, self.device, self.global_batch, self.batches = job, device, global_batch, list(batches)
        self.rank, self.world_size = channel.rank, channel.world_size
        self.local_batch = self.batches[self.rank]
        self._unreported_limit = max(_UNREPORTED_ITERATIONS, job.checkpoint_every or 0)
        self.iterations = job.iterations
        # batches per iteration: the job's; else the Trainer's, or one epoch of the first prepared loader's data
        self._steps_per_iteration = job.steps_per_iteration
        # in a tuning trial: the metric the scheduler reads (its name), and its sign (-1: minimised)
        self._trial_metric, self._trial_sign = trial_metric
        self._channel, self._cuda, self._faults, self._sinks = channel, cuda, list(faults), list(sinks)
        self._check_finite = check_finite
        started = time.perf_counter()
        self._saved = _load_state(job, global_batch)
        self.restore_s = time.perf_counter() - started if self._saved is not None else 0.0
        self.step = int(self._saved.get("step", self._saved["iteration"])) if self._saved is not None else 0
        self._start_step = self.step
        # the last boundary (where this world starts) and the latest checkpoint, in iterations
        self._reported_iteration = self._start = self._checkpointed = \
            int(self._saved["iteration"]) if self._saved is not None else 0
        self._state: Mapping[str, Any] | None = None
        self._ddp: Any = None
        self._trained: list[tuple[int, ...]] = []  # the shapes of the training forwards since the last draw
        self._began = False
        self._stopping = False
        self._reports = 0
        self._fired_at = -1  # the iteration whose faults fired
        # [stop, checkpoint now, record next, reports until the next exchange] (`_exchange`)
        self._flags = torch.zeros(4, dtype=torch.int64, device=device)
        # rank 0 writes its flags through a host tensor's numpy view (on a GPU, then copied in one)
        self._host_flags = self._flags if self._flags.device.type == "cpu" else torch.zeros(4, dtype=torch.int64)
        self._host_view = self._host_flags.numpy()
        self._group: Any = None  # the world's process group, once an exchange needs it
        self._pending: Any = None  # the all-reduce of the exchange started at the previous report (`_exchange`)
        self._next_exchange = 1  # the report at which the ranks next exchange flags
        self._exchanged = (0, time.perf_counter())  # (reports, time) at the last exchange
        # rank 0: the starter's stop, watched by a thread from the first exchange on (no round trip to the store
        # at an exchange), and its progress, written at the exchanges about every `_PROGRESS_S`, at checkpoints, a
        # stop, the job's end and every iteration a fault is at (any rank's: the starter learns from the progress
        # that an injected kill fired, and never sees a checkpoint past the progress)
        self._stop: CommandWatch | None = None
        self._progress_due = False
        self._progress_at = -math.inf  # when rank 0 last wrote its progress (perf_counter)
        self._fault_iterations = frozenset(f.at_iteration for f in job.faults)
        self._last_checkpoint_at = self._last_record_at = time.monotonic()
        self._record_next = job.metrics_every_s is not None  # a world's first iteration records its metrics
        self._records: list[tuple[int, dict[str, float]]] = []
        self._timing_from: tuple[int, float] | None = None
        self._iteration_started = (time.time(), time.perf_counter())
        self._first_result = True
        self._clock: ClockMarks | None = None
        # the usual report and draw take a short path (`_settle`): a report while ``_reports + 1`` is under
        # `_quiet_reports` and its iteration under `_quiet_iteration`; a draw of a step under `_draw_until`
        self._quiet_reports = self._quiet_iteration = 0
        self._draw_until = -1
        self._check_until = 0  # the step of the next draw whose forwards are checked (`_arm_check`)
        self._recording = job.metrics_every_s is not None
        self.rng = "seeded"
        seed_everything(job.seed)  # the loop builds its model from the job's seed on every rank

    # -- what the plan gave this rank ------------------------------------------------------
    @property
    def steps_per_iteration(self) -> int:
        """Batches in one iteration: the job's; in a tuning trial without one,
        the `Trainer`'s, or one epoch of the data the loop first gave
        `prepare_loader` (`RankLoader.batches_per_epoch`); 1 until known."""
        return self._steps_per_iteration or 1

    @steps_per_iteration.setter
    def steps_per_iteration(self, steps: int) -> None:
        self._steps_per_iteration = steps
        self._quiet_reports, self._draw_until = 0, -1  # the short paths' bounds are in steps of the old length

    @property
    def iteration(self) -> int:
        """Iterations done: the data position (batches drawn) over the batches of an iteration."""
        return self.step // (self._steps_per_iteration or 1)  # `steps_per_iteration`, without its call

    @property
    def loss_scale(self) -> float:
        """The factor a loop that scales its own loss (``prepare_model(model,
        scale_loss=True)``) multiplies its batch-mean loss by: ``b_r * W / B``."""
        if self.job.weighting == "mean":
            return 1.0
        return loss_scale(self.local_batch, self.global_batch, self.world_size)

    @property
    def model(self) -> Any:
        """The prepared (DDP) model, or None before `prepare_model`."""
        return self._ddp

    # -- the contract ----------------------------------------------------------------------
    def prepare_model(self, model: Any, *, scale_loss: bool = False) -> Any:
        """`model` on this rank's device, wrapped in DDP, its gradients
        reweighted by batch share: by the communication hook, or, with
        `scale_loss`, by the loop itself multiplying its loss by `loss_scale`
        (cheaper; the `Trainer` short form does it); with equal local batches
        DDP's own average is the same weighting, and no hook is installed.
        The gradients are views of DDP's buckets (`data_parallel`).
        Call it once, after loading a restored state into the model."""
        if self._ddp is not None:
            raise ProblemError(f"{self._who()} called prepare_model twice; a job trains one model")
        if not isinstance(model, torch.nn.Module):
            raise ProblemError(f"{self._who()} gave prepare_model a {type(model).__name__}, but it takes a "
                               "torch.nn.Module")
        model = model.to(self.device)
        ddp = data_parallel(model, [self.device.index] if self._cuda else None)
        weighting = self.job.weighting
        # equal local batches: DDP's own averaging is the reweighting (b_r / B = 1 / W), in C++ without a hook
        if weighting == "hook" or (weighting == "batch" and not scale_loss and len(set(self.batches)) > 1):
            register_reweighting(ddp, self.local_batch, self.global_batch)
        if self.job.clock_every_s is not None:  # a training job's clock marks, for its online calibration
            self._clock = ClockMarks(model, ddp, self.job.clock_every_s)
        self._ddp = ddp
        self._draw_until = -1  # the next draw arms the batch check on it (`_arm_check`)
        return ddp

    def prepare_loader(self, data: Any, *, to_device: bool = True) -> "RankLoader":
        """This rank's share of each global batch of `data` (a map-style
        dataset, or a ``DataLoader`` whose dataset, collate function, workers
        and worker options are kept), from the data position to the job's
        end; batches moved to the context's device unless `to_device` is False."""
        loader = RankLoader(self, data, to_device)
        if self._steps_per_iteration is None:  # a tuning trial's iteration: one epoch of its (first) data
            self.steps_per_iteration = loader.batches_per_epoch
        return loader

    def restore(self) -> dict[str, Any] | None:
        """The state the loop checkpointed (its mapping, each object's
        ``state_dict()``), when this world resumes from a checkpoint; else None."""
        saved = self._saved
        if saved is None:
            return None
        keys = saved.get("state_keys", [k for k in ("model", "optimizer") if k in saved])
        return {key: saved[key] for key in keys}

    def report(self, metrics: Metrics = None, checkpoint: Mapping[str, Any] | None = None) -> None:
        """The iteration boundary: `metrics` of this rank's batch (numbers;
        or a callable that returns them, called only when the runtime records
        them), `checkpoint` the loop's state (kept by reference, written when a
        checkpoint is due). Raises `StopJob` when the runtime stops the job."""
        iteration = self.iteration
        if self._reports + 1 < self._quiet_reports and iteration < self._quiet_iteration:
            # the usual report: nothing due but its numbers' check and record (`_settle` says when it may)
            if checkpoint is not None and checkpoint is not self._state:
                self._state = _checked_state(checkpoint, self._who())
            self._reports += 1
            self._reported_iteration = iteration
            if callable(metrics):  # called only when the runtime records (a long report)
                return
            numbers = self._values(metrics)
            if self._recording:
                self._records.append((iteration, numbers))
            return
        if self._stopping:
            raise StopJob()
        if self._ddp is None:
            raise ProblemError(f"{self._who()} reported without calling ctx.prepare_model(model): its "
                               "gradients would not be averaged over the ranks")
        if not self._began:
            raise ProblemError(f"{self._who()} reported before drawing a batch from ctx.prepare_loader(...): "
                               "the plan's batches reach a job only through it")
        if checkpoint is not None and checkpoint is not self._state:  # the same mapping is checked when written
            self._state = _checked_state(checkpoint, self._who())
        self._reports += 1
        advanced = iteration > self._reported_iteration
        job = self.job
        last = job.iterations is not None and iteration >= job.iterations
        values: dict[str, float] | None = None
        if not callable(metrics) or (job.evaluate and advanced):
            values = self._values(metrics)  # numbers are checked at every report; a callable only when needed
        if job.metrics_every_s is not None and (self._record_next or last or not callable(metrics)):
            values = values if values is not None else self._values(metrics)
            # a trial whose metric goes by the default name ("metric"): that value is the scheduler's, not a record
            hidden = TRIAL_METRIC if job.evaluate and self._trial_metric == TRIAL_METRIC else None
            self._records.append((iteration, values if hidden not in values else
                                  {k: v for k, v in values.items() if k != hidden}))
        if self._record_next or last:
            self._flush_records()
            self._record_next = False
        due = advanced and job.checkpoint_every is not None and \
            iteration // job.checkpoint_every > self._reported_iteration // job.checkpoint_every
        saved = False
        if job.evaluate and advanced:  # a trial's result is posted once its iteration is durable
            metric = self._trial_score(values)
            if due:
                self._checkpoint({"metric": metric, "iteration_s": time.perf_counter() - self._iteration_started[1]})
                saved = True
            if self.rank == 0:
                self._post_result(metric, saved)
        self._reported_iteration = iteration
        if self._clock is not None and advanced:
            self._clock.iteration_done()
            self._clock.on = self._clock.on or iteration >= self._start + TIMING_WARMUP
        if iteration == self._start + TIMING_WARMUP and self._timing_from is None:
            self._timing_from = (iteration, time.perf_counter())
        stopped, save_now = self._exchange(advanced, last)
        if (save_now or due or last) and not saved and self._checkpointed != iteration:
            self._checkpoint()
        if self.rank == 0 and advanced and (self._progress_due or last or stopped or self._checkpointed == iteration
                                            or iteration in self._fault_iterations):
            self._channel.progress(iteration)
            self._progress_due, self._progress_at = False, time.perf_counter()
        if self._clock is not None:
            self._clock.publish(self._channel, iteration, force=stopped or last)
        if job.evaluate:  # when the next iteration started, for its result
            self._iteration_started = (time.time(), time.perf_counter())
        if stopped:
            self._stopping = True
            self._quiet_reports, self._draw_until = 0, -1
            self._flush_records()  # every record reaches the starter before the world ends
            raise StopJob()
        self._settle(iteration)

    def _settle(self, iteration: int) -> None:
        """After a report that took the long path: until when the reports
        and the draws may take their short paths, on which an iteration of
        tiny-mlp spends microseconds its own work does not (the loop path's
        cost over plain DDP, `benchmarks/runtime_overheads.py`). A report
        may while no exchange is due or in flight, no metrics are due to be
        sent, and its iteration reaches no end, checkpoint, fault or timing
        mark; never in a job that evaluates, awaits decisions or keeps
        clock marks, whose every report does work. A draw may while the
        loop is within its unreported limit, no faults are injected, and
        neither this draw nor the one before is a checked one (`_arm_check`)."""
        job = self.job
        if self._pending is not None or self._record_next or self._clock is not None or job.evaluate \
                or job.await_decision or self._steps_per_iteration is None:
            self._quiet_reports = 0
        else:
            self._quiet_reports = self._next_exchange
            marks = [f for f in self._fault_iterations if f > iteration]
            if job.iterations is not None:
                marks.append(job.iterations)
            if job.checkpoint_every is not None:
                marks.append((iteration // job.checkpoint_every + 1) * job.checkpoint_every)
            if self._timing_from is None and self._start + TIMING_WARMUP > iteration:
                marks.append(self._start + TIMING_WARMUP)
            self._quiet_iteration = min(marks, default=iteration + 2 ** 62)
        self._draw_from(iteration)

    def _draw_from(self, reported: int) -> None:
        """The step under which a draw takes its short path (`_settle`), the
        last report at iteration `reported`."""
        steps = self._steps_per_iteration
        if self._faults or self._stopping or not self._began or steps is None:
            self._draw_until = -1
            return
        until = min((reported + self._unreported_limit) * steps, self._check_until)
        end = self.iterations * steps if self.iterations is not None else None
        self._draw_until = until if end is None else min(until, end)

    # -- the runtime's side ----------------------------------------------------------------
    def finish(self, returned: Any) -> str:
        """After the loop returned: check it, checkpoint an end not yet
        checkpointed, and say how the world ended (``done`` or ``stopped``)."""
        if returned is not None:
            raise ProblemError(f"{self._who()} returned a {type(returned).__name__}; a loop function returns "
                               "nothing (a Trainer factory takes only keyword arguments, all given or defaulted)")
        if not self._began:  # a world that starts at the job's end: nothing to train
            self._begin()
        self._check_trained()
        if self._reports == 0 and self.step > self._start_step:
            raise ProblemError(f"{self._who()} returned without calling ctx.report(): the runtime checkpoints, "
                               "stops and re-plans a job only at its reports")
        iteration, end = self.iteration, self.job.iterations
        if end is not None and iteration < end:
            raise ProblemError(f"{self._who()} returned after iteration {iteration} of {end}: iterate "
                               "ctx.prepare_loader(...) to its end (the job's last iteration)")
        if self._pending is not None:  # an exchange the job's end made moot
            self._pending.wait()
            self._pending = None
        self._flush_records()  # every record reaches the starter before rank 0 posts the end
        if self._checkpointed != iteration:
            self._checkpoint()
        return "done" if end is not None and iteration >= end else "stopped"

    def timing(self) -> dict[str, Any] | None:
        """The throughput of this world's iterations after the first `TIMING_WARMUP`."""
        start = self._timing_from
        if start is None or self.iteration <= start[0]:
            return None
        return {"from_iteration": start[0], "to_iteration": self.iteration, "seconds": time.perf_counter() - start[1]}

    def _who(self) -> str:
        return f"job '{self.job.trainer}' (rank {self.rank})"

    def _begin(self) -> None:
        """Before the first batch: the world is ready to train; each rank's
        random state restored (the world that wrote the checkpoint) or seeded
        from ``(seed, step, rank)``."""
        self._began = True
        saved_rng = self._saved.get("rng") if self._saved is not None else None
        if saved_rng is not None and saved_rng["batches"] == self.batches:
            restore_rng(saved_rng["states"][self.rank], self.device if self._cuda else None)
            self.rng = "restored"
        else:
            seed_everything(rank_seed(self.job.seed, self.step, self.rank))
        self._channel.post("ready", start_iteration=self.iteration, rng=self.rng, world_size=self.world_size,
                           batch=self.local_batch)
        self._iteration_started = (time.time(), time.perf_counter())

    def _before_batch(self) -> None:
        """The runtime's work before each batch: the world's start, injected
        faults, and the check that the loop reports."""
        if self._stopping:
            raise StopJob()
        if not self._began:
            self._begin()
        self._check_trained()
        iteration = self.iteration
        if self._faults and self.step % self.steps_per_iteration == 0 and self._fired_at != iteration:
            self._fired_at = iteration
            _fire_faults(self, iteration)
        if iteration - self._reported_iteration >= self._unreported_limit:
            raise ProblemError(f"{self._who()} drew {iteration - self._reported_iteration} iterations without "
                               "calling ctx.report(); the runtime checkpoints, stops and re-plans a job only at "
                               "its reports: report every iteration (or every few)")
        self._arm_check(self.step)
        self._draw_from(self._reported_iteration)

    def _arm_check(self, step: int) -> None:
        """At the draw of `step`: whether the prepared model notes the
        batches of its training forwards until the next draw, which then
        checks them (`_check_trained`): in a world's first `_CHECK_FIRST`
        draws and at every `_CHECK_EVERY`-th. The model goes through
        `_checked_forward` while it does (an instance attribute over DDP's
        own forward), else through DDP's forward untouched."""
        checked = step < self._start_step + _CHECK_FIRST or step % _CHECK_EVERY == 0
        self._check_until = step + 1 if checked else (step // _CHECK_EVERY + 1) * _CHECK_EVERY
        ddp = self._ddp
        if ddp is None:
            return
        if checked:
            ddp.__dict__["forward"] = self._checked_forward  # not Module.__setattr__: no parameter or module
        else:
            ddp.__dict__.pop("forward", None)

    def _checked_forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """The prepared model's forward at a checked draw (`_arm_check`):
        DDP's, after noting the batch's shape of a training forward (train
        mode, gradients on) for `_check_trained`: the first input's, when it
        is a tensor with a batch dimension, else `_check_batch`'s pick.
        Not a forward pre-hook: a module with a hook takes torch's slower
        call path, 3 to 7 us a forward on tiny-mlp here."""
        ddp = self._ddp
        if ddp.training and torch.is_grad_enabled():
            first = inputs[0] if inputs else None
            if type(first) is torch.Tensor and first.dim():
                self._trained.append(first.shape)
            else:
                self._check_batch(inputs, kwargs)
        return DistributedDataParallel.forward(ddp, *inputs, **kwargs)

    def _check_batch(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """At a checked training forward whose first input is no tensor
        with a batch dimension (`_checked_forward`): notes the shape of the
        first input that is, for `_check_trained`."""
        for given in (args, kwargs.values()):
            for a in given:
                if isinstance(a, torch.Tensor) and a.dim() > 0:
                    self._trained.append(a.shape)  # a torch.Size, a tuple
                    return

    def _check_trained(self) -> None:
        """Before the next draw (and at the loop's end): the training forwards
        since the last draw held the plan's local batch along one dimension
        (the batch's): micro-batches that add up to it (gradient accumulation),
        or passes that each hold all of it (one pass; or several on the same
        batch, as sharpness-aware steps and `prime_buckets` make)."""
        shapes = list(self._trained)
        self._trained.clear()
        local = self.local_batch
        if not shapes or len(shapes) == 1 and shapes[0][0] == local:  # none, or the usual one pass
            return
        shapes = [tuple(shape) for shape in shapes]
        ranks = {len(shape) for shape in shapes}
        if len(ranks) == 1 and any(sum(shape[d] for shape in shapes) == local
                                   or all(shape[d] == local for shape in shapes) for d in range(ranks.pop())):
            return
        if len(shapes) == 1:
            got = f"a batch of shape {shapes[0]}"
        else:
            got = f"{len(shapes)} forward passes of shapes {', '.join(map(str, shapes))} between two draws (along no " \
                  "dimension do they add up to it, or each hold it)"
        raise ProblemError(f"{self._who()} trained on {got}, but the plan gives this rank {local} samples "
                           "(ctx.local_batch): train on the batches of ctx.prepare_loader(...) as they come, whole "
                           "or in micro-batches that add up to them")

    def _values(self, metrics: Metrics) -> dict[str, float]:
        got = metrics() if callable(metrics) else metrics
        if got is None:
            return {}
        if type(got) is dict:  # the usual: names to finite floats (``loss.item()``), kept as they are
            for name, value in got.items():
                if type(value) is not float or type(name) is not str or value - value != 0.0:  # inf - inf is nan
                    break
            else:
                return got.copy()
        if type(got) is not dict and not isinstance(got, Mapping):  # a dict, the usual, skips the ABC's check
            raise ProblemError(f"{self._who()} reported a {type(got).__name__}, but metrics must be a mapping "
                               "of names to numbers")
        values = {}
        for name, value in got.items():
            if type(value) is float:  # the usual (loss.item()): no conversion
                number = value
            else:
                try:
                    number = float(value)
                except (TypeError, ValueError, RuntimeError) as e:
                    raise ProblemError(f"{self._who()} reported {name!r} = {value!r}, which is not a number") from e
            if self._check_finite and not math.isfinite(number):
                raise ProblemError(f"{self._who()} reported {name} = {number} at iteration {self.iteration}; the "
                                   f"checkpoint of iteration {self._checkpointed} is kept")
            values[name if type(name) is str else str(name)] = number
        return values

    def _trial_score(self, values: Mapping[str, float] | None) -> float:
        """A tuning trial's result at an iteration boundary, as the scheduler
        sees it (higher is better): its metric, combined over the ranks that
        report it by batch share (`combine_metrics`; a metric every rank
        computes alike, on the whole validation set, stays what it is), times
        the sign of its mode. One small gather of the ranks' values, so every
        rank agrees when none reports it."""
        name = self._trial_metric
        mine = values.get(name) if values is not None else None
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, mine)
        per_rank = [{name: v} if v is not None else {} for v in gathered]
        if not any(per_rank):
            raise ProblemError(f"{self._who()}: a tuning trial must report {name!r} (the experiment's metric, "
                               f"which the scheduler reads) at every iteration's end: ctx.report({{{name!r}: ...}}); "
                               f"iteration {self.iteration} reported {sorted(values or {}) or 'nothing'}")
        return self._trial_sign * combine_metrics(per_rank, self.batches)[name]

    def _flush_records(self) -> None:
        """Every rank's buffered metrics to rank 0, combined per iteration and written to the sinks."""
        if self.job.metrics_every_s is None:
            return
        mine, self._records = self._records, []
        gathered: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        self._last_record_at = time.monotonic()
        if gathered is None:
            return
        at = time.time()
        out = [{"at": at, "iteration": iteration, "loss": values.pop("loss", None), "metrics": values}
               for iteration, values in combine_records(gathered, self.batches)]
        for sink in self._sinks:
            sink.write(out)

    def _exchange(self, advanced: bool, last: bool) -> tuple[bool, bool]:
        """At a report: (stop after this report, checkpoint now), as the ranks
        agreed. They agree, in one all-reduce of flags that rank 0 sets, on
        those, on recording metrics at the next report, and on how many
        reports until the next exchange: about `_EXCHANGE_S` of them (one, in
        a job that awaits its starter's decisions), at most as many as the
        world has made and at most `_MAX_GAP`, so that a small all-reduce
        costs little on short iterations.

        The all-reduce overlaps one iteration: an exchange starts it at one
        report, and every rank waits for it (long done: the iteration's own
        gradient all-reduce came after it) and acts on it at the next report,
        so no rank waits for the others at a report, as a loop without the
        runtime would not. A stop (or a checkpoint) rank 0 decides on at an
        exchange is so done at the report after it, by every rank, and no
        further exchange starts once a stop is agreed: a stop comes within
        about `_EXCHANGE_S` plus one iteration at the pace the gap was agreed
        at (and the moment rank 0's watch thread takes to wake) of being
        asked, and whatever their pace within as many reports as the world
        had made at the exchange before (at most `_MAX_GAP`) plus one.
        Rank 0 reads the starter's stop from that thread (`CommandWatch`): an
        exchange makes no round trip to the starter's store, which on a busy
        host would keep every rank waiting. A job that awaits its starter's decisions (a tuning trial)
        exchanges at every report and acts at once."""
        stop = save = False
        if self._pending is not None:  # the exchange of the previous report
            self._pending.wait()
            self._pending = None
            stop, save = self._agreed()
        if stop or (self._reports < self._next_exchange and not self.job.await_decision):
            return stop, save
        if self.job.await_decision:
            self._reduce(advanced).wait()
            return self._agreed()
        if not last:  # the job's last report waits for no later one: nothing to start
            self._pending = self._reduce(advanced)
        return stop, save

    def _reduce(self, advanced: bool) -> Any:
        """Start the all-reduce (maximum) of the flags of an exchange
        starting now: rank 0's decisions, zeros elsewhere. It calls the
        process group's all-reduce directly, as the reweighting hook does
        (`thrifty.runtime.ddp.reweight`), without ``dist.all_reduce``'s Python
        checks."""
        job = self.job
        if self.rank == 0:
            stop, save = self._decide(advanced)
            now, reports = time.perf_counter(), self._reports - self._exchanged[0]
            per_report = (now - self._exchanged[1]) / max(1, reports)
            record = job.metrics_every_s is not None and time.monotonic() - self._last_record_at >= job.metrics_every_s
            gap = max(1, min(_MAX_GAP, self._reports, int(_EXCHANGE_S / per_report) if per_report > 0 else _MAX_GAP))
            view = self._host_view  # item by item: a tuple given to the slice costs microseconds to convert
            view[0], view[1], view[2], view[3] = stop, save, record, gap
            if self._host_flags is not self._flags:
                self._flags.copy_(self._host_flags)
            # the progress goes to the starter's store at about every `_PROGRESS_S` of exchanges, not at each
            self._progress_due = self._progress_due or now - self._progress_at >= _PROGRESS_S
        elif self._host_flags is self._flags:
            self._host_view.fill(0)
        else:
            self._flags.zero_()
        self._exchanged = (self._reports, time.perf_counter())
        group = self._group
        if group is None:  # looked up once: `dist.group.WORLD` is a property that searches the world's groups
            group = self._group = dist.group.WORLD
            assert group is not None, "a rank's job runs in its world's process group"
        return group.allreduce([self._flags], _FLAGS_MAX)

    def _agreed(self) -> tuple[bool, bool]:
        """Act on the reduced flags of the exchange started at report
        ``self._exchanged[0]``: (stop, checkpoint now)."""
        flags = self._host_view if self._host_flags is self._flags else self._flags.cpu().numpy()
        stop_now, save_now, record, gap = flags.tolist()
        self._record_next = bool(record)
        self._next_exchange = self._exchanged[0] + gap
        return bool(stop_now), bool(save_now)

    def _decide(self, advanced: bool) -> tuple[bool, bool]:
        """Rank 0: (stop after this iteration, checkpoint now). An awaiting job
        waits for the starter's decision for this iteration (go, save:
        checkpoint and stop, anything else: stop); any other job stops, with a
        checkpoint, when the starter has asked, and checkpoints when its clock
        says so."""
        job = self.job
        if job.await_decision and advanced:
            decision = self._channel.wait_command(DECISION.format(self.iteration), job.timeout_s)
            return decision != "go", decision == "save"
        if self._stop is None:
            self._stop = self._channel.watch_command(STOP)
        stop = self._stop.given is not None
        timed = job.checkpoint_every_s is not None and \
            time.monotonic() - self._last_checkpoint_at >= job.checkpoint_every_s
        return stop, stop or timed

    def _post_result(self, metric: float, saved: bool) -> None:
        """Rank 0: the iteration's result, posted with its time (checkpoint
        included), whether it is `checkpointed` (then the checkpoint holds it),
        and, after a launch's first iteration, when it started and what the
        restore cost."""
        started_at, t0 = self._iteration_started
        extra = {"started_at": started_at, "restore_s": self.restore_s} if self._first_result else {}
        self._first_result = False
        self._channel.post("result", iteration=self.iteration, metric=metric, iteration_s=time.perf_counter() - t0,
                           checkpointed=saved, **extra)

    def _checkpoint(self, result: dict[str, float] | None = None) -> None:
        """Every rank's random state to rank 0, which writes the checkpoint
        atomically: the loop's state, the data position and the random states;
        with the iteration's `result` (metric, time) when it is written before
        the result is posted, so that a starter killed in between finds it."""
        if self._state is None:
            raise ProblemError(f"{self._who()}: a checkpoint is due at iteration {self.iteration}, but the loop "
                               "has not given its state: ctx.report(metrics, checkpoint={'model': model, "
                               "'optimizer': optimizer, ...})")
        _checked_state(self._state, self._who())  # as it is now: a report checks only a new mapping
        # the records up to the checkpoint reach the starter first: a world lost later loses none of them (its
        # successor replays the iterations after the checkpoint and reports those again)
        self._flush_records()
        job = self.job
        states: list[Any] = [None] * self.world_size
        dist.all_gather_object(states, capture_rng(self.device if self._cuda else None))
        self._checkpointed = self.iteration
        self._last_checkpoint_at = time.monotonic()
        if self.rank != 0:
            return
        state = {key: _state_of(value) for key, value in self._state.items()}
        seconds, size = save_checkpoint(job.checkpoint_path, {
            **state, "state_keys": list(state), "iteration": self.iteration, "step": self.step,
            "samples_seen": self.step * self.global_batch, "global_batch": self.global_batch, "trainer": job.trainer,
            "trainer_args": job.trainer_args, "seed": job.seed, "rng": {"batches": self.batches, "states": states},
            "saved_at": time.time(), **({"result": result} if result is not None else {}),
        })
        self._channel.post("checkpoint", iteration=self.iteration, save_s=seconds, bytes=size)


class RankLoader:
    """This rank's batches of the job's data stream (`JobContext.prepare_loader`):
    iterating it draws batch after batch from the data position to the job's
    end (without end in a tuning trial); several loops over it, or several
    loaders, share the one position."""

    def __init__(self, ctx: JobContext, data: Any, to_device: bool):
        from torch.utils.data import DataLoader, IterableDataset

        self.ctx = ctx
        options: dict[str, Any] = {}
        if isinstance(data, DataLoader):
            # every option of the user's loader (collate function, workers and their options, pinning, ...)
            # but the batching and the order, which are the plan's
            names = [name for name in inspect.signature(DataLoader.__init__).parameters
                     if name not in _REPLACED and hasattr(data, name)]
            options = {name: getattr(data, name) for name in names}
            if not options.get("num_workers"):  # DataLoader refuses these without workers
                options.pop("prefetch_factor", None)
                options.pop("persistent_workers", None)
            data = data.dataset
        if isinstance(data, IterableDataset) or not hasattr(data, "__len__") or not hasattr(data, "__getitem__"):
            raise ProblemError(f"{ctx._who()} gave prepare_loader a {type(data).__name__}, but it needs a map-style "
                               "dataset (len and [i]) or a DataLoader over one, to share each global batch by index")
        if len(data) < 1:
            raise ProblemError(f"{ctx._who()} gave prepare_loader an empty dataset")
        self.dataset, self.options, self.to_device = data, options, to_device
        self.stream = ShardedStream(len(data), ctx.global_batch, rank_offsets(ctx.batches)[ctx.rank], ctx.local_batch,
                                    ctx.job.seed)
        tensors = getattr(data, "tensors", None)
        self._sliced = isinstance(tensors, (tuple, list)) and len(tensors) >= 1 \
            and all(isinstance(t, torch.Tensor) for t in tensors) and not options.get("num_workers") \
            and options.get("collate_fn") in (None, _default_collate())
        self.batches_per_epoch = math.ceil(len(data) / ctx.global_batch)
        # slices of tensors already on the device stay there: nothing to move
        self._moves = to_device and not (self._sliced and all(t.device == ctx.device for t in tensors or ()))

    @property
    def epoch_end(self) -> bool:
        """Whether the batch just drawn is the last of an epoch: every
        `batches_per_epoch` (``ceil(len(data) / global batch)``, a
        ``DataLoader``'s length) draws, as the four-factory `Trainer` and a
        tuning trial count an epoch (a trial's iteration ends here, unless
        its experiment sets ``steps_per_iteration``). The same on every rank;
        False before the first draw. A loop evaluates here."""
        step = self.ctx.step
        return step > 0 and step % self.batches_per_epoch == 0

    def __len__(self) -> int:
        """Batches left to the job's end (a tuning trial's loader has no end: 0)."""
        end = self._end()
        return max(0, end - self.ctx.step) if end is not None else 0

    def _end(self) -> int | None:
        iterations = self.ctx.iterations
        return iterations * self.ctx.steps_per_iteration if iterations is not None else None

    def _steps(self) -> Iterator[int]:
        step, end = self.ctx.step, self._end()
        while end is None or step < end:
            yield step
            step += 1

    def _slices(self) -> Iterator[Any]:
        """`__iter__` over a dataset of tensors (a ``TensorDataset``): each
        tensor indexed at once by the batch's indices, as the default
        collate function would stack its samples. One generator, not a
        chain of them: on tiny-mlp a draw's every microsecond shows."""
        ctx, device, moves = self.ctx, self.ctx.device, self._moves
        tensors, indices, from_numpy = tuple(self.dataset.tensors), self.stream.indices, torch.from_numpy
        while True:
            step = ctx.step
            if step >= ctx._draw_until:  # else the short path (`JobContext._settle`): nothing to do
                end = self._end()
                if end is not None and step >= end:
                    return
                ctx._before_batch()
            index = from_numpy(indices(step))
            batch = tuple([t[index] for t in tensors])
            ctx.step = step + 1
            yield _to(batch, device) if moves else batch

    def __iter__(self) -> Iterator[Any]:
        return self._slices() if self._sliced else self._loaded()

    def _loaded(self) -> Iterator[Any]:
        """`__iter__` through a ``DataLoader`` (the user's options kept) whose batches are the plan's."""
        from torch.utils.data import DataLoader

        ctx = self.ctx
        sampler = (self.stream.indices(step).tolist() for step in self._steps())
        source = iter(DataLoader(self.dataset, batch_sampler=_Batches(sampler), **self.options))
        while True:
            end = self._end()
            if end is not None and ctx.step >= end:
                return
            ctx._before_batch()
            batch = next(source)
            ctx.step += 1
            yield _to(batch, ctx.device) if self._moves else batch


_REPLACED = frozenset({"self", "dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"})


class _Batches:
    """A batch sampler over a generator of index lists (DataLoader's protocol)."""

    def __init__(self, batches: Iterator[list[int]]):
        self.batches = batches

    def __iter__(self) -> Iterator[list[int]]:
        return self.batches


def _default_collate() -> Any:
    from torch.utils.data import default_collate

    return default_collate


def _to(batch: Any, device: Any) -> Any:
    """`batch` (tensors in tuples, lists and mappings) on `device`."""
    if isinstance(batch, torch.Tensor):
        return batch if batch.device == device else batch.to(device, non_blocking=True)
    if isinstance(batch, (tuple, list)):
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
            return type(batch)(*(_to(v, device) for v in batch))
        return type(batch)(_to(v, device) for v in batch)
    if isinstance(batch, Mapping):
        return type(batch)({k: _to(v, device) for k, v in batch.items()}) if type(batch) is dict \
            else {k: _to(v, device) for k, v in batch.items()}
    return batch


def _checked_state(state: Any, who: str) -> Mapping[str, Any]:
    if not isinstance(state, Mapping):
        raise ProblemError(f"{who} gave checkpoint= a {type(state).__name__}, but it takes a mapping of names to "
                           "objects with state_dict() or plain values")
    clash = sorted(RUNTIME_KEYS & set(map(str, state)))
    if clash:
        raise ProblemError(f"{who}: checkpoint= uses the names {clash}, which the runtime keeps for itself")
    return state


def _state_of(value: Any) -> Any:
    """What a checkpoint keeps of one entry of the loop's state."""
    if isinstance(value, DistributedDataParallel):
        value = value.module
    if hasattr(value, "state_dict") and callable(value.state_dict):
        return value.state_dict()
    return value


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


def _fire_faults(ctx: JobContext, iteration: int) -> None:
    """The injected faults due before this iteration (tests and demos)."""
    import os
    import signal
    import sys

    slow = sum(f.seconds for f in ctx._faults if f.kind == "slow" and f.active(iteration))
    if slow > 0:
        time.sleep(slow)
    for fault in ctx._faults:
        if fault.at_iteration != iteration:
            continue
        if fault.kind == "kill":
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)  # a preemption without notice
        elif fault.kind == "notice":
            machine = ctx.job.machine_ids[fault.rank] if ctx.job.machine_ids else None
            ctx._channel.post("notice", machine_id=machine, time_left_s=fault.seconds, iteration=fault.at_iteration)
        elif fault.kind == "hang":
            time.sleep(10 * ctx.job.timeout_s)
