"""The worker: one rank of synchronous data-parallel training (Srifty 4.5).

Run by the driver (`thrifty.runtime.training.launcher`) as
``python -m thrifty.runtime.training.worker --job JOB.json``, or by torchrun::

    torchrun --nproc-per-node 3 -m thrifty.runtime.training.worker \\
        --trainer thrifty.runtime.training.examples:tiny_mlp --batches 3,5,8 \\
        --iterations 100 --checkpoint run/checkpoint.pt

Rank, world size and the rendezvous come from the torchrun environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``,
``init_method="env://"``); gloo on CPU, NCCL on GPUs. Each rank trains on its
own local batch (`sharding`), its gradient is weighted by its share of the
global batch before DDP's average (`reweight`), and every `checkpoint_every` iterations (or seconds, or when
asked to stop) rank 0 writes an atomic checkpoint (`checkpoint`). About once
every `metrics_every_s` the ranks report the training loss (the global-batch
mean: each rank's mean weighted by its batch share) and the trainer's own
metrics, gathered on rank 0; the decision to report travels in the per-iteration
flags all-reduce, so every rank takes part in the same iterations.

When the thrifty driver launched it (a rank of a worker world,
`thrifty.perfmodels.measure.worlds`; the driver hosts the rendezvous store,
as torchrun's agent does with ``TORCHELASTIC_USE_AGENT_STORE``), the worker
also reports through that store, in the worlds' one protocol: events (ready,
checkpoints, spot notices, errors), progress, and the latest loss and
metrics; and rank 0 reads the driver's stop command each iteration and
shares it with the other ranks in the flags all-reduce, so every rank stops
after the same iteration.

This module imports torch at the top: only worker processes import it.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from thrifty.datasets.errors import ProblemError
from thrifty.perfmodels.measure.worlds import RankChannel, join_world, resolve_backend, serve_rank
from thrifty.runtime.training.checkpoint import (
    capture_rng,
    load_checkpoint,
    rank_seed,
    restore_rng,
    save_checkpoint,
    seed_everything,
)
from thrifty.runtime.training.job import JobSpec, WorkerFault
from thrifty.runtime.training.reweight import loss_scale, register_reweighting
from thrifty.runtime.training.sharding import ShardedStream, rank_offsets
from thrifty.runtime.training.trainer import Trainer, load_trainer

__all__ = ["main", "run_worker", "fetch_batch", "train_step", "prime_buckets", "single_process_reference",
           "combine_reports", "STOP", "METRICS"]

log = logging.getLogger(__name__)  # to the worker's log file (stderr), never to the driver's terminal
STOP = "stop"  # the driver's command: checkpoint and stop
METRICS = "metrics"  # rank 0 publishes the latest loss and metrics under this name
TIMING_WARMUP = 3  # iterations left out of the throughput a finished world reports


def fetch_batch(dataset: Any, indices: np.ndarray, device: Any) -> tuple[Any, Any]:
    """The samples at `indices` as one batch ``(inputs, targets)``; a
    ``TensorDataset`` is sliced, any other dataset is indexed and collated."""
    tensors = getattr(dataset, "tensors", None)
    if isinstance(tensors, (tuple, list)) and len(tensors) >= 2:
        index = torch.from_numpy(indices)
        inputs, targets = tensors[0][index], tensors[1][index]
    else:
        from torch.utils.data import default_collate

        inputs, targets = default_collate([dataset[int(i)] for i in indices])[:2]
    return inputs.to(device), targets.to(device)


def _scaled_loss(loss_fn: Any, scale: float, outputs: Any, targets: Any) -> Any:
    return loss_fn(outputs, targets) * scale


def train_step(model: Any, optimizer: Any, loss_fn: Any, inputs: Any, targets: Any) -> Any:
    return _step(model, optimizer, loss_fn, inputs, targets)[0]


def _step(model: Any, optimizer: Any, loss_fn: Any, inputs: Any, targets: Any) -> tuple[Any, Any]:
    """One optimizer step; (the loss, the detached outputs) for reports."""
    optimizer.zero_grad(set_to_none=True)
    outputs = model(inputs)
    loss = loss_fn(outputs, targets)
    loss.backward()
    optimizer.step()
    return loss, outputs.detach() if isinstance(outputs, torch.Tensor) else outputs


def _rank_report(trainer: Trainer, spec: str, loss: Any, loss_unscale: float, outputs: Any,
                 targets: Any) -> tuple[float, dict[str, float]]:
    """This rank's batch-mean loss (undoing the reweighting's loss scale) and
    the trainer's metrics on its batch."""
    values: dict[str, float] = {}
    if trainer.metrics is not None:
        with torch.no_grad():
            got = _call(spec, "metrics", trainer.metrics, outputs, targets)
        if not isinstance(got, Mapping):
            raise ProblemError(f"trainer '{spec}': metrics() returned a {type(got).__name__}, but must return a "
                               "mapping of names to numbers")
        for name, value in got.items():
            try:
                values[str(name)] = float(value)
            except (TypeError, ValueError, RuntimeError) as e:
                raise ProblemError(f"trainer '{spec}': metrics() gave {name!r} = {value!r}, which is not a "
                                   "number") from e
    return float(loss.detach().item()) * loss_unscale, values


