"""The gloo group's teardown, two orders side by side (the deadlock that
`thrifty.runtime.worlds.leave_group` avoids).

Each round, in one process: a gloo group of one, a DDP model, three backward
passes, then the group destroyed

- ``model alive``: ``destroy_process_group()`` with the DDP model still
  alive, the model freed after (what ``_ddp_overhead`` did before): the
  model's Reducer frees the group with the GIL held;
- ``leave_group``: the model dropped, then `leave_group()` (the runtime's
  way): the group's Python object frees it, the GIL released.

Each order runs in a worker world of one rank (a fork of thrifty's fork
server); a world in which no round has ended for ``--stall-s`` seconds is
stopped and reported hung, with the round it hung in. Run: ``python
benchmarks/group_teardown.py [--rounds N] [--stall-s S]``. Prints one table.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

ORDERS = ("model alive", "leave_group")


def teardown_rank(argv: list[str]) -> None:
    """The one rank of an order's world: its rounds, its progress moved at each round's end."""
    from thrifty.runtime.worlds import serve_rank

    order, rounds = argv[0], int(argv[1])
    serve_rank(lambda channel: channel.finish(rounds_worker(channel, order, rounds)))


def rounds_worker(channel: "object", order: str, rounds: int) -> int:
    """Run the rounds (the rank's progress: the rounds done); return how many."""
    import torch
    import torch.distributed as dist

    from thrifty.runtime.worlds import leave_group

    for i in range(rounds):
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 64),
                                                                              torch.nn.Linear(64, 8)))
        for _ in range(3):
            model(torch.randn(16, 64)).sum().backward()
        if order == "model alive":
            dist.destroy_process_group()
            del model  # at once, as a function's return frees its locals
        else:
            del model
            leave_group()
        channel.progress(i + 1)  # type: ignore[attr-defined]
    return rounds


def run_order(order: str, rounds: int, stall_s: float) -> tuple[int, bool, float]:
    """(rounds done, hung, seconds) of one order in a world of one rank;
    hung: no round ended in `stall_s` seconds (a round takes about 0.1 s),
    and the world is stopped."""
    from thrifty.runtime.worlds import World, WorldFailed

    start = time.monotonic()
    done = [0]
    world = World(1, f"{Path(__file__).stem}:teardown_rank", [order, str(rounds)], where=f"the {order} world")
    try:
        world.run(stall_timeout_s=stall_s, on_progress=lambda total: done.__setitem__(0, total))
        hung = False
    except WorldFailed as e:
        if "no progress for" not in str(e):
            raise
        hung = True
    return done[0], hung, time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--stall-s", type=float, default=20.0, help="no round ended in this long: hung")
    args = parser.parse_args()
    print(f"{'order':<14} {'rounds done':>12} {'of':>5} {'seconds':>8}  outcome")
    for order in ORDERS:
        done, hung, seconds = run_order(order, args.rounds, args.stall_s)
        outcome = f"hung in round {done + 1}" if hung else "all done"
        print(f"{order:<14} {done:>12} {args.rounds:>5} {seconds:>8.1f}  {outcome}")


if __name__ == "__main__":
    main()
