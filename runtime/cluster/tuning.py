"""Tuning across machines (issue "Run plans across machines", part 5): the
tuning loop's executor on the machines of a Ray cluster.

A trial is a world of ``atoms`` ranks, as on one host
(`thrifty.runtime.tuning.executors.local`); here its ranks run on the
machines of a `RayProvider` (each a Ray node), forked by each machine's
agent, the store on rank 0's machine, gloo over the machines' addresses.
Launch, proceed, suspend (pause and the first half of a resize), terminate
and the measured overheads are the local executor's own code: `RayExecutor`
only gives it the provider, whose machines `MachineSlots` hands out (one
slot per device of the instance type, or `slots_per_machine`). So every
scheduler (HyperSched, POP, ASHA, Bandit, EarlyTerm, FIFO) runs on it
through `run_experiment`, and the RubberBand plan executor (`execute_plan`)
too: it provisions each stage's machines from the same provider, places
trials with its placement controller (the executor starts each rank where
that placement says), and gives back the machines a stage no longer needs
(`RayProvider.terminate`: a pool node becomes free again; a machine of a
source provider such as EC2 is terminated).

Checkpoints and worker logs go under `workdir` on whichever machine runs the
rank: a path every machine shares (the tests' machines are all on this
host; on EC2, a shared file system mounted at the same path).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from thrifty.runtime.cluster.provider import RayProvider
from thrifty.runtime.tuning.executors.local import LocalExecutor

__all__ = ["RayExecutor"]


class RayExecutor(LocalExecutor):
    """The local executor whose trials run on `provider`'s machines.

    For `run_experiment`, provision the machines first
    (``provider.provision(type, count, market)``); `execute_plan` provisions
    them itself. Other arguments as `LocalExecutor`.
    """

    def __init__(self, trainer: str | Callable[..., Any], workdir: str | Path, provider: RayProvider, *,
                 slots_per_machine: int | None = None, **options: Any):
        super().__init__(trainer, workdir, provider=provider, slots_per_machine=slots_per_machine, **options)
