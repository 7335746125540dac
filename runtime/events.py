"""Events the runtime reacts to, one type per kind, whatever delivers them.

A preemption is the same `Preemption` whether the fault injector killed a
worker in a test, the EC2 instance-metadata poller saw a spot
``instance-action`` notice (Srifty 4.5: two minutes of warning), the driver saw
an instance leave ``running`` in ``describe_instances``, or a launch failed for
capacity. The runtime marks ``(instance_type, market)`` depleted and re-solves
with what is left (Srifty 4.5, 5.4).
"""

from __future__ import annotations

import time
from dataclasses import field
from typing import Literal

from pydantic.dataclasses import dataclass

from thrifty.core.validation import RECORD_CONFIG

__all__ = ["Preemption", "PreemptionSource"]

PreemptionSource = Literal["injector", "imds", "describe", "capacity", "worker-exit", "node-lost"]


@dataclass(frozen=True, config=RECORD_CONFIG)
class Preemption:
    """One machine (or one whole market, for capacity) taken away.

    `time_left_s` is the warning before the machine stops: 120 s for an EC2
    spot notice, 0 when it is already gone, None when unknown. `machine_id` is
    None for a capacity failure, which depletes the market before any machine
    exists.
    """

    instance_type: str
    market: str
    source: PreemptionSource
    machine_id: str | None = None
    time_left_s: float | None = None
    reason: str = ""
    at: float = field(default_factory=time.time)

    @property
    def key(self) -> tuple[str, str]:
        """The (instance type, market) this event depletes."""
        return (self.instance_type, self.market)