def combine_reports(reports: Sequence[tuple[float, Mapping[str, float]]], batches: Sequence[int]) -> dict[str, Any]:
    """The ranks' batch means as global-batch means: each weighted by its
    rank's batch share (a metric that only some ranks report, over those)."""
    total = sum(batches)
    loss = sum(b * r[0] for b, r in zip(batches, reports)) / total
    names = sorted({name for _, values in reports for name in values})
    metrics = {}
    for name in names:
        pairs = [(b, values[name]) for b, (_, values) in zip(batches, reports) if name in values]
        metrics[name] = sum(b * v for b, v in pairs) / sum(b for b, _ in pairs)
    return {"loss": loss, "metrics": metrics}


def prime_buckets(ddp: Any, loss_fn: Any, inputs: Any, targets: Any, cuda_device: Any = None) -> None:
    """One forward and backward that changes nothing, so that every real
    iteration of every process runs on the same gradient buckets.

    DDP regroups its gradient buckets, in the order gradients became ready,
    after the first backward of each process; the order in which gloo's ring
    sums an element depends on where the element sits in its bucket. Without
    this, the first iteration after a resume would sum in another order than
    the uninterrupted run did, and the two would differ by rounding. The
    module's buffers (batch-norm statistics) and the random states are put
    back, and no optimizer step is taken."""
    buffers = [b.detach().clone() for b in ddp.module.buffers()]
    rng = capture_rng(cuda_device)
    loss_fn(ddp(inputs), targets).backward()
    ddp.zero_grad(set_to_none=True)
    with torch.no_grad():
        for saved, live in zip(buffers, ddp.module.buffers()):
            live.copy_(saved)
    restore_rng(rng, cuda_device)


def _build_model(trainer: Trainer, spec: str, device: Any) -> Any:
    try:
        model = trainer.model()
    except Exception as e:
        raise ProblemError(f"trainer '{spec}': model() raised {type(e).__name__}: {e}") from e
    if not isinstance(model, torch.nn.Module):
        raise ProblemError(f"trainer '{spec}': model() returned a {type(model).__name__}, but must return a "
                           "torch.nn.Module")
    return model.to(device)


def _call(spec: str, name: str, factory: Any, *args: Any) -> Any:
    try:
        return factory(*args)
    except Exception as e:
        raise ProblemError(f"trainer '{spec}': {name}() raised {type(e).__name__}: {e}") from e


def _check_checkpoint(state: Mapping[str, Any], job: JobSpec) -> None:
    where = job.checkpoint_path
    if state["global_batch"] != job.global_batch:
        raise ProblemError(f"was written with global batch {state['global_batch']}, but this job's is "
                           f"{job.global_batch}", source=where)
    if state["trainer"] != job.trainer or state.get("trainer_args", {}) != job.trainer_args:
        raise ProblemError(f"was written by trainer '{state['trainer']}' {state.get('trainer_args', {})}, "
                           f"not '{job.trainer}' {job.trainer_args}", source=where)
    if state["iteration"] > job.iterations:
        raise ProblemError(f"is at iteration {state['iteration']}, past this job's {job.iterations}", source=where)


def _fire(fault: WorkerFault, job: JobSpec, control: RankChannel) -> None:
    if fault.kind == "kill":
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)  # a preemption without notice
    elif fault.kind == "notice":
        machine = job.machine_ids[fault.rank] if job.machine_ids else None
        control.post("notice", machine_id=machine, time_left_s=fault.seconds, iteration=fault.at_iteration)
    elif fault.kind == "hang":
        time.sleep(10 * job.timeout_s)


