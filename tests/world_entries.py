"""Entry points of the worker-world tests' ranks (``world_entries:NAME``):
each is called with the world's argv in a forked worker process."""

from __future__ import annotations

import os
import time

from thrifty.runtime.worlds import RankChannel, join_world, serve_rank


def _sum_ranks(channel: RankChannel) -> None:
    import torch
    import torch.distributed as dist

    join_world(channel, "gloo", 30.0)
    total = torch.tensor([channel.rank + 1])
    dist.all_reduce(total)
    for step in range(3):
        channel.barrier(f"step-{step}")
        channel.progress(step + 1)
        if channel.rank == 0:
            channel.send("steps", {"step": step})
    channel.post("hello", env_thrifty=os.environ.get("THRIFTY_WORLD"))
    channel.finish({"rank": channel.rank, "total": int(total), "argv": ARGV})
    dist.destroy_process_group()


ARGV: list[str] = []


def sum_ranks(argv: list[str]) -> None:
    ARGV[:] = argv
    serve_rank(_sum_ranks)


def fail(argv: list[str]) -> None:
    def body(channel: RankChannel) -> None:
        if channel.rank == int(argv[0]):
            raise ValueError("rank failed on purpose")
        time.sleep(60)

    serve_rank(body)


def die(argv: list[str]) -> None:
    def body(channel: RankChannel) -> None:
        if channel.rank == 1:
            os._exit(3)
        time.sleep(60)

    serve_rank(body)


def hang(argv: list[str]) -> None:
    serve_rank(lambda channel: time.sleep(600))


def no_result(argv: list[str]) -> None:
    serve_rank(lambda channel: None)


def wait_for_go(argv: list[str]) -> None:
    serve_rank(lambda channel: channel.finish(channel.wait_command("go", 30.0)))


def exchange_gradients(argv: list[str]) -> None:
    """The co-located profiler's gradient exchange on a model whose gradients
    span several DDP buckets and two dtypes: every rank sets gradient
    ``(rank + 1) * pattern`` (one parameter left without a gradient) and
    reports the largest distance of the exchanged gradients from the average,
    ``1.5 * pattern`` on two ranks."""
    def body(channel: RankChannel) -> None:
        import torch
        import torch.distributed as dist

        from thrifty.runtime.measure.colocated import gradient_exchange

        join_world(channel, "gloo", 30.0)
        model = torch.nn.Sequential(torch.nn.Linear(600, 600), torch.nn.Linear(600, 20), torch.nn.Linear(20, 3))
        model[1].double()
        patterns = {}
        for i, p in enumerate(model.parameters()):
            if i == 5:  # the last bias: no gradient this iteration
                continue
            patterns[i] = torch.arange(p.numel(), dtype=p.dtype).reshape(p.shape) / p.numel() + i
            p.grad = (channel.rank + 1) * patterns[i]
        gradient_exchange(torch, model)()
        errors = [float((p.grad - 1.5 * patterns[i]).abs().max()) for i, p in enumerate(model.parameters())
                  if i in patterns]
        channel.finish({"errors": errors, "none_left": list(model.parameters())[5].grad is None})
        dist.destroy_process_group()

    serve_rank(body)


def sleep_alone(argv: list[str]) -> None:
    """A rank that joins no world: it sleeps `argv[0]` seconds."""
    time.sleep(float(argv[0]))
