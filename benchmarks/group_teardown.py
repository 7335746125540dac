"""The gloo group's teardown, two orders side by side (the deadlock that
`thrifty.runtime.worlds.leave_group` avoids).

Each round, in one process: a gloo group of one, a DDP model, three backward
passes, then the group destroyed

- ``model alive``: ``destroy_process_group()`` with the DDP model still
  alive, the model freed after (what ``_ddp_overhead`` did before): the
  model's Reducer frees the group with the GIL held;
- ``leave_group``: the model dropped, then `leave_group()` (the runtime's
  way): the group's Python object frees it, the GIL released.

Each order runs in a process of its own with a time limit; a process still
in which no round has ended for ``--stall-s`` seconds is stopped and
reported hung, with the round it hung in. Run: ``python
benchmarks/group_teardown.py [--rounds N] [--stall-s S]``. Prints one table.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

ORDERS = ("model alive", "leave_group")


def rounds_worker(order: str, rounds: int) -> None:
    """Run the rounds, printing each one's number as it ends."""
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
        print(i + 1, flush=True)


def run_order(order: str, rounds: int, stall_s: float) -> tuple[int, bool, float]:
    """(rounds done, hung, seconds) of one order in a process of its own;
    hung: no round ended in `stall_s` seconds (a round takes about 0.1 s),
    and the process is stopped."""
    import queue
    import threading

    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, __file__, "--worker", order, "--rounds", str(rounds)],
                            stdout=subprocess.PIPE, text=True)
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout] + [lines.put(None)],
                     daemon=True).start()
    done, hung = 0, False
    while True:
        try:
            line = lines.get(timeout=stall_s)
        except queue.Empty:
            hung = True
            proc.kill()
            break
        if line is None:
            break
        done = int(line)
    if proc.wait() != 0 and not hung:
        raise SystemExit(f"{order}: the worker failed with exit code {proc.returncode}")
    return done, hung, time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--stall-s", type=float, default=20.0, help="no round ended in this long: hung")
    parser.add_argument("--worker", choices=ORDERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        rounds_worker(args.worker, args.rounds)
        return
    print(f"{'order':<14} {'rounds done':>12} {'of':>5} {'seconds':>8}  outcome")
    for order in ORDERS:
        done, hung, seconds = run_order(order, args.rounds, args.stall_s)
        outcome = f"hung in round {done + 1}" if hung else "all done"
        print(f"{order:<14} {done:>12} {args.rounds:>5} {seconds:>8.1f}  {outcome}")


if __name__ == "__main__":
    main()