def run_worker(job: JobSpec, rank: int, world_size: int, local_rank: int, control: RankChannel) -> None:
    """Train this rank from the last checkpoint (if any) to `job.iterations`,
    or until the driver asks it to stop; then end the process (exit code 0)."""
    torch.set_num_threads(job.threads)
    faults = [f for f in job.faults if f.rank == rank]
    for f in faults:
        if f.kind == "delay_start":
            time.sleep(f.seconds)
    backend = resolve_backend(job.backend)
    cuda = backend == "nccl"
    control.post("joining")
    device = join_world(control, backend, job.timeout_s)
    if world_size != len(job.batches):
        raise ProblemError(f"lists {len(job.batches)} local batches, but the world has {world_size} ranks",
                           path="batches")

    trainer = load_trainer(job.trainer, job.trainer_args)
    seed_everything(job.seed)
    model = _build_model(trainer, job.trainer, device)
    state = load_checkpoint(job.checkpoint_path)
    if state is not None:
        _check_checkpoint(state, job)
        model.load_state_dict(state["model"])
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    batch = job.batches[rank]
    loss_fn, loss_unscale = trainer.loss, 1.0
    if job.weighting == "batch":  # Srifty 4.5: weight this rank's gradient by b_r * W / B before the average
        scale = loss_scale(batch, job.global_batch, world_size)
        loss_fn, loss_unscale = functools.partial(_scaled_loss, trainer.loss, scale), 1.0 / scale
    elif job.weighting == "hook":
        register_reweighting(ddp, batch, job.global_batch)
    optimizer = _call(job.trainer, "optimizer", trainer.optimizer, ddp.parameters())
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
    dataset = _call(job.trainer, "dataset", trainer.dataset)
    stream = ShardedStream(len(dataset), job.global_batch, rank_offsets(job.batches)[rank], batch, job.seed)

    start = int(state["iteration"]) if state is not None else 0
    if state is not None and state["rng"]["batches"] == list(job.batches):
        restore_rng(state["rng"]["states"][rank], device if cuda else None)
        rng = "restored"
    else:  # a fresh run, or a new world after a re-plan: a deterministic per-rank seed
        seed_everything(rank_seed(job.seed, start, rank))
        rng = "seeded"
    if start < job.iterations:
        prime_buckets(ddp, loss_fn, *fetch_batch(dataset, stream.indices(start), device), device if cuda else None)
    control.post("ready", start_iteration=start, rng=rng, world_size=world_size, batch=batch)

    def checkpoint(done: int) -> None:
        states: list[Any] = [None] * world_size
        dist.all_gather_object(states, capture_rng(device if cuda else None))
        if rank == 0:
            seconds, size = save_checkpoint(job.checkpoint_path, {
                "iteration": done, "samples_seen": done * job.global_batch, "global_batch": job.global_batch,
                "trainer": job.trainer, "trainer_args": job.trainer_args, "seed": job.seed,
                "model": ddp.module.state_dict(), "optimizer": optimizer.state_dict(),
                "rng": {"batches": list(job.batches), "states": states}, "saved_at": time.time(),
            })
            control.post("checkpoint", iteration=done, save_s=seconds, bytes=size)

    def report(done: int, loss: Any, outputs: Any, targets: Any) -> None:
        mine = _rank_report(trainer, job.trainer, loss, loss_unscale, outputs, targets)
        gathered: list[Any] | None = [None] * world_size if rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if rank == 0:
            control.publish(METRICS, {"at": time.time(), "iteration": done, **combine_reports(gathered, job.batches)})

    # flags, agreed on by every rank after each iteration: [stop, checkpoint now (time), report next]
    flags = torch.zeros(3, dtype=torch.int64, device=device)
    last_checkpoint_at = last_report_at = time.monotonic()
    timing_from: tuple[int, float] | None = None
    done, stopped = start, False
    report_next = job.metrics_every_s is not None  # the first iteration of a world reports
    while done < job.iterations and not stopped:
        for f in faults:
            if f.at_iteration == done and f.kind in ("kill", "notice", "hang"):
                _fire(f, job, control)
        extra = sum(f.seconds for f in faults if f.kind == "slow" and f.active(done))
        if extra > 0:
            time.sleep(extra)
        inputs, targets = fetch_batch(dataset, stream.indices(done), device)
        loss, outputs = _step(ddp, optimizer, loss_fn, inputs, targets)
        done += 1
        if report_next or (job.metrics_every_s is not None and done == job.iterations):
            report(done, loss, outputs, targets)
            last_report_at = time.monotonic()
        del loss, outputs
        if done == start + TIMING_WARMUP:
            timing_from = (done, time.perf_counter())
        flags.zero_()
        if rank == 0:
            now = time.monotonic()
            flags[0] = int(control.command(STOP) is not None)
            flags[1] = int(job.checkpoint_every_s is not None and now - last_checkpoint_at >= job.checkpoint_every_s)
            flags[2] = int(job.metrics_every_s is not None and now - last_report_at >= job.metrics_every_s)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        stopped = bool(flags[0].item())
        report_next = bool(flags[2].item())
        due = job.checkpoint_every is not None and done % job.checkpoint_every == 0
        if stopped or due or bool(flags[1].item()) or done == job.iterations:
            checkpoint(done)
            last_checkpoint_at = time.monotonic()
        if rank == 0:
            control.progress(done)

    timing = None
    if timing_from is not None and done > timing_from[0]:
        timing = {"from_iteration": timing_from[0], "to_iteration": done,
                  "seconds": time.perf_counter() - timing_from[1]}
    if rank == 0:
        control.post("done" if done >= job.iterations else "stopped", iteration=done, timing=timing)
    dist.barrier()
    # Every rank is past its last collective: leave now. Tearing down DDP and
    # gloo objects (destroy_process_group, or this frame's locals going away)
    # has blocked at times after the last barrier, and a worker has nothing
    # left to clean up.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def single_process_reference(trainer: str, global_batch: int, iterations: int, seed: int = 0,
                             trainer_args: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Train on one process with the whole global batch, on the same data
    stream and from the same initial weights as a distributed run: the model's
    state dict after `iterations` steps. Gradient reweighting makes any
    distributed run of the same job equal to this (up to rounding)."""
    made = load_trainer(trainer, trainer_args)
    seed_everything(seed)
    model = _build_model(made, trainer, torch.device("cpu"))
    optimizer = _call(trainer, "optimizer", made.optimizer, model.parameters())
    dataset = _call(trainer, "dataset", made.dataset)
    stream = ShardedStream(len(dataset), global_batch, 0, global_batch, seed)
    seed_everything(rank_seed(seed, 0, 0))
    for it in range(iterations):
        inputs, targets = fetch_batch(dataset, stream.indices(it), torch.device("cpu"))
        train_step(model, optimizer, made.loss, inputs, targets)
    return model.state_dict()


# -- the entry point -------------------------------------------------------------------

def _parse(argv: Sequence[str] | None) -> JobSpec:
    parser = argparse.ArgumentParser(prog="python -m thrifty.runtime.training.worker",
                                     description="one rank of a thrifty training job (torchrun-compatible)")
    parser.add_argument("--job", metavar="JOB.json", help="a job file written by the thrifty driver")
    parser.add_argument("--trainer", metavar="MODULE:FACTORY")
    parser.add_argument("--trainer-args", metavar="JSON", default="{}")
    parser.add_argument("--batches", metavar="B0,B1,...", help="local batch of each rank, in rank order")
    parser.add_argument("--iterations", type=int)
    parser.add_argument("--checkpoint", metavar="PATH")
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds any collective may wait")
    parser.add_argument("--metrics-every", type=float, default=1.0, metavar="SECONDS",
                        help="report the loss and the trainer's metrics this often (0: never)")
    args = parser.parse_args(argv)
    if args.job:
        return JobSpec.read(args.job)
    missing = [flag for flag, value in (("--trainer", args.trainer), ("--batches", args.batches),
                                        ("--iterations", args.iterations), ("--checkpoint", args.checkpoint))
               if value is None]
    if missing:
        parser.error(f"give --job, or {', '.join(missing)}")
    try:
        batches = tuple(int(b) for b in args.batches.split(","))
        trainer_args = json.loads(args.trainer_args)
    except ValueError as e:
        parser.error(f"bad --batches or --trainer-args: {e}")
    return JobSpec(trainer=args.trainer, trainer_args=trainer_args, global_batch=sum(batches),
                   iterations=args.iterations, batches=batches, checkpoint_path=args.checkpoint,
                   checkpoint_every=args.checkpoint_every, seed=args.seed, threads=args.threads,
                   backend=args.backend, timeout_s=args.timeout,
                   metrics_every_s=args.metrics_every if args.metrics_every > 0 else None)


def main(argv: Sequence[str] | None = None) -> None:
    """One rank, under a thrifty world or torchrun; ends the process (exit
    code 0, 1 after reporting an error, 2 for bad arguments)."""
    def body(channel: RankChannel) -> None:
        job = _parse(argv)
        run_worker(job, channel.rank, channel.world_size, int(os.environ.get("LOCAL_RANK", "0")), channel)

    serve_rank(body)


if __name__ == "__main__":
    main()
