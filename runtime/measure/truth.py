"""The truth loop: real data-parallel training iterations of a workload on
this host, timed as a user's own training loop runs them. What thrifty's
predictions are checked against (``thrifty validate``,
``benchmarks/perfmodel_accuracy.py``).

Each rank is a process of a worker world
(`thrifty.runtime.worlds.World`: forked from the fork server, under
the allocator policy every worker runs with, `thrifty.runtime.worlds.allocator`)
that joins a torch.distributed group (gloo over 127.0.0.1 with `threads` torch
threads on CPU, NCCL with one GPU per rank on CUDA), builds the workload from
its factory (``module:function``; the zoo's factories at their default seed),
wraps the model in PyTorch DDP with its default buckets and trains it with
SGD (lr 1e-3, momentum 0.9, as `thrifty profile` does) on its own local batch.
The loop is the ordinary one: forward, loss, ``backward()``, ``step()``,
``zero_grad()`` (gradients freed, PyTorch's default), on four batches drawn
before the loop and reused in turn, with no barrier between iterations (one
before the first timed iteration, after `warmup` untimed ones).

What is timed, per rank and iteration: the whole iteration (from before the
forward pass to after ``zero_grad()``) and, by clock marks between its parts,
the forward pass with the loss (which includes DDP's broadcast of buffers),
the backward pass (DDP's ``backward()`` returns only when its allreduces are
done, so it holds the exposed communication, and any wait for a slower rank)
and the optimizer step with ``zero_grad()``. On CPU a mark is one
``time.perf_counter()`` call (under a microsecond, against iterations of
milliseconds); on CUDA it records a CUDA event on the current stream
(asynchronous: the loop never waits for the GPU, as a user's loop does not),
read after the last iteration. A synchronous iteration ends with its slowest
rank, so a run's iteration time is, per iteration, the largest over ranks.
Rank 0 tells the starter about its progress at most once a second, between
two iterations, so that a long run is not taken for a stalled one.

The host's speed drifts (a shared VM moves by 10-30% over minutes), so
`measure_rounds` runs every configuration several times, interleaved, and
`summarize` takes the median of the rounds' means and says how far they
spread.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn, TypeVar

import numpy as np
from pydantic.dataclasses import dataclass as pydantic_dataclass

from thrifty.core.errors import ProblemError
from thrifty.core.validation import RECORD_CONFIG
from thrifty.runtime.worlds import RankChannel, World, WorldFailed

__all__ = ["TruthRun", "Truth", "measure_once", "measure", "measure_rounds", "interleaved", "retried", "summarize",
           "check_ranks",
           "DEFAULT_WARMUP", "PHASES", "RANKS_PER_CORE"]

log = logging.getLogger(__name__)

DEFAULT_WARMUP = 10
STALL_TIMEOUT_S = 300.0  # a world that reports nothing for this long is stopped
JOIN_TIMEOUT_S = 60.0  # rendezvous and every collective of the loop
PROGRESS_EVERY_S = 1.0
PHASES = ("iteration_s", "forward_s", "backward_s", "step_s")
# CPU ranks beyond this many per core time-share the cores so thinly that the
# run says more about the scheduler than about training (the accuracy
# benchmark goes to 2 per core)
RANKS_PER_CORE = 4

_ENTRY = "thrifty.runtime.measure.truth:_rank"

Config = tuple[str, tuple[int, ...]]  # (factory 'module:function', per-rank batches)


@dataclass(frozen=True)
class TruthRun:
    """The timed iterations of one run, in seconds: per phase an array of
    shape (ranks, iterations)."""

    batches: tuple[int, ...]
    iteration_s: np.ndarray
    forward_s: np.ndarray
    backward_s: np.ndarray
    step_s: np.ndarray
    # a job's run (`thrifty.runtime.measure.job_truth`) splits the backward pass from the exchange after it
    compute_s: np.ndarray | None = None
    exchange_s: np.ndarray | None = None

    def slowest(self, phase: str = "iteration_s") -> np.ndarray:
        """Per iteration, the largest time of `phase` over the ranks."""
        return np.max(getattr(self, phase), axis=0)


@pydantic_dataclass(frozen=True, config=RECORD_CONFIG)
class Truth:
    """What the rounds of one configuration measured, in seconds.

    mean_s: the median over rounds of the round's mean iteration time (per
        iteration the slowest rank's); p95_s: the 95th percentile of all
        rounds' iterations pooled; spread: max/min - 1 of the round means
        (how much the host moved).
    forward_s, backward_s, step_s: the same median of round means for each
        part, per iteration the slowest rank's part (so they need not add up
        to `mean_s`: the slowest forward and the slowest backward may be on
        different ranks).
    rank_mean_s: per rank, its mean iteration time over all rounds.
    timed_iterations: how many iterations the figures pool (all rounds').
    compute_s, exchange_s: a job's backward pass and the exchange after its
        last gradient, measured apart (`backward_s` is their sum); None for
        a workload's truth loop, which does not split them.
    """

    batches: tuple[int, ...]
    mean_s: float
    p95_s: float
    spread: float
    round_means_s: tuple[float, ...]
    forward_s: float
    backward_s: float
    step_s: float
    rank_mean_s: tuple[float, ...]
    timed_iterations: int
    compute_s: float | None = None
    exchange_s: float | None = None


def check_ranks(batches: Sequence[int], device: str, what: str = "the configuration") -> None:
    """Whether this host can run `batches` (one rank each) as a truth loop on
    `device`: on CUDA one GPU per rank, on CPU at most `RANKS_PER_CORE` ranks
    per core; a `ProblemError` naming `what` otherwise."""
    ranks = len(batches)
    if ranks < 1:
        raise ProblemError(f"{what} has no ranks, but needs at least one")
    if device == "cuda":
        import torch

        gpus = torch.cuda.device_count()
        if ranks > gpus:
            raise ProblemError(f"{what} needs {ranks} ranks, one GPU each, but this host has {gpus} GPUs")
        return
    cores = os.cpu_count() or 1
    if ranks > RANKS_PER_CORE * cores:
        raise ProblemError(
            f"{what} needs {ranks} worker processes, but this host has {cores} CPU cores: at most "
            f"{RANKS_PER_CORE * cores} ({RANKS_PER_CORE} per core) can be measured meaningfully here")


# --- one rank (a worker world's rank) ----------------------------------------------------


def _rank(argv: list[str]) -> None:
    """Entry point of one rank of a measured DDP run."""
    from thrifty.runtime.worlds import serve_rank

    settings = json.loads(argv[0])
    serve_rank(lambda channel: _train(channel, **settings))


def _train(channel: RankChannel, factory: str, batches: list[int], warmup: int, iters: int,
           device: str = "cpu", threads: int = 1) -> NoReturn:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from thrifty.runtime.measure.timing import make_trainer
    from thrifty.runtime.measure.workloads import load_workload
    from thrifty.runtime.worlds import join_world, world_barrier

    torch.set_num_threads(threads)
    where = join_world(channel, "nccl" if device == "cuda" else "gloo", JOIN_TIMEOUT_S)
    rank = dist.get_rank()
    # the profiler's model, loss, optimizer (SGD, lr 1e-3, momentum 0.9) and clock, on this rank's device
    trainer = make_trainer(torch, load_workload(factory), device, None)
    model = DDP(trainer.model, device_ids=[where.index] if where.type == "cuda" else None)
    loss_fn, opt, clock = trainer.loss_fn, trainer.optimizer, trainer.clock
    data = [trainer.batch(batches[rank]) for _ in range(4)]
    marks = []
    reported = time.perf_counter()
    for i in range(warmup + iters):
        if i == warmup:
            world_barrier(where)
        t0 = clock.mark()
        x, y = data[i % 4]
        loss = loss_fn(model(x), y)
        t1 = clock.mark()
        loss.backward()
        t2 = clock.mark()
        opt.step()
        opt.zero_grad()  # as a user writes it (gradients freed), and as thrifty's worker and the profiler do
        t3 = clock.mark()
        if i >= warmup:
            marks.append((t0, t1, t2, t3))
        if rank == 0 and time.perf_counter() - reported > PROGRESS_EVERY_S:
            channel.progress(i + 1)
            reported = time.perf_counter()
    clock.sync()
    world_barrier(where)
    seconds = clock.seconds
    channel.finish_and_leave({"iteration_s": [seconds(a, d) for a, _b, _c, d in marks],
                              "forward_s": [seconds(a, b) for a, b, _c, _d in marks],
                              "backward_s": [seconds(b, c) for _a, b, c, _d in marks],
                              "step_s": [seconds(c, d) for _a, _b, c, d in marks]})


# --- the starter ------------------------------------------------------------------------------


def measure_once(factory: str, batches: Sequence[int], warmup: int, iters: int, *, device: str = "cpu",
                 threads: int = 1) -> TruthRun:
    """One run: ``len(batches)`` ranks, rank r training on ``batches[r]``
    samples per iteration, `warmup` untimed then `iters` timed iterations.
    Raises `WorldFailed` when a rank fails, dies or stalls."""
    settings = {"factory": factory, "batches": list(batches), "warmup": warmup, "iters": iters,
                "device": device, "threads": threads}
    world = World(len(batches), _ENTRY, [json.dumps(settings)], where=f"a DDP worker of '{factory}'",
                  backend="nccl" if device == "cuda" else "gloo", threads=threads,
                  preload=(_ENTRY.split(":")[0],))
    results = world.run(stall_timeout_s=STALL_TIMEOUT_S, failure=WorldFailed)
    return TruthRun(tuple(batches), *(np.array([r[phase] for r in results]) for phase in PHASES))


def measure(factory: str, batches: Sequence[int], warmup: int, iters: int, *, device: str = "cpu",
            threads: int = 1, attempts: int = 3) -> TruthRun:
    """`measure_once`, tried again after a failure (`retried`)."""
    return retried(lambda: measure_once(factory, batches, warmup, iters, device=device, threads=threads),
                   f"{factory} {tuple(batches)}", attempts)


R = TypeVar("R")


def retried(run: Callable[[], R], what: str, attempts: int = 3) -> R:
    """``run()``, tried again after a `WorldFailed` (gloo on a busy host
    sometimes drops a connection), at most `attempts` times."""
    for attempt in range(1, attempts + 1):
        try:
            return run()
        except WorldFailed as e:
            if attempt == attempts:
                raise
            log.warning("retrying %s: %s", what, e)  # whole: a stall carries the stacks
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def measure_rounds(configs: Sequence[Config], warmup: int, iters: int, rounds: int, *, device: str = "cpu",
                   threads: int = 1, on_run: Callable[[int, int, TruthRun], None] | None = None
                   ) -> list[list[TruthRun]]:
    """Every configuration ``(factory, batches)`` run `rounds` times
    (`interleaved`); per configuration, its runs in round order."""
    return interleaved(len(configs), rounds, lambda k: measure(configs[k][0], configs[k][1], warmup, iters,
                                                               device=device, threads=threads), on_run)


def interleaved(count: int, rounds: int, run: Callable[[int], TruthRun],
                on_run: Callable[[int, int, TruthRun], None] | None = None) -> list[list[TruthRun]]:
    """``run(k)`` for each of `count` configurations, `rounds` times, the
    rounds interleaved over all configurations (round-robin, as the profiler
    spreads its repeats), so that a slow spell of the host does not fall on
    one configuration; per configuration, its runs in round order.
    ``on_run(round, index, run)`` is called after each run."""
    runs: list[list[TruthRun]] = [[] for _ in range(count)]
    for r in range(rounds):
        for k in range(count):
            done = run(k)
            runs[k].append(done)
            if on_run is not None:
                on_run(r, k, done)
    return runs


def summarize(runs: Sequence[TruthRun]) -> Truth:
    """The rounds of one configuration in figures (see `Truth`)."""
    if not runs:
        raise ValueError("summarize needs at least one run")

    def median_of_means(phase: str) -> float:
        return float(statistics.median(float(run.slowest(phase).mean()) for run in runs))

    means = tuple(float(run.slowest().mean()) for run in runs)
    pooled = np.concatenate([run.slowest() for run in runs])
    per_rank = np.concatenate([run.iteration_s for run in runs], axis=1)
    return Truth(
        batches=runs[0].batches,
        mean_s=float(np.median(means)),
        p95_s=float(np.quantile(pooled, 0.95)),
        spread=max(means) / min(means) - 1.0,
        round_means_s=means,
        forward_s=median_of_means("forward_s"),
        backward_s=median_of_means("backward_s"),
        step_s=median_of_means("step_s"),
        rank_mean_s=tuple(float(v) for v in per_rank.mean(axis=1)),
        timed_iterations=int(pooled.size),
        compute_s=median_of_means("compute_s") if runs[0].compute_s is not None else None,
        exchange_s=median_of_means("exchange_s") if runs[0].exchange_s is not None else None,
    )
