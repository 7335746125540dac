"""Measure a scaling profile (RubberBand 4.1, "Modeling Variables"): the
latency of one synchronous training iteration of one trial as a function of
the number of workers (GPUs) it gets, with its standard deviation, at a fixed
trial batch (strong scaling), written as ``thrifty.scaling_profile/1``
(`thrifty.perfmodels.scaling.parse_scaling_profile` reads it).

For each world size ``W`` the profiler starts ``W`` real worker processes on
this host that form a ``torch.distributed`` group (gloo over 127.0.0.1 on CPU,
NCCL with one GPU per rank on CUDA), started as a worker world
(`thrifty.runtime.worlds.World`, as the allreduce probe's).
Every rank builds the workload from the factory (``module:function``, as
`thrifty.runtime.measure.profiler.load_workload` resolves it), wraps the model in
``DistributedDataParallel`` and trains it with SGD at the per-rank batch
``batch // W``: the trial's batch stays the same as workers are added, as in
RubberBand, so a batch not divisible by every ``W`` is rejected. One
measurement:

1. all ranks meet at a barrier;
2. each rank runs forward, backward (DDP's bucketed allreduce overlaps it) and
   the optimizer step, and times it (CUDA events on GPUs);
3. the iteration's time is the *largest* over ranks, since a synchronous
   iteration is done only when its slowest worker is.

After `warmup` untimed iterations, `iterations` timed ones give the mean and
sample sd of each point. The profile's ``startup_s`` is the time from starting
the smallest world to its rank 0 starting the first iteration (forking the
ranks from the fork server, which has torch imported, as thrifty's tuning
runtime launches a trial; model construction; rendezvous), RubberBand's trial
start-up latency measured on this host. (Until issue 15 the ranks were fresh
interpreters, and ``startup_s`` also held an interpreter start and a torch
import per rank.)

Deviations from RubberBand: RubberBand profiles each model on the cloud
instance type it will rent, on GPUs; this profiler measures the host it runs
on, and on a CPU-only host every worker is a process with `threads` torch
threads, so the points describe local CPU workers (``instance_type``
``local`` unless told otherwise), not GPUs. RubberBand does not say how the
startup latency is measured; here it excludes loading a checkpoint (the
workload starts from its factory's initial weights).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from thrifty.core.errors import ProblemError
from thrifty.runtime.measure.probe import Placement, ProbeFailed
from thrifty.runtime.worlds import RankChannel, World, join_world, serve_rank, world_barrier
from thrifty.perfmodels.profile import Provenance
from thrifty.perfmodels.scaling import SCALING_FORMAT, ScalingPoint, ScalingProfileFile

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "default_model_name",
    "check_world_sizes",
    "profile_scaling",
]

DEFAULT_TIMEOUT_S = 300.0
_ENTRY = "thrifty.runtime.measure.scaling_profiler:_worker_entry"

ProgressCallback = Callable[[int, int, str], None]


def default_model_name(spec: str) -> str:
    """The profile's model name for a factory spec: its function's name, ``_`` as ``-``."""
    return spec.rsplit(":", 1)[-1].rsplit(".", 1)[-1].replace("_", "-")


def check_world_sizes(
    world_sizes: Sequence[int], batch: int, *, sizes_name: str = "world_sizes", batch_name: str = "batch"
) -> list[int]:
    """The distinct world sizes in increasing order, checked: integers >= 1,
    including 1 (a scaling profile starts at one worker), each dividing
    `batch` (strong scaling: every rank gets ``batch // W`` samples). Errors
    name the argument as `sizes_name` / `batch_name`."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ProblemError(f"{batch_name} is {batch!r}, but must be a positive integer")
    sizes = list(world_sizes)
    if not sizes:
        raise ProblemError(f"{sizes_name} is empty, but must list at least one world size")
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ProblemError(f"{sizes_name} has {size!r}, but every world size must be an integer >= 1")
    sizes = sorted(set(sizes))
    if sizes[0] != 1:
        raise ProblemError(f"{sizes_name} is {sizes}, but must include 1: a scaling profile starts at one worker")
    for size in sizes:
        if batch % size:
            raise ProblemError(
                f"{batch_name} is {batch}, but must be divisible by every world size ({size} does not divide it): "
                "the trial's batch is split evenly over its workers"
            )
    return sizes


def _check_counts(iterations: int, warmup: int, threads: int, timeout_s: float) -> None:
    for name, value, least in (("iterations", iterations, 1), ("warmup", warmup, 0), ("threads", threads, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ProblemError(f"{name} is {value!r}, but must be an integer of at least {least}")
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ProblemError(f"timeout_s is {timeout_s!r}, but must be a positive number of seconds")


# --- the worker (one process per rank) ----------------------------------------------


@dataclass(frozen=True)
class _RankPlan:
    backend: str
    spec: str
    rank_batch: int
    iterations: int
    warmup: int
    threads: int
    timeout_s: float


def _worker_entry(argv: list[str]) -> None:
    """Entry point of one rank (a `thrifty.runtime.worlds.World` rank)."""
    plan = _RankPlan(**json.loads(argv[0]))
    serve_rank(lambda channel: _train(plan, channel))


def _train(plan: _RankPlan, channel: RankChannel) -> None:
    """Train the workload under DDP; rank 0 reports progress after every
    iteration and, at the end, the per-iteration max over ranks and the wall
    time at which its first iteration started."""
    import torch
    import torch.distributed as dist

    from thrifty.runtime.ddp.reweight import data_parallel
    from thrifty.runtime.measure.timing import make_trainer, timed_without_gc
    from thrifty.runtime.measure.workloads import load_workload

    torch.set_num_threads(plan.threads)
    device = join_world(channel, plan.backend, plan.timeout_s)
    # the profiler's trainer (a copy of the model, SGD as `thrifty profile`
    # uses, a clock that syncs the GPU), with the model wrapped in DDP
    trainer = make_trainer(torch, load_workload(plan.spec), device.type, None)
    gpu_ids = [device.index] if device.type == "cuda" else None
    trainer = replace(trainer, model=data_parallel(trainer.model, gpu_ids))
    inputs, targets = trainer.batch(plan.rank_batch)

    def iterate() -> tuple[list[float], float]:
        times: list[float] = []
        first_started = time.time()
        for i in range(plan.warmup + plan.iterations):
            world_barrier(device)
            m = trainer.iteration(inputs, targets)
            if i >= plan.warmup:
                times.append(trainer.clock.seconds(m.start, m.end))
            if channel.rank == 0:
                channel.progress(i + 1)
        return times, first_started

    times, first_started = timed_without_gc(iterate)
    # a synchronous iteration is done when its slowest rank is
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    world_barrier(device)
    channel.finish_and_leave({"times": slowest.cpu().tolist(), "first_started": first_started}
                             if channel.rank == 0 else None)


# --- the parent ---------------------------------------------------------------------


def profile_scaling(
    spec: str,
    world_sizes: Sequence[int],
    batch: int,
    *,
    iterations: int,
    warmup: int,
    device: str = "auto",
    threads: int = 1,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    model_name: str | None = None,
    instance_type: str = "local",
    command: str | None = None,
    on_progress: ProgressCallback | None = None,
    placement: Placement | None = None,
    job_args: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Measure the scaling profile of the workload that the factory `spec`
    (``module:function``) builds, at every world size in `world_sizes` (which
    must include 1), with the trial batch `batch`; or, with `job_args`, of
    the job `spec` (a loop function or a `Trainer` factory, with those
    arguments): its own loop through the rank loop of ``thrifty run``
    (`thrifty.runtime.measure.job_truth.job_scaling`).
    Return the
    ``thrifty.scaling_profile/1`` document (schema
    `thrifty.perfmodels.scaling.ScalingProfileFile`).

    `timeout_s` bounds every collective and the rendezvous, and is how long
    a world may go without finishing an iteration before it is stopped.
    `on_progress(done, total, label)` is called as iterations finish (over
    all worlds). `command` is recorded in the provenance (default: this call).
    `placement` puts each world's ranks on a cluster's machines (as the
    allreduce probe's; default: processes of this host); `device` is then
    the machines' (``cpu`` or ``cuda``), not resolved here.
    Raises `ProblemError` for bad arguments or a bad factory,
    `thrifty.runtime.measure.probe.ProbeFailed` when a world fails or stalls.
    """
    from thrifty.runtime.measure.workloads import machine_description, resolve_device

    sizes = check_world_sizes(world_sizes, batch)
    _check_counts(iterations, warmup, threads, timeout_s)
    if placement is not None and device not in ("cpu", "cuda"):
        raise ProblemError(f"device is '{device}', but on a cluster's machines it must be 'cpu' or 'cuda'")
    resolved: str = resolve_device(device) if placement is None else device
    backend = "nccl" if resolved == "cuda" else "gloo"
    if resolved == "cuda" and placement is None:
        _check_gpus(sizes)
    if job_args is not None:
        from thrifty.runtime.measure.job_truth import job_scaling

        times, startup_s = job_scaling(spec, job_args, sizes, batch, iterations=iterations, warmup=warmup,
                                       device=resolved, threads=threads, timeout_s=timeout_s,
                                       on_progress=on_progress, placement=placement)
        points = [scaling_point(size, t, iterations) for size, t in zip(sizes, times)]
        iteration = f"one iteration of the job's own loop, batch {batch} split over the workers"
    else:
        points, startup_s = _workload_points(spec, sizes, batch, iterations, warmup, threads, timeout_s, backend,
                                             on_progress, placement)
        iteration = f"one synchronous DDP training step of batch {batch} split over the workers"
    return ScalingProfileFile(
        format=SCALING_FORMAT,
        model=model_name or default_model_name(spec),
        instance_type=instance_type,
        batch=batch,
        iteration=iteration,
        startup_s=round(startup_s, 4),
        provenance=Provenance(
            kind="measured",
            command=command or _python_command(spec, sizes, batch, iterations, warmup, device, threads),
            machine=(f"{machine_description(resolved, threads)}, {backend} backend" if placement is None
                     else f"machines of {instance_type}, {backend} backend, {threads} torch threads per worker"),
            date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
            notes=(f"measured from the job '{spec}' itself (its own loop), arguments "
                   f"{json.dumps(dict(job_args), sort_keys=True)}" if job_args is not None else None),
        ),
        points=points,
    ).to_json()


def _workload_points(spec: str, sizes: list[int], batch: int, iterations: int, warmup: int, threads: int,
                     timeout_s: float, backend: str, on_progress: ProgressCallback | None,
                     placement: Placement | None) -> tuple[list[ScalingPoint], float]:
    """A workload's worlds (module docstring): per size its point, and the smallest world's start-up."""
    from thrifty.runtime.measure.workloads import load_workload

    load_workload(spec)  # a bad factory is a clear error here, not a traceback from every rank
    per_world = warmup + iterations
    total = per_world * len(sizes)
    points: list[ScalingPoint] = []
    startup_s = 0.0
    for index, size in enumerate(sizes):
        plan = _RankPlan(backend, spec, batch // size, iterations, warmup, threads, float(timeout_s))

        def progress(done: int, offset: int = index * per_world, size: int = size) -> None:
            if on_progress is not None:
                on_progress(offset + done, total, _workers(size))

        launcher, rank_env = placement(size) if placement is not None else (None, None)
        launched = time.time()
        world = World(size, _ENTRY, [json.dumps(asdict(plan))], backend=backend, threads=threads,
                      timeout_s=timeout_s, preload=(_ENTRY.split(":")[0],), launcher=launcher, rank_env=rank_env,
                      where=f"scaling profile of '{spec}' with {_workers(size)}")
        result = world.run(stall_timeout_s=timeout_s, on_progress=progress, failure=ProbeFailed)[0]
        if index == 0:
            startup_s = max(0.0, result["first_started"] - launched)
        points.append(scaling_point(size, result["times"], iterations))
    return points, startup_s


def _workers(size: int) -> str:
    return f"{size} worker{'s' if size > 1 else ''}"


def _check_gpus(sizes: list[int]) -> None:
    import torch

    gpus = torch.cuda.device_count()
    if sizes[-1] > gpus:
        raise ProblemError(f"world size {sizes[-1]} needs one GPU per worker, but this host has {gpus}")


def scaling_point(size: int, times: list[float], iterations: int) -> ScalingPoint:
    """The point of world size `size`: the mean and sample sd of its `iterations` iteration times."""
    if len(times) != iterations:
        raise ProbeFailed(f"world size {size}: expected {iterations} iteration times, got {len(times)}")
    return ScalingPoint(
        gpus=size,
        iteration_s=statistics.fmean(times),
        iteration_sd_s=statistics.stdev(times) if len(times) > 1 else 0.0,
        repeats=iterations,
    )


def _python_command(
    spec: str, sizes: list[int], batch: int, iterations: int, warmup: int, device: str, threads: int
) -> str:
    settings = f"iterations={iterations}, warmup={warmup}, device={device!r}, threads={threads}"
    return f"thrifty.runtime.measure.scaling_profiler.profile_scaling({spec!r}, {sizes}, {batch}, {settings})"
