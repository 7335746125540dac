"""The worker: the one entry point of every rank of a training job or a
tuning trial (synchronous data-parallel training, Srifty 4.5).

A thrifty starter (the training driver's `thrifty.runtime.training.launcher`,
the tuning executor) starts each rank of a worker world
(`thrifty.runtime.worlds`) as ``ENTRY`` with `job_argv(job)`: the `JobSpec`
as JSON on its command line, ``--job JSON``. By hand, a job file (the driver
keeps each world's job in its run folder) is ``--job @JOB.json``, and under
torchrun the job's fields may be given as flags::

    torchrun --nproc-per-node 3 -m thrifty.runtime.ddp.worker \\
        --trainer thrifty.runtime.training.examples:tiny_mlp --batches 3,5,8 \\
        --iterations 100 --checkpoint run/checkpoint.pt

Rank, world size and the rendezvous come from the torchrun environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``,
``init_method="env://"``); gloo on CPU, NCCL on GPUs. The job is carried out
by the one rank loop, `thrifty.runtime.ddp.loop.run_rank`: per-rank batches,
gradient reweighting, checkpoints, loss and metric reports, a trial's
results, and the starter's commands.

When a thrifty starter launched it (the starter hosts the rendezvous store,
as torchrun's agent does with ``TORCHELASTIC_USE_AGENT_STORE``), the worker
also reports through that store, in the worlds' one protocol. This module
imports no torch itself; the loop does.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from thrifty.runtime.ddp.job import JobSpec
from thrifty.runtime.worlds import RankChannel, serve_rank

__all__ = ["main", "ENTRY", "PRELOAD", "job_argv"]

ENTRY = "thrifty.runtime.ddp.worker:main"
# what the fork server imports before forking ranks: this entry and the loop it runs
PRELOAD = ("thrifty.runtime.ddp.worker", "thrifty.runtime.ddp.loop", "thrifty.runtime.ddp.context")


def job_argv(job: JobSpec) -> list[str]:
    """The command line that gives `job` to a rank started as `ENTRY`."""
    return ["--job", job.to_json()]


# -- the entry point -------------------------------------------------------------------

def _parse(argv: Sequence[str] | None) -> JobSpec:
    parser = argparse.ArgumentParser(prog="python -m thrifty.runtime.ddp.worker",
                                     description="one rank of a thrifty training job or tuning trial "
                                                 "(torchrun-compatible)")
    parser.add_argument("--job", metavar="JSON|@JOB.json",
                        help="the job as JSON, or @ and the path of a job file (one the thrifty driver kept)")
    parser.add_argument("--trainer", metavar="MODULE:FACTORY")
    parser.add_argument("--trainer-args", metavar="JSON", default="{}")
    parser.add_argument("--batches", metavar="B0,B1,...", help="local batch of each rank, in rank order")
    parser.add_argument("--iterations", type=int)
    parser.add_argument("--checkpoint", metavar="PATH|s3://BUCKET/KEY")
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds any collective may wait")
    parser.add_argument("--metrics-every", type=float, default=1.0, metavar="SECONDS",
                        help="report the loss and the trainer's metrics this often (0: never)")
    args = parser.parse_args(argv)
    if args.job:
        if args.job.startswith("@"):
            return JobSpec.read(args.job[1:])
        return JobSpec.from_json(args.job, source="--job")
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
        from thrifty.runtime.ddp.loop import run_rank

        run_rank(_parse(argv), channel)

    serve_rank(body)


if __name__ == "__main__":
    main()
