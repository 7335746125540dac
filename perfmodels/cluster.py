"""A cluster configuration: groups of identical machines, each with the local
batch every machine of the group processes per iteration.

Text form (Srifty's notation, ``4p3@512`` = 4 p3.8xlarge with batch 512
each): ``"4xp3.8xlarge@512+4xg4dn.8xlarge@32"``; the count defaults to 1, so
``"local@16+local@48"`` is two local worker processes with batches 16 and 48.
A machine's batch is split evenly over its GPUs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from thrifty.datasets.catalog import Catalog, InstanceType
from thrifty.core.errors import ProblemError
from thrifty.core.validation import short_value

__all__ = ["MachineGroup", "merge_groups", "parse_cluster", "format_cluster", "world_size", "instance_count"]

MAX_MACHINES = 10_000  # machines of one type: above any cloud account's quota (a problem's quota bound too)
MAX_BATCH = 2**20      # samples per machine: 16x the largest published data-parallel batch

_PART = re.compile(r"^\s*(?:(\d+)\s*x\s*)?([A-Za-z0-9][A-Za-z0-9.\-_]*)\s*@\s*(\d+)\s*$")


@dataclass(frozen=True)
class MachineGroup:
    instance_type: InstanceType
    count: int
    batch: int  # per machine, split evenly over its GPUs

    def __post_init__(self) -> None:
        for name, value, most in (("count", self.count, MAX_MACHINES), ("batch", self.batch, MAX_BATCH)):
            if value < 1:
                raise ProblemError(f"{name} is {value}, but must be at least 1")
            if value > most:
                raise ProblemError(f"{name} is {short_value(value)}, but must be at most {most:,}")

    @property
    def devices(self) -> int:
        return self.count * self.instance_type.gpus

    @property
    def device_batch(self) -> int:
        """The largest per-device batch on one machine (it bounds the machine)."""
        gpus = self.instance_type.gpus
        return -(-self.batch // gpus)

    def __str__(self) -> str:
        return f"{self.count}x{self.instance_type.name}@{self.batch}"


def parse_cluster(text: str, catalog: Catalog) -> list[MachineGroup]:
    """Parse ``"4xp3.8xlarge@512+1xg4dn.8xlarge@32"`` into machine groups."""
    if not text or not text.strip():
        raise ProblemError("config is empty; expected e.g. '4xp3.8xlarge@512+2xg4dn.8xlarge@64'")
    groups = []
    for i, part in enumerate(text.split("+")):
        m = _PART.match(part)
        if not m:
            raise ProblemError(
                f"part {i + 1} '{part.strip()}' is not COUNTxTYPE@BATCH (e.g. 4xp3.8xlarge@512)",
                path="config",
            )
        count = int(m.group(1) or 1)
        itype = catalog.get(m.group(2))
        try:
            groups.append(MachineGroup(itype, count, int(m.group(3))))
        except ProblemError as e:
            raise ProblemError(f"part {i + 1} '{part.strip()}': {e.message}", path="config") from None
    return groups


def merge_groups(groups: Sequence[MachineGroup]) -> list[MachineGroup]:
    """The same machines with the groups of one instance type and one batch
    joined into one (at the first's place): a type's spot and on-demand
    machines at the same batch are, to an iteration, one group of identical
    machines. Groups that differ keep their order."""
    merged: dict[tuple[str, int], MachineGroup] = {}
    for g in groups:
        key = (g.instance_type.name, g.batch)
        seen = merged.get(key)
        merged[key] = g if seen is None else MachineGroup(g.instance_type, seen.count + g.count, g.batch)
    return list(merged.values())


def format_cluster(groups: list[MachineGroup]) -> str:
    return "+".join(str(g) for g in groups)


def world_size(groups: list[MachineGroup]) -> int:
    return sum(g.devices for g in groups)


def instance_count(groups: list[MachineGroup]) -> int:
    return sum(g.count for g in groups)
