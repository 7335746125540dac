"""Measurements that need worker processes of their own (Srifty 4.1):
DDP's overhead on a world of one (`measure_ddp_overhead`) and the latency
sweep measured in ``k`` co-located processes at once, which share the host's
cores as ``k`` worker processes of a run do (`measure_colocated`). Each
process is a rank of a worker world (`thrifty.runtime.worlds`)
and loads the workload from its factory spec; results come back as the
ranks' JSON results.

The co-located processes exchange their gradients for real in every
iteration, between backward and the optimizer step where DDP does (an
allreduce of DDP's bucket sizes over the world's gloo group, untimed;
`gradient_exchange`), because a run's compute is not the compute of a
process that only computes. Measured with two processes: after an exchange
a model's step and forward pass are slower than back to back (most for the
memory-bound embedding-bag, least for the MLP), and a sleep of the same
length in place of the exchange slows them alike, so it is the wait (a core
that idled, caches that others used meanwhile) more than the traffic. A
profile that times back-to-back iterations is therefore faster than any
training loop that communicates, most for memory-bound models. Srifty 4.1
profiles compute alone; this is thrifty's addition for workers that share a
host."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from collections.abc import Callable
from typing import Any, NoReturn

from thrifty.core.errors import ProblemError
from thrifty.runtime.measure.timing import (
    Samples,
    TimedTrainer,
    make_trainer,
    measure_sweep,
    point,
    timed_without_gc,
)
from thrifty.runtime.measure.workloads import import_torch, load_workload
from thrifty.runtime.worlds import RankChannel, World, join_world, serve_rank
from thrifty.perfmodels.profile import ColocatedPoints

__all__ = ["measure_ddp_overhead", "measure_colocated", "check_colocated", "gradient_exchange"]

STALL_TIMEOUT_S = 600.0  # a worker that reports nothing for this long is stopped


def check_colocated(colocated: int, factory: str | None, device: str, make_optimizer: Any) -> None:
    if isinstance(colocated, bool) or not isinstance(colocated, int) or colocated < 1:
        raise ProblemError(f"colocated is {colocated!r}, but must be an integer of at least 1")
    if colocated == 1:
        return
    if device != "cpu":
        raise ProblemError("colocated workers share a host's CPU cores; on CUDA each worker has its own GPU")
    if factory is None:
        raise ProblemError("colocated workers load the workload themselves: give its factory ('module:function')")
    if make_optimizer is not None:
        raise ProblemError("colocated workers use the default optimizer; leave make_optimizer out")




_THIS = "thrifty.runtime.measure.colocated"


def gradient_exchange(torch: Any, model: Any) -> Callable[[], None]:
    """What DDP does with the gradients between backward and the step, as a
    callable for `TimedTrainer.exchange`: the gradients, in reverse parameter
    order (DDP's), grouped into buckets of DDP's sizes (the first 1 MiB, then
    25 MiB, one dtype each), each copied into a flat buffer and allreduced
    over the default process group, all buckets in flight at once, then
    averaged and copied back. A sparse gradient is allreduced alone, as DDP
    does."""
    import torch.distributed as dist

    from thrifty.perfmodels.simulator import DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES

    params = [p for p in reversed(list(model.parameters())) if p.requires_grad]
    world = dist.get_world_size()

    def buckets(grads: list[Any]) -> list[list[Any]]:
        out: list[list[Any]] = []
        limit, size = DDP_FIRST_BUCKET_BYTES, 0
        current: list[Any] = []
        for g in grads:
            if current and (size >= limit or g.dtype != current[0].dtype):
                out.append(current)
                limit, size, current = DDP_BUCKET_BYTES, 0, []
            current.append(g)
            size += g.numel() * g.element_size()
        if current:
            out.append(current)
        return out

    def exchange() -> None:
        grads = [p.grad for p in params if p.grad is not None]
        pending: list[tuple[Any, Any, list[Any]]] = []
        for g in grads:
            if g.is_sparse:
                pending.append((dist.all_reduce(g, async_op=True), g, []))
        for bucket in buckets([g for g in grads if not g.is_sparse]):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            pending.append((dist.all_reduce(flat, async_op=True), flat, bucket))
        for work, flat, bucket in pending:
            work.wait()
            flat.div_(world)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()

    return exchange


def measure_ddp_overhead(factory: str, device: str, batch: int, warmup: int, repeats: int, threads: int) -> float:
    """Seconds PyTorch DDP adds to an iteration besides the allreduce: the
    median, over `repeats` interleaved pairs at `batch`, of a DDP iteration on
    a world of one process minus a plain one (its autograd hooks and collective launches;
    the model wrapped as a training rank wraps it, `data_parallel`).
    Runs in a worker process of its own (a world of one: gloo, or NCCL on
    CUDA), which loads the workload from `factory`."""
    settings = {"factory": factory, "device": device, "batch": batch, "warmup": warmup, "repeats": repeats,
                "threads": threads}
    world = World(1, f"{_THIS}:_ddp_overhead_rank", [json.dumps(settings)], threads=threads,
                  backend="nccl" if device == "cuda" else "gloo", preload=(_THIS,),
                  where="the DDP overhead measurement")
    [seconds] = world.run(stall_timeout_s=STALL_TIMEOUT_S, failure=ProblemError)
    return float(seconds)


def _ddp_overhead_rank(argv: list[str]) -> None:
    settings = json.loads(argv[0])
    serve_rank(lambda channel: _ddp_overhead(channel, **settings))


def _ddp_overhead(channel: RankChannel, factory: str, device: str, batch: int, warmup: int, repeats: int,
                  threads: int) -> NoReturn:
    torch = import_torch()
    from thrifty.runtime.ddp.reweight import data_parallel

    torch.set_num_threads(threads)
    join_world(channel, "nccl" if device == "cuda" else "gloo")
    workload = load_workload(factory)
    plain = make_trainer(torch, workload, device, None)
    wrapped = make_trainer(torch, workload, device, None)
    wrapped = dataclasses.replace(wrapped, model=data_parallel(wrapped.model))
    inputs, targets = plain.batch(batch)

    def seconds(trainer: TimedTrainer) -> float:
        m = trainer.iteration(inputs, targets)
        return trainer.clock.seconds(m.start, m.end)

    def pairs() -> list[float]:
        differences = []
        for i in range(warmup + repeats):
            first, second = (plain, wrapped) if i % 2 == 0 else (wrapped, plain)
            a, b = seconds(first), seconds(second)
            if i >= warmup:
                differences.append(b - a if first is plain else a - b)
        return differences

    # reported while the DDP model is alive: its teardown can block (finish_and_leave)
    channel.finish_and_leave(max(0.0, statistics.median(timed_without_gc(pairs))))


def measure_colocated(
    factory: str, sweep: list[int], workers: int, warmup: int, repeats: int, rounds: int, threads: int, bar: Any
) -> ColocatedPoints:
    """The latency sweep measured in `workers` processes at once (see the
    module docstring): each point pools the samples of every process."""
    settings = {"factory": factory, "sweep": sweep, "warmup": warmup, "repeats": repeats, "rounds": rounds,
                "threads": threads}
    per_worker = len(sweep) * (rounds * warmup + repeats)
    task = bar.add_task(f"{workers} co-located workers", total=per_worker * workers)
    world = World(workers, f"{_THIS}:_colocated_rank", [json.dumps(settings)], threads=threads, preload=(_THIS,),
                  where="a co-located worker")
    results = world.run(stall_timeout_s=STALL_TIMEOUT_S, failure=ProblemError,
                        on_progress=lambda done: bar.update(task, completed=done))
    bar.update(task, completed=per_worker * workers)
    pooled = {b: Samples([], [], []) for b in sweep}
    for result in results:
        for b, samples in result.items():
            pooled[int(b)].extend(Samples(**samples))
    return ColocatedPoints(
        workers=workers,
        host_cores=os.cpu_count(),
        exchange=True,
        step_s=statistics.fmean(v for s in pooled.values() for v in s.step_s),
        points=[point(b, s) for b, s in pooled.items()],
    )


def _colocated_rank(argv: list[str]) -> None:
    settings = json.loads(argv[0])
    serve_rank(lambda channel: channel.finish(_colocated_sweep(channel, **settings)))


def _colocated_sweep(channel: RankChannel, factory: str, sweep: list[int], warmup: int, repeats: int, rounds: int,
                     threads: int) -> dict[int, dict[str, list[float]]]:
    """One co-located process: the sweep, in step with the others (a barrier
    of the world before every batch, so that all of them run it together, and
    the gradient exchange in every iteration)."""
    ticks = 0
    barriers = 0

    def tick() -> None:
        nonlocal ticks
        ticks += 1
        channel.progress(ticks)

    def report(_doing: str) -> Callable[[], None]:
        nonlocal barriers
        barriers += 1
        channel.barrier(f"batch-{barriers}")  # every process starts this batch together
        return tick

    torch = import_torch()
    torch.set_num_threads(threads)
    join_world(channel, "gloo")
    trainer = make_trainer(torch, load_workload(factory), "cpu", None)
    trainer = dataclasses.replace(trainer, exchange=gradient_exchange(torch, trainer.model))
    measured = measure_sweep(trainer, sweep, warmup, repeats, rounds, report)
    return {b: dataclasses.asdict(s) for b, s in measured.items()}
